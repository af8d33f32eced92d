"""A real model: a GPT-2-family checkpoint run by our own transformer and taken apart head by head."""
import inspect
import os

import numpy as np
import pandas as pd
import streamlit as st

from core import pretrained
from core.lessons import real_model as rm
from core.models import sampling
from core.models import layers as L
from core.models import transformer as tr
from core.models import tuned_forward as TF
from ui import charts, state

PAGE = "real_model"
SHIPPED = os.path.join(os.path.dirname(tr.__file__), "tiny_gpt")
HOW = {"zero": "zero (remove the head)", "mean": "mean over positions", "patch": "patch from the second prompt"}
SPEC = {"model": state.text_field(""), "text": state.text_field("the query and the key give a score. the query and the key"),
        "layer": state.int_field(1, 1, 96), "head": state.int_field(1, 1, 64),
        "how": state.choice_field("zero", list(HOW)), "other": state.text_field("the value and the key give a weight."),
        "temperature": state.float_field(0.8, 0.0, 2.0), "top_k": state.int_field(40, 0, 1000),
        "top_p": state.float_field(0.95, 0.05, 1.0), "n_new": state.int_field(20, 1, 60), "seed": state.int_field(0, 0, 999)}
GRID_TOKENS = 16                       # the grid of every head shows at most this many tokens
k = lambda name: state.key(PAGE, name)  # noqa: E731
show = lambda token: token.replace(" ", "·").replace("\n", "⏎")  # noqa: E731  (spaces and new lines, visible)
ss = st.session_state


@st.cache_resource(show_spinner=False, max_entries=2)
def model_for(source: str, _progress=None) -> pretrained.Model:
    """One read-only copy per server process, shared by every session."""
    return pretrained.load(source or SHIPPED, np.float32, progress=_progress)


@st.cache_resource(show_spinner=False, max_entries=4)
def run(_m: pretrained.Model, source: str, ids: tuple):
    """The forward pass of one text and its cache (shared, read only)."""
    logits, cache = _m.forward(np.array(ids))
    for array in (logits, *cache.values()):
        array.setflags(write=False)                     # shared by every session that asks for this text
    return logits, cache


