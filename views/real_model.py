"""A real model: a BERT-family encoder (all-MiniLM-L6-v2), a Llama-family language model
(SmolLM2-135M-Instruct) or a GPT-2-family decoder, run by our own transformer and taken apart head by head."""
import dataclasses
import os

import pandas as pd
import streamlit as st

from core.lessons import notation, param_counts, questions
from core.lessons import real_model as rm
from core.model import minilm_package, names
from core.recording import Record, recorded, recording
from ui import charts, lesson, state
from ui import real_model_parts as parts
from ui.widgets import function_sources, source_expander

PAGE = "real_model"
MODELS = parts.MODELS
HOW = {"zero": "zero (remove the head)", "mean": "mean over positions", "patch": "patch from the second prompt"}
SPEC = {"which": state.choice_field(parts.DEFAULT_MODEL, list(MODELS)), "model": state.text_field(""),
        "text": state.text_field("The cat sat on the mat. The cat sat on the mat."),
        "sentences": state.text_field("The weather is lovely today.\nIt's so sunny outside!\nHe drove to the stadium."),
        "layer": state.int_field(1, 1, 96), "head": state.int_field(1, 1, 64), "grid_layer": state.int_field(0, 0, 96),
        "how": state.choice_field("zero", list(HOW)), "other": state.text_field("the value and the key give a weight."),
        "temperature": state.float_field(0.8, 0.0, 2.0), "top_k": state.int_field(40, 0, 1000),
        "top_p": state.float_field(0.95, 0.05, 1.0), "n_new": state.int_field(20, 1, 60), "seed": state.int_field(0, 0, 999)}
GRID_TOKENS = 16                       # the grid of every head shows at most this many tokens
k = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state

st.title("A real model")
state.restore(PAGE, SPEC)
lesson.header("real_model")
unlocked = lesson.predict("real_model")          # opens the head maps and the choice of a head
st.markdown("A published checkpoint, read from its own files and run by **our** transformer: the same blocks as "
            "every other page, set to the checkpoint's architecture. Every map below is the model's own.")

# 1. the model and the text ----------------------------------------------------------------------
offered = parts.offered(os.environ)              # "Another checkpoint" only where the server takes one
if ss[k("which")] not in offered:
    state.settle(PAGE, "which", parts.DEFAULT_MODEL, "this server takes no other checkpoints.")
st.radio("Model", list(offered), format_func=offered.get, key=k("which"), horizontal=True)
if ss[k("which")] == "other":
    st.text_input("A folder (config.json, model.safetensors, tokenizer.json) or a Hub name such as gpt2 or "
                  "bert-base-uncased", key=k("model"))
source = {**parts.SOURCES, "other": ss[k("model")].strip()}[ss[k("which")]]
bar = st.progress(0.0) if ss[k("which")] in ("other", "smollm2") and source else None   # a download says how far
try:
    with st.spinner(parts.loading_message(source)):
        m = parts.model_for(source, (lambda f, msg: bar.progress(f, text=msg)) if bar else None)
    ss[k("good_model")] = source
except ValueError as err:
    fallback = ss.get(k("good_model"), "")
    fallback = "" if fallback == source else fallback
    (st.info if ss[k("which")] in ("minilm", "smollm2") else st.error)(   # a packaged model not installed: a note
        f"{err}\n\nShowing {'the shipped small GPT' if not fallback else fallback} instead.")
    source, m = fallback, parts.model_for(fallback)
finally:
    if bar is not None:
        bar.empty()
cfg = m.config
for line in parts.architecture_latex(cfg):
    st.latex(line)
st.caption(parts.architecture_caption(cfg))
kv = rm.kv_heads(cfg)
st.caption(f"{parts.credit(source)}: {'an encoder' if m.is_encoder else 'a decoder'}, {cfg.n_layers} layers × "
           f"{cfg.n_heads} heads" + (f" over {kv} key/value heads" if kv < cfg.n_heads else "")
           + f", d = {cfg.d_model}, vocabulary {cfg.vocab_size:,}, context {cfg.n_ctx:,}, run in float32.")


def read_text(text: str):
    """The text's ids, fitted to the context, and how many tokens were cut; ``ValueError`` when the
    model would read no token of it (an encoder reads nothing between its [CLS] and [SEP])."""
    ids, cut = rm.fit_context(m.encode(text), cfg.n_ctx, keep_last=m.is_encoder)
    if m.is_encoder and len(ids) <= 2:
        raise ValueError("The text holds no word for the encoder to read: type at least one word.")
    return ids, cut


parts.clip_long_text(k("text"), "The text has")
state.vet(PAGE, "text", read_text)
st.text_area(f"Your text (at most {state.MAX_TEXT} characters; a longer one is cut at a word)", key=k("text"))
try:
    text = ss[k("text")]
    ids, cut = read_text(text)
    ss[k("good_text")] = text
