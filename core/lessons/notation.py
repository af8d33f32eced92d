"""The notation card: every symbol the pages use, defined once.

Pages, captions and formulas use these names and no others; the sidebar shows the card.
"""
from __future__ import annotations

# (symbol in LaTeX, what it is)
SYMBOLS: tuple[tuple[str, str], ...] = (
    (r"T", "tokens in the sequence; positions are counted from 1 to T on every page"),
    (r"X", "the input to a layer, one row per token (T × d_model)"),
    (r"x_t^{(\ell)}", "token t's vector in the residual stream after layer ℓ (x_t^{(0)}: its embedding)"),
    (r"d_{\text{model}}", "the width of every token's vector between layers"),
    (r"H", "the number of heads in a layer; h = 1 … H indexes them"),
    (r"d_k,\ d_v", "the width of one head's queries and keys, and of its values (usually d_model / H)"),
    (r"W_Q^h,\ W_K^h,\ W_V^h", "head h's projections: Q_h = X W_Q^h, K_h = X W_K^h, V_h = X W_V^h"),
    (r"A_h", "head h's attention weights, softmax(Q_h K_hᵀ / √d_k + M): row t is where query t looks"),
    (r"o_h", "head h's output, A_h V_h (T × d_v)"),
    (r"M", "the mask added to the scores: 0 where a key may be read, −∞ where it may not"),
    (r"W_O,\ W_O^{(h)}", "the output projection, and its block of rows that reads head h"),
    (r"W_Q^h W_K^{h\top}", "head h's QK circuit: which tokens attend to which"),
    (r"W_V^h W_O^{(h)}", "head h's OV circuit: what a token read by head h writes into the output"),
    (r"z", "the logits: one score per vocabulary token before the final softmax"),
)

HEAD_NAMES = ("A head is named L3H2: layer 3, head 2, both counted from 1. Papers count from 0 and write "
              "the same head 2.1; the pages give that name in a tooltip.")
