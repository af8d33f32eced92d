"""The tiny transformer encoder: forward pass, hand-written backward pass, Adam, save and load.

Architecture (the original Transformer encoder: post-norm, ReLU, no dropout)::

    h = embed[tokens] + PE                                   # (B, T, d)
    for each layer:
        h = LN1(h + MHA(h))                                  # MHA with biases b_Q, b_K, b_V, b_O
        h = LN2(h + relu(h W_1 + b_1) W_2 + b_2)
    logits = mean_over_positions(h) W_cls + b_cls           # (B, C)
    loss = mean cross-entropy

Parameters are a ``dict[str, np.ndarray]`` (names in ``param_shapes``) and are computed in their
own dtype, float32 (fast, for training) or float64 (gradient checks). The matrix products go
through NumPy's BLAS; everything between them runs in fused Numba kernels
(``core/encoder_kernels.py``).

Backend: ``backend=`` is accepted and resolved like everywhere else, but the encoder always runs
on the CPU kernels. A model this small (about 20k parameters, a 64 x 16 batch) is dominated by
launch and transfer overhead on a GPU, so there is deliberately no CUDA path.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import glob
import io
import math
import os
import re
import zipfile

import numpy as np

from core import backend as _backend
from core import encoder_kernels as K
from core.kernels.reference import sinusoidal
from core.validate import check_heads

POSITIONAL_CHOICES = ("sinusoidal", "learned", "none")
LAYER_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O",
                "ln1_g", "ln1_b", "ln2_g", "ln2_b", "W_1", "b_1", "W_2", "b_2")


# ----------------------------------------------------------------------------------------------
# configuration and parameters
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the tiny encoder; checked on creation (``ValueError`` in the user's terms)."""

    vocab_size: int = 10
    seq_len: int = 16
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 64
    n_layers: int = 2
    n_classes: int = 2
    positional: str = "sinusoidal"
    ln_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "d_ff", "n_layers", "n_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}.")
        if self.n_classes < 2:
            raise ValueError(f"n_classes must be at least 2 for a classifier, got {self.n_classes}.")
        check_heads(self.d_model, self.n_heads)
        if self.positional not in POSITIONAL_CHOICES:
            raise ValueError(f"positional must be one of {', '.join(POSITIONAL_CHOICES)}, "
                             f"got {self.positional!r}.")
        if not (isinstance(self.ln_eps, (int, float)) and math.isfinite(self.ln_eps) and self.ln_eps > 0):
            raise ValueError(f"ln_eps must be a small positive number, got {self.ln_eps!r}.")

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


