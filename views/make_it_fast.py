"""Make it fast: one attention timed on the lesson kernel, the tuned kernel and NumPy, and the tuned
kernel's ideas beside its source."""
import time

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from core.kernels import cpu as lesson_cpu
from core.kernels.tuned import cpu as tuned_cpu
from core.kernels.tuned import gemm, simd, target
from core.lessons import gemm_speed, speed
from core import warmup
from ui import state
from ui.warmup import wait_for_kernels


PAGE = "make_it_fast"
# Every control's value, kept in the page's address so a link reopens this exact comparison.
SPEC = {"T": state.text_field("6, 64, 256, 1024"), "H": state.int_field(4, 1, speed.MAX_HEADS),
        "dk": state.choice_field("64", tuple(map(str, speed.D_K_CHOICES))),
        "op": state.choice_field(speed.OPERATIONS[0], speed.OPERATIONS),
        "gemm": state.choice_field(next(iter(gemm_speed.SHAPES)), tuple(gemm_speed.SHAPES))}
key = lambda name: state.key(PAGE, name)  # noqa: E731
GEMM_BUTTON = "Time the five steps"
RESULTS = key("results")   # the last measurement: its settings and rows, so a plain rerun keeps it
REMEASURE = key("remeasure")   # the button under a "machine was busy" message
GEMM_RESULTS = key("gemm_results")   # the last timing of the matrix-product steps: its shape and rows


def number(value: float, digits: int, missing: str) -> str:
    """A table's number as text; ``missing`` (words that say why) in place of NaN."""
    return f"{value:.{digits}f}" if value == value else missing


@st.cache_resource(show_spinner="Compiling the lesson and tuned kernels for this operation (once per server; "
                                "a minute or more when nothing is cached yet)…")
def _kernels_compiled(operation: str) -> bool:
    speed.warm_up([operation])
    return True


@st.cache_resource(show_spinner="Compiling the matrix-product steps (once per server)…")
def _gemm_steps_compiled() -> bool:
    gemm_speed.warm_up()
    return True


st.title("Make it fast")
state.restore(PAGE, SPEC)
st.markdown(
    "The lesson kernels are written to be read: one loop nest per step of the formula. The tuned kernels "
    "compute the same numbers with the tricks of a BLAS library. Here both run, with NumPy's textbook "
    "`softmax(Q Kᵀ/√d_k) V` beside them, **measured now, on this machine**: float32, one sequence "
    "(batch 1), self-attention (T queries and T keys), on the CPU whatever the sidebar says.")

# 1. what to time -------------------------------------------------------------------------------
c1, c2, c3 = st.columns([2, 1, 1])
state.vet(PAGE, "T", speed.parse_lengths)
lengths_text = c1.text_input(f"Sequence lengths T ({speed.MIN_T} to {speed.MAX_T}, comma-separated)", key=key("T"))
n_heads = c2.slider("Heads H", 1, speed.MAX_HEADS, key=key("H"))
d_k = int(c3.select_slider("d_k = d_v", options=[str(d) for d in speed.D_K_CHOICES], key=key("dk")))
operation = st.radio("Operation", speed.OPERATIONS, key=key("op"), horizontal=True,
                     help="With weights: the (H, T, T) weights are built and returned. Without: the fused "
                          "kernel (online softmax) never builds them. NumPy builds them either way.")
st.caption(f"At most {speed.MAX_LENGTHS} lengths; H·T² at most {speed.MAX_WEIGHT_ENTRIES:,} weights (64 MiB). "
           f"A call predicted to take over {speed.CALL_CAP_S:g} s is skipped with a note (the lesson kernel "
           f"at T = 2048): predicted from {speed.PROBES} trial runs at T = {speed.PREDICT_FROM_T}, never one.")

try:
    lengths = speed.parse_lengths(lengths_text)
    speed.check_sizes(lengths, n_heads, d_k)
except ValueError as err:
    st.error(str(err))
    lengths = None