@st.cache_resource(show_spinner=False, max_entries=2)
def detector(_m: pretrained.Model, source: str):
    """Every head's scores on repeated random tokens, once per model."""
    first = _m.tokenizer.token_to_id("<|endoftext|>") if _m.tokenizer is not None else None
    return rm.detect_heads(_m.params, _m.config, n=min(20, _m.config.n_ctx // 2 - 1), first=first)


st.title("A real model")
state.restore(PAGE, SPEC)
st.markdown("A GPT-2-family checkpoint, read from its own files and run by **our** transformer (the same "
            "blocks as every other page, set to GPT-2's architecture: LayerNorm before each sublayer, GELU, "
            "learned positions, the unembedding tied to the embedding). Every map below is the model's own.")
st.latex(r"h \leftarrow h + \mathrm{MHA}(\mathrm{LN}_1(h)), \qquad h \leftarrow h + \mathrm{FFN}(\mathrm{LN}_2(h)), "
         r"\qquad \text{logits} = \mathrm{LN}_f(h)\, W_E^\top")

# 1. the model and the text ----------------------------------------------------------------------
st.text_input("Model: a folder (config.json, model.safetensors, tokenizer.json) or a Hub name such as gpt2; "
              "empty for the small model shipped with the dashboard", key=k("model"))
source = ss[k("model")].strip()
bar = st.progress(0.0) if source and not os.path.isdir(os.path.expanduser(source)) else None
try:
    m = model_for(source, (lambda f, msg: bar.progress(f, text=msg)) if bar else None)
    ss[k("good_model")] = source
except ValueError as err:
    source = ss.get(k("good_model"), "")
    st.error(f"{err}\n\nStill showing {source or 'the shipped model'}.")
    m = model_for(source)
finally:
    if bar is not None:
        bar.empty()
cfg = m.config
st.caption(f"{source or 'shipped tiny model (trained here on the dashboard text: python -m core.models.make_tiny_gpt)'}: "
           f"{cfg.n_layers} layers × {cfg.n_heads} heads, d = {cfg.d_model}, vocabulary {cfg.vocab_size:,}, "
           f"context {cfg.n_ctx}, {tr.param_count(cfg):,} parameters, run in float32.")

st.text_area("Your text", key=k("text"), max_chars=state.MAX_TEXT)
try:
    ids, cut = rm.fit_context(m.encode(ss[k("text")]), cfg.n_ctx)
    ss[k("good_text")] = ss[k("text")]
except ValueError as err:
    text = ss.get(k("good_text"), SPEC["text"].default)
    st.error(f"{err} Still showing: “{text}”.")
    ids, cut = rm.fit_context(m.encode(text), cfg.n_ctx)
if cut:
    st.warning(f"The text is {cut} tokens longer than the model's context: only its first {cfg.n_ctx} are used.")
words = m.tokens(ids)
labels = charts.position_labels([show(w) for w in words])
st.markdown("**Tokens**, as the tokenizer cut them (· is a space, ⏎ a new line): " +
            " ".join(f"`{show(w)}`" for w in words))
logits, cache = run(m, source, tuple(int(i) for i in ids))
W = rm.stack_weights(cache, cfg.n_layers)                                         # (L, H, T, T)
T = len(ids)

# 2. every head, then one in detail ------------------------------------------------------------------
st.header("Every head")
n = min(T, GRID_TOKENS)
st.vega_lite_chart(charts.heatmap_grid([W[l, h, :n, :n] for l in range(cfg.n_layers) for h in range(cfg.n_heads)],
                                       labels[:n], labels[:n],
                                       [f"L{l + 1}H{h + 1}" for l in range(cfg.n_layers) for h in range(cfg.n_heads)],
                                       columns=min(cfg.n_heads, 6), size=120, annotate=False))
if T > n:
    st.caption(f"The grid shows the first {n} tokens; the head below shows all {T}.")
c1, c2 = st.columns(2)
ss[k("layer")] = min(ss[k("layer")], cfg.n_layers)
ss[k("head")] = min(ss[k("head")], cfg.n_heads)
layer = c1.number_input("Layer", 1, cfg.n_layers, key=k("layer")) - 1
head = c2.number_input("Head", 1, cfg.n_heads, key=k("head")) - 1
st.vega_lite_chart(charts.heatmap(W[layer, head], labels, labels, annotate=False, size=420,
                                  title=f"Layer {layer + 1}, head {head + 1}: attention weights"))

# 3. the head detector -----------------------------------------------------------------------------
st.header("Head detector")
scores = detector(m, source)
st.markdown("Each head's mean attention on **repeated random tokens** (n random ids, then the same n again, "
            "as on the induction page): to the previous token, to the earlier copy of the current token "
            "(duplicate), to the token after that copy (induction), and to the first token (a \"sink\").")
st.latex(r"\text{induction}_h = \operatorname{mean}_{t \in \text{2nd copy}} A^h_{t,\,t-n+1} \qquad "
         r"\text{previous}_h = \operatorname{mean}_{t} A^h_{t,\,t-1}")
heads = [f"H{h + 1}" for h in range(cfg.n_heads)]
layers = [f"L{l + 1}" for l in range(cfg.n_layers)]
cols = st.columns(2)
for i, kind in enumerate(rm.HEAD_KINDS):
    cols[i % 2].vega_lite_chart(charts.heatmap(scores[kind], layers, heads, title=f"{kind} score", value_name="score",
                                               row_title="layer", col_title="head", size=300))
table = pd.DataFrame({"head": [f"L{l + 1}H{h + 1}" for l in range(cfg.n_layers) for h in range(cfg.n_heads)]}
                     | {kind: scores[kind].ravel() for kind in rm.HEAD_KINDS})
st.dataframe(table.round(3), hide_index=True, height=220)
st.caption("In GPT-2 small, published work (Olsson et al. 2022; TransformerLens's head detector) finds induction "
           "heads at 5.1, 5.5, 6.9, 7.2 and 7.10 (layer.head, counted from 0: L6H2, L6H6, L7H10, L8H3, L8H11 "
           "here) and previous-token heads in layer 4. The multi-head page's hand-set presets \"Previous "
           "token\" and \"First token\" are the patterns the previous-token and first-token scores look for.")

# 4. the logit lens and attention rollout ---------------------------------------------------------
st.header("Logit lens")
st.latex(r"\text{guess}_\ell(t) = \arg\max \operatorname{softmax}\big(\mathrm{LN}_f(h_\ell(t))\, W_E^\top\big)")
top, prob = rm.logit_lens(m.params, cfg, cache)
lens = pd.DataFrame([[f"{show(m.decode([t]))} ({p:.0%})" for t, p in zip(top[r], prob[r])]
                     for r in range(cfg.n_layers + 1)],
                    columns=labels, index=["embeddings"] + [f"after block {l + 1}" for l in range(cfg.n_layers)])
st.dataframe(lens.rename_axis("logit lens").reset_index(), hide_index=True)
st.caption("Each row reads the residual stream after that block as if the rest of the model were skipped; "
           "the last row is the model's own next-token prediction at each position.")

st.header("Attention rollout")
st.latex(r"\bar A_\ell = \mathrm{rownorm}\big(\tfrac12 \operatorname{mean}_h A_{\ell,h} + \tfrac12 I\big), \qquad "
         r"R_\ell = \bar A_\ell \cdots \bar A_1")
R = rm.rollout(W)
r1, r2 = st.columns(2)
r1.vega_lite_chart(charts.heatmap(W[-1].mean(0), labels, labels, annotate=False, title="Last layer, mean over heads"))
r2.vega_lite_chart(charts.heatmap(R[-1], labels, labels, annotate=False, title="Rollout through every layer",
                                  value_name="share"))
st.caption("Abnar & Zuidema (2020): the identity stands for the residual connection; the rollout multiplies the "
           "layers' maps to estimate how much each input token reaches each position.")

# 5. ablation and patching --------------------------------------------------------------------------
st.header(f"Remove or patch head L{layer + 1}H{head + 1}")
a1, a2 = st.columns([1, 2])
how = a1.radio("Change its output", list(HOW), format_func=HOW.get, key=k("how"))
a2.text_input("Second prompt (patching: this head's output on it replaces the output on your text, the two aligned at their last tokens)", key=k("other"))
other_cache = None
if how == "patch":
    try:
        other_ids, _ = rm.fit_context(m.encode(ss[k("other")]), cfg.n_ctx)
        _, other_cache = run(m, source, tuple(int(i) for i in other_ids))
    except ValueError as err:
        st.error(f"Second prompt: {err}")
if how != "patch" or other_cache is not None:
    rows = rm.edit_effect(m.params, cfg, ids, logits, rm.head_edit(cache, layer, head, how, other_cache))
    effect = pd.DataFrame([{"next token": show(m.decode([r["id"]])), "before": r["before"],
                            "after": r["after"], "change": r["change"]} for r in rows])
    st.metric("largest change in a next-token probability", f"{effect['change'].abs().max():.4f}")
    st.dataframe(effect.style.format({"before": "{:.4f}", "after": "{:.4f}", "change": "{:+.4f}"}), hide_index=True)

# 6. generation ----------------------------------------------------------------------------------------
st.header("Generation")
g = st.columns(5)
g[0].slider("temperature", 0.0, 2.0, key=k("temperature"), help="0 = greedy")
g[1].number_input("top-k (0 = off)", 0, 1000, key=k("top_k"))
g[2].slider("top-p", 0.05, 1.0, key=k("top_p"))
g[3].number_input("new tokens", 1, 60, key=k("n_new"))
g[4].number_input("seed", 0, 999, key=k("seed"))
settings = sampling.SamplerSettings(ss[k("temperature")], ss[k("top_k")] or None, ss[k("top_p")])
new = rm.generate(m.params, cfg, ids, max_new_tokens=ss[k("n_new")], settings=settings, seed=ss[k("seed")])
st.markdown(f"Continued: {m.decode(ids)}**{m.decode(new)}**" if len(new) else "The context is full: no room for new tokens.")
st.caption("The prompt runs once and fills the KV cache; each new token then runs alone, its query attending "
           "over the cached keys and values.")

with st.expander("Source: the transformer and the analyses that ran"):
    # a model of GPT-2's size runs the tuned twins of the softmax, GELU and KV cache (tr.BLAS_FROM)
    tuned = (TF.softmax_rows, TF._softmax_rows, TF.gelu_tanh, TF._gelu_tanh_flat, TF.append_kv) \
        if cfg.d_model ** 2 >= tr.BLAS_FROM else (tr.softmax_rows, L.gelu_tanh)
    for fn in (tr.forward, tr.forward_checked, tr.block, tr.self_attention, tr.feed_forward, tr.dense,
               tr.layer_norm, L.layer_norm, L._layer_norm_rows, *tuned, tr.edit_heads, rm.head_scores, rm.logit_lens,
               rm.rollout, rm.generate):
        st.code(inspect.getsource(getattr(fn, "py_func", fn)), language="python")

state.publish(PAGE, SPEC)
