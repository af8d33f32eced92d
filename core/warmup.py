"""Compile the kernels once per server process, in the background, while pages run without them.

On an empty Numba cache the compiled training steps take over a minute to compile on two cores.
No page waits for that: the server's first session starts :func:`start_once`, and

- every step compiles in a **child process** (``python -m core.warmup STEP``) that writes Numba's
  disk cache, and then loads from that cache here in a fraction of a second, between page runs
  (:meth:`WarmUp.page_running`). A compile in this process would hold the interpreter's lock for
  seconds (the lesson kernels, first) to much of a minute and slow every page; a child holds none
  of this process's locks. A lesson page that needs its kernels before they have loaded compiles
  them itself, as it would with no warm-up;
- until a step has loaded, pages run its readable twin: a model page trains and runs on the
  readable step and says so (:func:`ready`), and the readable sublayers run their NumPy formula
  instead of a compiled loop not yet loaded (:func:`can_run`). Both read the process's warm-up from
  :mod:`core.readiness`, the leaf module below every layer that runs compiled code.

A page asks for what it needs with :meth:`WarmUp.want`: that step compiles next. "Make it fast"
asks for its tuned kernels, which are compiled only then, and times them with the compiling
child stopped (:meth:`WarmUp.paused`).

    warm = start_once()                      # idempotent: one warm-up per process
    ready(ENCODER)                           # True once loaded (or when no warm-up runs here)
    warm.want(SPEED_FOR["with weights"])     # next; warm.progress(): (done, in all, compiling now)

``python -m core.warmup --profile`` compiles every step on an empty cache in this process and prints
what the time goes to, function by function. Nothing here imports Streamlit.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from core import readiness
from core.readiness import can_run, ready, running  # noqa: F401  (public here too: the pages ask warmup.ready)

# the operations every lesson page warms (ui.widgets.ensure_kernels), union over the pages
LESSON_OPERATIONS = ("scaled_scores", "attention_with_weights", "project_heads", "merge_heads_project",
                     "weighted_sum", "sinusoidal")


def _lesson_kernels() -> None:
    from core import backend, validate
    from core.kernels import dispatch

    validate.warm_up("float64")
    dispatch.warm_up(backend.resolve(None), "float64", LESSON_OPERATIONS)


def _readable_loops() -> None:
    """The compiled loops inside the readable sublayers (attention rows, LayerNorm, products, GELU),
    forward and backward, in both precisions, as the model pages run them: an encoder classifier,
    an encoder-decoder, a decoder-only model, the exact GELU, GPT-2's tuned elementwise steps, a
    Llama-family model (SmolLM2's settings), the unpacking of a GGUF file's quantised weights, and
    the products of a loaded model whose weights are packed, and its attention when it keeps no weights."""
    from core.kernels.tuned import cpu as tuned_cpu, gemm
    from core.model import decoder, presets, transformer
    from core.model.gguf import product, quants
    from core.model.tuned import forward as tuned_forward
    from core.model import layers as L
    from core.model import transformer_backward as TB
    from core.model.config import TransformerConfig, init_params

    classifier = TransformerConfig(vocab_size=5, n_ctx=4, d_model=8, n_heads=2, d_ff=8, n_layers=1, causal=False,
                                   head="classify", n_classes=3)
    llama = TransformerConfig(vocab_size=5, n_ctx=4, d_model=8, n_heads=2, n_kv_heads=1, d_ff=8, n_layers=1,
                              norm="rmsnorm", norm_placement="pre", activation="silu", gated_ffn=True,
                              positional="rotary", bias=False, tied_unembed=True, final_ln=True)
    for dtype in (np.float32, np.float64):
        TB.forward_backward(init_params(classifier, 0, dtype), classifier, np.zeros((2, 4), np.int64),
                            np.zeros(2, np.int64))
        tiny = dict(vocab_size=5, n_ctx=3, d_model=4, n_heads=1, n_layers=1)
        tokens = np.zeros((2, 3), np.int64)
        for cfg, src in ((presets.seq2seq(src_vocab_size=5, src_len=3, d_ff=4, bos_id=0, **tiny), tokens),
                         (presets.attention_only(**tiny), None)):
            decoder.loss_and_grads(decoder.init_params(cfg, 0, dtype), cfg, tokens, tokens, src)
        x = np.zeros((2, 3), dtype)
        L.gelu_erf(x), L.gelu_tanh_backward(x, x), tuned_forward.gelu_tanh(x), tuned_forward.silu(x)
        tuned_forward.softmax_rows(np.zeros((1, 1, 2, 2), dtype))
        tuned_forward.rms_norm(x, x[0], 1e-5)
        angles = np.zeros((2, 2), dtype)
        angles.setflags(write=False)              # as positions.rotary_angles keeps them
        for heads in (np.zeros((1, 2, 2, 2), dtype).swapaxes(1, 2), np.zeros((1, 2, 1, 2), dtype)):   # a pass, a token
            tuned_forward.rotate(heads, angles, angles)
        for T in (2, 64):                         # the attention of a pass that keeps no weights: serial, threaded
            heads = np.zeros((1, 1, T, 4), dtype)
            tuned_cpu.fused_attention(heads, heads, heads, np.zeros((1, 1, 1, 1), dtype), 0.5)
        transformer.forward(init_params(llama, 0, dtype), llama, np.zeros((1, 3), np.int64))
        for rows in (gemm.TILE_ROWS, 1):         # a loaded model's packed product: a pass, a generated token
            gemm.matmul(np.zeros((rows, 2), dtype), gemm.pack(np.zeros((2, 3), dtype)))
        gemm.joined_matmul(np.zeros((gemm.TILE_ROWS, 2), dtype), [gemm.pack(np.zeros((2, 3), dtype))] * 3)   # Q, K, V
        for rows in (L.TILED_BATCH_ROWS, 1):      # its attention: a pass (the register tile), a generated token
            L.matmul(np.zeros((1, rows, 2), dtype), np.zeros((1, 2, 2), dtype), threaded=True)
    for fmt in quants.FORMATS.values():          # a GGUF file's unpacking loops, on its read-only memory map
        raw = np.zeros((1, fmt.nbytes), np.uint8)
        raw.setflags(write=False)
        quants.dequantize(raw, fmt)
    raw = np.zeros((1, 20), np.uint8)            # its product read in the packed form: a pass, a generated token
    raw.setflags(write=False)
    for rows in (product.FEW_ROWS, 1):
        product.rows_product(np.zeros((rows, 32), np.float32), raw, np.zeros(1, np.int64), "Q4_1")
    x, part = np.zeros((product.FEW_ROWS, 32), np.float32), (raw, np.zeros(1, np.int64))
    product.joined_product(x, [part] * 3, "Q4_1")             # a layer's queries, keys and values
    product.joined_product(x, [part] * 2, "Q4_1", gated=True)   # SwiGLU's gate and up


def _encoder() -> None:
    """The encoder's compiled training step and forward pass (float32, as the pages train)."""
    from core.model.tuned import classifier
    from core.training.encoder_runs import EncoderRun

    classifier.warm_up(EncoderRun().config())


def _decoder() -> None:
    """The decoders' compiled gradient (encoder-decoder, decoder-only, attention-only: one compiled
    function, float32)."""
    from core.model.tuned import decoder_loss

    decoder_loss.warm_up()


def _speed(operation: str) -> None:
    """The lesson and tuned kernels "Make it fast" times for ``operation``, float32."""
    from core.lessons import speed

    speed.warm_up([operation])


LESSONS, READABLE = "the lesson kernels", "the readable models' compiled loops"
ENCODER, DECODER = "the encoder's compiled training step", "the decoders' compiled training step"
SPEED_FOR = {op: f"the kernels Make it fast times ({op})" for op in ("with weights", "without weights (fused)")}
# (label, function, in the child process); on demand only: compiled when a page asks (want)
STEPS = ((LESSONS, _lesson_kernels, True), (READABLE, _readable_loops, True), (ENCODER, _encoder, True),
         (DECODER, _decoder, True))
ON_DEMAND = tuple((label, functools.partial(_speed, op), True) for op, label in SPEED_FOR.items())
CHILD_NICE = 10          # a student's page comes first
PAGE_WAIT_S = 5.0        # the longest a step waits for the pages running here to end (WarmUp.page_running)


class _Compiler:
    """One child interpreter (``python -m core.warmup --serve``) that compiles steps on request and
    writes Numba's disk cache: started once (its imports cost seconds), then fed one step at a time,
    so a step asked for by a page (:meth:`WarmUp.want`) is the next one it compiles."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
        self.proc = subprocess.Popen([sys.executable, "-m", "core.warmup", "--serve"], cwd=root, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1)

    def compile(self, index: int) -> str:
        """Step ``index`` (of STEPS + ON_DEMAND) compiled there: "" when it succeeded, else why not."""
        try:
            self.proc.stdin.write(f"{index}\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
        except (OSError, ValueError) as err:
            return f"{type(err).__name__}: {err}"
        return "" if answer == f"ok {index}" else answer or "the compiling process ended"

    def close(self) -> None:
        """End the child: its input closes, it exits (killed if it does not within 10 s)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def _serve() -> None:
    """The child's side of :class:`_Compiler`: a step index per line in, ``ok INDEX`` (or the error) out.
    The child lowers its own priority. A ``preexec_fn`` doing it would make the server fork with the
    interpreter's lock held and run every fork handler: OpenBLAS's joins its threads, and a page's
    NumPy product on them then waits for that lock forever. Without one, Popen spawns (vfork + exec)."""
    os.nice(CHILD_NICE)
    steps = (*STEPS, *ON_DEMAND)
    for line in sys.stdin:
        index = int(line)
        try:
            steps[index][1]()
            print(f"ok {index}", flush=True)
        except Exception as err:   # told to the server, which then compiles the step itself
            print(f"error {index}: {type(err).__name__}: {err}".replace("\n", " "), flush=True)


class WarmUp:
    """Runs ``steps`` in a daemon thread, each once, in order, except that :meth:`want` moves a step
    to the front; thread-safe to read. Steps are ``(label, fn)`` or ``(label, fn, in_child)``: one
    ``in_child`` is compiled in the child process first, then loaded here from the disk cache."""

    def __init__(self, steps=STEPS, on_demand=()):
        self._all = [tuple(s) + (False,) * (3 - len(s)) for s in (*steps, *on_demand)]
        self._index = {label: i for i, (label, _, _) in enumerate(self._all)}
        self._pending = [label for label, _, _ in self._all[:len(steps)]]
        self._asked = set(self._pending)           # every step, and an on-demand one once wanted
        self._lock = threading.Lock()
        self._done: set[str] = set()
        self._current = ""
        self._compiler: _Compiler | None = None
        self._pause_count = 0
        self._errors: list[str] = []
        self._finished = threading.Event()
        self._quiet = threading.Lock()             # held while a step loads here, and while timing
        self._pages = 0                            # pages running now (page_running), and their condition
        self._pages_changed = threading.Condition()
        self._a_page_ended = threading.Event()
        self.seconds: dict[str, float] = {}
        if not self._pending:
            self._finished.set()

    def start(self, after_a_page: bool = False) -> "WarmUp":
        """Run the steps in a thread; ``after_a_page``: not before a page has run here (at most
        ``PAGE_WAIT_S``), so that a fresh server's first visit does not share its two cores with the
        compiling child's start and imports."""
        threading.Thread(target=self._run, args=(after_a_page,), name="kernel-warm-up", daemon=True).start()
        return self

    def want(self, label: str) -> None:
        """Compile ``label`` next (an on-demand step: now queued); nothing when done or running."""
        with self._lock:
            if label in self._done or label == self._current or label not in self._index:
                return
            if label in self._pending:
                self._pending.remove(label)
            self._pending.insert(0, label)
            self._asked.add(label)
            if self._finished.is_set():          # the thread had ended: start it again
                self._finished.clear()
                self.start()

    def _next(self) -> str | None:
        """The next step; None when there is none (the warm-up has finished, and its child ends)."""
        with self._lock:
            if self._pending:
                self._current = self._pending.pop(0)
                return self._current
            self._current = ""
            self._finished.set()
            compiler, self._compiler = self._compiler, None
        if compiler is not None:
            compiler.close()
        return None

    def _child_compiles(self, index: int) -> str:
        """Step ``index`` compiled in the child process (started on first use): "" or why not."""
        with self._lock:
            if self._compiler is None or self._compiler.proc.poll() is not None:
                try:
                    self._compiler = _Compiler()
                except OSError as err:
                    return str(err)
                if self._pause_count:
                    self._compiler.proc.send_signal(signal.SIGSTOP)
            compiler = self._compiler
        return compiler.compile(index)

    def _signal_child(self, sig) -> None:
        if self._compiler is not None and self._compiler.proc.poll() is None:
            self._compiler.proc.send_signal(sig)

    def stop_child(self) -> None:
        """Kill the compiling child (the server is exiting: it must not outlive it)."""
        with self._lock:
            self._signal_child(signal.SIGKILL)

    def _run(self, after_a_page: bool = False) -> None:
        if after_a_page:
            self._a_page_ended.wait(PAGE_WAIT_S)
        # This thread keeps the process's priority. Numba compiles and loads while holding the
        # interpreter's lock: a thread niced below a busy machine's other work would hold that lock
        # for as long as it waits for a core, and every page of the server would wait with it.
        # What runs long (the heavy compiles) runs in the niced child instead.
        while (label := self._next()) is not None:
            _, fn, in_child = self._all[self._index[label]]
            start = time.perf_counter()
            try:
                why = self._child_compiles(self._index[label]) if in_child else ""
                if why:
                    with self._lock:
                        self._errors.append(f"{label}: the compiling process failed ({why}); compiled here instead")
                self._after_pages()
                with self._quiet:                # loads from the disk cache (or compiles, if the child failed)
                    fn()
            except Exception as err:   # a page compiles it then, as before; nothing breaks here
                with self._lock:
                    self._errors.append(f"{label}: {type(err).__name__}: {err}")
            self.seconds[label] = time.perf_counter() - start
            with self._lock:
                self._done.add(label)

    @contextlib.contextmanager
    def page_running(self):
        """Around a page's run. A step loads (or compiles) here holding the interpreter's lock, which
        the page needs at every line: on a fresh server the first visit waited seconds behind it. So
        while any page runs, the next step here waits for them to end, at most ``PAGE_WAIT_S`` (a busy
        server always has a page running); the child's compiling goes on meanwhile."""
        self._count_pages(1)
        try:
            yield
        finally:
            self._count_pages(-1)

    @contextlib.contextmanager
    def page_waiting(self):
        """Inside :meth:`page_running`, a page that waits for a step: it does not hold that step back."""
        self._count_pages(-1)
        try:
            yield
        finally:
            self._count_pages(1)

    def _count_pages(self, change: int) -> None:
        with self._pages_changed:
            self._pages += change
            self._pages_changed.notify_all()
            if self._pages <= 0:
                self._a_page_ended.set()

    def _after_pages(self) -> None:
        with self._pages_changed:
            self._pages_changed.wait_for(lambda: self._pages <= 0, timeout=PAGE_WAIT_S)

    @contextlib.contextmanager
    def paused(self):
        """Nothing compiles during the ``with`` block: the compiling child is stopped (SIGSTOP) and
        continued after, and no step loads here meanwhile (a timing measures the kernels alone)."""
        with self._lock:
            self._pause_count += 1
            self._signal_child(signal.SIGSTOP)
        try:
            with self._quiet:
                yield
        finally:
            with self._lock:
                self._pause_count -= 1
                if not self._pause_count:
                    self._signal_child(signal.SIGCONT)

    def progress(self) -> tuple[int, int, str]:
        """``(steps done, steps in all, the step running now or "")``; on-demand steps count once asked."""
        with self._lock:
            return len(self._done), len(self._asked), self._current

    def has_done(self, label: str | None = None) -> bool:
        """Whether step ``label`` has run (loaded here); every step asked for when None."""
        if label is None:
            return self.finished
        with self._lock:
            return label in self._done or label not in self._index

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)


