"""Saving and loading the tiny encoder's parameters: ``.npz`` archives, one array per name of the
one vocabulary (``embed``, ``blocks.{i}.attn.W_Q``, ``classifier.W`` ...), with the settings the
weights alone do not determine stored beside them.

Files saved before the one vocabulary name the same arrays ``layers.{i}.W_Q``, ``layers.{i}.ln1_g``,
``W_cls`` ...: they still load, renamed by their own format, :mod:`core.model.formats.legacy_npz`.
"""
from __future__ import annotations

import io
import os
import re
import zipfile

import numpy as np

from core.model import params as P
from core.model import presets
from core.model.formats import legacy_npz
from core.model.config import EMBEDDING_POSITIONAL, TransformerConfig, check_params, param_shapes

# Settings the weights alone do not determine, stored beside them as "config.<name>" arrays.
SETTINGS_PREFIX = "config."

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def save(params: dict, path_or_file, cfg: TransformerConfig | None = None) -> None:
    """Write the parameters to an ``.npz`` archive, one array per name of the one vocabulary.

    With ``cfg``, the head count and the kind of positional encoding are stored too
    (``config.n_heads``, ``config.positional``): the arrays' shapes do not tell them.
    """
    arrays = {name: np.asarray(value) for name, value in params.items()}
    if cfg is not None:
        arrays[SETTINGS_PREFIX + "n_heads"] = np.array(cfg.n_heads)
        arrays[SETTINGS_PREFIX + "positional"] = np.array(cfg.positional)
    np.savez(path_or_file, **arrays)


def load(path_or_file, cfg: TransformerConfig | None = None) -> dict[str, np.ndarray]:
    """Read parameters from an ``.npz`` file (no pickles) and check them.

    Arrays under the older names (:mod:`core.model.formats.legacy_npz`) are renamed to the one
    vocabulary's. With ``cfg`` the names, shapes, dtype and finiteness are checked against it;
    without, a config is inferred (:func:`infer_config`, with the settings the file stores) and the
    parameters are checked against that. Returned in ``param_shapes(cfg)`` order. A file that is not
    a valid archive, or holds the wrong arrays, raises ``ValueError`` saying what is wrong.
    """
    return load_with_settings(path_or_file, cfg)[0]


def load_with_settings(path_or_file, cfg: TransformerConfig | None = None) -> tuple[dict, TransformerConfig, dict]:
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
    params = legacy_npz.params_from(params)
    if cfg is None:
        cfg = infer_config(params, **settings)
    else:
        check_params(params, cfg, finite=True)
    return {name: params[name] for name in param_shapes(cfg)}, cfg, settings


def _take_settings(arrays: dict) -> dict:
    """Remove the ``config.*`` arrays from ``arrays`` and return them as checked settings."""
    settings = {}
    for name in [n for n in arrays if n.startswith(SETTINGS_PREFIX)]:
        key, value = name[len(SETTINGS_PREFIX):], arrays.pop(name)
        one = value.reshape(()) if value.size == 1 else None     # stored as a scalar (read back 1-D)
        if key == "n_heads" and one is not None and value.dtype.kind in "iu" and 1 <= one <= 4096:
            settings[key] = int(one)
        elif key == "positional" and one is not None and value.dtype.kind == "U" \
                and str(one) in EMBEDDING_POSITIONAL:
            settings[key] = str(one)
        else:
            raise ValueError(f"The parameter file's setting {name!r} is not one this encoder knows "
                             f"(n_heads: a whole number; positional: one of {', '.join(EMBEDDING_POSITIONAL)}).")
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
                 ln_eps: float = 1e-5) -> TransformerConfig:
    """The encoder classifier (:func:`core.model.presets.encoder_classifier`) a parameter dict,
    named in the one vocabulary, belongs to (e.g. an uploaded file), checked.

    The weights do not determine the head count: ``n_heads`` when given, else the default 4 when
    that divides ``d_model``, else 1. ``positional`` is "learned" when a ``pos`` array is present
    (giving another kind then is an error), else "sinusoidal" unless given.
    """
    if not isinstance(params, dict) or "embed" not in params or "classifier.W" not in params:
        raise ValueError("These are not encoder parameters: 'embed' and 'classifier.W' are required.")
    embed, W = np.asarray(params["embed"]), np.asarray(params["classifier.W"])
    if embed.ndim != 2 or W.ndim != 2:
        raise ValueError(f"'embed' and 'classifier.W' must be matrices, got shapes {embed.shape} and {W.shape}.")
    V, d = embed.shape
    block_ids = {int(m.group(1)) for name in params if (m := _BLOCK.match(name))}
    n_layers = len(block_ids)
    if n_layers == 0 or block_ids != set(range(n_layers)):
        raise ValueError(f"Blocks must be numbered 0..L-1 with at least one block, found {sorted(block_ids)}.")
    W_1 = np.asarray(params.get("blocks.0.ffn.W_1", np.empty((0, 0))))
    if W_1.ndim != 2:
        raise ValueError("'blocks.0.ffn.W_1' must be a matrix.")
    if "pos" in params:
        pos = np.asarray(params["pos"])
        if pos.ndim != 2:
            raise ValueError(f"'pos' must be a (n_ctx, d_model) matrix, got shape {pos.shape}.")
        if positional not in (None, "learned"):
            raise ValueError(f"The parameters hold a learned position table ('pos'), but the positional "
                             f"encoding is given as {positional!r}.")
        n_ctx, positional = pos.shape[0], "learned"
    else:
        n_ctx = 16
        positional = positional or "sinusoidal"
        if positional == "learned":
            raise ValueError("positional='learned' needs a 'pos' array in the parameters.")
    if n_heads is None:
        n_heads = 4 if d % 4 == 0 else 1
    cfg = presets.encoder_classifier(vocab_size=V, n_ctx=n_ctx, d_model=d, n_heads=n_heads, d_ff=W_1.shape[1],
                                     n_layers=n_layers, n_classes=W.shape[1], positional=positional, ln_eps=ln_eps)
    check_params(params, cfg, finite=True)
    return cfg
