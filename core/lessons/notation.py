"""The notation card: every symbol the pages use, defined once.

Pages, captions and formulas use these names and no others; the sidebar shows the card. Meanings
are Markdown with inline LaTeX between dollar signs.
"""
from __future__ import annotations

# (symbol in LaTeX, what it is)
SYMBOLS: tuple[tuple[str, str], ...] = (
    (r"T", "tokens in the sequence; positions are counted from 1 to $T$ (only the sinusoidal code's formula "
           "writes $pos = 0, \\dots, T - 1$, as the original paper does, and its page says so)"),
    (r"X", r"the input to a layer, one row per token ($T \times d_{\text{model}}$)"),
    (r"x_t^{(\ell)}", r"token $t$'s vector in the residual stream after layer $\ell$ ($x_t^{(0)}$: its embedding)"),
    (r"d_{\text{model}}", "the width of every token's vector between layers"),
    (r"H", "the number of heads in a layer; $h = 1, \\dots, H$ indexes them"),
    (r"d_k,\ d_v", r"the width of one head's queries and keys, and of its values (usually $d_{\text{model}} / H$)"),
    (r"W_Q^h,\ W_K^h,\ W_V^h", r"head $h$'s projections: $Q_h = X W_Q^h$, $K_h = X W_K^h$, $V_h = X W_V^h$"),
    (r"A_h", r"head $h$'s attention weights, $\mathrm{softmax}(Q_h K_h^\top / \sqrt{d_k} + M)$: row $t$ is where "
             r"query $t$ looks"),
    (r"o_h", r"head $h$'s output, $A_h V_h$ ($T \times d_v$)"),
    (r"M", r"the mask added to the scores: $0$ where a key may be read, $-\infty$ where it may not"),
    (r"W_O,\ W_O^{(h)}", r"the output projection, and its block of $d_v$ rows that reads head $h$"),
    (r"W_Q^h W_K^{h\top}", "head $h$'s **QK circuit**: which tokens attend to which"),
    (r"W_V^h W_O^{(h)}", "head $h$'s **OV circuit**: what a token read by head $h$ writes into the output"),
    (r"z", "the logits: one score per vocabulary token, before the final softmax"),
)

HEAD_NAMES = ("A head is named L3H2: layer 3, head 2, both counted from 1. Papers count from 0 and write "
              "the same head 2.1; the pages give that name in a tooltip.")
