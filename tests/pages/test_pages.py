"""Every page listed in ``app.py``, run headless through ``streamlit.testing.v1.AppTest``.

- each page renders with no exception and shows a title;
- the router (``app.py``) renders, with its sidebar, and reaches every page through ``switch_page``;
- a seeded fuzz: random values, within each widget's own bounds, for the sliders, number inputs,
  select boxes, select sliders, radios, toggles and text inputs of each page (text: empty, blank,
  over-long, odd characters). A page may answer with ``st.error`` / ``st.warning``; it may not
  raise.

The pages are read from ``app.py`` (see ``browser_support.discover_pages``), so a page added to
the router later is covered here without editing this file.
"""
from __future__ import annotations

import random

import pytest
from streamlit.testing.v1 import AppTest

from browser_support import APP, discover_pages, skip_or_fail

PAGES = discover_pages()
FIRST_RUN_S = 180   # a cold Numba cache compiles a page's kernels on its first run
RUN_S = 60
FUZZ_ROUNDS = 8     # widget changes per page (each followed by a rerun)
FUZZ_SEED = 20240611

# Text a student might type, or paste by mistake.
ODD_TEXT = ["", "   ", "a", "the the the the", "Ünïcødé wörds — ok?", "x" * 400,
            " ".join(f"w{i}" for i in range(40)), "1 2 3 4 5", "\t\n tabs and\nnewlines ", "<b>html</b> & ; , ="]


def _page_or_skip(info):
    if not info.exists:
        skip_or_fail(f"{info.path} is listed in app.py but not written yet")
    return AppTest.from_file(str(info.file), default_timeout=RUN_S)


def _problems(at: AppTest) -> list[str]:
    return [f"{e.message}\n{''.join(e.stack_trace) if e.stack_trace else ''}"[:2000] for e in at.exception]


@pytest.mark.parametrize("info", PAGES, ids=[p.name for p in PAGES])
def test_page_renders(info):
    at = _page_or_skip(info).run(timeout=FIRST_RUN_S)
    assert _problems(at) == [], f"{info.path} raised"
    assert len(at.title) >= 1, f"{info.path} shows no st.title"
    assert at.title[0].value.strip(), f"{info.path} has an empty title"


def test_router_renders_and_reaches_every_page():
    missing = [p.path for p in PAGES if not p.exists]
    if missing:
        skip_or_fail(f"app.py lists pages not written yet: {', '.join(missing)}")
    at = AppTest.from_file(str(APP), default_timeout=RUN_S).run(timeout=FIRST_RUN_S)
    assert _problems(at) == []
    assert "Backend" in [s.label for s in at.sidebar.selectbox]
    assert at.sidebar.caption and at.sidebar.caption[0].value.startswith("Running on:")
    assert at.title, "the default page shows no title"
    for info in PAGES:
        at.switch_page(info.path).run(timeout=FIRST_RUN_S)
        assert _problems(at) == [], f"{info.path} raised when reached through the router"
        assert at.title, f"{info.path} shows no title when reached through the router"


def test_router_float32_precision():
    """The sidebar's float32 choice reaches the pages that compute."""
    missing = [p.path for p in PAGES if not p.exists]
    if missing:
        skip_or_fail(f"app.py lists pages not written yet: {', '.join(missing)}")
    at = AppTest.from_file(str(APP), default_timeout=RUN_S).run(timeout=FIRST_RUN_S)
    at.sidebar.radio[0].set_value("float32").run()
    for info in PAGES:
        at.switch_page(info.path).run(timeout=FIRST_RUN_S)
        assert _problems(at) == [], f"{info.path} raised in float32"


# --- fuzz -----------------------------------------------------------------------------------------


def _fuzzable(at: AppTest) -> list:
    """Widgets in the main area whose value can be set to a random allowed value."""
    kinds = ("slider", "number_input", "selectbox", "select_slider", "radio", "toggle", "checkbox",
             "text_input", "text_area")
    found = []
    for kind in kinds:
        for w in getattr(at.main, kind, []):
            if not getattr(w, "disabled", False):
                found.append((kind, w))
    return found


def _random_number(rng: random.Random, lo, hi, step, integer: bool):
    lo = -1e6 if lo is None else lo
    hi = 1e6 if hi is None else hi
    pick = rng.choice(["lo", "hi", "mid", "any"])
    value = {"lo": lo, "hi": hi, "mid": (lo + hi) / 2}.get(pick, rng.uniform(lo, hi))
    if integer:
        return int(round(value))
    if step:  # stay on the widget's grid, as the browser does
        value = lo + round((value - lo) / step) * step
    return float(min(max(value, lo), hi))


def _random_value(rng: random.Random, kind: str, w):
    if kind == "slider":
        integer = isinstance(w.value, int) if not isinstance(w.value, tuple) else isinstance(w.value[0], int)
        one = lambda: _random_number(rng, w.min, w.max, w.step, integer)  # noqa: E731
        if isinstance(w.value, tuple):
            return tuple(sorted((one(), one())))
        return one()
    if kind == "number_input":
        integer = isinstance(w.value, int) and not isinstance(w.value, bool)
        return _random_number(rng, w.min, w.max, w.step, integer)
    if kind in ("selectbox", "radio", "select_slider"):
        options = _raw_options(w)
        if not options:
            return None
        if kind == "select_slider" and isinstance(w.value, tuple):
            return tuple(sorted(rng.sample(options, 2), key=options.index))
        return rng.choice(options)
    if kind in ("toggle", "checkbox"):
        return not w.value
    if kind in ("text_input", "text_area"):
        text = rng.choice(ODD_TEXT)
        max_chars = getattr(w, "max_chars", None)
        return text[:max_chars] if max_chars else text
    return None


def _raw_options(w) -> list:
    """The option values behind a choice widget's labels, where they can be recovered.

    AppTest sees only the labels; ``set_value`` wants the values. A label is its own value when
    ``format_func`` leaves it unchanged; a ``dict.get`` format_func is inverted; other options
    are left out of the fuzz.
    """
    fmt = w.format_func
    owner = getattr(fmt, "__self__", None)
    inverse = {str(v): k for k, v in owner.items()} if isinstance(owner, dict) else {}
    raw = []
    for label in w.options:
        try:
            if str(fmt(label)) == label:
                raw.append(label)
                continue
        except Exception:  # noqa: BLE001 - a format_func that wants the raw type
            pass
        if label in inverse:
            raw.append(inverse[label])
    if w.value is not None and not isinstance(w.value, tuple) and w.value not in raw:
        raw.append(w.value)
    return raw


def _set(kind: str, w, value) -> None:
    w.set_value(value)


@pytest.mark.parametrize("info", PAGES, ids=[p.name for p in PAGES])
def test_fuzz_widgets(info):
    rng = random.Random(f"{FUZZ_SEED}-{info.name}")
    at = _page_or_skip(info).run(timeout=FIRST_RUN_S)
    assert _problems(at) == []
    done = []
    for _ in range(FUZZ_ROUNDS):
        widgets = _fuzzable(at)
        if not widgets:
            break
        kind, w = rng.choice(widgets)
        value = _random_value(rng, kind, w)
        if value is None:
            continue
        done.append(f"{kind} {w.label!r} <- {value!r}"[:160])
        _set(kind, w, value)
        at.run(timeout=RUN_S)
        assert _problems(at) == [], f"{info.path} raised after:\n  " + "\n  ".join(done)
        # A refused value is shown, not raised; the page still has its title.
        assert at.title, f"{info.path} lost its title after:\n  " + "\n  ".join(done)
