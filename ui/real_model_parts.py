"""The "A real model" page's parts: the models it offers, the shared model and computation caches, the
architecture's formulas read off the config, and the sections only an encoder (sentence similarity)
or only a decoder (logit lens, next-token effects, generation) or only grouped-query attention has.
A cached computation returns the record of what computed it, and a section replays it into the
page's recording: the page's source expander shows what computed every number."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import streamlit as st

from core import pretrained
from core.lessons import real_model as rm
from core.model import checkpoint_policy
from core.model import minilm_package, smollm2_package
from core.model import generation
from core.model import names
from core.model.packaged import installed_path
from core.recording import recorded, recording, replay
from core.training import make_tiny_gpt
from ui import charts, state

SHIPPED = pretrained.SHIPPED
SMOLLM2_NAME = smollm2_package.SMOLLM2.rsplit("/", 1)[-1]
MODELS = {"minilm": "all-MiniLM-L6-v2: a real encoder (BERT family)",
          "smollm2": f"{SMOLLM2_NAME}: a real language model (Llama family)",
          "tiny_gpt": "The small GPT trained here: 137K parameters on a few kilobytes of text (it repeats itself)",
          "other": "Another checkpoint: a folder or a Hub name"}
# what each choice loads ("": the shipped small GPT)
SOURCES = {"minilm": minilm_package.MINILM, "smollm2": smollm2_package.SMOLLM2, "tiny_gpt": ""}
DEFAULT_MODEL = "minilm"                                # the page opens on this one
DESCRIBED = {"minilm": f"{minilm_package.MINILM.rsplit('/', 1)[-1]}, a pretrained sentence encoder of the BERT family",
             "smollm2": f"{SMOLLM2_NAME}, a pretrained language model of the Llama family, 135 million parameters",
             "tiny_gpt": "the small GPT shipped with the dashboard, a decoder trained here"}
NAMED_MOST = 12                # heads named per kind, the highest scores first; the score table has the rest
GRID_MAPS = 96                 # at most this many maps in one grid: a larger model's grid shows one layer
EVERY_LAYER = 0                # the grid's layer choice that shows every layer
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


def offered(environ=os.environ) -> dict:
    """The page's model choices: :data:`MODELS`, without "Another checkpoint" where the instructor's
    setting takes none (``ATTENTION_CHECKPOINTS=off``). A setting that is not one keeps the choice:
    the loader then names the variable and what to write."""
    try:
        rules = checkpoint_policy.policy(environ)
    except ValueError:
        return dict(MODELS)
    takes_none = rules.names == frozenset() and not rules.folders
    return {choice: label for choice, label in MODELS.items() if not (takes_none and choice == "other")}


def credit(source: str) -> str:
    """Who made the model the page runs, its licence and where its file came from."""
    if source == minilm_package.MINILM:
        return (f"all-MiniLM-L6-v2 (sentence-transformers, {minilm_package.LICENSE}), from the installed package "
                f"{minilm_package.DISTRIBUTION}, its weights checked against their published sha256")
    if source == smollm2_package.SMOLLM2:
        where = (f"from the installed package {smollm2_package.DISTRIBUTION}"
                 if installed_path(smollm2_package.DISTRIBUTION, smollm2_package.PATH_IN_PACKAGE)
                 else f"downloaded from {smollm2_package.GGUF_REPO} at a pinned commit")
        return (f"{SMOLLM2_NAME} by HuggingFaceTB ({smollm2_package.LICENSE}), quantised to Q4_1 by QuantFactory "
                f"({smollm2_package.FILENAME}), {where}, its sha256 checked against the published one")
    if source == "":
        return "the small GPT shipped with the dashboard (re-create it: python -m core.training.make_tiny_gpt)"
    return source


def loading_message(source: str) -> str:
    """What the spinner says while ``source`` loads."""
    if source == smollm2_package.SMOLLM2:
        return (f"Reading {SMOLLM2_NAME} ({smollm2_package.SIZE / 1e6:.0f} MB; checking its sha256 takes a few "
                "seconds the first time)…")
    return f"Loading {source or 'the small GPT'}…"


@st.cache_resource(show_spinner=False, max_entries=3)
def model_for(source: str, _progress=None) -> pretrained.Model:
    """One read-only copy per server process, shared by every session ("" is the shipped model)."""
    return pretrained.load(source or SHIPPED, np.float32, progress=_progress)


# the forward cache's entries per block that the page reads (maps, lens, edits, patches); the rest
# (SmolLM2's feed-forward layers above all) is not kept, in the pass or after it
KEPT = ("resid_pre", "resid_post", "attn.weights", "attn.head_outputs")


@st.cache_resource(show_spinner=False, max_entries=8)
def run(_m: pretrained.Model, source: str, ids: tuple):
    """The forward pass of one text, its cache (shared, read only), and the record of what computed
    them: the one transformer's functions, and the compiled loops or their NumPy formulas (a freshly
    started server runs the NumPy ones while it compiles)."""
    with recording() as ran:
        out, cache = recorded(_m.forward)(np.array(ids), keep=KEPT)   # what the page reads: a tenth of SmolLM2's cache
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


@st.cache_resource(show_spinner=False, max_entries=8)
def lens(_m: pretrained.Model, source: str, ids: tuple):
    """The logit lens of one text (its forward pass from :func:`run`), and the record of what computed it."""
    _, cache, _ = run(_m, source, ids)
    with recording() as ran:
        top, prob = rm.logit_lens(_m.params, _m.config, cache)
    return top, prob, ran


@st.cache_resource(show_spinner=False, max_entries=32)
def edited(_m: pretrained.Model, source: str, ids: tuple, layer: int, head: int, how: str, other: tuple = ()):
    """The next-token probabilities before and after one head's output is zeroed, averaged or patched
    from the second prompt ``other``, and the record of what computed them."""
    logits, cache, _ = run(_m, source, ids)
    other_cache = run(_m, source, other)[1] if how == "patch" else None
    with recording() as ran:
        rows = rm.edit_effect(_m.params, _m.config, np.array(ids), logits,
                              rm.head_edit(cache, layer, head, how, other_cache), cache=cache)
    return rows, ran


@st.cache_resource(show_spinner=False, max_entries=32)
def generated(_m: pretrained.Model, source: str, ids: tuple, temperature: float, top_k: int, top_p: float,
              n_new: int, seed: int):
    """The model's continuation of ``ids`` through the KV cache (the new ids), and the record of what
    computed it: a real model writes a token in about a second, so one set of choices runs once."""
    with recording() as ran:
        gen = generation.generate(_m.params, _m.config, prompt=np.array(ids), max_new_tokens=n_new,
                                  temperature=temperature, top_k=top_k or None, top_p=top_p, seed=seed)
    return np.asarray(gen.new_tokens), ran


# ----------------------------------------------------------------------------------------------
# the architecture, read off the config
# ----------------------------------------------------------------------------------------------
NORM_SYMBOLS = {"layernorm": r"\mathrm{LN}", "rmsnorm": r"\mathrm{RMSNorm}"}
ACTIVATION_SYMBOLS = {"relu": r"\mathrm{ReLU}", "gelu_tanh": r"\mathrm{GELU}", "gelu_erf": r"\mathrm{GELU}",
                      "silu": r"\mathrm{silu}"}


def norm_symbol(cfg, which: str) -> str:
    """The model's norm (``cfg.norm``) as LaTeX, subscripted ``which`` (``1``, ``2``, ``f``)."""
    symbol = NORM_SYMBOLS.get(cfg.norm, r"\mathrm{Norm}")
    return rf"{symbol}_{which}"