def param_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter name with its shape, in a fixed order."""
    d, V, T, F, C = cfg.d_model, cfg.vocab_size, cfg.seq_len, cfg.d_ff, cfg.n_classes
    shapes: dict[str, tuple[int, ...]] = {"embed": (V, d)}
    if cfg.positional == "learned":
        shapes["pos"] = (T, d)
    per_layer = {"W_Q": (d, d), "W_K": (d, d), "W_V": (d, d), "W_O": (d, d),
                 "b_Q": (d,), "b_K": (d,), "b_V": (d,), "b_O": (d,),
                 "ln1_g": (d,), "ln1_b": (d,), "ln2_g": (d,), "ln2_b": (d,),
                 "W_1": (d, F), "b_1": (F,), "W_2": (F, d), "b_2": (d,)}
    for i in range(cfg.n_layers):
        for name in LAYER_PARAMS:
            shapes[f"layers.{i}.{name}"] = per_layer[name]
    shapes["W_cls"] = (d, C)
    shapes["b_cls"] = (C,)
    return shapes


def param_count(cfg: EncoderConfig) -> int:
    """Number of trainable numbers in the model."""
    return int(sum(np.prod(s) for s in param_shapes(cfg).values()))


def init_params(cfg: EncoderConfig, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Fresh parameters: weights ``N(0, 1/d_in)``, embeddings ``N(0, 1)``, learned positions
    ``N(0, 0.1^2)``, biases 0, layer-norm gains 1 (deterministic for a seed)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype}.")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        short = name.rsplit(".", 1)[-1]
        if short == "embed":
            value = rng.standard_normal(shape)
        elif short == "pos":
            value = 0.1 * rng.standard_normal(shape)
        elif short.startswith("W_"):
            value = rng.standard_normal(shape) / math.sqrt(shape[0])
        elif short in ("ln1_g", "ln2_g"):
            value = np.ones(shape)
        else:
            value = np.zeros(shape)
        params[name] = np.ascontiguousarray(value, dtype=dtype)
    return params


def positional_table(params: dict, cfg: EncoderConfig, T: int) -> np.ndarray:
    """The (T, d) table added to the embeddings: sinusoidal, the learned ``pos`` rows, or zeros."""
    dtype = params["embed"].dtype
    if cfg.positional == "learned":
        return params["pos"][:T]
    if cfg.positional == "sinusoidal":
        return _sinusoidal_cached(T, cfg.d_model, dtype.str)
    return np.zeros((T, cfg.d_model), dtype=dtype)


_PE_CACHE: dict = {}


def _sinusoidal_cached(T: int, d: int, dtype_str: str) -> np.ndarray:
    key = (T, d, dtype_str)
    if key not in _PE_CACHE:
        table = np.ascontiguousarray(sinusoidal(T, d), dtype=np.dtype(dtype_str))
        table.setflags(write=False)
        _PE_CACHE[key] = table
    return _PE_CACHE[key]


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------
def check_params(params: dict, cfg: EncoderConfig) -> np.dtype:
    """Refuse missing/extra names, wrong shapes, mixed or non-float dtypes, NaN/inf. Returns the dtype."""
    expected = param_shapes(cfg)
    missing = [n for n in expected if n not in params]
    extra = [n for n in params if n not in expected]
    if missing:
        raise ValueError(f"Parameters are missing {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''} for this configuration.")
    if extra:
        raise ValueError(f"Unexpected parameters {', '.join(extra[:5])}"
                         f"{' ...' if len(extra) > 5 else ''} for this configuration.")
    dtype = np.asarray(params["embed"]).dtype
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"Parameters must be float32 or float64, got {dtype} for 'embed'.")
    for name, shape in expected.items():
        arr = params[name]
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"Parameter {name!r} is not a NumPy array.")
        if arr.shape != shape:
            raise ValueError(f"Parameter {name!r} has shape {arr.shape}; this configuration needs {shape}.")
        if arr.dtype != dtype:
            raise ValueError(f"Parameter {name!r} is {arr.dtype} but 'embed' is {dtype}; use one dtype.")
        if not np.isfinite(arr).all():
            raise ValueError(f"Parameter {name!r} contains NaN or infinity.")
    return dtype


def check_tokens(tokens, cfg: EncoderConfig) -> np.ndarray:
    """Tokens as a C-contiguous int64 (B, T) array with ``1 <= T <= seq_len`` and ids in range."""
    arr = np.asarray(tokens)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"Tokens must be whole-number ids, got values of type {arr.dtype}.")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"Tokens must be a non-empty (batch, positions) array, got shape {arr.shape}.")
    if arr.shape[1] > cfg.seq_len:
        raise ValueError(f"Sequences have {arr.shape[1]} tokens, but the model was built for at most "
                         f"seq_len = {cfg.seq_len}.")
    if arr.min() < 0 or arr.max() >= cfg.vocab_size:
        raise ValueError(f"Token ids must lie in 0..{cfg.vocab_size - 1} (vocab_size = {cfg.vocab_size}); "
                         f"got {arr.min()}..{arr.max()}.")
    return np.ascontiguousarray(arr, dtype=np.int64)


def check_labels(labels, batch: int, cfg: EncoderConfig) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.dtype.kind not in "iu" or arr.shape != (batch,):
        raise ValueError(f"Labels must be {batch} whole-number class ids, got {arr.dtype} with shape {arr.shape}.")
    if arr.size and (arr.min() < 0 or arr.max() >= cfg.n_classes):
        raise ValueError(f"Labels must lie in 0..{cfg.n_classes - 1}.")
    return np.ascontiguousarray(arr, dtype=np.int64)


# ----------------------------------------------------------------------------------------------
# forward
# ----------------------------------------------------------------------------------------------
def forward(params: dict, tokens, cfg: EncoderConfig, *, backend=None):
    """Run the encoder on a batch of token ids.

    Parameters
    ----------
    params : dict from :func:`init_params` (or :func:`load`)
    tokens : int array (B, T) or (T,), ``T <= cfg.seq_len``
    backend : resolved as elsewhere (``"cpu"``, ``"cuda"``, ``None``); the encoder always runs on the
        CPU kernels (a model this small gains nothing on a GPU).

    Returns
    -------
    logits : (B, C)
    cache : dict with ``attn`` (L, B, H, T, T) (each row sums to 1), ``pooled`` (B, d), ``hidden``
        (B, T, d), the final hidden states, and everything the backward pass needs.
    """
    _backend.resolve(backend)
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    logits, cache = _forward(params, tok, cfg)
    B, T = tok.shape
    cache["attn"] = np.ascontiguousarray(cache["P"].transpose(0, 4, 1, 2, 3))        # (L, B, H, T, T)
    cache["hidden"] = np.ascontiguousarray(
        cache["h_out"].reshape(T, B, cfg.d_model).transpose(1, 0, 2))               # (B, T, d)
    return logits, cache


def _forward(params: dict, tok: np.ndarray, cfg: EncoderConfig):
    """Forward pass without checks (training loop); ``tok`` is int64 (B, T).

    Rows of the activations are time-major (``t * B + b``), see ``core/encoder_kernels.py``; the
    internal attention weights ``cache["P"]`` are (L, H, T, T, B).
    """
    B, T = tok.shape
    N, d, H, L = B * T, cfg.d_model, cfg.n_heads, cfg.n_layers
    dtype = params["embed"].dtype
    eps = float(cfg.ln_eps)
    # 1. embed and add positions
    h = np.empty((N, d), dtype=dtype)                                      # (T*B, d)
    K.embed_forward(tok, params["embed"], positional_table(params, cfg, T), h)
    P = np.empty((L, H, T, T, B), dtype=dtype)
    fast_exp = dtype == np.float32        # float64 (gradient checks, lessons) keeps math.exp
    layers = []
    for i in range(L):
        p = _layer(params, i)
        x = h
        # 2. multi-head attention: one packed projection (transposed), then the fused kernel
        W_qkv = np.concatenate((p["W_Q"], p["W_K"], p["W_V"]), axis=1)    # (d, 3d)
        qkvT = (W_qkv.T @ x.T).reshape(3 * d, T, B)                        # (3d, T, B)
        ctxT = np.empty((d, T, B), dtype=dtype)                            # heads concatenated
        K.attention_forward(qkvT, p["b_Q"], p["b_K"], p["b_V"], H, ctxT, P[i], fast_exp)
        ctx = ctxT.reshape(d, N).T                                         # (N, d) view
        mha = ctx @ p["W_O"]                                               # (N, d), b_O added in LN1
        # 3. h1 = LN1(x + MHA(x))
        h1 = np.empty((N, d), dtype=dtype)
        xhat1 = np.empty((N, d), dtype=dtype)
        rstd1 = np.empty(N, dtype=dtype)
        K.residual_layernorm_forward(x, mha, p["b_O"], p["ln1_g"], p["ln1_b"], eps, h1, xhat1, rstd1)
        # 4. h2 = LN2(h1 + relu(h1 W_1 + b_1) W_2 + b_2)
        a = h1 @ p["W_1"]                                                  # (N, d_ff)
        K.bias_relu_forward(a, p["b_1"])
        ffn = a @ p["W_2"]                                                 # (N, d), b_2 added in LN2
        h2 = np.empty((N, d), dtype=dtype)
        xhat2 = np.empty((N, d), dtype=dtype)
        rstd2 = np.empty(N, dtype=dtype)
        K.residual_layernorm_forward(h1, ffn, p["b_2"], p["ln2_g"], p["ln2_b"], eps, h2, xhat2, rstd2)
        layers.append({"x": x, "W_qkv": W_qkv, "qkvT": qkvT, "ctx": ctx, "h1": h1, "xhat1": xhat1,
                       "rstd1": rstd1, "a": a, "xhat2": xhat2, "rstd2": rstd2})
        h = h2
    # 5. mean over positions, then the classifier
    pooled = np.empty((B, d), dtype=dtype)
    K.mean_pool(h, B, T, pooled)
    logits = pooled @ params["W_cls"] + params["b_cls"]                    # (B, C)
    cache = {"P": P, "tokens": tok, "layers": layers, "h_out": h, "pooled": pooled, "logits": logits}
    return logits, cache


def _layer(params: dict, i: int) -> dict:
    prefix = f"layers.{i}."
    return {name: params[prefix + name] for name in LAYER_PARAMS}


def predict(params: dict, tokens, cfg: EncoderConfig, *, batch_size: int = 4096) -> np.ndarray:
    """Predicted class ids (arg-max of the logits), computed in chunks."""
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    return _predict(params, tok, cfg, batch_size)


def _predict(params, tok, cfg, batch_size=4096):
    out = np.empty(tok.shape[0], dtype=np.int64)
    for start in range(0, tok.shape[0], batch_size):
        logits, _ = _forward(params, tok[start:start + batch_size], cfg)
        out[start:start + batch_size] = np.argmax(logits, axis=1)
    return out


# ----------------------------------------------------------------------------------------------
# backward
# ----------------------------------------------------------------------------------------------
def loss_and_grads(params: dict, tokens, labels, cfg: EncoderConfig, *, backend=None):
    """Mean cross-entropy of the batch and its gradient for every parameter.

    Returns ``(loss, grads)``; ``grads`` has the same names, shapes and dtype as ``params``. The
    backward pass is written by hand, step by step, mirroring :func:`forward` (CPU kernels; see
    the module docstring about ``backend``).
    """
    _backend.resolve(backend)
    check_params(params, cfg)
    tok = check_tokens(tokens, cfg)
    lab = check_labels(labels, tok.shape[0], cfg)
    grads = {name: np.empty_like(value) for name, value in params.items()}
    loss, _ = _loss_and_grads_into(params, tok, lab, cfg, grads)
    return loss, grads


def _loss_and_grads_into(params, tok, lab, cfg, grads):
    """Forward + backward without checks; writes every gradient into ``grads`` (arrays of the
    right shapes, e.g. views of one flat buffer). Returns ``(loss, n_correct)``."""
    logits, cache = _forward(params, tok, cfg)
    B, T = tok.shape
    N, d, H = B * T, cfg.d_model, cfg.n_heads
    dtype = logits.dtype
    # 5'. loss and classifier
    dlogits = np.empty_like(logits)
    loss, n_correct = K.softmax_cross_entropy(logits, lab, dlogits)
    pooled = cache["pooled"]
    np.matmul(pooled.T, dlogits, out=grads["W_cls"])
    K.column_sums(dlogits, grads["b_cls"])
    dpooled = dlogits @ params["W_cls"].T                                   # (B, d)
    dh = np.empty((N, d), dtype=dtype)
    K.mean_pool_backward(dpooled, T, dh)
    dres = np.empty((N, d), dtype=dtype)
    dqkvT = np.empty((3 * d, T, B), dtype=dtype)
    db_qkv = np.empty(3 * d, dtype=dtype)
    for i in reversed(range(cfg.n_layers)):
        p = _layer(params, i)
        g = {name: grads[f"layers.{i}.{name}"] for name in LAYER_PARAMS}
        c = cache["layers"][i]
        # 4'. through LN2: dres is the gradient of (h1 + ffn + b_2)
        K.layernorm_backward(dh, c["xhat2"], c["rstd2"], p["ln2_g"], dres, g["ln2_g"], g["ln2_b"])
        K.column_sums(dres, g["b_2"])
        a = c["a"]
        np.matmul(a.T, dres, out=g["W_2"])
        da = dres @ p["W_2"].T                                              # (N, d_ff)
        K.relu_backward(da, a, g["b_1"])
        np.matmul(c["h1"].T, da, out=g["W_1"])
        dh1 = da @ p["W_1"].T
        dh1 += dres                                                         # the residual path
        # 3'. through LN1: dres is the gradient of (x + mha + b_O)
        K.layernorm_backward(dh1, c["xhat1"], c["rstd1"], p["ln1_g"], dres, g["ln1_g"], g["ln1_b"])
        K.column_sums(dres, g["b_O"])
        np.matmul(c["ctx"].T, dres, out=g["W_O"])
        dctxT = (p["W_O"] @ dres.T).reshape(d, T, B)                        # (d, T, B)
        # 2'. attention core, then the packed projection
        K.attention_backward(c["qkvT"], cache["P"][i], dctxT, H, dqkvT, db_qkv)
        g["b_Q"][:] = db_qkv[:d]
        g["b_K"][:] = db_qkv[d:2 * d]
        g["b_V"][:] = db_qkv[2 * d:]
        dqkv_rows = dqkvT.reshape(3 * d, N)                                  # (3d, N)
        dW_qkvT = dqkv_rows @ c["x"]                                        # (3d, d)
        g["W_Q"][:] = dW_qkvT[:d].T
        g["W_K"][:] = dW_qkvT[d:2 * d].T
        g["W_V"][:] = dW_qkvT[2 * d:].T
        dh = dqkv_rows.T @ c["W_qkv"].T                                    # (N, d)
        dh += dres                                                          # the residual path
    # 1'. embeddings and positions
    d_pos = grads["pos"] if cfg.positional == "learned" else np.empty((T, d), dtype=dtype)
    if cfg.positional == "learned" and T < cfg.seq_len:
        d_pos[T:] = 0.0
        d_pos = d_pos[:T]
    K.embed_backward(tok, dh, grads["embed"], d_pos)
    return float(loss), int(n_correct)


@functools.lru_cache(maxsize=1)
def _openblas_local_threads():
    """``openblas_set_num_threads_local`` of NumPy's bundled OpenBLAS, or None where there is none."""
    folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "lib*openblas*.so*"))):
        try:
            fn = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
        return fn
    return None


