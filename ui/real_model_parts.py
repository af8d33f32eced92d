"""The "A real model" page's parts: the shared model and forward-pass caches, and the sections only an
encoder (sentence similarity) or only a decoder (logit lens, next-token effects, generation) has.
Each section returns the functions that computed what it drew, for the page's source expander."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import streamlit as st

from core import pretrained
from core.lessons import real_model as rm
from core.model import layers as L
from core.model import generation
from core.model import transformer as tr
from ui import charts

SHIPPED = os.path.join(os.path.dirname(tr.__file__), "tiny_gpt")
MAX_SENTENCES = 8
show = lambda token: token.replace(" ", "·").replace("\n", "⏎")  # noqa: E731  (spaces and new lines, visible)


@st.cache_resource(show_spinner=False, max_entries=3)
def model_for(source: str, _progress=None) -> pretrained.Model:
    """One read-only copy per server process, shared by every session ("" is the shipped model)."""
    return pretrained.load(source or SHIPPED, np.float32, progress=_progress)


@st.cache_resource(show_spinner=False, max_entries=8)
def run(_m: pretrained.Model, source: str, ids: tuple):
    """The forward pass of one text, its cache (shared, read only), and the compiled loops or NumPy
    formulas that computed it (a freshly started server runs the NumPy ones while it compiles)."""
    with L.recording() as ran:
        out, cache = _m.forward(np.array(ids))
    for array in (out, *cache.values()):
        array.setflags(write=False)                     # shared by every session that asks for this text
    return out, cache, tuple(ran)


@st.cache_resource(show_spinner=False, max_entries=3)
def decoder_detector(_m: pretrained.Model, source: str):
    """Every head's scores on repeated random tokens, once per model."""
    return rm.detect_heads(_m.params, _m.config, n=min(20, _m.config.n_ctx // 2 - 1), first=_m.token_id("<|endoftext|>"))


@st.cache_resource(show_spinner=False, max_entries=16)
def similarity(_m: pretrained.Model, source: str, sentences: tuple, edit: tuple = ()):
    """Embeddings and cosine matrix of the sentences, with ``edit`` = ((layer, head, how),) applied."""
    ids, mask = rm.pad_batch([rm.fit_context(_m.encode(s), _m.config.n_ctx, keep_last=True)[0] for s in sentences],
                             _m.token_id("[PAD]") or 0)
    return rm.similarity(_m.params, _m.config, ids, mask, {(l, h): how for l, h, how in edit} or None)


def head_name(layer: int, head: int) -> str:
    """``L1H3 (0.2)``: the page's count from 1, and the layer.head from 0 that papers use."""
    return f"L{layer + 1}H{head + 1} ({layer}.{head})"


def named_heads_markdown(scores: dict) -> str:
    rows = rm.named_heads(scores)
    if not rows:
        return "No head reaches a threshold on this input."
    by_kind = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(f"{head_name(r['layer'], r['head'])} {r['score']:.2f}")
    return "\n".join(f"- **{kind}** (≥ {rm.THRESHOLDS[kind]}): " + ", ".join(heads) for kind, heads in by_kind.items())


def score_table(scores: dict, cfg) -> pd.DataFrame:
    names = [head_name(l, h) for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    return pd.DataFrame({"head": names} | {kind: s.ravel() for kind, s in scores.items()}).round(3)


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
    st.latex(r"e = \frac{\sum_t m_t\, h_t}{\sum_t m_t}, \qquad \cos(a, b) = \frac{e_a \cdot e_b}{\lVert e_a\rVert\, \lVert e_b\rVert}")
    _, S = similarity(m, source, tuple(sentences))
    labels = sentence_labels(sentences)
    st.vega_lite_chart(charts.heatmap(S, labels, labels, kind="signed", value_name="cosine", domain_values=[-1, 1],
                                      row_title="sentence", col_title="sentence", title="Cosine similarity",
                                      annotate=True, size=320))
    return S


def similarity_edit_section(m, source: str, sentences: list[str], before: np.ndarray, layer: int, head: int,
                            how: str) -> float:
    """The cosine matrix with one head removed, and what moved; returns the largest change."""
    _, after = similarity(m, source, tuple(sentences), ((layer, head, how),))
    change = after - before
    labels = sentence_labels(sentences)
    st.metric("largest change in a similarity", f"{np.abs(change).max():.4f}")
    c1, c2 = st.columns(2)
    c1.vega_lite_chart(charts.heatmap(after, labels, labels, kind="signed", value_name="cosine", domain_values=[-1, 1],
                                      row_title="sentence", col_title="sentence", annotate=True,
                                      title=f"Without {head_name(layer, head)}"))
    c2.vega_lite_chart(charts.heatmap(change, labels, labels, kind="signed", value_name="change", annotate=True,
                                      row_title="sentence", col_title="sentence", title="After − before"))
    return float(np.abs(change).max())


# ----------------------------------------------------------------------------------------------
# a decoder's sections
# ----------------------------------------------------------------------------------------------
def logit_lens_section(m, cache, labels) -> None:
    st.header("Logit lens")
    st.latex(r"\text{guess}_\ell(t) = \arg\max \operatorname{softmax}\big(\mathrm{LN}_f(h_\ell(t))\, W_E^\top\big)")
    cfg = m.config
    top, prob = rm.logit_lens(m.params, cfg, cache)
    lens = pd.DataFrame([[f"{show(m.decode([t]))} ({p:.0%})" for t, p in zip(top[r], prob[r])]
                         for r in range(cfg.n_layers + 1)],
                        columns=labels, index=["embeddings"] + [f"after block {l + 1}" for l in range(cfg.n_layers)])
    st.dataframe(lens.rename_axis("logit lens").reset_index(), hide_index=True)
    st.caption("Each row reads the residual stream after that block as if the rest of the model were skipped; "
               "the last row is the model's own next-token prediction at each position.")


def next_token_effect_section(m, ids, logits, edit: dict) -> None:
    rows = rm.edit_effect(m.params, m.config, ids, logits, edit)
    effect = pd.DataFrame([{"next token": show(m.decode([r["id"]])), "before": r["before"],
                            "after": r["after"], "change": r["change"]} for r in rows])
    st.metric("largest change in a next-token probability", f"{effect['change'].abs().max():.4f}")
    st.dataframe(effect.style.format({"before": "{:.4f}", "after": "{:.4f}", "change": "{:+.4f}"}), hide_index=True)


def generation_section(m, ids, key) -> None:
    st.header("Generation")
    g = st.columns(5)
    g[0].slider("temperature", 0.0, 2.0, key=key("temperature"), help="0 = greedy")
    g[1].number_input("top-k (0 = off)", 0, 1000, key=key("top_k"))
    g[2].slider("top-p", 0.05, 1.0, key=key("top_p"))
    g[3].number_input("new tokens", 1, 60, key=key("n_new"))
    g[4].number_input("seed", 0, 999, key=key("seed"))
    ss = st.session_state
    room = min(ss[key("n_new")], m.config.n_ctx - len(ids))          # new tokens, each with a position of its own
    if room < 1:
        st.markdown("The context is full: no room for new tokens.")
    else:
        gen = generation.generate(m.params, m.config, prompt=ids, max_new_tokens=room, temperature=ss[key("temperature")],
                                  top_k=ss[key("top_k")] or None, top_p=ss[key("top_p")], seed=ss[key("seed")])
        st.markdown(f"Continued: {m.decode(ids)}**{m.decode(gen.new_tokens)}**")
    st.caption("The prompt runs once and fills the KV cache; each new token then runs alone, its query attending "
               "over the cached keys and values.")
