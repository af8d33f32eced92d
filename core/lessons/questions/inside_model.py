"""The questions of the page "Inside a trained model"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
