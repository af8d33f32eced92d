"""The questions of the page "Induction heads".

Both are asked about the model the page opens on (the default run, seed 0, shipped with the app);
the opening question's answer is what removing that model's previous-token head measures.
"""
from core.lessons.predictions import Prediction
from core.model import names
from core.lessons import induction

PAGE = "induction"
_RUN, _DATA, _M, (_PREV, _IND), _ABLATION = induction.opening_experiment("zero")
_PREV_NAME, _IND_NAME = names.head(_PREV.layer, _PREV.head), names.head(_IND.layer, _IND.head)


def _why_removal() -> str:
    a = _ABLATION
    found = (f"On the default model removing {_PREV_NAME} takes layer 2's best induction score from "
             f"{a.induction_before:.3f} to {a.induction_after:.3f} and the repeated segment's accuracy from "
             f"{a.acc_before:.1%} to {a.acc_after:.1%}.")
    return ("An induction head's key at position j has to carry which token stood at j − 1. The embeddings at j "
            "hold only x_j and the position j, so a layer-1 head has to write it there. " + found)


REMOVAL = Prediction(
    key="induction.remove_previous_token", page=PAGE,
    prompt=(f"In the default model (seed 0) layer 1's best previous-token head is {_PREV_NAME} and layer 2's best "
            f"induction head {_IND_NAME}. Replace {_PREV_NAME}'s output by zero at every position and score the "
            "held-out sequences again: what happens to layer 2's best induction score?"),
    options=("It rises: without it layer 2 matches the current token more sharply.",
             "It falls, but keeps more than half of itself.",
             "It falls to half of itself or less."),
    answer=induction.ablation_outcome(_ABLATION),
    hint=(f"{_PREV_NAME} never looks at the token to predict. But where do layer 2's keys learn which token "
          "stood before them?"),
    why=_why_removal(),
)

CONTRIBUTION = Prediction(
    key="induction.previous_token_role", page=PAGE,
    prompt="What does the previous-token head contribute to the copying?",
    options=("The token to predict: it reads it from the earlier copy.",
             "At each position, the token before it: what the induction head matches the current token against.",
             "Where the segment starts, so the induction head can count back from there."),
    answer=1,
    hint=("Look where the previous-token head's weight sits, and then at what its removal does to the induction "
          "head's map rather than to its own."),
    why=("It looks one step back and writes that token into each position. The induction head's query (the current "
         "token) is matched against those keys, so its weight lands right after the earlier copy, where the next "
         "token stands. Remove the previous-token head and the induction head's map loses that diagonal, though "
         "the removed head itself looks one step back, not at the token to predict."),
)

QUESTIONS: tuple[Prediction, ...] = (REMOVAL, CONTRIBUTION)