# 2. the measurement ----------------------------------------------------------------------------
if lengths is not None:
    settings = (lengths, n_heads, d_k, operation)
    again = st.button("Measure again", help="The machine's speed drifts; a second run shows by how much.")
    again = again or st.session_state.get(REMEASURE, False)
    kept = st.session_state.get(RESULTS, {})
    if again or kept.get("settings") != settings or "result" not in kept:
        # this page's kernels compile next, in the background; the page waits for them
        wait_for_kernels(warmup.SPEED_FOR[operation], why="The timing starts once they are loaded.")
        _kernels_compiled(operation)                  # loaded by now (compiled here when no warm-up runs)
        bar = st.empty()
        # nothing compiles while the kernels are timed (a 45 µs call measured 7.6 ms beside a compile):
        # the warm-up's compiling process is stopped meanwhile, and continued after
        with warmup.start_once().paused(), speed.measuring_alone(lambda: bar.info(
                "Another visitor to this server is timing the kernels: yours start when theirs end, so that "
                "neither run slows the other.", icon=":material/hourglass_top:")):
            bar.progress(0.0, text="Measuring this machine's matrix-product speed…")
            # the ceiling is what the machine can do: the faster of a reading before and one after, measured
            # again while a kernel reads faster than it; the run says when the machine was too busy to time
            result = speed.measure_against_ceiling(
                lengths, n_heads, d_k, operation,
                progress=lambda fraction, text: bar.progress(fraction, text=f"Timing {text}…"))
        st.session_state[RESULTS] = {"settings": settings, "result": result,
                                     "blas": speed.blas_info(), "when": time.strftime("%H:%M:%S")}
        bar.empty()
    run = st.session_state[RESULTS]
    result = run["result"]
    rows, sgemm = result.rows, result.ceiling
    if result.busy:
        st.warning("**This machine was too busy to time fairly**: other programs (or other visitors to this "
                   "server) had the cores while it was measured, so the times below may be slower than the "
                   "kernels are, and their share of the ceiling is not shown.\n\n"
                   + "\n".join(f"- {reason}" for reason in result.busy), icon=":material/warning:")
        st.button("Measure again now", key=REMEASURE, type="primary",
                  help="Times every kernel and the ceiling again; close other programs first if you can.")

    # the table writes its numbers as text: a cell with no number says why in words (an empty number
    # cell would read "None")
    table = pd.DataFrame({
        "T": [r.T for r in rows], "kernel": [r.kernel for r in rows], "operation": [r.operation for r in rows],
        "time (µs)": [number(r.seconds * 1e6, 1, "not run") for r in rows],
        "GFLOP/s": [number(r.gflops, 2, "not run") for r in rows],
        "% of sgemm": [number(result.share(r), 1, "not run" if r.skipped else
                              "not shown: machine busy" if result.busy else "over the ceiling") for r in rows],
        "note": [r.note for r in rows]})
    st.dataframe(table, hide_index=True)
    st.caption(f"Measured at {run['when']}: each time is the faster of two passes over the table, each the "
               f"best of up to five rounds (a round repeats short calls); GFLOP/s counts the two matrix "
               f"products, H·(2T²d_k + 2T²d_v) flops. A time far off its neighbours usually means other "
               f"programs, or other visitors to this server, had the cores then: measure again.")

    measured = pd.DataFrame({"T": [r.T for r in rows if not r.skipped],
                             "kernel": [r.kernel for r in rows if not r.skipped],
                             "time (µs)": [r.seconds * 1e6 for r in rows if not r.skipped],
                             "GFLOP/s": [r.gflops for r in rows if not r.skipped]})
    # one colour per kernel in every chart, whichever kernels a run measured: a fixed domain takes the
    # theme's series colours in its order (each readable on the light and the dark background)
    colour = alt.Color("kernel:N", scale=alt.Scale(domain=[*speed.KERNELS, "sgemm ceiling"]))
    tooltip = ["T", "kernel", alt.Tooltip("time (µs)", format=".1f"), alt.Tooltip("GFLOP/s", format=".2f")]
    times = alt.Chart(measured, title="time per call").mark_line(point=True).encode(
        x=alt.X("T:Q", scale=alt.Scale(type="log"), title="sequence length T"),
        y=alt.Y("time (µs):Q", scale=alt.Scale(type="log")), color=colour, tooltip=tooltip)
    rates = alt.Chart(measured, title="achieved GFLOP/s (dashed: the sgemm ceiling)").mark_line(point=True).encode(
        x=alt.X("T:Q", scale=alt.Scale(type="log"), title="sequence length T"),
        y=alt.Y("GFLOP/s:Q", scale=alt.Scale(type="log")), color=colour, tooltip=tooltip)
    # the ceiling as one more "kernel" of the colour legend: it then takes a theme colour, as the lines do
    ceiling = alt.Chart(pd.DataFrame({"GFLOP/s": [sgemm], "kernel": ["sgemm ceiling"]})).mark_rule(
        strokeDash=[4, 4]).encode(y="GFLOP/s:Q", color=colour,
                                  tooltip=[alt.Tooltip("GFLOP/s", format=".1f", title="sgemm ceiling")])
    left, right = st.columns(2)
    left.altair_chart(times, width="stretch")
    right.altair_chart(rates + ceiling, width="stretch")

    # 3. against what the machine can do ----------------------------------------------------------
    st.header("Against what this machine can do")
    best = result.fastest
    m1, m2 = st.columns(2)
    blas = run["blas"]
    which = (f"{blas.get('internal_api')} {blas.get('version')} (kernel {blas.get('architecture')}, "
             f"{blas.get('num_threads')} threads)" if blas else "NumPy's BLAS")
    m1.metric("sgemm ceiling", f"{sgemm:.1f} GFLOP/s", "measured while the machine was busy" if result.busy else None,
              delta_color="off",
              help=f"A 1024 × 1024 float32 matrix product through {which} (2·1024³ flops): the fastest of a few "
                   "runs just before the kernels were timed and a few just after, measured again while a kernel "
                   "read faster.")
    if best is not None:
        share = result.share(best)
        m2.metric("fastest here", f"{best.gflops:.1f} GFLOP/s",
                  f"{best.kernel} at T = {best.T}" + (f": {share:.0f}% of the ceiling" if share == share else
                                                      ", no share of the ceiling: the machine was busy"),
                  delta_color="off")
    st.markdown(
        "The ceiling is one large matrix product: long runs of multiply-adds with nothing in between. "
        "The gap between it and a kernel's GFLOP/s is time that kernel spends on something other than "
        "counted multiply-adds at full speed: the softmax's maxima, exponentials and divisions, the T × T "
        "weights written to memory and read back, loops too short to keep the vector units busy, and at "
        "small T starting the call (and its threads), which costs more than the arithmetic.")

