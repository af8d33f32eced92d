"""Every page's questions, one module per lesson page (named as the page's address).

Each module holds ``QUESTIONS``, a tuple of :class:`~core.lessons.predictions.Prediction`: the first
opens the page (the student answers it before the control that shows the answer unlocks); the
others sit where their effect is visible. "Check yourself" gathers them all.
"""
from __future__ import annotations

import importlib

from core.lessons import path
from core.lessons.predictions import Prediction


def of_page(page: str) -> tuple[Prediction, ...]:
    """The questions of lesson page ``page``, its opening question first."""
    path.step(page)                         # refuses a page that is not on the path
    return importlib.import_module(f"{__name__}.{page}").QUESTIONS


def opening(page: str) -> Prediction:
    """The question that opens ``page``."""
    return of_page(page)[0]


def everything() -> tuple[Prediction, ...]:
    """All questions, in the order of the path."""
    return tuple(q for s in path.STEPS for q in of_page(s.page))


def by_key(key: str) -> Prediction:
    for q in everything():
        if q.key == key:
            return q
    raise ValueError(f"No question {key!r}.")