@contextlib.contextmanager
def single_threaded_blas():
    """Run NumPy's matrix products on one thread, for the calling thread only, then restore.

    The encoder's products are tiny (1024 x 32 by 32 x 32): a second BLAS thread saves little,
    and when the cores are shared (Streamlit sessions, other processes) spinning BLAS threads can
    make a step ten times slower. A no-op where NumPy's BLAS offers no per-thread setting.
    """
    fn = _openblas_local_threads()
    if fn is None:
        yield
        return
    previous = fn(1)
    try:
        yield
    finally:
        fn(previous)


# ----------------------------------------------------------------------------------------------
# Adam
# ----------------------------------------------------------------------------------------------
def pack(params: dict) -> tuple[np.ndarray, dict]:
    """Copy parameters into one flat buffer; return it and a dict of views into it (same names).

    Updating the flat buffer (one Adam kernel call) updates every view at once.
    """
    dtype = next(iter(params.values())).dtype
    total = sum(v.size for v in params.values())
    flat = np.empty(total, dtype=dtype)
    views, offset = {}, 0
    for name, value in params.items():
        view = flat[offset:offset + value.size].reshape(value.shape)
        view[...] = value
        views[name] = view
        offset += value.size
    return flat, views


class Adam:
    """Adam (Kingma & Ba) with bias correction, on one flat parameter buffer.

    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``;
    ``p -= lr * m_hat / (sqrt(v_hat) + eps)`` with ``m_hat = m / (1-b1^t)``, ``v_hat = v / (1-b2^t)``.
    """

    def __init__(self, size: int, dtype=np.float32, lr: float = 3e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = float(lr), float(betas[0]), float(betas[1]), float(eps)
        self.m = np.zeros(size, dtype=dtype)
        self.v = np.zeros(size, dtype=dtype)
        self.t = 0

    def step(self, flat_params: np.ndarray, flat_grads: np.ndarray) -> None:
        """Update ``flat_params`` in place from ``flat_grads``."""
        self.t += 1
        K.adam_update(flat_params, flat_grads, self.m, self.v, self.lr, self.beta1, self.beta2,
                      self.eps, self.t)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "eps": self.eps,
                "m": self.m.copy(), "v": self.v.copy(), "t": self.t}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Adam":
        opt = cls(state["m"].size, state["m"].dtype, state["lr"], (state["beta1"], state["beta2"]), state["eps"])
        opt.m[:] = state["m"]
        opt.v[:] = state["v"]
        opt.t = int(state["t"])
        return opt