# 4. how the tuned kernel gets there ------------------------------------------------------------
st.header("How the tuned kernel gets there")
lanes = simd.lanes(np.dtype(np.float32))
st.markdown(
    f"The lesson kernel computes a score, then a weight, then a sum, one number at a time. The tuned kernel "
    f"(`core/kernels/tuned/`) computes the same formulas with seven ideas. This CPU's vectors hold "
    f"**{lanes} float32 numbers** (its widest SIMD registers), so one instruction does {lanes} multiply-adds.")


def show(trick: str) -> None:
    for name, source in speed.trick_sources(trick):
        st.markdown(f"`{name}`")
        st.code(source, language="python")


vectors = target.TILE_VECTORS
st.subheader(f"1. Register tiles: 4 queries × {vectors} vectors of keys")
st.markdown(
    f"A score is a dot product, and a dot product loads two numbers per multiply-add. The tile computes a "
    f"block of 4 queries × {vectors * lanes} keys together: at each feature c it loads {vectors} vectors of keys "
    f"and four query numbers, then does {4 * vectors} vector multiply-adds ({4 * vectors * lanes} scores advanced "
    f"by one feature). The {4 * vectors} running sums stay in registers for the whole loop over c and are stored "
    f"once. The tile is as wide as the registers allow: this CPU's code has {target.REGISTERS} vector registers, "
    f"and {4 * vectors} sums + {vectors} loaded vectors + 1 broadcast number must fit (4 × 4 with AVX-512's 32, "
    f"4 × 2 with AVX2's 16). The same tile computes A V, with rows of weights in place of queries.")
st.latex(rf"S_{{i,\,j:j+{vectors}L}} \mathrel{{+}}= q_{{i,c}}\;K^{{\mathsf T}}_{{c,\,j:j+{vectors}L}}"
         rf"\qquad i = 1..4,\quad c = 1..d_k,\quad L = {lanes}")
show("register tiles")

st.subheader("2. Keys transposed, values padded")
st.markdown(
    "One vector load takes neighbouring numbers in memory. K is stored one key per row, so feature c of "
    f"{lanes} keys is scattered; each head's keys are copied once into panels of {vectors * lanes} keys, where "
    "feature c of the panel's keys is one row, read in order by the tile. The last panel is zero past the last "
    "key, so the last load may run past it with no scalar leftover loop. Value rows are padded to whole vectors "
    "for the same reason. Each of these arrays starts on a 64-byte cache line, so that no vector straddles two "
    "lines (a straddling load costs two).")
