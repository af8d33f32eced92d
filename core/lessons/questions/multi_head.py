"""The questions of the page "Multi-head, set by hand"."""
from core.lessons import heads
from core.lessons.predictions import Prediction

PAGE = "multi_head"

# The opening question reads head 2 (the lesson's previous-token head) at this query position.
PREVIOUS_HEAD = heads.LESSON_HEADS.index("previous_token") + 1
QUERY_T = 4

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.previous_token", PAGE,
        f"Head {PREVIOUS_HEAD} uses the previous-token recipe (gain {heads.DEFAULT_GAIN:g}, causal mask on). "
        f"At query position t = {QUERY_T}, which key position gets most of head {PREVIOUS_HEAD}'s weight?",
        0,
        f"Read the recipe under head {PREVIOUS_HEAD}'s box: where on the circle does query t point, and "
        "which key sits there?",
        "The recipe puts key i on a circle at angle 2πi/T and query t one step back, at angle 2π(t − 1)/T, "
        "so q_t·k_i = gain²·cos(2π(i − t + 1)/T) is largest at i = t − 1: row t puts most of its weight on "
        "the token just before (row 1, with no earlier token, can only read itself). The head finds t − 1 "
        "only because its recipe wrote each token's position into its query and key; attention itself does "
        "not know the order. Open the head and read its row.",
        options=(
            f"Position {QUERY_T - 1}, the token just before",
            f"Position {QUERY_T}, the query's own token",
            "Position 1, the first token",
            f"Positions 1 to {QUERY_T} equally",
        ),
    ),
    Prediction(
        f"{PAGE}.copied_heads", PAGE,
        "Set H = 8: heads 5 to 8 repeat heads 1 to 4 exactly (the same W_Q, W_K, W_V, so the same queries "
        "and keys). What do heads 5 to 8 output?",
        1,
        "Set H to 8 and compare the columns “head 1” and “head 5” of the selectivity table, and their maps "
        "in the grid at the top.",
        "A head's output is a fixed function of its weights and its input: the same W_Q, W_K, W_V on the "
        "same X give the same map A_h and the same output o_h, so exact copies add nothing. Trained, they "
        "would not stay copies: each head writes into the output through its own block of rows W_O^(h), so "
        "the gradient reaching head h's output is ∂L/∂o_h = (∂L/∂O)·W_O^(h)ᵀ. Where the blocks W_O^(1) and "
        "W_O^(5) differ (W_O starts random), heads 1 and 5 get different gradients, and their W_Q, W_K, W_V "
        "move apart. Copies whose blocks of W_O were equal too would get equal gradients and stay copies.",
        options=(
            "Something new, because they run in parallel.",
            "Exactly what heads 1 to 4 output: same weights, same input, same result.",
            "Zero, because the heads share one softmax.",
            "The average of heads 1 to 4.",
        ),
    ),
)
