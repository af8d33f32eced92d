"""The "A real model" page's parts: the shared model and forward-pass caches, and the sections only an
encoder (sentence similarity) or only a decoder (logit lens, next-token effects, generation) has.
A cached computation returns the record of what computed it, and a section replays it into the
page's recording: the page's source expander shows what computed every number."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import streamlit as st

from core import pretrained
from core.lessons import real_model as rm
from core.model import minilm_package
from core.model import generation
from core.model import names
from core.model import transformer as tr
from core.recording import recorded, recording, replay
from core.training import make_tiny_gpt
from ui import charts, state

SHIPPED = os.path.join(os.path.dirname(tr.__file__), "tiny_gpt")
MODELS = {"minilm": "all-MiniLM-L6-v2: a real encoder (BERT family)",
          "tiny_gpt": "The small GPT shipped with the dashboard (a decoder)",
          "other": "Another checkpoint: a folder or a Hub name"}
SOURCES = {"minilm": minilm_package.MINILM, "tiny_gpt": ""}   # what each choice loads ("": the shipped small GPT)
DEFAULT_MODEL = "minilm"                                # the page opens on this one
DESCRIBED = {"minilm": f"{minilm_package.MINILM.rsplit('/', 1)[-1]}, a pretrained sentence encoder of the BERT family",
             "tiny_gpt": "the small GPT shipped with the dashboard, a decoder trained here"}
MAX_SENTENCES = 8
show = lambda token: token.replace(" ", "·").replace("\n", "⏎")  # noqa: E731  (spaces and new lines, visible)


def visible_ends(text: str) -> str:
    """``text`` with the spaces at its two ends shown as ·, so that a continuation that starts a new
    word shows it (inside, spaces stay spaces)."""
    core = text.strip(" ")
    if not core:
        return show(text)
    start = len(text) - len(text.lstrip(" "))
    end = len(text) - len(text.rstrip(" "))
    return "·" * start + core + "·" * end


def code_span(text: str) -> str:
    """``text`` as a markdown code span, shown as typed: fenced by more backticks than it holds in a row,
    and padded with a space where it starts or ends with one (CommonMark's rule)."""
    longest, current = 0, 0
    for c in text:
        current = current + 1 if c == "`" else 0
        longest = max(longest, current)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def clip_long_text(key: str, what_has: str) -> None:
    """Call before the text box ``key`` is drawn. A text longer than a link can carry (``state.MAX_TEXT``
    characters) is cut at a word to fit, and while the box holds that cut text the page says so."""
    ss = st.session_state
    note = f"{key}.__clipped"
    text = ss.get(key, "")
    if len(text) > state.MAX_TEXT:
        kept = rm.clip_text(text, state.MAX_TEXT)
        ss[key], ss[note] = kept, (kept, len(text), len(text.split()))
    if ss.get(note) and ss[note][0] == ss.get(key):
        kept, n_chars, n_words = ss[note]
        st.warning(f"{what_has} {n_chars:,} characters ({n_words:,} words); this page takes at most "
                   f"{state.MAX_TEXT} characters, so that a link can carry it. It keeps the first "
                   f"{len(kept.split()):,} words ({len(kept)} characters) and runs the model on those.")


@st.cache_resource(show_spinner=False, max_entries=3)
def model_for(source: str, _progress=None) -> pretrained.Model:
    """One read-only copy per server process, shared by every session ("" is the shipped model)."""
    return pretrained.load(source or SHIPPED, np.float32, progress=_progress)


@st.cache_resource(show_spinner=False, max_entries=8)
def run(_m: pretrained.Model, source: str, ids: tuple):
    """The forward pass of one text, its cache (shared, read only), and the record of what computed
    them: the one transformer's functions, and the compiled loops or their NumPy formulas (a freshly
    started server runs the NumPy ones while it compiles)."""
    with recording() as ran:
        out, cache = recorded(_m.forward)(np.array(ids))
    for array in (out, *cache.values()):
        array.setflags(write=False)                     # shared by every session that asks for this text
    return out, cache, ran


@st.cache_resource(show_spinner=False, max_entries=3)
def decoder_detector(_m: pretrained.Model, source: str):
    """Every head's scores on repeated random tokens, once per model, and the record of what computed them."""
    with recording() as ran:
        scores = rm.detect_heads(_m.params, _m.config, n=min(20, _m.config.n_ctx // 2 - 1),
                                 first=_m.token_id("<|endoftext|>"))
    return scores, ran


@st.cache_resource(show_spinner=False, max_entries=16)
def similarity(_m: pretrained.Model, source: str, sentences: tuple, edit: tuple = ()):
    """Embeddings and cosine matrix of the sentences, with ``edit`` = ((layer, head, how),) applied, and
    the record of what computed them."""
    with recording() as ran:
        ids, mask = rm.pad_batch([rm.fit_context(_m.encode(s), _m.config.n_ctx, keep_last=True)[0]
                                  for s in sentences], _m.token_id("[PAD]") or 0)
        result = rm.similarity(_m.params, _m.config, ids, mask, {(l, h): how for l, h, how in edit} or None)
    return result, ran


def papers_names(rows) -> str:
    """A tooltip: the heads of ``rows`` (``layer``, ``head`` from 0) under the page's name and as papers
    write them, counted from 0."""
    pairs = dict.fromkeys(f"{names.head(r['layer'], r['head'])} = {names.paper_head(r['layer'], r['head'])}"
                          for r in rows)
    return "As papers write them (layer.head, both counted from 0): " + ", ".join(pairs) + "."


def named_heads_markdown(scores: dict) -> tuple[str, str | None]:
    """The named heads as a markdown list, each with its score, and a tooltip with their papers' names."""
    rows = rm.named_heads(scores)
    if not rows:
        return "No head reaches a threshold on this input.", None
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(f"{names.head(r['layer'], r['head'])} {r['score']:.2f}")
    text = "\n".join(f"- **{kind}** (≥ {rm.THRESHOLDS[kind]}): " + ", ".join(heads)
                     for kind, heads in by_kind.items())
    return text, papers_names(rows)


def score_table(scores: dict, cfg) -> pd.DataFrame:
    heads = [names.head(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return pd.DataFrame({"head": heads} | {kind: s.ravel() for kind, s in scores.items()}).round(3)


def published_heads_caption(scores: dict) -> tuple[str, str]:
    """What Wang et al. (2022) name in GPT-2 small, each head with the score this page measures for it,
    and a tooltip with the paper's own names for them."""
    rows = rm.published_heads(scores)
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(f"{names.head(r['layer'], r['head'])} ({r['score']:.2f} here)")
    named = " and ".join(f"{kind} heads {' and '.join(heads)}" for kind, heads in by_kind.items())
    return ("In GPT-2 small, Wang et al. (2022), who traced how it completes \"When Mary and John went to the "
            f"store, John gave a drink to\" with \"Mary\", name {named}; the score after each head is its "
            "score as that kind on this page's repeated random tokens."), papers_names(rows)


# ----------------------------------------------------------------------------------------------
# an encoder's sections
# ----------------------------------------------------------------------------------------------
def sentence_labels(sentences) -> list[str]:
    return [f"{i + 1} {s if len(s) <= 28 else s[:27] + '…'}" for i, s in enumerate(sentences)]


def read_sentences(text: str) -> list[str]:
    """The non-empty lines of ``text``: 2 to ``MAX_SENTENCES`` sentences, or a ValueError that says why."""
    sentences = [line.strip() for line in text.splitlines() if line.strip()]
    if not 2 <= len(sentences) <= MAX_SENTENCES:
        raise ValueError(f"Give 2 to {MAX_SENTENCES} sentences, one per line (got {len(sentences)}).")
    return sentences


def similarity_section(m, source: str, sentences: list[str]) -> np.ndarray:
    """Mean pooling on the real encoder: the cosine matrix of the sentences; returns it."""
    st.latex(r"e = \frac{\sum_t m_t\, x_t^{(L)}}{\sum_t m_t}, \qquad \cos(a, b) = \frac{e_a \cdot e_b}{\lVert e_a\rVert\, \lVert e_b\rVert}")
    (_, S), computed = similarity(m, source, tuple(sentences))
    replay(computed)
    labels = sentence_labels(sentences)
    st.vega_lite_chart(charts.heatmap(S, labels, labels, kind="signed", value_name="cosine", domain_values=[-1, 1],
                                      row_title="sentence", col_title="sentence", title="Cosine similarity",
                                      annotate=True, size=320))
    return S


def similarity_edit_section(m, source: str, sentences: list[str], before: np.ndarray, layer: int, head: int,
                            how: str) -> float:
    """The cosine matrix with one head removed, and what moved; returns the largest change."""
    (_, after), computed = similarity(m, source, tuple(sentences), ((layer, head, how),))
    replay(computed)
    change = after - before
    labels = sentence_labels(sentences)
    st.metric("largest change in a similarity", f"{np.abs(change).max():.4f}")
    c1, c2 = st.columns(2)
    c1.vega_lite_chart(charts.heatmap(after, labels, labels, kind="signed", value_name="cosine", domain_values=[-1, 1],
                                      row_title="sentence", col_title="sentence", annotate=True,
                                      title=f"Without {names.head(layer, head)}"))
    c2.vega_lite_chart(charts.heatmap(change, labels, labels, kind="signed", value_name="change", annotate=True,
                                      row_title="sentence", col_title="sentence", title="After − before"))
    return float(np.abs(change).max())


# ----------------------------------------------------------------------------------------------
# a decoder's sections
# ----------------------------------------------------------------------------------------------
def logit_lens_section(m, cache, labels) -> None:
    st.header("Logit lens")
    st.latex(r"\text{guess}_\ell(t) = \arg\max \operatorname{softmax}\big(\mathrm{LN}_f(x_t^{(\ell)})\, W_E^\top\big)")
    cfg = m.config
    top, prob = rm.logit_lens(m.params, cfg, cache)
    lens = pd.DataFrame([[f"{show(text)} ({p:.0%})" for text, p in zip(rm.token_texts(m, top[r]), prob[r])]
                         for r in range(cfg.n_layers + 1)],
                        columns=labels, index=["embeddings"] + [f"after block {l + 1}" for l in range(cfg.n_layers)])
    st.dataframe(lens.rename_axis("logit lens").reset_index(), hide_index=True)
    st.caption("Each row reads the residual stream after that block as if the rest of the model were skipped; "
               "the last row is the model's own next-token prediction at each position.")


def next_token_effect_section(m, ids, logits, edit: dict) -> None:
    rows = rm.edit_effect(m.params, m.config, ids, logits, edit)
    texts = rm.token_texts(m, [r["id"] for r in rows])
    effect = pd.DataFrame([{"next token": show(text), "before": r["before"], "after": r["after"],
                            "change": r["change"]} for text, r in zip(texts, rows)])
    st.metric("largest change in a next-token probability", f"{effect['change'].abs().max():.4f}")
    st.dataframe(effect.style.format({"before": "{:.4f}", "after": "{:.4f}", "change": "{:+.4f}"}), hide_index=True)


def heads_found(scores: dict) -> str:
    """What the head detector's scores show a decoder's heads doing, as a sentence: the previous-token
    and induction heads it names, or that it names none."""
    rows = rm.named_heads({kind: scores[kind] for kind in ("previous-token", "induction")})
    found = {kind: [names.head(r["layer"], r["head"]) for r in rows if r["kind"] == kind]
             for kind in ("previous-token", "induction")}
    said = {"previous-token": "a head on the previous token", "induction": "a head on the token that followed the "
            "current one last time (induction)"}
    clauses = [f"{said[kind]} ({', '.join(heads)})" for kind, heads in found.items() if heads]
    if not clauses:
        return ("Yet the head detector above names neither a previous-token head nor an induction head in it, on "
                "repeated random tokens.")
    return "On repeated random tokens, the head detector above finds " + " and ".join(clauses) + " in it."


def shipped_model_note(m, scores: dict) -> str:
    """What the small GPT shipped with the dashboard is, why its text repeats itself, and what its heads
    do according to the head detector's ``scores``."""
    kilobytes = os.path.getsize(make_tiny_gpt.CORPUS) / 1000
    return (f"This is the small GPT shipped with the dashboard: {rm.parameter_count(m.params):,} parameters, trained "
            f"here in a few minutes on {kilobytes:.1f} kB of text (core/training/corpus.txt, short sentences about "
            "attention). That is far too little to learn a language: it repeats itself (\"sat sat satat sat\") and "
            f"breaks words. It is here to be taken apart. {heads_found(scores)} A real language model needs far "
            "more data and parameters: GPT-2 small, the smallest GPT-2, has about 124 million parameters and read "
            "about 40 GB of web text.")


def generation_section(m, ids, key, note: str | None = None) -> None:
    """Sampling controls and the model's continuation of the prompt; ``note`` (the shipped model's) above."""
    st.header("Generation")
    if note:
        st.info(note)
    g = st.columns(5)
    g[0].slider("temperature", 0.0, 2.0, key=key("temperature"), help="0 = greedy")
    state.whole_number_input(g[1], "top-k (0 = off)", 0, 1000, key=key("top_k"))
    g[2].slider("top-p", 0.05, 1.0, key=key("top_p"))
    state.whole_number_input(g[3], "new tokens", 1, 60, key=key("n_new"))
    state.whole_number_input(g[4], "seed", 0, 999, key=key("seed"))
    ss = st.session_state
    room = min(ss[key("n_new")], m.config.n_ctx - len(ids))          # new tokens, each with a position of its own
    if room < 1:
        st.markdown("The context is full: no room for new tokens.")
    else:
        gen = generation.generate(m.params, m.config, prompt=ids, max_new_tokens=room, temperature=ss[key("temperature")],
                                  top_k=ss[key("top_k")] or None, top_p=ss[key("top_p")], seed=ss[key("seed")])
        # shown as plain text: the model's output may hold spaces at its ends and *, _, `, # or $, which
        # markdown would read as markup
        st.markdown("**Your prompt**, as the model read it:")
        st.code(rm.text_of(m, ids), language=None, wrap_lines=True)
        st.markdown(f"**Continued** by the model ({len(gen.new_tokens)} new tokens, · a space at either end):")
        continued = rm.text_of(m, gen.new_tokens)
        st.code(visible_ends(continued), language=None, wrap_lines=True)
        if "<0x" in continued:
            st.caption("`<0xD9>` and the like: bytes that make no whole character (see the tokens above).")
    st.caption("The prompt runs once and fills the KV cache; each new token then runs alone, its query attending "
               "over the cached keys and values.")