show("laid-out keys and values")

st.subheader("3. Online softmax (the fused kernel)")
st.markdown(
    "Without weights, the kernel never builds the T × T matrix. Per query it keeps a running maximum m, "
    f"a running sum ℓ and an unnormalised output o, and folds in the keys a tile ({tuned_cpu.KEY_TILE} keys) "
    "at a time; when a tile raises the maximum, what was summed so far is rescaled:")
st.latex(r"m' = \max(m, \max_j s_j),\quad \ell' = e^{m-m'}\,\ell + \sum_j e^{s_j-m'},\quad "
         r"o' = e^{m-m'}\,o + \sum_j e^{s_j-m'}\,v_j,\qquad \text{out} = o/\ell")
show("online softmax")
with st.expander("The lesson kernel's version: the same update, one key at a time"):
    st.code(speed.source_of(lesson_cpu.fused_attention_kernel), language="python")

st.subheader("4. A fast exp")
st.markdown(
    "`math.exp` is a call into the C library, one number per call, and a loop with a call in it cannot use "
    "the vector lanes. For float32 the tuned kernel computes exp with arithmetic only (Cephes' `expf`): split "
    "x into a power of two and a small remainder, approximate e^r by a polynomial, and build 2ⁿ by writing "
    "n + 127 into the float's exponent bits. Relative error about 1e-7, the precision of float32; below −87 it "
    f"returns exactly 0, so a masked score (−∞) still gets weight 0. The kernel computes {lanes} of them at once, "
    "a whole vector of a row's scores, and the vectors at either end of a row's live keys mask their lanes "
    "outside it instead of finishing one key at a time. Each exp is a chain of some twenty instructions that "
    "wait on one another, so the four rows of a group go through one loop together: four chains the core can "
    "overlap, where one row at a time left it waiting.")
st.latex(r"e^x = 2^n\,e^r,\quad n = \operatorname{round}(x/\ln 2),\quad r = x - n\ln 2\in[-\tfrac{\ln 2}{2}, "
         r"\tfrac{\ln 2}{2}],\quad e^r \approx 1 + r + r^2 P_5(r)")
show("fast exp")

st.subheader("5. The row maximum as an integer maximum")
st.markdown(
    "The softmax subtracts each row's maximum. LLVM does not vectorise a float maximum (it would have to "
    "decide what NaN does), but it does vectorise an integer one. Read a float32's 32 bits as an integer: "
    "for non-negative floats the integer order is the float order; for negative ones it is reversed, so "
    "flip their 31 lower bits. The map is its own inverse, so the integer maximum maps back to the float one.")
st.latex(r"\operatorname{ordered}(b) = b \;\oplus\; \bigl((b \gg 31)\;\&\;\mathtt{0x7FFFFFFF}\bigr)")
show("bit-trick maximum")

st.subheader("6. Views without reference counts")
st.markdown(
    "Every view Numba makes of an array (`A[b, h, i]`, `row[lo:hi]`) holds a reference to the memory's "
    "owner: an atomic increment when made, a decrement when dropped. In the inner loops at 64 keys that was "
    "about a tenth of the time. `borrowed` copies an array's shape, strides and data pointer without the "
    "owner, so its views count nothing. It is safe only while the caller keeps the real array alive, which "
    "is why only a function's arguments are borrowed.")
show("views without reference counts")

st.subheader("7. Masked keys are skipped")
st.markdown(
    "A causal or padding mask leaves each query one unbroken run of keys it may see. Before the work is split "
    "among the threads, the kernel finds each mask row's run once (one scan for all the heads that share the "
    "mask), and whether the mask is 0 all along it, as a causal or padding mask is. The tiles then compute "
    "scores, exps and the weighted sum over that run only, and add nothing where the mask is 0: causal "
    "attention does about half the work of unmasked attention. Other masks are added to the scores as they are.")
show("masked keys skipped")

# 5. a matrix product, step by step ---------------------------------------------------------------
st.header("A matrix product, step by step")
width = gemm.panel_width(np.float32)
st.markdown(
    "Each linear layer of a real model computes `y = x W`: the activations of M tokens (x, M × K) times a "
    "weight (W, K × N). Here one such product, float32, is timed five ways, each a step "
    "from the loops of the definition to our own product (`core/kernels/tuned/gemm.py`), with NumPy's BLAS "
    "beside them. Each result is checked against NumPy's float64 product before it is timed.")