def unembedding_symbol(cfg) -> str:
    return r"W_E^\top" if cfg.tied_unembed else "W_U"


def architecture_latex(cfg) -> list[str]:
    """The model's block, feed-forward network and (for a Llama-like model) norm and attention scores
    as LaTeX lines, each piece read off the config: where the norm sits and which norm, the activation
    and whether it is gated, biases, rotary positions, shared key/value heads, tied unembedding."""
    n1, n2 = norm_symbol(cfg, "1"), norm_symbol(cfg, "2")
    if cfg.norm_placement == "post":
        block = rf"x \leftarrow {n1}(x + \mathrm{{MHA}}(x)), \qquad x \leftarrow {n2}(x + \mathrm{{FFN}}(x))"
    else:
        block = rf"x \leftarrow x + \mathrm{{MHA}}({n1}(x)), \qquad x \leftarrow x + \mathrm{{FFN}}({n2}(x))"
    if cfg.head == "lm":
        block += (rf", \qquad z = {norm_symbol(cfg, 'f')}(x)\, " if cfg.final_ln else r", \qquad z = x\, ") \
            + unembedding_symbol(cfg)
    act = ACTIVATION_SYMBOLS.get(cfg.activation, r"\mathrm{act}")
    if cfg.gated_ffn:
        gate_bias, up_bias = (r" + b_{\text{gate}}", " + b_1") if cfg.bias else ("", "")
        ffn = (rf"\mathrm{{FFN}}(x) = \big({act}(x W_{{\text{{gate}}}}{gate_bias}) \odot (x W_1{up_bias})\big)\, W_2"
               + (" + b_2" if cfg.bias else ""))
    else:
        ffn = rf"\mathrm{{FFN}}(x) = {act}(x W_1{' + b_1' if cfg.bias else ''})\, W_2{' + b_2' if cfg.bias else ''}"
    lines = [block, ffn]
    pieces = []
    if cfg.norm == "rmsnorm":
        pieces.append(r"\mathrm{RMSNorm}(x) = g \odot \frac{x}{\sqrt{\operatorname{mean}_i x_i^2 + \epsilon}}")
    if cfg.activation == "silu":
        pieces.append(r"\mathrm{silu}(u) = u\, \sigma(u)")
    if pieces:
        lines.append(r", \qquad ".join(pieces))
    rotary, kv = cfg.positional == "rotary", rm.kv_heads(cfg)
    if rotary or kv < cfg.n_heads:
        turn = (lambda v, t: rf"R_{t}\, {v}") if rotary else (lambda v, t: v)        # noqa: E731
        key_head = rf"^{{\lceil h / {cfg.n_heads // kv} \rceil}}" if kv < cfg.n_heads else "^{h}"
        query, key = turn(r"x_t W_Q^{h}", "t"), turn(rf"x_s W_K{key_head}", "s")
        score = rf"S^{{h}}_{{ts}} = \frac{{\big({query}\big) \cdot \big({key}\big)}}{{\sqrt{{d_k}}}}"
        if rotary:
            base = f"{cfg.rope_base:,.0f}".replace(",", "{,}")               # 100{,}000: no space after the comma
            score += (rf", \qquad R_t \text{{ turns features }} (c,\ c + \tfrac{{d_k}}{{2}}) \text{{ by }} "
                      rf"t\, \theta_c, \ \ \theta_c = {base}^{{-2c / d_k}}")
        lines.append(score)
    return lines


