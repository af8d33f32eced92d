"""The questions of the page "Concat, W_O and the filter bank"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