st.latex(r"y_{ij} = \sum_{k=1}^{K} x_{ik}\,W_{kj},\qquad \text{flops} = 2\,M K N,\qquad "
         r"\text{GFLOP/s} = \frac{2\,M K N}{\text{seconds}\cdot 10^{9}}")
shapes = gemm_speed.SHAPES
shape_id = st.selectbox("Shape M × K × N", tuple(shapes), key=key("gemm"), format_func=lambda s: shapes[s].label,
                        help="x is M × K (M tokens), W is K × N: the weight of a real model's linear layer.")
shape = shapes[shape_id]
asked = st.button(GEMM_BUTTON, key=key("gemm_time"),
                  help="Times every step at this shape (a few seconds); changing the shape then times it again.")
kept_gemm = st.session_state.get(GEMM_RESULTS)
if asked or (kept_gemm is not None and kept_gemm["shape"] != shape_id):
    # our product loads with the readable models' loops; the other steps compile (or load) here once
    wait_for_kernels(warmup.READABLE, why="The timing starts once they are loaded.")
    _gemm_steps_compiled()
    waiting = st.empty()
    # as for attention: nothing compiles meanwhile, and one session's timing at a time
    with st.spinner(f"Timing the five steps at {shape.M} × {shape.K} × {shape.N}…"), \
            warmup.start_once().paused(), speed.measuring_alone(lambda: waiting.info(
                "Another visitor to this server is timing: yours starts when theirs ends, so that neither "
                "run slows the other.", icon=":material/hourglass_top:")):
        measured_gemm = gemm_speed.measure_against_ceiling(shape.dims)
    waiting.empty()
    st.session_state[GEMM_RESULTS] = kept_gemm = {"shape": shape_id, "result": measured_gemm,
                                                  "when": time.strftime("%H:%M:%S")}

if kept_gemm is not None and kept_gemm["shape"] == shape_id:
    result_gemm = kept_gemm["result"]
    steps, ceiling_gemm = result_gemm.rows, result_gemm.ceiling
    if result_gemm.busy:
        st.warning("**This machine was too busy to time fairly**: the times below may be slower than the steps "
                   "are, and their share of the ceiling is not shown. Time them again.\n\n"
                   + "\n".join(f"- {reason}" for reason in result_gemm.busy), icon=":material/warning:")
    st.dataframe(pd.DataFrame({
        "step": [r.step for r in steps], "M": [r.M for r in steps], "K": [r.K for r in steps],
        "N": [r.N for r in steps],
        "time (µs)": [number(r.seconds * 1e6, 1, "not run") for r in steps],
        "GFLOP/s": [number(r.gflops, 2, "not run") for r in steps],
        "% of sgemm": [number(result_gemm.share(r), 1, "not run" if r.skipped else "not shown: machine busy")
                       for r in steps],
        "× naive loops": [number(gemm_speed.speed_up(r, steps), 1, "not run" if r.skipped else
                                 "naive loops not run") for r in steps],
        "note": [r.note for r in steps]}), hide_index=True)
    st.caption(f"Measured at {kept_gemm['when']}: each time is the faster of two passes over the steps, each "
               f"the best of up to five rounds; GFLOP/s = 2·M·K·N / time. W is packed once before timing, as a "
               f"model's weights are when it loads. The ceiling is NumPy's BLAS on one 1024 × 1024 product, not "
               f"the cores' peak, and a step may pass it (over 100 %). Steps 1 to 3 run on one of the "
               f"{gemm_speed.ALL_THREADS} cores.")
    bars = pd.DataFrame({"step": [r.step for r in steps if not r.skipped],
                         "time (µs)": [r.seconds * 1e6 for r in steps if not r.skipped],
                         "GFLOP/s": [r.gflops for r in steps if not r.skipped]})
    rate = alt.Chart(bars, title=f"achieved GFLOP/s at {shape.M} × {shape.K} × {shape.N} (dashed: the sgemm "
                                 f"ceiling)").mark_bar().encode(
        y=alt.Y("step:N", sort=list(gemm_speed.STEPS), title=None), x=alt.X("GFLOP/s:Q"),
        tooltip=["step", alt.Tooltip("time (µs)", format=".1f"), alt.Tooltip("GFLOP/s", format=".2f")])
    rule = alt.Chart(pd.DataFrame({"GFLOP/s": [ceiling_gemm]})).mark_rule(strokeDash=[4, 4]).encode(
        x="GFLOP/s:Q", tooltip=[alt.Tooltip("GFLOP/s", format=".1f", title="sgemm ceiling")])
    st.altair_chart(rate + rule, width="stretch")
    ours = next(r for r in steps if r.step == gemm_speed.PACKED_ALL)
    blas_row = next(r for r in steps if r.step == gemm_speed.BLAS)
    g1, g2 = st.columns(2)
    g1.metric("sgemm ceiling, this timing", f"{ceiling_gemm:.1f} GFLOP/s",
              "measured while the machine was busy" if result_gemm.busy else None, delta_color="off",
              help="A 1024 × 1024 float32 product through NumPy's BLAS, read just before and just after the steps.")
    g2.metric("our packed product against NumPy's BLAS", f"{blas_row.seconds / ours.seconds:.2f}×",
              f"{ours.gflops:.1f} against {blas_row.gflops:.1f} GFLOP/s", delta_color="off",
              help="BLAS's time over ours at this shape: above 1, ours is faster.")