# ----------------------------------------------------------------------------------------------
# save and load
# ----------------------------------------------------------------------------------------------
_LAYER_NAME = re.compile(r"^layers\.(\d+)\.(\w+)$")


# Settings the weights alone do not determine, stored beside them as "config.<name>" arrays.
SETTINGS_PREFIX = "config."


def save(params: dict, path_or_file, cfg: EncoderConfig | None = None) -> None:
    """Write the parameters to an ``.npz`` archive, one array per design name.

    With ``cfg``, the head count and the kind of positional encoding are stored too
    (``config.n_heads``, ``config.positional``): the arrays' shapes do not tell them.
    """
    arrays = {name: np.asarray(value) for name, value in params.items()}
    if cfg is not None:
        arrays[SETTINGS_PREFIX + "n_heads"] = np.array(cfg.n_heads)
        arrays[SETTINGS_PREFIX + "positional"] = np.array(cfg.positional)
    np.savez(path_or_file, **arrays)


def load(path_or_file, cfg: EncoderConfig | None = None) -> dict[str, np.ndarray]:
    """Read parameters from an ``.npz`` file (no pickles) and check them.

    With ``cfg`` the names, shapes, dtype and finiteness are checked against it; without, a config
    is inferred (:func:`infer_config`, with the settings the file stores) and the parameters are
    checked against that. A file that is not a valid archive, or holds the wrong arrays, raises
    ``ValueError`` saying what is wrong.
    """
    return load_with_settings(path_or_file, cfg)[0]


