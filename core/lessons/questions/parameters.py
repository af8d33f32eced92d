"""The questions of the page "Parameters and cost".

Every count is weights only (no biases), as each prompt says: the page's Biases box starts off.
"""
from core.lessons.param_counts import mha_param_count, mha_param_count_of_width
from core.lessons.predictions import Prediction
from core.validate import check_heads

PAGE = "parameters"

# The opening question: the page's starting width, split into twice its starting number of heads.
START_D_MODEL, START_HEADS, MORE_HEADS = 64, 8, 16
# Exercise 2 of the lesson: d_model = 384 and the head counts it lists.
EX2_D_MODEL, EX2_HEADS = 384, (1, 2, 4, 6, 8, 12)
# Exercise 5: d_model = 512, H = 8, d_k = 64; keep d_k = 64 and grow H to 16.
EX5_D_MODEL, EX5_HEADS, EX5_MORE_HEADS, EX5_D_K = 512, 8, 16, 64

_start = mha_param_count(START_D_MODEL, START_HEADS)
_more = mha_param_count(START_D_MODEL, MORE_HEADS)
_ex2 = mha_param_count(EX2_D_MODEL, 6)
_ex5_before = mha_param_count(EX5_D_MODEL, EX5_HEADS)
_ex5_grown = mha_param_count(EX5_MORE_HEADS * EX5_D_K, EX5_MORE_HEADS)                 # d_model = H·d_k
_ex5_kept = mha_param_count_of_width(EX5_D_MODEL, EX5_MORE_HEADS, EX5_D_K)              # d_model stays

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.more_heads_same_width", PAGE,
        f"This page starts at d_model = {START_D_MODEL} with H = {START_HEADS} heads. Keep d_model = "
        f"{START_D_MODEL} and split it into H = {MORE_HEADS} heads instead. Counting weights only (no "
        "biases), how many numbers do W_Q, W_K, W_V and W_O hold together?",
        _more,
        "Pack every head's W_Q^h side by side: W_Q is d_model × (H·d_k). What is H·d_k when the heads "
        "split d_model?",
        f"The {MORE_HEADS} heads are {check_heads(START_D_MODEL, MORE_HEADS)} wide (d_k = d_model / H), so "
        f"W_Q, W_K, W_V and W_O are still {START_D_MODEL} × {START_D_MODEL}: 4·{START_D_MODEL}² = {_more:,}, "
        f"the same as the {_start:,} at H = {START_HEADS}. At a fixed d_model more heads are narrower "
        "heads, not more weights. Now change H above and watch the count.",
    ),
    Prediction(
        f"{PAGE}.head_width", PAGE,
        "A model has d_model = 256 and splits it into H = 8 heads in the usual way. How wide is each "
        "head's query and key (d_k)?",
        check_heads(256, 8),
        "The heads share out the model's width equally.",
        f"d_k = d_model / H = 256 / 8 = {check_heads(256, 8)}. Each head reads the whole input but "
        f"projects it down to {check_heads(256, 8)} numbers per position: the d_k column of the table "
        "shows it at d_model = 256.",
    ),
    Prediction(
        f"{PAGE}.params_384", PAGE,
        f"The lesson's exercise 2: d_model = {EX2_D_MODEL} with H = 6 heads, weights only (no biases). "
        "How many parameters does one multi-head attention block have?",
        _ex2,
        "Each of W_Q, W_K, W_V and W_O is d_model × d_model when d_k = d_model / H.",
        f"4·{EX2_D_MODEL}² = {_ex2:,}, and the same for every H the exercise lists "
        f"({', '.join(map(str, EX2_HEADS))}): only d_k = {EX2_D_MODEL} / H changes "
        f"({', '.join(str(check_heads(EX2_D_MODEL, h)) for h in EX2_HEADS)}).",
    ),
    Prediction(
        f"{PAGE}.more_heads", PAGE,
        "A colleague says: adding attention heads always makes a model better. Which is a sound reason "
        "to doubt it?",
        1,
        "Compare the attention count and the score FLOPs on this page at H = 1 and at H = 16, "
        "d_model unchanged.",
        "At a fixed d_model the count is 4·d_model² whatever H, and H heads of width d_model / H cost "
        "the same score FLOPs as one head of width d_model, so the first and third reasons are false. "
        "What H trades is the number of patterns against how rich each one can be (rank at most "
        "d_k), and trained models often carry heads that can be removed with little loss.",
        options=(
            "Every extra head adds 4·d_model² parameters, so the model overfits.",
            "At a fixed d_model each extra head is narrower (d_k = d_model / H), so each head's score "
            "matrix has rank at most d_k; and trained models often carry heads that can be pruned with "
            "little loss.",
            "Extra heads multiply the score FLOPs by H.",
            "All heads share one softmax, so more heads blur each other.",
        ),
    ),
    Prediction(
        f"{PAGE}.grow_d_model", PAGE,
        f"Exercise 5, read with d_model growing: start from d_model = {EX5_D_MODEL}, H = {EX5_HEADS}, "
        f"d_k = {EX5_D_K}. Keep d_k = {EX5_D_K}, grow H to {EX5_MORE_HEADS}, and let d_model = H·d_k "
        "grow with it. By what factor does the attention block's weight count (no biases) grow?",
        _ex5_grown / _ex5_before,
        "Every weight matrix is d_model × d_model, and d_model doubles.",
        f"d_model becomes {EX5_MORE_HEADS}·{EX5_D_K} = {EX5_MORE_HEADS * EX5_D_K}, and 4·d_model² goes "
        f"from {_ex5_before:,} to {_ex5_grown:,}: ×{_ex5_grown / _ex5_before:g}, the square of the "
        "heads' ratio.",
    ),
    Prediction(
        f"{PAGE}.fixed_head_width", PAGE,
        f"Exercise 5, read with d_model kept: d_model stays {EX5_D_MODEL}, every head stays {EX5_D_K} wide, "
        f"and there are now H = {EX5_MORE_HEADS} heads, so their concatenation (H·d_k) is wider than "
        "d_model. Weights only (no biases): how many weights does the attention block have?",
        _ex5_kept,
        "W_Q maps d_model to every head's columns at once: d_model × (H·d_k). W_O maps the "
        "concatenation back: (H·d_k) × d_model.",
        f"W_Q, W_K and W_V are {EX5_D_MODEL} × {EX5_MORE_HEADS * EX5_D_K} and W_O {EX5_MORE_HEADS * EX5_D_K} × "
        f"{EX5_D_MODEL}: 4·{EX5_D_MODEL}·{EX5_MORE_HEADS * EX5_D_K} = {_ex5_kept:,}, "
        f"×{_ex5_kept / _ex5_before:g} the {_ex5_before:,} of {EX5_HEADS} heads. Read with d_model = "
        f"H·d_k growing instead, the count is {_ex5_grown:,} (×{_ex5_grown / _ex5_before:g}).",
    ),
)