def architecture_caption(cfg) -> str:
    """What the formulas' symbols are, and what this model's attention does beyond the other pages'."""
    said = ("x is the residual stream (token t's row after layer ℓ is x_t^(ℓ))"
            + ("" if cfg.head != "lm" else ", z the logits")
            + "; MHA is the multi-head attention of every other page, its heads' outputs concatenated and mixed "
              "by W_O.")
    kv = rm.kv_heads(cfg)
    if kv < cfg.n_heads:
        said += (f" Here its {cfg.n_heads} query heads share {kv} key/value heads: head h (counted from 1) reads "
                 f"key/value head ⌈h/{cfg.n_heads // kv}⌉ (grouped-query attention, below).")
    if cfg.positional == "rotary":
        said += (f" No position vector is added to x: rotary positions turn each query and key by its position "
                 f"(R_t, base {cfg.rope_base:,.0f}; the Positional encoding page shows why only the offset t − s "
                 f"then counts).")
    if cfg.gated_ffn:
        said += " The feed-forward network is gated: silu(x W_gate) decides, feature by feature, how much of x W_1 passes."
    return said


def parameters_caption(cfg, sizes: rm.GroupedQuery) -> str:
    """How one layer's attention and feed-forward network are counted, for this config: 4·d² (+ 4d)
    whatever the head count with one key/value head per query head; fewer with shared ones."""
    kv, H, d = rm.kv_heads(cfg), cfg.n_heads, cfg.d_model
    if kv < H:
        said = (f"Each attention block is d·H·d_k + 2·d·H_kv·d_k + H·d_k·d = {sizes.attention_params:,} here: its "
                f"{H} query heads share {kv} key/value heads, so W_K and W_V are {kv}/{H} of their full size "
                f"(4·d² = {sizes.full_attention_params:,} with a key/value head per query head)"
                + ("; biases add H·d_k + 2·H_kv·d_k + d." if cfg.bias else "."))
    else:
        said = f"Each attention block is 4·d²{' + 4d' if cfg.bias else ''} whatever the head count."
    if cfg.gated_ffn:
        said += (f" Each gated feed-forward network has three matrices, W_gate, W_1 and W_2: 3·d·d_ff = "
                 f"{3 * d * cfg.d_ff:,}" + (" plus biases." if cfg.bias else "."))
    return said


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
        by_kind.setdefault(r["kind"], []).append(r)
    listed = [r for kind_rows in by_kind.values() for r in kind_rows[:NAMED_MOST]]
    text = "\n".join(f"- **{kind}** (≥ {rm.THRESHOLDS[kind]}): "
                     + ", ".join(f"{names.head(r['layer'], r['head'])} {r['score']:.2f}" for r in kind_rows[:NAMED_MOST])
                     + (f", and {len(kind_rows) - NAMED_MOST} more (the table below has every head)"
                        if len(kind_rows) > NAMED_MOST else "")
                     for kind, kind_rows in by_kind.items())
    return text, papers_names(listed)


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
def logit_lens_section(m, source: str, ids: tuple, labels) -> None:
    st.header("Logit lens")
    cfg = m.config
    norm = norm_symbol(cfg, "f") if cfg.final_ln else ""
    st.latex(rf"\text{{guess}}_\ell(t) = \arg\max \operatorname{{softmax}}\big({norm}(x_t^{{(\ell)}})\, "
             rf"{unembedding_symbol(cfg)}\big)")
    top, prob, computed = lens(m, source, ids)
    replay(computed)
    lens_table = pd.DataFrame([[f"{show(text)} ({p:.0%})" for text, p in zip(rm.token_texts(m, top[r]), prob[r])]
                               for r in range(cfg.n_layers + 1)],
                              columns=labels,
                              index=["embeddings"] + [f"after block {l + 1}" for l in range(cfg.n_layers)])
    st.dataframe(lens_table.rename_axis("logit lens").reset_index(), hide_index=True)
    st.caption("Each row reads the residual stream after that block as if the rest of the model were skipped, "
               f"through the model's own final norm ({'RMSNorm' if cfg.norm == 'rmsnorm' else 'LayerNorm'}) and "
               + ("its tied unembedding (the token embeddings, read a slice of the vocabulary at a time)"
                  if cfg.tied_unembed else "its unembedding")
               + "; the last row is the model's own next-token prediction at each position.")