except ValueError as err:
    text = ss.get(k("good_text"), SPEC["text"].default)
    st.error(f"{err} Still showing: {parts.code_span(text)}.")
    ids, cut = read_text(text)
if cut:
    st.warning(f"The text is {cut} tokens longer than the model's context: only {cfg.n_ctx} of its tokens are used.")
ran = Record()                     # what computes the numbers below, for the source at the end of the page
with recording(ran):
    words = rm.token_texts(m, ids)
labels = charts.position_labels([parts.show(w) for w in words])
st.markdown("**Tokens**, as the tokenizer cut them (· is a space, ⏎ a new line"
            + (", [CLS] and [SEP] the encoder's own" if m.is_encoder else "") + "): "
            + " ".join(parts.code_span(parts.show(w)) for w in words))
if rm.has_partial_character(words):
    examples = ", ".join(f"{c} = {hexes}" for c, hexes in rm.multibyte_characters(text))
    st.info("Tokens such as `<0xF0>` hold **part of a character**. This model's tokenizer cuts bytes, not "
            "characters: in UTF-8 one character takes 1 to 4 bytes (a letter of the English alphabet 1, é or an "
            "Arabic letter 2, most emoji 4), and a character that was rare in the model's training text stays "
            "in pieces. A piece of a character is no character at all, so decoding it alone "
            "gives \"�\": the page shows such a token as its bytes in hexadecimal."
            + (f" Characters of several bytes in your text: {examples}." if examples else ""))
if m.is_encoder and "[UNK]" in words:
    st.info("`[UNK]` stands for a character this encoder's vocabulary does not have (an emoji, for instance): "
            "the model sees only that something unknown was there.")
# the forward pass (its record: the one transformer's functions, and the loops or, on a freshly started
# server, their NumPy formulas, the softmax and GELU it ran: GPT-2's sizes run the tuned twins)
with st.spinner(f"Running the model's {cfg.n_layers} layers on your text…"):
    out, cache, forward_ran = parts.run(m, source, tuple(int(i) for i in ids))
ran.merge(forward_ran)
with recording(ran):
    W = rm.stack_weights(cache, cfg.n_layers)                                     # (L, H, T, T)
T = len(ids)

# 2. every head (one layer at a time in a large model), then one in detail ----------------------------
st.header("Every head")
st.markdown(notation.HEAD_NAMES)
n = min(T, GRID_TOKENS)
group = cfg.n_heads // kv                       # query heads per key/value head: one row of the grid each
one_layer_only = cfg.n_layers * cfg.n_heads > parts.GRID_MAPS      # too many maps to read at once
if one_layer_only and ss[k("grid_layer")] == parts.EVERY_LAYER:
    state.settle(PAGE, "grid_layer", 1, f"this model's {cfg.n_layers * cfg.n_heads} maps are shown one layer at a time.")
if ss[k("grid_layer")] > cfg.n_layers:
    state.settle(PAGE, "grid_layer", cfg.n_layers, f"this model has {cfg.n_layers} layers.")
if unlocked:
    choices = ([] if one_layer_only else [parts.EVERY_LAYER]) + list(range(1, cfg.n_layers + 1))
    if len(choices) > 1:
        st.select_slider("Layers in the grid", choices, key=k("grid_layer"),
                         format_func=lambda v: "every layer" if v == parts.EVERY_LAYER else f"layer {v}",
                         help=f"{cfg.n_layers} layers of {cfg.n_heads} heads: "
                              + (f"{cfg.n_layers * cfg.n_heads} maps, one layer at a time." if one_layer_only
                                 else "one layer, or every one at once."))
    picked = ss[k("grid_layer")]
    shown_layers = range(cfg.n_layers) if picked == parts.EVERY_LAYER else [picked - 1]
    heads_shown = [(l, h) for l in shown_layers for h in range(cfg.n_heads)]
    st.vega_lite_chart(charts.heatmap_grid([W[l, h, :n, :n] for l, h in heads_shown], labels[:n], labels[:n],
                                           [names.head(l, h) for l, h in heads_shown],
                                           columns=group if group > 1 else min(cfg.n_heads, 6),
                                           size=160 if group > 1 else 120, annotate=False))
    if group > 1:
        st.caption(f"Each row of maps is one key/value head's {group} query heads: they score the same keys with "
                   "their own queries (grouped-query attention, below).")
    if T > n:
        st.caption(f"The grid shows the first {n} tokens; the head below shows all {T}.")
else:
    st.caption("Answer the question at the top first: the maps of every head show its answer.")
c1, c2 = st.columns(2)
for name, count in (("layer", cfg.n_layers), ("head", cfg.n_heads)):
    if ss[k(name)] > count:
        state.settle(PAGE, name, count, f"this model has {cfg.n_layers} layers of {cfg.n_heads} heads.")
