"""The questions of the page "Decoder and generation"."""
from core.lessons.predictions import Prediction

QUESTIONS: tuple[Prediction, ...] = ()
