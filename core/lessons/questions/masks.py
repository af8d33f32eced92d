"""The questions of the page "Masks and cross-attention"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