layer = state.whole_number_input(c1, "Layer", 1, cfg.n_layers, key=k("layer"), disabled=not unlocked) - 1
head = state.whole_number_input(c2, "Head", 1, cfg.n_heads, key=k("head"), disabled=not unlocked) - 1
if unlocked:
    st.vega_lite_chart(charts.heatmap(W[layer, head], labels, labels, annotate=False, size=420,
                                      title=f"{names.head(layer, head)}: attention weights"))
    if group > 1:
        partners = [names.head(layer, h) for h in rm.query_heads_of(cfg)[head // group] if h != head]
        st.caption(f"{names.head(layer, head)} reads key/value head {head // group + 1} of its layer, with "
                   f"{' and '.join(partners)}: the same keys, its own query.")
if kv < cfg.n_heads:
    with recording(ran):
        parts.grouped_query_section(cfg, T)

# 3. the head detector -----------------------------------------------------------------------------
st.header("Head detector")
if m.is_encoder:
    with recording(ran):
        scores = rm.sentence_head_scores(W)
        sinks = rm.sink_heads(scores)
    st.markdown("Each head's mean weight on **your text**: on the previous token, on the next one, on [CLS] and on "
                "[SEP], and how broad its rows are (a row's entropy over log₂ T: 1 is uniform, 0 one-hot). "
                f"On this text {sinks} of the {cfg.n_layers * cfg.n_heads} heads put half their weight or more on "
                "[CLS] or on [SEP]. A common reading (Clark et al. 2019, of BERT's attention to [SEP]) is that a head "
                "with nothing to look for at a token parks its weight there; that is a hypothesis, and these scores "
                "measure only where the weight goes, not why.")
    st.latex(r"\text{previous}_h = \operatorname*{mean}_{t = 2..T} (A_h)_{t,\,t-1} \qquad "
             r"\text{next}_h = \operatorname*{mean}_{t = 1..T-1} (A_h)_{t,\,t+1} \qquad "
             r"\text{broad}_h = \operatorname*{mean}_t \frac{-\sum_s (A_h)_{ts} \log_2 (A_h)_{ts}}{\log_2 T}")
else:
    with st.spinner("Running the model on repeated random tokens…"):
        scores, detected = parts.decoder_detector(m, source)
    ran.merge(detected)
    st.markdown("Each head's mean weight on **repeated random tokens** (n random ids, then the same n again, "
                "as on the induction page): on the previous token, on the earlier copy of the current token "
                "(duplicate), on the token after that copy (induction, the pattern Olsson et al. 2022 study), "
                "and on the first token (often called an attention sink).")
    st.latex(r"\text{induction}_h = \operatorname*{mean}_{t \in \text{2nd copy}} (A_h)_{t,\,t-n+1} \qquad "
             r"\text{previous}_h = \operatorname*{mean}_{t \ge 2} (A_h)_{t,\,t-1}")
if unlocked:                             # the next-token scores answer the opening question
    with recording(ran):
        named_text, papers = parts.named_heads_markdown(scores)
    st.markdown("**Named heads**, each with its score, at or above its kind's threshold:\n\n" + named_text,
                help=papers)
    heads = [f"H{h + 1}" for h in range(cfg.n_heads)]
    layers = [f"L{l + 1}" for l in range(cfg.n_layers)]
    cols = st.columns(2)
    for i, (kind, s) in enumerate(scores.items()):
        cols[i % 2].vega_lite_chart(charts.heatmap(s, layers, heads, title=f"{kind} score", value_name="score",
                                                   row_title="layer", col_title="head", size=300))
    st.dataframe(parts.score_table(scores, cfg), hide_index=True, height=220, column_config={
        "head": st.column_config.TextColumn("head", help="Layer and head, both counted from 1: papers write "
                                                         "L3H2 as 2.1, both counted from 0.")})
    if source in rm.GPT2_SMALL and not m.is_encoder:
        with recording(ran):
            published, papers = parts.published_heads_caption(scores)
        st.caption(published, help=papers)
else:
    st.caption("Answer the question at the top first: the scores show its answer too.")

# 4. attention rollout ------------------------------------------------------------------------------
st.header("Attention rollout")
st.latex(r"\bar A_\ell = \mathrm{rownorm}\big(\tfrac12 \operatorname{mean}_h A_{\ell,h} + \tfrac12 I\big), \qquad "
         r"R_\ell = \bar A_\ell \cdots \bar A_1")
with recording(ran):
    R = rm.rollout(W)
r1, r2 = st.columns(2)
r1.vega_lite_chart(charts.heatmap(W[-1].mean(0), labels, labels, annotate=False, title="Last layer, mean over heads"))
r2.vega_lite_chart(charts.heatmap(R[-1], labels, labels, annotate=False, title="Rollout through every layer",
                                  value_name="share"))
st.caption("Abnar & Zuidema (2020): the identity stands for the residual connection; the rollout multiplies the "
           "layers' maps to estimate how much each input token reaches each position.")
lesson.ask(next(q for q in questions.of_page(PAGE) if q.key == f"{PAGE}.rollout_share"))

# 5. what the model is for: sentence similarity (encoder) or next tokens (decoder), and a head removed --
if m.is_encoder:
    st.header("Sentence similarity")
    st.markdown("A sentence's embedding is the **mean of its tokens' vectors after the last layer** (padding left "
                "out by the key mask), made unit length: the pooling all-MiniLM-L6-v2 was trained with. Similar "
                "sentences point the same way.")
    parts.clip_long_text(k("sentences"), "The sentences have")
    state.vet(PAGE, "sentences", parts.read_sentences)
    st.text_area(f"Sentences, one per line (2 to {parts.MAX_SENTENCES}, at most {state.MAX_TEXT} characters in all)",
                 key=k("sentences"))
    try:
        sentences = parts.read_sentences(ss[k("sentences")])
        ss[k("good_sentences")] = ss[k("sentences")]
    except ValueError as err:
        sentences = parts.read_sentences(ss.get(k("good_sentences"), SPEC["sentences"].default))
        st.error(f"{err} Still showing the last sentences that worked.")
    with recording(ran):
        before = parts.similarity_section(m, source, sentences)
    if source == minilm_package.MINILM and sentences == SPEC["sentences"].default.splitlines():
        st.caption("The model's published figures for these three sentences: 0.6660, 0.1046 and 0.1411.")
    st.header(f"Remove head {names.head(layer, head)}")
    if ss[k("how")] == "patch":
        state.settle(PAGE, "how", "zero", "patching takes a second prompt, which this page offers on decoders only.")
    how = st.radio("Replace its output by", ["zero", "mean"], format_func=HOW.get, key=k("how"), horizontal=True)
    with recording(ran):
        parts.similarity_edit_section(m, source, sentences, before, layer, head, how)
else:
    with recording(ran):
        parts.logit_lens_section(m, source, tuple(int(i) for i in ids), labels)
    st.header(f"Remove or patch head {names.head(layer, head)}")
    a1, a2 = st.columns([1, 2])
    how = a1.radio("Change its output", list(HOW), format_func=HOW.get, key=k("how"))
    state.vet(PAGE, "other", lambda text: rm.fit_context(m.encode(text), cfg.n_ctx))
    a2.text_input("Second prompt (patching: this head's output on it replaces the output on your text, the two "
                  "aligned at their last tokens)", key=k("other"))
    other_ids = None
    if how == "patch":
        try:
            other_ids = tuple(int(i) for i in rm.fit_context(m.encode(ss[k("other")]), cfg.n_ctx)[0])
            ran.merge(parts.run(m, source, other_ids)[2])
        except ValueError as err:
            st.error(f"Second prompt: {err}")
    with recording(ran):
        if how != "patch" or other_ids is not None:
            with st.spinner(f"Running the model again with {names.head(layer, head)} changed…"):
                parts.next_token_effect_section(m, source, tuple(int(i) for i in ids), layer, head, how,
                                                other_ids or ())
        parts.generation_section(m, source, ids, k,
                                 note=parts.shipped_model_note(m, scores) if source == "" else None)

# 6. its parameters, counted two ways ------------------------------------------------------------------
st.header("Its parameters, counted two ways")
with recording(ran):
    formula = recorded(param_counts.model_param_count)(cfg)
    sizes = rm.grouped_query(cfg)
p1, p2 = st.columns(2)
p1.metric("in the checkpoint's tensors", f"{m.checkpoint_params:,}")
p2.metric("by the Parameters page's formula", f"{formula.total:,}")
# a static table of text: a pandas Styler costs a fresh server's first visit a tenth of a second (jinja2),
# and the interactive table's script more than a megabyte in the browser
st.table(pd.DataFrame([(part, f"{count:,}", f"{share:.1%}") for part, count, share in formula.rows()],
                      columns=["part", "parameters", "share"]).set_index("part"))
st.caption(parts.parameters_caption(cfg, sizes) + " The formula knows only the config, the first count only the "
           "file." + ("" if formula.total == m.checkpoint_params else
                      " They differ: the file holds tensors this config does not describe."))

if sources := source_expander("Source: the transformer and the analyses that ran"):
    with sources:
        function_sources(ran)

# a large model's grid opens on layer 1, a small one's on every layer: each its own default in the link
state.publish(PAGE, SPEC | {"grid_layer": dataclasses.replace(SPEC["grid_layer"], default=1 if one_layer_only else 0)})
