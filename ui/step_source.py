"""The source a training page shows for a training step: what one step of the page's model on that
track ran (``core.training.step_record``), recorded once per server for each model and track."""
from __future__ import annotations

import streamlit as st

from core import warmup
from core.recording import Record
from core.training import step_record

LABELS = {"encoder": warmup.ENCODER, "decoder": warmup.DECODER}   # each kind's compiled step, in the warm-up
RECORDERS = {"encoder": step_record.encoder_step, "decoder": step_record.decoder_step}
STILL_COMPILING = "The compiled step is still compiling in the background: its source shows here once it has loaded."


@st.cache_resource(show_spinner=False, max_entries=16)
def _recorded(kind: str, cfg, track: str, warming_up: bool) -> Record:
    return RECORDERS[kind](cfg, track)


def step_record_of(kind: str, cfg, track: str) -> Record | None:
    """What one training step of model ``cfg`` (``kind``: "encoder" or "decoder") runs on ``track``
    (shared, read only); None while the compiled step still compiles in the background (running it
    would compile it here). Recorded again once the warm-up has ended: until then the readable
    step runs the NumPy twins of the loops not loaded yet."""
    if track == "compiled" and not warmup.ready(LABELS[kind]):
        return None
    return _recorded(kind, cfg, track, warmup.running() is not None)
