"""Parameters and cost: what multi-head attention, a block, and a whole model weigh."""
import dataclasses
import math

import numpy as np
import pandas as pd
import streamlit as st

from core.lessons import analysis, heads, param_counts, questions
from core.lessons.questions import parameters as EX
from core.limits import MAX_D_MODEL, MAX_TOKENS
from core.model.config import TransformerConfig
from ui import charts, lesson, state


PAGE = "parameters"
PRESET_LABELS = {"custom": "Custom (the sizes above)"} | {k: s.name for k, s in param_counts.MODEL_PRESETS.items()}
# Exercise 5 keeps d_k and grows H; it leaves open what happens to d_model, so it has two readings.
# The third choice keeps d_model and lets d_k shrink (exercise 2's way).
KEEPING = {"d_k": "d_k, and d_model = H·d_k grows", "both": "d_k and d_model: the heads outgrow d_model",
           "d_model": "d_model, and d_k = d_model/H shrinks"}
# The sizes and the preset, kept in the page's address so a link reopens this exact configuration.
SPEC = {"d_model": state.int_field(64, 8, MAX_D_MODEL), "heads": state.int_field(8, 1, 64),
        "d_ff": state.int_field(4 * 64, 8, 4 * MAX_D_MODEL), "layers": state.int_field(6, 1, 48),
        "vocab": state.int_field(10_000, 1, 1_000_000), "T": state.int_field(128, 1, 4096),
        "bias": state.bool_field(False), "preset": state.choice_field("custom", tuple(PRESET_LABELS)),
        "ff_auto": state.bool_field(True),
        "keep": state.choice_field("d_k", tuple(KEEPING)), "h0": state.int_field(8, 1, 64),
        "h1": state.int_field(16, 1, 64), "dk0": state.int_field(64, 1, 512),
        # the whole model's choices; their defaults are the preset's own (see whole_model_spec)
        "arch": state.choice_field("encoder-only", param_counts.ARCHITECTURES),
        "pos": state.choice_field("sinusoidal", param_counts.POSITIONAL),
        "lm": state.bool_field(False), "tied": state.bool_field(True)}
WHOLE_MODEL = ("arch", "pos", "lm", "tied")
key = lambda name: state.key(PAGE, name)  # noqa: E731
ss = st.session_state
# SmolLM2-135M-Instruct's sizes as its GGUF file gives them (A real model reads them from the file), and
# the numbers that file's tensors hold
SMOLLM2_135M = TransformerConfig(vocab_size=49152, n_ctx=8192, d_model=576, n_heads=9, n_kv_heads=3, d_ff=1536,
                                 n_layers=30, norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True,
                                 positional="rotary", rope_base=100000.0, tied_unembed=True, final_ln=True, bias=False,
                                 ln_eps=1e-5)
SMOLLM2_135M_TENSORS = 134_515_008


def preset_choices(preset: str) -> dict:
    """The whole-model choices a preset starts from (the custom model: SPEC's defaults)."""
    base = param_counts.MODEL_PRESETS.get(preset)
    if base is None:
        return {name: SPEC[name].default for name in WHOLE_MODEL}
    return dict(zip(WHOLE_MODEL, param_counts.choices(base)))


def whole_model_spec(preset: str) -> dict:
    """SPEC with the preset's own whole-model choices as defaults, so a link leaves them out."""
    return SPEC | {name: dataclasses.replace(SPEC[name], default=value) for name, value in preset_choices(preset).items()}


def preset_changed() -> None:
    """Another preset starts from its own choices, or from those last made for it in this visit."""
    memory = ss.setdefault(key("whole_model_memory"), {})
    memory[ss.get(key("whole_model_of"), "custom")] = {name: ss[key(name)] for name in WHOLE_MODEL}
    for name, value in memory.get(ss[key("preset")], preset_choices(ss[key("preset")])).items():
        ss[key(name)] = value


COUNT = st.column_config.NumberColumn(format="localized")   # 1,073,741,824: thousands separated

st.title("Parameters and cost")
first_run = key("__restored") not in ss
state.restore(PAGE, SPEC)
if first_run:        # a link that names a preset but not a whole-model choice: the preset's own
    for name, value in preset_choices(ss[key("preset")]).items():
        if state.from_link(PAGE, name) is None:
            ss[key(name)] = value
