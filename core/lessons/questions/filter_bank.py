"""The questions of the page "Concat, W_O and the filter bank"."""
from core.lessons.predictions import Prediction

PAGE = "filter_bank"

# The W_O preset the opening question asks about: dense, so every output channel reads both heads.
DENSE_W_O = "random"

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.exact_sum", PAGE,
        "The page splits O = Concat·W_O into one term per head, A_h X W_V^h W_O^(h). Choose a dense "
        f"W_O (the “{DENSE_W_O}” preset), where every output channel reads both heads: does the sum of "
        "the terms equal Concat·W_O exactly, or only approximately?",
        0,
        "Write Concat·W_O as a product of blocks: Concat's column blocks are the heads' outputs o_1, o_2, "
        "and W_O's row blocks are W_O^(1), W_O^(2) (the rows h1.* and h2.* of the W_O table). What does a "
        "row of blocks times a column of blocks give?",
        "Concat·W_O = [o_1, o_2]·[W_O^(1); W_O^(2)] = o_1 W_O^(1) + o_2 W_O^(2), with o_h = A_h X W_V^h. That "
        "is block matrix multiplication, with no approximation, for any W_O: a channel that reads both "
        "heads just adds the two heads' contributions. The metric under the terms shows the difference "
        "at floating-point rounding: exactly 0, or about 1e-16 in float64 (1e-7 in float32).",
        options=(
            "Exactly, for any W_O: the difference is floating-point rounding.",
            "Only approximately: the channels that mix heads leave cross terms between the heads out.",
            "Exactly only when W_O is the identity or swaps the head blocks.",
        ),
    ),
    Prediction(
        f"{PAGE}.w_o_mixing", PAGE,
        "Two heads of width 2 feed a 4-wide output through W_O. With W_O = identity, and then with W_O = "
        "the permutation that swaps the two head blocks, does any output channel read more than one head?",
        3,
        "Choose each preset and look at the W_O heatmap: for each output channel (a column), are there "
        "non-zero entries in both row blocks, h1.* and h2.*?",
        "A permutation (the identity included) only moves columns around: every output channel is still "
        "one head's column. A channel combines heads only when its column of W_O has non-zero entries in "
        "more than one head's block of rows, as d1 does in the lesson's mixing matrix; a learned W_O is "
        "dense, which is how the layers after it use all heads at once.",
        options=(
            "Yes, in both cases.",
            "Only with the swap.",
            "Only with the identity.",
            "No, in neither case: each output channel still copies one concat column.",
        ),
    ),
)