registers, tile_vectors = target.REGISTERS, gemm.TILE_VECTORS
STEP_TEXT = {
    gemm_speed.NAIVE: (
        "One output number at a time: row i of x against column j of W, K multiply-adds into one sum. Each "
        "add waits for the one before, one number per instruction, and going down column j reads W N numbers "
        "apart, a new cache line at every k.", r"y_{ij} = \sum_k x_{ik} W_{kj}"),
    gemm_speed.TILE: (
        f"A tile of 4 rows × {tile_vectors} vectors ({tile_vectors * lanes} columns) of y. At each k it loads "
        f"{tile_vectors} vectors of W's row k and broadcasts 4 numbers of x: {4 * tile_vectors} fused multiply-adds "
        f"of {lanes} lanes. The {4 * tile_vectors} running sums stay in registers for the whole loop over k "
        f"({registers} vector registers here; 16 sums with AVX-512's 32, 12 with AVX2's 16), and every number of W "
        f"loaded serves 4 rows. W is read where it lies: its rows k and k + 1 are N numbers apart.",
        rf"y_{{m+r,\;n:n+{tile_vectors}L}} \mathrel{{+}}= x_{{m+r,\,k}}\;W_{{k,\;n:n+{tile_vectors}L}}"
        rf"\qquad r = 0..3,\quad L = {lanes}"),
    gemm_speed.PACKED_ONE: (
        f"W packed once into panels of one tile's {width} columns, each k's {width} numbers side by side: the "
        f"tile reads its panel in order, cache line after cache line, where W's own rows lay N numbers apart. The "
        f"larger W, the more this counts (here W is {shape.K * shape.N * 4 / 2 ** 20:.1f} MiB; at 2048 × 2048 the "
        f"unpacked tile ran at a quarter of the packed one's speed); while W's rows stay in the caches, the tile of "
        f"step 2 reads them about as fast, and the table says which won on this machine. Packing is a pass over W: "
        f"a model pays it once, when it loads.",
        rf"\text{{panel}}_{{p,\,k,\,j}} = W_{{k,\;{width}p + j}}\qquad j = 0..{width - 1}"),
    gemm_speed.PACKED_ALL: (
        f"The tiles (blocks of 4 rows × panels) shared out among Numba's {gemm_speed.ALL_THREADS} threads "
        "(`prange`). Each tile is one thread's, its sums added in the same order whatever the thread count, so "
        "the numbers do not depend on it: the same bits on one core as on all.", None),
    gemm_speed.BLAS: (
        "OpenBLAS's sgemm does all of this in hand-written assembly, but it is handed W afresh at every call "
        "and re-packs it (and x) each time: K × N numbers copied per call against M × K × N multiply-adds, so the "
        "fewer the rows, the larger the packing's share. A model's weights are known when it loads: we pack them "
        "once then.",
        None),
}
for i, step in enumerate(gemm_speed.STEPS, 1):
    text, formula = STEP_TEXT[step]
    st.markdown(f"**{i}. {step}.** {text}")
    if formula:
        st.latex(formula)
    with st.expander(f"Source: {step}"):
        found = gemm_speed.sources(step)
        for name, source in found:
            st.markdown(f"`{name}`")
            st.code(source, language="python")
        if not found:
            st.code("y = x @ W     # NumPy hands x and W to its BLAS's sgemm (compiled C and assembly)",
                    language="python")

state.publish(PAGE, SPEC)
