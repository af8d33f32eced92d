"""The questions of the page "Parameters and cost"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
