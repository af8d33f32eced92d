"""The path through the lessons: which page teaches which section, what it needs, what it proves.

The dashboard teaches three lesson texts. Each lesson page names the section it teaches, the pages
a student should have seen first, and the one claim the student verifies on it. The order of
:data:`STEPS` is the order of the path (and of the sidebar): a page's prerequisites come before it.

    step("masks").needs           -> ("one_head",)
    step("masks").lesson          -> "The transformer"
"""
from __future__ import annotations

from dataclasses import dataclass

# The three lesson texts, by the short names the pages use.
TRANSFORMER = "The transformer"                      # the module: heads, positions, masks, the block
MULTI_HEAD = "Multi-head attention"                  # the dimension split and the parameter count
LESSON_09 = "Lesson 09: multi-head attention"        # the filter bank, hand-set heads, the exercises


@dataclass(frozen=True)
class Step:
    """One page on the path. ``page`` is its address (``/one_head``); ``needs`` the pages to see first."""

    page: str
    title: str
    lesson: str
    section: str
    needs: tuple[str, ...]
    claim: str


STEPS: tuple[Step, ...] = (
    Step("one_head", "One head", TRANSFORMER, "One head, one relational pattern", (),
         "One softmax row is one convex blend of the values: ask one head for two positions and they split "
         "one row of weights."),
    Step("positional", "Positional encoding", TRANSFORMER, "Sinusoidal positional encoding", ("one_head",),
         "In the sinusoidal code PE_p · PE_(p+k) takes one value for every p: the offset k is in the code."),
    Step("multi_head", "Multi-head, set by hand", LESSON_09, "Four heads, four patterns",
         ("one_head", "positional"),
         "Several heads attend to several places at once, where one head can only blend them."),
    Step("filter_bank", "Concat, W_O and the filter bank", LESSON_09, "Concatenation and output projection",
         ("multi_head",),
         "Each head's term is its map A_h followed by its OV circuit W_V^h W_O^(h); W_O decides which "
         "output channels mix heads."),
    Step("parameters", "Parameters and cost", MULTI_HEAD, "Parameter count", ("multi_head",),
         "Attention holds 4·d_model·H·d_k weights, read off its shapes: 4·d_model² when the heads split d_model."),
    Step("masks", "Masks and cross-attention", TRANSFORMER, "Why mask the decoder self-attention?",
         ("one_head",),
         "Under the causal mask query t reads keys 1 … t only; a padded key gets a weight of exactly 0."),
    Step("training", "Train an encoder", TRANSFORMER, "Worked examples: a small transformer encoder",
         ("multi_head", "positional", "parameters"),
         "Without positions the encoder cannot tell a sequence from its reordering: on 'increasing' it guesses."),
    Step("inside_model", "Inside a trained model", TRANSFORMER, "Interpretability caution", ("training",),
         "An attention map is a diagnostic, not an explanation: the most focused head need not be the one needed most."),
    Step("decoder", "Decoder and generation", TRANSFORMER, "Why mask the decoder self-attention?",
         ("masks", "training"),
         "Generation reads a cache of keys and values: count what it saves against recomputing every position."),
    Step("induction", "Induction heads", TRANSFORMER, "Interpretability caution", ("decoder",),
         "A layer-2 head copies what followed a token's earlier copy; remove layer 1's previous-token head and it stops."),
    Step("real_model", "A real model", TRANSFORMER, "Ablations: encoder-only and decoder-only",
         ("inside_model", "induction"),
         "A pretrained model's heads have measurable jobs, and removing one head moves its output."),
)

BY_PAGE = {s.page: s for s in STEPS}


def step(page: str) -> Step:
    """The step of ``page`` (its address without the slash)."""
    if page not in BY_PAGE:
        raise ValueError(f"No lesson page {page!r}; the path has {', '.join(BY_PAGE)}.")
    return BY_PAGE[page]


def implied(page: str, need: str) -> bool:
    """Whether ``need`` is already a prerequisite of another of ``page``'s prerequisites."""
    def before(p: str) -> set[str]:
        return {n for m in step(p).needs for n in (m, *before(m))}
    return any(need in before(other) for other in step(page).needs if other != need)


def dot() -> str:
    """The path as a Graphviz graph: one node per page, numbered in order, an arrow from each
    prerequisite to the page that needs it (none where another prerequisite already leads there)."""
    nodes = [f'  "{s.page}" [label="{i}. {s.title}"];' for i, s in enumerate(STEPS, start=1)]
    edges = [f'  "{need}" -> "{s.page}";' for s in STEPS for need in s.needs if not implied(s.page, need)]
    # a transparent ground, light boxes with dark text and grey arrows: it reads on a light and a dark theme
    return "\n".join(["digraph path {", '  rankdir=TB; ranksep=0.2; nodesep=0.25; bgcolor="transparent";',
                      '  node [shape=box, style="rounded,filled", fillcolor="#e8eef7", color="#7f8ea3", '
                      'fontcolor="#1f2430", fontname="sans-serif", fontsize=13];',
                      '  edge [color="#8a94a6"];', *nodes, *edges, "}"])
