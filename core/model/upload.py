"""An uploaded weights file, checked before it becomes a model: size, unpacked size, names,
shapes and values (``core.model.encoder_io.load_with_settings`` reads the archive; no pickles)."""
from __future__ import annotations

import dataclasses
import io
import zipfile

from core import limits
from core.model import encoder_io
from core.model.config import TransformerConfig, check_params


def weights_from_upload(raw: bytes, *, n_heads: int, positional: str,
                        max_mb: float = limits.MAX_UPLOAD_MB) -> tuple[dict, TransformerConfig, list[str]]:
    """Check an uploaded ``.npz`` and rebuild its config: ``(params, cfg, notes)``.

    The archive is read by ``core.model.encoder_io.load_with_settings`` (no pickles; every name, shape and
    value checked). Files saved by this dashboard record the head count and the positional
    encoding; for a file that does not, those come from the page's settings (``n_heads`` when it
    divides the file's d_model) and ``notes`` says so. Anything wrong raises ``ValueError``.
    """
    size = len(raw)
    if size > max_mb * 2 ** 20:
        raise ValueError(f"The file is {size / 2 ** 20:.1f} MB; weight files may be at most {max_mb:g} MB.")
    if size == 0:
        raise ValueError("The file is empty.")
    _check_unpacked_size(raw, max_mb)
    params, cfg, stored = encoder_io.load_with_settings(raw)    # infers a config and checks everything
    notes = []
    heads = stored.get("n_heads", int(n_heads))
    if "n_heads" not in stored:
        if heads < 1 or cfg.d_model % heads:
            notes.append(f"The file does not record the number of heads, and {heads} does not divide its "
                         f"d_model = {cfg.d_model}: using {cfg.n_heads}.")
            heads = cfg.n_heads
        else:
            notes.append(f"The file does not record the number of heads: using {heads} from the settings.")
    if "positional" in stored or cfg.positional == "learned":
        kind = cfg.positional
    elif positional in ("sinusoidal", "none"):
        kind = positional
        notes.append(f"The file has no learned position table: using the '{kind}' encoding from the settings.")
    else:
        kind = "sinusoidal"
        notes.append("The settings ask for learned positions but the file has no 'pos' array: using sinusoidal.")
    cfg = dataclasses.replace(cfg, n_heads=heads, positional=kind)
    check_params(params, cfg)
    return params, cfg, notes


def _check_unpacked_size(raw: bytes, max_mb: float) -> None:
    """Refuse an archive whose arrays would unpack to more than ``max_mb`` (a compressed bomb)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return   # not a zip archive: core.model.encoder_io.load says so in its own words
    if unpacked > max_mb * 2 ** 20:
        raise ValueError(f"The arrays in the file would take {unpacked / 2 ** 20:.1f} MB once unpacked; "
                         f"weight files may hold at most {max_mb:g} MB.")
