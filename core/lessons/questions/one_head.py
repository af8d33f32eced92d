"""The questions of the page "One head"."""
import math

from core.lessons.predictions import Prediction

PAGE = "one_head"

# The opening question's head width: wide enough that dividing by √d_k matters (√64 = 8).
WIDE_D_K = 64
_stretch = math.sqrt(WIDE_D_K)

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.scale", PAGE,
        f"Set d_k = {WIDE_D_K}, then switch off “Divide by √d_k”. What happens to the entropy of the "
        "rows of A (how spread out each query's weights are)?",
        0,
        f"Read the formula for S at the top: without √d_k every score is {_stretch:g} times larger. "
        "What does that do to the gaps between the scores of one row, and so to the softmax of that row?",
        f"Without the division every score is √d_k = {_stretch:g} times larger, so the gaps between a "
        "row's scores grow as much, and the softmax, which weighs each key by e^(score), piles the "
        "weight on the largest score. Stretching a row's scores can only lower its entropy (a one-hot row "
        "has 0 bits). That is why we scale: q·k adds up d_k products, so for entries of variance 1 its "
        f"variance is d_k ({WIDE_D_K} here); dividing by √d_k brings it back to 1, so the softmax does not "
        "saturate (a saturated softmax passes almost no gradient back). Read the mean row entropy under the heatmaps "
        "with the switch on and off.",
        options=(
            "It falls: the rows go nearly one-hot, most of each row's weight on one key.",
            "It rises: the rows spread out towards the uniform row.",
            "It stays the same: the softmax depends only on the order of the scores.",
        ),
    ),
)