def load_with_settings(path_or_file, cfg: EncoderConfig | None = None) -> tuple[dict, EncoderConfig, dict]:
    """:func:`load`, returning ``(params, cfg, settings)``: the parameters, the config they were
    checked against, and the settings the file stores (``{"n_heads": int, "positional": str}``,
    or fewer keys: none for a file saved without a config)."""
    raw = _read_bytes(path_or_file)
    if not raw.startswith(b"PK"):
        what = "a single .npy array" if raw.startswith(b"\x93NUMPY") else "it does not start like a zip file"
        raise ValueError(f"Could not read the parameter file: it is not a valid .npz archive ({what}).")
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as archive:
            params = {name: np.ascontiguousarray(archive[name]) for name in archive.files}
    except ValueError as err:   # e.g. an object array, which would need unpickling
        raise ValueError(f"Could not read the parameter file: {err}") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError, RuntimeError) as err:
        reason = str(err) or type(err).__name__
        raise ValueError(f"Could not read the parameter file: it is not a valid .npz archive ({reason}).") from None
    settings = _take_settings(params)
    if cfg is None:
        cfg = infer_config(params, **settings)
    else:
        check_params(params, cfg)
    return params, cfg, settings


def _take_settings(arrays: dict) -> dict:
    """Remove the ``config.*`` arrays from ``arrays`` and return them as checked settings."""
    settings = {}
    for name in [n for n in arrays if n.startswith(SETTINGS_PREFIX)]:
        key, value = name[len(SETTINGS_PREFIX):], arrays.pop(name)
        one = value.reshape(()) if value.size == 1 else None     # stored as a scalar (read back 1-D)
        if key == "n_heads" and one is not None and value.dtype.kind in "iu" and 1 <= one <= 4096:
            settings[key] = int(one)
        elif key == "positional" and one is not None and value.dtype.kind == "U" \
                and str(one) in POSITIONAL_CHOICES:
            settings[key] = str(one)
        else:
            raise ValueError(f"The parameter file's setting {name!r} is not one this encoder knows "
                             f"(n_heads: a whole number; positional: one of {', '.join(POSITIONAL_CHOICES)}).")
    return settings


