"""Predict, then see: the questions the pages ask before they show, and how an answer is judged.

A :class:`Prediction` is asked on one page. The student answers; a wrong first answer gets the
question's hint, a wrong second answer gets the answer and why; a right answer gets why. Only the
first answer counts toward the score, and once the answer is known (right, or shown after two
tries) the question is closed: answering again changes nothing.

    p = Prediction("dk_entropy", "one_head", "…", options=("rises", "falls"), answer=1, hint="…", why="…")
    progress = Progress()
    progress, verdict = attempt(progress, p, "rises")    # wrong: verdict.stage == HINT
    progress, verdict = attempt(progress, p, "falls")    # right: progress.done, not first_try_right

The questions themselves live beside the pages' lessons (:mod:`core.lessons.questions`), their
answers computed from the same functions the pages draw with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

RIGHT, HINT, REVEALED, BLANK = "right", "hint", "revealed", "blank"


@dataclass(frozen=True)
class Prediction:
    """A question: multiple choice (``answer`` indexes ``options``) or a number (no ``options``;
    a typed number counts when within ``tolerance``, relative, of ``answer``)."""

    key: str
    page: str
    prompt: str
    answer: float
    hint: str
    why: str
    options: tuple[str, ...] = ()
    tolerance: float = 0.0

    def __post_init__(self):
        if self.options and not (isinstance(self.answer, int) and 0 <= self.answer < len(self.options)):
            raise ValueError(f"{self.key}: the answer must index one of its {len(self.options)} options.")
        if not self.options and not math.isfinite(self.answer):
            raise ValueError(f"{self.key}: a numeric answer must be finite.")

    @property
    def numeric(self) -> bool:
        return not self.options

    @property
    def answer_text(self) -> str:
        if self.options:
            return self.options[int(self.answer)]
        return f"{self.answer:,.0f}" if float(self.answer).is_integer() else f"{self.answer:,.4g}"


@dataclass(frozen=True)
class Progress:
    """Where a student stands on one question: tries so far, whether the first was right, done."""

    tries: int = 0
    first_try_right: bool | None = None
    done: bool = False
    last: str | None = None                # the stage of the latest verdict shown


@dataclass(frozen=True)
class Verdict:
    """What to show after an answer: its ``stage`` (right, hint, revealed, blank) and the text."""

    stage: str
    text: str


def parse_number(typed) -> float | None:
    """A typed number (commas, spaces and underscores ignored), or None when it is not one."""
    if isinstance(typed, (int, float)) and not isinstance(typed, bool):
        return float(typed) if math.isfinite(typed) else None
    if not isinstance(typed, str):
        return None
    cleaned = typed.strip().replace(",", "").replace("_", "").replace(" ", "")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def is_right(p: Prediction, answer) -> bool | None:
    """Whether ``answer`` (an option's text or index, or a typed number) is right; None when it is
    no answer at all (nothing chosen, or not a number), which costs no try."""
    if p.options:
        if answer is None:
            return None
        if isinstance(answer, int) and not isinstance(answer, bool):
            if not 0 <= answer < len(p.options):
                return None
            return answer == p.answer
        if answer not in p.options:
            return None
        return p.options.index(answer) == p.answer
    value = parse_number(answer)
    if value is None:
        return None
    return abs(value - p.answer) <= p.tolerance * abs(p.answer)


def attempt(progress: Progress, p: Prediction, answer) -> tuple[Progress, Verdict]:
    """Judge ``answer`` and move ``progress`` on: right → done; first wrong → the hint; second wrong →
    the answer shown, done. A closed question is not judged again (its progress stays)."""
    if progress.done:
        return progress, shown(progress, p)
    right = is_right(p, answer)
    if right is None:
        what = "Choose one of the options" if p.options else "Type a number"
        return progress, Verdict(BLANK, f"{what} first.")
    tries = progress.tries + 1
    first = right if progress.tries == 0 else progress.first_try_right
    if right:
        stage, done = RIGHT, True
    elif tries == 1:
        stage, done = HINT, False
    else:
        stage, done = REVEALED, True
    moved = replace(progress, tries=tries, first_try_right=first, done=done, last=stage)
    return moved, shown(moved, p)


def shown(progress: Progress, p: Prediction) -> Verdict:
    """The verdict a question shows at ``progress`` (after its latest answer)."""
    if progress.last == RIGHT:
        return Verdict(RIGHT, "Right. " + p.why)
    if progress.last == HINT:
        return Verdict(HINT, "Not yet. Hint: " + p.hint)
    if progress.last == REVEALED:
        return Verdict(REVEALED, f"The answer: {p.answer_text}. " + p.why)
    return Verdict(BLANK, "")


def score(progresses) -> tuple[int, int]:
    """``(right at the first try, questions tried)`` over an iterable of :class:`Progress`."""
    tried = [q for q in progresses if q.tries > 0]
    return sum(1 for q in tried if q.first_try_right), len(tried)
