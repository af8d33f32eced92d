"""The questions of the page "Inside a trained model".

Both are asked about the model the page opens on (the default model shipped with the app: 'sum',
seed 0), and their answers are that model's measured numbers.
"""
import numpy as np

from core.lessons import inside
from core.lessons.predictions import Prediction
from core.model import names

PAGE = "inside_model"
_MODEL, _REPORT, _ = inside.opening_model()
_H = _MODEL.cfg.n_heads
_CHANGE = _REPORT.change("zero").ravel()
_FOCUSED = inside.most_focused(_REPORT)
_WORST = int(np.argmin(_CHANGE))


def _name(flat: int) -> str:
    return names.head(*divmod(flat, _H))


def _why_focused() -> str:
    focused = f"Removing {_name(_FOCUSED)} changes the test accuracy by {_CHANGE[_FOCUSED]:+.3f}"
    if inside.largest_drop(_CHANGE) is None:
        found = "; removing no single head lowers it."
    elif _CHANGE[_WORST] < _CHANGE[_FOCUSED]:
        found = f"; removing {_name(_WORST)} lowers it most ({_CHANGE[_WORST]:+.3f})."
    else:
        found = ", the largest drop of any single head."
    return (focused + found + " A map shows where a head looks; whether the classifier needs what the head "
            "reads shows only when the head is removed and the test set scored again.")


STRIKING = Prediction(
    key="inside_model.striking_head", page=PAGE,
    prompt=(f"In the default model ('sum', seed 0), head {_name(_FOCUSED)} has the most focused mean attention "
            f"map of its {_MODEL.cfg.n_layers * _H} heads (focus {_REPORT.focus.ravel()[_FOCUSED]:.3f}; section 2 "
            "draws it). Replace its output by zero and score the test set again: what happens to the accuracy?"),
    options=("It falls more than removing any other single head would: the most focused map marks the head "
             "the model needs most.",
             "It falls, but removing some other head costs more.",
             "It does not fall."),
    answer=inside.focused_head_outcome(_REPORT, "zero"),
    hint=("On 'sum' the label depends on every token alike. Does a head that looks at a few tokens more than "
          "at the others have to be the one the classifier reads most?"),
    why=_why_focused(),
)

_EXAMPLE = 0                                        # the test example the page opens on, layer 1
_LN = {s.name: s for s in inside.walkthrough(inside.forward(_MODEL.params, _MODEL.cfg, _MODEL.data.X_test[:1])[1],
                                             _MODEL.params, _MODEL.cfg, 0, _EXAMPLE)}["LayerNorm 1"]
_STD = inside.layernorm_table(_LN)["std of x-hat"]
if np.all(np.abs(_STD - 1) < 1e-12):
    _SIDE = 0
elif np.all(_STD < 1) and _STD.min() > 0.99:
    _SIDE = 1
elif np.all(_STD > 1) and _STD.max() < 1.01:
    _SIDE = 2
else:
    _SIDE = 3

LAYERNORM = Prediction(
    key="inside_model.layernorm_std", page=PAGE,
    prompt=(r"LayerNorm first normalises each token's residual sum r over its d_model features: "
            r"x̂ = (r − μ) / √(σ² + ε). Token by token, what standard deviation does x̂ have?"),
    options=("Exactly 1.", "A hair under 1.", "A hair over 1.", "It varies widely from token to token."),
    answer=_SIDE,
    hint="ε is a small positive number added to σ² before the square root. Which way does it move the quotient?",
    why=(f"x̂'s standard deviation is √(σ² / (σ² + ε)), just under 1 because ε = {_MODEL.cfg.ln_eps:g} > 0: on the "
         f"test example the page opens on it runs from {_STD.min():.6f} to {_STD.max():.6f}. The gain g and bias b "
         "then give each feature its own scale and offset."),
)

QUESTIONS: tuple[Prediction, ...] = (STRIKING, LAYERNORM)