def _read_bytes(path_or_file) -> bytes:
    """The whole file: from a path, raw bytes, or a binary file object (e.g. a Streamlit upload)."""
    if isinstance(path_or_file, (bytes, bytearray)):
        return bytes(path_or_file)
    if isinstance(path_or_file, (str, os.PathLike)):
        try:
            with open(path_or_file, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            raise ValueError(f"Could not read the parameter file: {os.fspath(path_or_file)} does not exist.") from None
        except OSError as err:
            raise ValueError(f"Could not read the parameter file: {err}.") from None
    if hasattr(path_or_file, "read"):
        if hasattr(path_or_file, "seek"):
            path_or_file.seek(0)
        data = path_or_file.read()
        if isinstance(data, (bytes, bytearray)):
            return bytes(data)
    raise ValueError("Could not read the parameter file: expected a path, bytes or a binary file object.")


def infer_config(params: dict, *, n_heads: int | None = None, positional: str | None = None,
                 ln_eps: float = 1e-5) -> EncoderConfig:
    """The :class:`EncoderConfig` a parameter dict belongs to (e.g. an uploaded file), checked.

    The weights do not determine the head count: ``n_heads`` when given, else the default 4 when
    that divides ``d_model``, else 1. ``positional`` is "learned" when a ``pos`` array is present
    (giving another kind then is an error), else "sinusoidal" unless given.
    """
    if not isinstance(params, dict) or "embed" not in params or "W_cls" not in params:
        raise ValueError("These are not encoder parameters: 'embed' and 'W_cls' are required.")
    embed, W_cls = np.asarray(params["embed"]), np.asarray(params["W_cls"])
    if embed.ndim != 2 or W_cls.ndim != 2:
        raise ValueError(f"'embed' and 'W_cls' must be matrices, got shapes {embed.shape} and {W_cls.shape}.")
    V, d = embed.shape
    layer_ids = {int(m.group(1)) for name in params if (m := _LAYER_NAME.match(name))}
    n_layers = len(layer_ids)
    if n_layers == 0 or layer_ids != set(range(n_layers)):
        raise ValueError(f"Layers must be numbered 0..L-1 with at least one layer, found {sorted(layer_ids)}.")
    W_1 = np.asarray(params.get("layers.0.W_1", np.empty((0, 0))))
    if W_1.ndim != 2:
        raise ValueError("'layers.0.W_1' must be a matrix.")
    if "pos" in params:
        pos = np.asarray(params["pos"])
        if pos.ndim != 2:
            raise ValueError(f"'pos' must be a (seq_len, d_model) matrix, got shape {pos.shape}.")
        if positional not in (None, "learned"):
            raise ValueError(f"The parameters hold a learned position table ('pos'), but the positional "
                             f"encoding is given as {positional!r}.")
        seq_len, positional = pos.shape[0], "learned"
    else:
        seq_len = 16
        positional = positional or "sinusoidal"
        if positional == "learned":
            raise ValueError("positional='learned' needs a 'pos' array in the parameters.")
    if n_heads is None:
        n_heads = 4 if d % 4 == 0 else 1
    cfg = EncoderConfig(vocab_size=V, seq_len=seq_len, d_model=d, n_heads=n_heads, d_ff=W_1.shape[1],
                        n_layers=n_layers, n_classes=W_cls.shape[1], positional=positional, ln_eps=ln_eps)
    check_params(params, cfg)
    return cfg
