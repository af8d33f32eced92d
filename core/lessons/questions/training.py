"""The questions of the page "Train an encoder"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
