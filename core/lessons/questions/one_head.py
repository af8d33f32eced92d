"""The questions of the page "One head"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
