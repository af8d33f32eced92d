"""The questions of the page "A real model"."""
import numpy as np

from core import masks
from core.lessons import real_model as rm
from core.lessons.predictions import Prediction
from core.model import presets

PAGE = "real_model"


def _reads_the_next_token(causal: bool) -> bool:
    """Whether a query of a self-attention (causal or not) may put weight on the key right after it:
    the mask's entry there is finite (0), not −∞."""
    M = masks.causal(2) if causal else np.zeros((2, 2))
    return bool(np.isfinite(M[0, 1]))


# The opening question: which architecture can have a next-token head. The page opens on an encoder
# (all-MiniLM-L6-v2); SmolLM2, GPT-2 and the shipped small GPT are decoders.
LOOK_AHEAD = ("Only the encoder (all-MiniLM-L6-v2)", "Only the decoders (SmolLM2, GPT-2, the small GPT)", "Both",
              "Neither")
_encoder = _reads_the_next_token(presets.encoder_classifier().causal)
_decoder = _reads_the_next_token(presets.gpt2().causal)
_look_ahead = {(True, False): 0, (False, True): 1, (True, True): 2, (False, False): 3}[(_encoder, _decoder)]

# "Your turn" in the rollout: two layers whose heads all look one token back; the share token
# ROLL_TOKEN (counted from 1) keeps on itself, and the shares on the tokens before it.
ROLL_T, ROLL_TOKEN = 5, 3
_one_back = np.eye(ROLL_T, k=-1)
_one_back[0, 0] = 1.0                                            # the first token has none before it
_rolled = rm.rollout(np.stack([_one_back[None], _one_back[None]]))[-1, ROLL_TOKEN - 1]   # (T,)
_kept, _back_one, _back_two = (float(_rolled[ROLL_TOKEN - 1 - i]) for i in range(3))

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.next_token_head", PAGE,
        "all-MiniLM-L6-v2 is an encoder; SmolLM2, GPT-2 and the small GPT shipped here are decoders. Which of them "
        "can have a **next-token head**, one whose query at token t puts most of its weight on token t + 1?",
        _look_ahead,
        "What does a decoder add to its scores before the softmax, and where?",
        "A decoder adds its causal mask, −∞ on every key after the query, so its weight on token t + 1 is "
        "exactly 0 whatever it learned. An encoder has no such mask: it reads both ways, and training "
        "decides where each head looks. Open the heads below: on the encoder, the head detector's next-token "
        "column shows how much weight each head puts one token ahead; on a decoder, every map is empty above "
        "its diagonal.",
        options=LOOK_AHEAD,
    ),
    Prediction(
        f"{PAGE}.rollout_share", PAGE,
        f"A model has two layers, and every head of both puts each token's whole weight on the token just "
        f"before it (the first token, with none before it, on itself). In its attention rollout, what share "
        f"of token {ROLL_TOKEN} stays on token {ROLL_TOKEN} itself after both layers? (A number between 0 and 1.)",
        round(_kept, 12),
        "Each layer's rollout map is half the heads' mean map and half the identity; the rollout "
        "multiplies the layers' maps.",
        f"Each layer keeps half of a token on itself and passes half one token back, so after two layers "
        f"{_kept:g} stays on token {ROLL_TOKEN}, {_back_one:g} reaches token {ROLL_TOKEN - 1} (by two routes) "
        f"and {_back_two:g} token {ROLL_TOKEN - 2}. The identity is the residual connection: with it, "
        "the rollout never moves a token's whole share away in one layer, however one-hot the heads are.",
        tolerance=0.01,
    ),
)
