"""The questions of the page "A real model"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