for name in ("d_model", "d_ff"):          # these sliders move in steps of 8
    if ss[key(name)] % 8:
        state.settle(PAGE, name, max(8, ss[key(name)] // 8 * 8), f"{name} moves in steps of 8.")
# d_ff follows 4·d_model until the student sets it. A moved d_ff slider differs from the value the
# page last wrote; on a link's first run, a d_ff other than the default and 4·d_model was chosen.
auto_ff = 4 * ss[key("d_model")]
written = ss.get(key("ff_written"))
if (first_run and ss[key("d_ff")] not in (SPEC["d_ff"].default, auto_ff)) or \
        (written is not None and ss[key("d_ff")] != written):
    ss[key("ff_auto")] = False
if ss[key("ff_auto")]:
    ss[key("d_ff")] = auto_ff
ss[key("ff_written")] = ss[key("d_ff")]
lesson.header("parameters")
unlocked = lesson.predict("parameters")
st.markdown(
    "Count the numbers a Transformer has to learn. Pick the sizes below; every count on this page is "
    "plain arithmetic on shapes (no kernel runs here)."
)
with st.expander("What to look for"):
    st.markdown(
        "- Change **H** at a fixed d_model: what moves, the attention count or d_k?\n"
        "- At a fixed d_model, one wide head and H narrow heads cost the same to score; the narrow ones "
        "give H separate patterns.\n"
        "- Exercise 5 keeps d_k and grows H: the count then depends on whether d_model grows too.\n"
        "- In a block with d_ff = 4·d_model, the feed-forward network holds about twice the weights of attention.\n"
        "- In a whole model, the embedding table can rival the layers."
    )

# 1. sizes ----------------------------------------------------------------------------------------
c1, c2, c3 = st.columns(3)
d_model = c1.slider("d_model", 8, MAX_D_MODEL, step=8, key=key("d_model"),
                    help=f"Model width (at most {MAX_D_MODEL} on this page).")
n_heads = state.whole_number_input(c2, "Heads H", 1, 64, key=key("heads"), disabled=not unlocked,
                                   help="Must divide d_model." + ("" if unlocked else " Answer the question at the top first."))
d_ff = c3.slider("d_ff (feed-forward width)", 8, 4 * MAX_D_MODEL, step=8, key=key("d_ff"),
                 help="Starts at 4·d_model, the original Transformer's ratio, and follows d_model until you move it.")
c3.checkbox("d_ff = 4·d_model", key=key("ff_auto"), help="Untick to set d_ff yourself; tick to follow d_model again.")
c4, c5, c6 = st.columns(3)
n_layers = c4.slider("Layers", 1, 48, key=key("layers"))
vocab = state.whole_number_input(c5, "Vocabulary size", 1, 1_000_000, step=1000, key=key("vocab"))
T = c6.slider("Sequence length T", 1, 4096, key=key("T"), help="Only the FLOPs depend on it.")
bias = st.checkbox("Biases on the projections", key=key("bias"))
st.caption(f"Caps: d_model ≤ {MAX_D_MODEL} here (the whole-model calculator below goes further); "
           f"the attention pages draw at most {MAX_TOKENS} tokens.")

try:
    shapes = param_counts.mha_param_shapes(d_model, int(n_heads), bias=bias)
    mha = param_counts.mha_param_count(d_model, int(n_heads), bias=bias)
except ValueError as err:
    divisors = [h for h in range(1, d_model + 1) if d_model % h == 0 and h <= 64]
    st.error(f"{err} Head counts that divide {d_model}: {', '.join(map(str, divisors))}.")
    state.publish(PAGE, whole_model_spec(ss[key("preset")]))
    st.stop()
d_k = d_model // int(n_heads)

# 2. one multi-head attention block --------------------------------------------------------------
# The formulas follow the Biases box, as the counts do.
st.header("Multi-head attention: 4·d_model²" + (" + 4·d_model" if bias else ""))
st.latex(r"\underbrace{3\,d_{\text{model}}^2}_{W_Q,\,W_K,\,W_V} + \underbrace{d_{\text{model}}^2}_{W_O}"
         + (r" + \underbrace{4\,d_{\text{model}}}_{b_Q,\,b_K,\,b_V,\,b_O}" if bias else "")
         + r" \quad\text{with } d_k = d_v = d_{\text{model}}/H")
st.caption("With biases: b_Q, b_K, b_V (d_k numbers per head, d_model in all for each) and b_O (d_model)."
           if bias else "Weights only. Tick *Biases on the projections* to add b_Q, b_K, b_V and b_O: 4·d_model more.")
size = lambda prefix: sum(math.prod(s) for name, s in shapes.items() if name.startswith(prefix))
table = pd.DataFrame(
    [(f"W_{p}", f"{int(n_heads)} heads × ({d_model} × {d_k})" if p != "O" else f"({int(n_heads) * d_k} × {d_model})",
      size(f"W_{p}"), size(f"b_{p}")) for p in "QKVO"],
    columns=["projection", "shape", "weights", "biases"])
st.dataframe(table, hide_index=True, column_config={"weights": COUNT, "biases": COUNT})
built = sum(np.zeros(s).size for s in shapes.values())   # allocate every array and count its entries
st.metric("Attention parameters", f"{mha:,}",
          help=f"4·d_model²{' + 4·d_model' if bias else ''}: the sum of the table, and of the sizes of the "
               "arrays themselves.")
st.caption(f"Check: allocating every weight array with these shapes gives {built:,} numbers "
           f"({'equal to' if built == mha else 'DIFFERENT from'} 4·{d_model}²{' + 4·' + str(d_model) if bias else ''}).")

# 2b. the lesson's own example: d_model = 4, two heads ----------------------------------------------
st.subheader("The lesson's example: d_model = 4, two heads")
toy = param_counts.packed_param_split(4, 2)
st.latex(rf"\underbrace{{3 \cdot {toy.per_matrix}}}_{{W_Q,\,W_K,\,W_V}} + \underbrace{{{toy.out}}}_{{W_O}}"
         rf" = {toy.qkv} + {toy.out} = {toy.total}")
st.markdown(f"Each of W_Q, W_K, W_V packs the two heads' 4 × 2 matrices side by side into one 4 × 4 matrix: "
            f"**{toy.per_matrix}** numbers each, **{toy.qkv}** for the three. W_O maps the 4 concatenated "
            f"columns back to d_model = 4: **{toy.out}**. Total **{toy.total}** (weights only; biases "
            f"would add 4·d_model = 16).")
t1, t2, t3 = st.columns(3)
t1.metric("W_Q, W_K, W_V", f"{toy.qkv}")
t2.metric("W_O", f"{toy.out}")
t3.metric("total (d_model = 4, H = 2)", f"{toy.total}")
# The packed W_Q of the lesson's two-head pipeline: with X = I, head h's queries are its own matrix.
pipe = heads.two_head_pipeline()
toy_dk = pipe.W_Q.shape[1] // pipe.n_heads
per_head_W_Q = [heads.self_position(4, toy_dk)[0], heads.uniform(4, toy_dk)[0]]   # how each head was built
slice_err = param_counts.packed_slice_error(pipe.X, pipe.W_Q, per_head_W_Q)
q_cols = [f"h{h + 1}.q{j + 1}" for h in range(pipe.n_heads) for j in range(toy_dk)]
x_rows = [f"x{i + 1}" for i in range(pipe.W_Q.shape[0])]
packed = charts.heatmap(pipe.W_Q, x_rows, q_cols, kind="signed", value_name="W_Q", row_title="input feature",
                        col_title="query dimension", size=240,
                        # two short lines: one long title is cut to "…" above a chart this narrow
                        title={"text": ["Packed W_Q (d_model × H·d_k)", "columns 1–2 head 1, 3–4 head 2"]})
# A bar on each slice boundary, so the heads read as column blocks; mid-grey keeps 3:1 contrast
# against both themes' backgrounds (Vega-Lite's default black vanishes on the dark one).
packed["layer"].append({
    "data": {"values": [{"col": q_cols[h * toy_dk]} for h in range(1, pipe.n_heads)]},
    "mark": {"type": "rule", "strokeWidth": 4, "color": "#808080"},
    "encoding": {"x": {"field": "col", "type": "nominal", "bandPosition": 0}}})
w1, w2 = st.columns([1, 1])
w1.vega_lite_chart(packed)
w2.dataframe(pd.DataFrame(pipe.W_Q + 0.0, columns=q_cols).assign(**{"W_Q": x_rows})[["W_Q", *q_cols]].round(4),
             hide_index=True)
w2.latex(r"Q_{\text{all}} = X\,W_Q")   # two lines: one does not fit half the page
w2.latex(r"\text{slice error} = \max_h \bigl|\,Q_{\text{all}}[:,\, h d_k:(h+1) d_k] - X W_Q^h\bigr|")
w2.metric("slice error", f"{slice_err:g}",
          help="One packed matmul against each head's own projection, computed now (X = I, the lesson's tokens).")
st.caption("Head 1 (self, on the circle code) owns columns 1–2, head 2 (uniform, Q = 0) columns 3–4: "
           "one product X·W_Q computes every head's queries at once.")

# 3. every H that divides d_model -----------------------------------------------------------------
st.subheader("Change H, keep d_model")
if not unlocked:
    st.info("Answer the question at the top first: this table gives its answer away.")
else:
    divisors = [h for h in range(1, d_model + 1) if d_model % h == 0 and h <= 64]
    sweep = pd.DataFrame({"H": divisors, "d_k": [d_model // h for h in divisors],
                          "parameters": [param_counts.mha_param_count(d_model, h, bias) for h in divisors]})
    left, right = st.columns([1, 2])
    left.dataframe(sweep, hide_index=True, height=260, column_config={"parameters": COUNT})
    long = sweep.melt(id_vars="H", value_vars=["d_k", "parameters"], var_name="quantity")
    right.vega_lite_chart(charts.lines(long[long.quantity == "d_k"], "H", "value", title="d_k = d_model / H",
                                    y_title="d_k", points=True), width="stretch")
    right.vega_lite_chart(charts.lines(long[long.quantity == "parameters"], "H", "value",
                                    title="parameters (flat)", y_title="parameters", points=True),
                          width="stretch")
    counts = sweep["parameters"].unique()
    st.caption(f"At d_model = {d_model}, every one of the {len(divisors)} head counts gives {counts[0]:,} "
               f"parameters; only d_k moves, from {sweep.d_k.max()} down to {sweep.d_k.min()}."
               if len(counts) == 1 else
               f"At d_model = {d_model} the counts differ with H: from {counts.min():,} to {counts.max():,}.")
ask = {p.key.split(".", 1)[1]: p for p in questions.of_page(PAGE)}
lesson.ask(ask["head_width"])
lesson.ask(ask["params_384"])

# 4. score FLOPs ----------------------------------------------------------------------------------
st.subheader("Scoring cost: one wide head against H narrow ones")
st.latex(r"2\,T^2 d_{\text{model}} \;=\; H \cdot 2\,T^2 \frac{d_{\text{model}}}{H}")
cost = analysis.wide_vs_narrow_score_flops(T, d_model, int(n_heads))
f1, f2 = st.columns(2)
f1.metric("One head of width d_model", f"{cost.one_wide_head:,} FLOPs")
f2.metric(f"{cost.n_heads} heads of width {cost.d_k}", f"{cost.narrow_heads:,} FLOPs")
st.caption("At a fixed d_model: the same arithmetic; the narrow heads buy H attention patterns, each with a "
           "score matrix of rank at most d_k.")
lesson.ask(ask["more_heads"])

# 4b. exercise 5: grow H keeping d_k; two readings, and the third way (keep d_model) ------------------
st.subheader("Grow H: exercise 5 has two readings")
ex_before = param_counts.mha_param_count(EX.EX5_D_MODEL, EX.EX5_HEADS)
ex_wide = EX.EX5_MORE_HEADS * EX.EX5_D_K                                # the 16 heads' concatenation
ex_grown = param_counts.mha_param_count(ex_wide, EX.EX5_MORE_HEADS)
ex_kept = param_counts.mha_param_count_of_width(EX.EX5_D_MODEL, EX.EX5_MORE_HEADS, EX.EX5_D_K)
st.markdown(
    f"The lesson's exercise 5: d_model = {EX.EX5_D_MODEL} with H = {EX.EX5_HEADS} gives d_k = "
    f"{EX.EX5_D_MODEL // EX.EX5_HEADS} and {ex_before:,} weights. Keep **d_k = {EX.EX5_D_K}** and grow **H to "
    f"{EX.EX5_MORE_HEADS}**: how does the count change? The exercise does not say what happens to d_model, "
    "and each reading has its own answer (weights only):\n"
    f"- **(a) d_model grows with H**: d_model = H·d_k = {ex_wide}, so 4·{ex_wide}² = **{ex_grown:,}**, "
    f"×{ex_grown / ex_before:g}. This is how models are widened.\n"
    f"- **(b) d_model stays {EX.EX5_D_MODEL}**: the heads' concatenation is H·d_k = {ex_wide} wide, so W_Q, W_K "
    f"and W_V are {EX.EX5_D_MODEL} × {ex_wide} and W_O {ex_wide} × {EX.EX5_D_MODEL}: 4·{EX.EX5_D_MODEL}·{ex_wide} "
    f"= **{ex_kept:,}**, ×{ex_kept / ex_before:g}. Here d_k = d_model / H no longer holds.\n\n"
    "Choose a reading below, or the third way (keep d_model and let d_k shrink), and try other numbers.")
g = st.columns(4)
keep = g[0].radio("Keep fixed", tuple(KEEPING), key=key("keep"), format_func=KEEPING.get)
h0 = state.whole_number_input(g[1], "H before", 1, 64, key=key("h0"))
h1 = state.whole_number_input(g[2], "H after", 1, 64, key=key("h1"))
dk0 = state.whole_number_input(g[3], "d_k before", 1, 512, key=key("dk0"), help="So d_model before = H before · d_k.")
try:
    before, after = analysis.grow_heads(int(h0), int(h1), int(dk0), T, keep=keep, bias=bias)
except ValueError as err:
    st.error(f"Keeping d_model fixed: {err}")
else:
    rows = [("H", before.n_heads, after.n_heads), ("d_k", before.d_k, after.d_k),
            ("H·d_k (the heads together)", before.n_heads * before.d_k, after.n_heads * after.d_k),
            ("d_model", before.d_model, after.d_model), ("attention parameters", before.parameters, after.parameters),
            (f"score FLOPs at T = {T}", before.score_flops, after.score_flops)]
    st.dataframe(pd.DataFrame([(n, a, b, b / a) for n, a, b in rows],
                              columns=["quantity", "before", "after", "after / before"]),
                 hide_index=True, column_config={"before": COUNT, "after": COUNT,
                                                 "after / before": st.column_config.NumberColumn(format="×%.2f")})
    e1, e2 = st.columns(2)
    e1.metric("Attention parameters after", f"{after.parameters:,}",
              delta=f"×{after.parameters / before.parameters:g} (was {before.parameters:,})", delta_color="off")
    e2.metric("Score FLOPs after", f"{after.score_flops:,}",
              delta=f"×{after.score_flops / before.score_flops:g} (was {before.score_flops:,})", delta_color="off")
    heads_ratio = after.n_heads / before.n_heads
    wide = after.n_heads * after.d_k
    if keep == "d_k":
        said = (f"Keeping d_k = {after.d_k} with d_model = H·d_k: d_model goes from {before.d_model} to "
                f"{after.d_model}, so the weights 4·d_model² scale by (H₁/H₀)² = ×{heads_ratio ** 2:g} and the "
                f"score FLOPs by H₁/H₀ = ×{heads_ratio:g}; every head keeps its {after.d_k} dimensions.")
    elif keep == "both":
        said = (f"Keeping d_k = {after.d_k} and d_model = {after.d_model}: W_Q, W_K and W_V are {after.d_model} × "
                f"{wide} and W_O {wide} × {after.d_model}, so the weights 4·d_model·H·d_k scale by H₁/H₀ = "
                f"×{heads_ratio:g}, and so do the score FLOPs; every head keeps its {after.d_k} dimensions, "
                + ("and H·d_k still equals d_model." if wide == after.d_model else
                   f"but H·d_k = {wide} is no longer d_model."))
    else:
        width = ("narrower" if after.d_k < before.d_k else "wider" if after.d_k > before.d_k else "as wide as before")
        said = (f"Keeping d_model = {after.d_model}: the same weights and score FLOPs, and d_k goes from "
                f"{before.d_k} to {after.d_k}: each head is {width}.")
    st.caption(said)
presets = list(param_counts.MODEL_PRESETS.values())
preset_d_k = {s.stack.d_model // s.stack.n_heads for s in presets}
st.markdown("Why fix d_k when scaling? A head's score matrix has rank at most d_k, so at a fixed d_model "
            "more heads are narrower heads, each with a poorer pattern. To widen a model, practitioners "
            "usually grow H together with d_model and keep d_k, so every head keeps its width as H grows. "
            "The presets below: "
            + ", ".join(f"{s.name} has d_model / H = {s.stack.d_model}/{s.stack.n_heads} = "
                        f"{s.stack.d_model // s.stack.n_heads}" for s in presets)
            + (f": the same d_k = {preset_d_k.pop()} from d_model = {min(s.stack.d_model for s in presets)} to "
               f"{max(s.stack.d_model for s in presets)}." if len(preset_d_k) == 1 else "."))
lesson.ask(ask["grow_d_model"])
lesson.ask(ask["fixed_head_width"])

# 5. one block ------------------------------------------------------------------------------------
st.header("One Transformer block")
block = param_counts.block_param_count(d_model, int(n_heads), d_ff, bias=bias)
# The projections' biases (attention's 4d, the FFN's d_ff + d) follow the Biases box; the LayerNorms
# always have a gain and a bias.
st.latex((r"\underbrace{4d^2 + 4d}_{\text{attention}} + \underbrace{2\,d\,d_{ff} + d_{ff} + d}_{\text{FFN}}" if bias else
          r"\underbrace{4d^2}_{\text{attention}} + \underbrace{2\,d\,d_{ff}}_{\text{FFN}}")
         + r" + \underbrace{2 \cdot 2d}_{\text{2 LayerNorms}}")
st.caption(f"At d = {d_model}, d_ff = {d_ff}: {block.self_attention:,} + {block.ffn:,} + {block.layernorms:,} = "
           f"{block.total:,}. " + ("The projections carry biases (the Biases box is ticked)." if bias else
                                   "The projections carry no biases (the Biases box is off); each LayerNorm "
                                   "always has a gain and a bias."))
parts = {"attention": block.self_attention, "FFN": block.ffn, "LayerNorms": block.layernorms}
st.vega_lite_chart(charts.bar(list(parts.values()), list(parts), title="parameters per sublayer",
                           x_title="sublayer", y_title="parameters", y_domain=None), width="stretch")
st.markdown(f"Block total **{block.total:,}**: the FFN holds **{block.ffn / block.total:.0%}**, attention "
            f"{block.self_attention / block.total:.0%}, LayerNorms {block.layernorms / block.total:.1%}. "
            f"{n_layers} layers: {n_layers * block.total:,}; a {vocab:,} × {d_model} embedding adds "
            f"{vocab * d_model:,}.")

# 6. whole models ---------------------------------------------------------------------------------
st.header("A whole model")
preset = st.selectbox("Start from", list(PRESET_LABELS), format_func=PRESET_LABELS.get, key=key("preset"),
                      on_change=preset_changed)
ss[key("whole_model_of")] = preset
base = param_counts.MODEL_PRESETS.get(preset) or param_counts.WholeModel(TransformerConfig(   # the sizes above
    vocab_size=int(vocab), n_ctx=max(T, 1), d_model=d_model, n_heads=int(n_heads), d_ff=d_ff, n_layers=n_layers,
    bias=bias, causal=False, head="none"))
a1, a2, a3 = st.columns(3)
arch = a1.radio("Architecture", param_counts.ARCHITECTURES, key=key("arch"))
positional = a2.radio("Positions", param_counts.POSITIONAL, key=key("pos"),
                      help="sinusoidal: fixed, 0 parameters; learned: one vector per position.")
lm_head = a3.checkbox("Output projection to the vocabulary", key=key("lm"))
tied = a3.checkbox("Tied to the token embedding", key=key("tied"), disabled=not lm_head)
try:
    model = param_counts.with_choices(base, arch, positional, lm_head, tied)
    counted = param_counts.model_param_count(model)
except ValueError as err:
    st.error(str(err))
    state.publish(PAGE, whole_model_spec(preset))
    st.stop()
st.dataframe(pd.DataFrame(counted.rows(), columns=["part", "parameters", "share"]),
             hide_index=True, column_config={"parameters": COUNT, "share": st.column_config.NumberColumn(format="percent")})
m1, m2 = st.columns(2)
m1.metric("Our count", f"{counted.total:,}", help=f"{counted.total / 1e6:.1f}M")
changed = (arch, positional, lm_head, tied) != param_counts.choices(base)     # any choice off the preset's own
if base.published_total and not changed:
    err = param_counts.relative_error_to_published(model)
    m2.metric("Published", f"{base.published_total / 1e6:.0f}M", delta=f"{err:+.1%} ours vs published",
              delta_color="off")
    st.caption(f"Source: {base.source}. The published figures are rounded, and papers omit small details "
               "(exact vocabulary, which biases), so a few percent apart is agreement.")
elif base.published_total:
    m2.metric("Published (unchanged preset)", f"{base.published_total / 1e6:.0f}M")
    st.caption("You changed the preset, so the published figure no longer describes this model.")
split = param_counts.blocks_and_embeddings(model)
millions = lambda n: f"{n / 1e6:.0f}M" if n >= 1e7 else f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"  # noqa: E731
label = model.name if preset != "custom" and not changed else "This model"
st.markdown(f"**{label}: {split.n_blocks} blocks ≈ {millions(split.blocks)} "
            f"parameters, plus embeddings** ({millions(split.embeddings)})"
            + (f" and {millions(split.other)} more ({', '.join(split.other_parts)})" if split.other else "")
            + f": {split.blocks:,} + {split.embeddings:,}" + (f" + {split.other:,}" if split.other else "")
            + f" = {counted.total:,} ≈ {counted.total / 1e6:.1f}M.")
# 7. the Llama family: SmolLM2-135M ------------------------------------------------------------------
st.header("The Llama family: SmolLM2-135M")
llama = SMOLLM2_135M
counted = param_counts.model_param_count(llama)
layer = param_counts.block_param_count(llama.d_model, llama.n_heads, llama.d_ff, bias=llama.bias, norm=llama.norm,
                                       n_kv_heads=llama.n_kv_heads, gated_ffn=llama.gated_ffn)
kv_width = llama.n_kv_heads * llama.d_k
st.markdown(f"SmolLM2-135M-Instruct, the language model on *A real model*, keeps the block and changes what is in "
            f"it: its {llama.n_heads} query heads share **{llama.n_kv_heads} key/value heads** (grouped-query "
            f"attention: W_K and W_V are d × H_kv·d_k = {llama.d_model} × {kv_width}, not d × d), its feed-forward "
            "network is **gated** (SwiGLU: a third d × d_ff matrix, W_gate), its norms are **RMSNorms** (a gain, no "
            "bias), no projection has a bias, rotary positions turn queries and keys (no parameters), and the "
            "output projection is the token embedding itself (tied).")
st.latex(r"\underbrace{V d}_{\text{tied embeddings}} + L \big(\underbrace{2 d^2 + 2\, d\, H_{kv} d_k}_{\text{attention}}"
         r" + \underbrace{3\, d\, d_{ff}}_{\text{gated FFN}} + \underbrace{2d}_{\text{2 RMSNorms}}\big)"
         r" + \underbrace{d}_{\text{final RMSNorm}}")
st.caption(f"V = {llama.vocab_size:,}, d = {llama.d_model}, L = {llama.n_layers}, H = {llama.n_heads}, "
           f"H_kv = {llama.n_kv_heads}, d_k = {llama.d_k}, d_ff = {llama.d_ff}: "
           f"{llama.vocab_size * llama.d_model:,} + {llama.n_layers} × ({layer.self_attention:,} + {layer.ffn:,} + "
           f"{layer.layernorms:,}) + {llama.d_model} = {counted.total:,}.")
st.dataframe(pd.DataFrame(counted.rows(), columns=["part", "parameters", "share"]),
             hide_index=True, column_config={"parameters": COUNT, "share": st.column_config.NumberColumn(format="percent")})
l1, l2 = st.columns(2)
l1.metric("SmolLM2-135M by the formula", f"{counted.total:,}")
l2.metric("in its checkpoint's tensors", f"{SMOLLM2_135M_TENSORS:,}",
          help="The numbers its GGUF file's tensors hold, as A real model counts them when it reads the file.")
classic = param_counts.model_param_count(dataclasses.replace(llama, n_kv_heads=None, gated_ffn=False))
st.caption(f"The same sizes with a key/value head per query head and an ungated network would have "
           f"{classic.total:,} parameters: sharing keys and values saves {llama.n_layers} × "
           f"{param_counts.mha_param_count(llama.d_model, llama.n_heads) - layer.self_attention:,}, and the gate "
           f"adds {llama.n_layers} × {llama.d_model * llama.d_ff:,}.")

state.publish(PAGE, whole_model_spec(preset))
