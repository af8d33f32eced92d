"""The questions of the page "Multi-head, set by hand"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
