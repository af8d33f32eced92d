"""The questions of the page "Induction heads"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