def next_token_effect_section(m, source: str, ids: tuple, layer: int, head: int, how: str, other: tuple = ()) -> None:
    rows, computed = edited(m, source, ids, layer, head, how, other)
    replay(computed)
    texts = rm.token_texts(m, [r["id"] for r in rows])
    effect = pd.DataFrame([{"next token": show(text), "before": r["before"], "after": r["after"],
                            "change": r["change"]} for text, r in zip(texts, rows)])
    st.metric("largest change in a next-token probability", f"{effect['change'].abs().max():.4f}")
    st.dataframe(effect.style.format({"before": "{:.4f}", "after": "{:.4f}", "change": "{:+.4f}"}), hide_index=True)


def grouped_query_section(cfg, n_tokens: int) -> None:
    """Which query heads share each key/value head, and what sharing saves: one layer's attention
    parameters and the KV cache, at this text's length and at the full context, against one key/value
    head per query head."""
    H, kv = cfg.n_heads, rm.kv_heads(cfg)
    st.header("Grouped-query attention")
    groups = rm.query_heads_of(cfg)
    sizes = rm.grouped_query(cfg)
    st.markdown(f"Each layer has **{H} query heads** but only **{kv} key/value heads**: every {H // kv} neighbouring "
                "query heads score the **same keys** and average the **same values**, each with its own query, so "
                "each head still draws its own map. Sharing shrinks W_K and W_V to "
                f"d × {kv}·d_k = {cfg.d_model} × {kv * cfg.d_k}, and the KV cache, which keeps every earlier "
                "position's keys and values while the model writes, by the same factor.")
    st.dataframe(pd.DataFrame({"key/value head": [f"K/V {g + 1}" for g in range(kv)],
                               "query heads (in every layer)": [", ".join(f"H{h + 1}" for h in heads)
                                                                for heads in groups]}), hide_index=True)
    st.latex(r"\underbrace{d \cdot H d_k}_{W_Q} + \underbrace{2\, d \cdot H_{kv} d_k}_{W_K,\, W_V} + "
             r"\underbrace{H d_k \cdot d}_{W_O} \quad\text{against}\quad 4 d^2, \qquad "
             r"\text{KV cache per token} = 2 \cdot L \cdot H_{kv} \cdot d_k \cdot 4 \text{ bytes}")
    at_text, at_context = sizes.kv_bytes(n_tokens), sizes.kv_bytes(cfg.n_ctx)
    rows = [("attention parameters per layer", sizes.attention_params, sizes.full_attention_params),
            ("KV cache per token, bytes (float32)", sizes.kv_bytes_per_token, sizes.full_kv_bytes_per_token),
            (f"KV cache for this text ({n_tokens} tokens), bytes", *at_text),
            (f"KV cache at the full context ({cfg.n_ctx:,} tokens), bytes", *at_context)]
    table = pd.DataFrame([(what, ours, full, ours / full) for what, ours, full in rows],
                         columns=["grouped-query attention", f"{kv} key/value heads (this model)",
                                  f"{H} key/value heads (one per query head)", "ratio"])
    st.dataframe(table, hide_index=True, column_config={
        table.columns[1]: st.column_config.NumberColumn(format="localized"),
        table.columns[2]: st.column_config.NumberColumn(format="localized"),
        "ratio": st.column_config.NumberColumn(format="%.3f")})
    st.caption(f"d = {cfg.d_model}, H = {H}, H_kv = {kv}, d_k = {cfg.d_k}, L = {cfg.n_layers}. Full multi-head "
               f"attention would take 4·d² = {sizes.full_attention_params:,} parameters a layer; at the full "
               f"context the cache would be {at_context[1] / 1e9:.2f} GB instead of {at_context[0] / 1e9:.2f} GB.")


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


def generation_section(m, source: str, ids, key, note: str | None = None) -> None:
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
        with st.spinner(f"Writing {room} tokens…"):
            new_tokens, computed = generated(m, source, tuple(int(i) for i in ids), float(ss[key("temperature")]),
                                             int(ss[key("top_k")]), float(ss[key("top_p")]), int(room),
                                             int(ss[key("seed")]))
        replay(computed)
        # shown as plain text: the model's output may hold spaces at its ends and *, _, `, # or $, which
        # markdown would read as markup
        st.markdown("**Your prompt**, as the model read it:")
        st.code(rm.text_of(m, ids), language=None, wrap_lines=True)
        st.markdown(f"**Continued** by the model ({len(new_tokens)} new tokens, · a space at either end):")
        continued = rm.text_of(m, new_tokens)
        st.code(visible_ends(continued), language=None, wrap_lines=True)
        if "<0x" in continued:
            st.caption("`<0xD9>` and the like: bytes that make no whole character (see the tokens above).")
    st.caption("The prompt runs once and fills the KV cache; each new token then runs alone, its query attending "
               "over the cached keys and values.")