_start_lock = threading.Lock()


def start_once(after_a_page: bool = False) -> WarmUp:
    """The process's warm-up, started on the first call (``ATTN_WARMUP=0`` turns it off: then a
    finished, empty one is returned and each page compiles what it needs on first use). It is
    registered in :mod:`core.readiness`, where the layers below this one read whether it has loaded
    what they would run; ``after_a_page``: its steps begin once a page has run (:meth:`WarmUp.start`)."""
    with _start_lock:
        if readiness.started() is None:
            if os.environ.get("ATTN_WARMUP", "1") == "0":
                warm = WarmUp(steps=())
            else:
                warm = WarmUp(STEPS, ON_DEMAND).start(after_a_page)
                atexit.register(warm.stop_child)
            readiness.register(warm)
        return readiness.started()


def track(label: str) -> str:
    """The training step a page runs now: ``"compiled"`` once step ``label`` has loaded (or with no
    warm-up here), else ``"readable"``, and ``label`` is compiled next."""
    if ready(label):
        return "compiled"
    start_once().want(label)
    return "readable"


# ----------------------------------------------------------------------------------------------
# the child process, and the profile
# ----------------------------------------------------------------------------------------------
def profile() -> list[tuple[float, str, str]]:
    """Run every step here and return ``(seconds, function, signature)`` per compile, longest first.
    A compile's seconds include those of the functions it compiled inside it."""
    from numba.core import event

    rows, started = [], {}

    def key(ev):                 # a compile's start and end are two events with the same data
        return id(ev.data["dispatcher"]), str(ev.data["args"])

    class Listener(event.Listener):
        def on_start(self, ev):
            started[key(ev)] = time.perf_counter()

        def on_end(self, ev):
            fn = ev.data["dispatcher"].py_func
            rows.append((time.perf_counter() - started.pop(key(ev)), f"{fn.__module__}.{fn.__qualname__}",
                         str(ev.data["args"])))

    listener = Listener()
    event.register("numba:compile", listener)
    try:
        for label, fn, _ in (*STEPS, *ON_DEMAND):
            start, before = time.perf_counter(), len(rows)
            fn()
            print(f"{label}: {time.perf_counter() - start:.1f} s, {len(rows) - before} compiles", flush=True)
    finally:
        event.unregister("numba:compile", listener)
    return sorted(rows, reverse=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--profile":
        rows = profile()
        print("\n| seconds (with what it compiled inside) | function | argument types |\n|---|---|---|")
        for seconds, name, args in rows[:int(argv[1]) if len(argv) > 1 else 40]:
            print(f"| {seconds:.2f} | `{name}` | {args[:120]} |")
        return 0
    if argv and argv[0] == "--serve":
        _serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
