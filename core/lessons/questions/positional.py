"""The questions of the page "Positional encoding"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
