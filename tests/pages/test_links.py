"""Every page's link, through AppTest: the link reopens the page as it was, and a bad link is named.

For every page of ``app.py`` that keeps its state in the address (``ui.state.restore``):

- the controls the page draws (widgets and editable matrices keyed ``ui.state.key(page, name)``)
  are exactly the fields of its link spec: a control left out of the spec, or a field with no
  control, fails;
- round trip: each field set to a value other than its default, the page run, the link read back
  from ``st.query_params``; a fresh session opened on that link shows every control at that value;
- a bad link: every field given a value it does not allow (out of range, NaN, infinite, not a
  number, an unknown choice, a bad matrix, over-long text), plus names the page does not have; each
  is named in a warning with the value given, and none stays in the address;
- values the spec alone cannot check (a head the model does not have, a query row past the end of
  the sentence, a sentence of too many words) are named the same way, and the address then holds
  the value used;
- a number box sent a number it cannot take (huge, infinite, NaN, a fraction in a whole-number
  box) says so, and keeps its value.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import Widget

from browser_support import discover_pages
from page_support import answer_everything
from ui import state

PAGES = [p for p in discover_pages() if p.exists and "state.restore(" in p.file.read_text(encoding="utf-8")]
ACTIONS = {"button", "download_button", "form_submit_button", "file_uploader", "page_link"}   # not state


def _matrix(rows: int, cols: int, start: float = 0.5) -> list[list[float]]:
    """A matrix of distinct entries, each exact in the link's 8 digits."""
    return [[start + 0.25 * (i * cols + j) - 1.0 for j in range(cols)] for i in range(rows)]


def _finished_encoder_run():
    """A finished "Train an encoder" run in the session, as the training page leaves it (tiny)."""
    from core.training.encoder_runs import EncoderRun
    from ui.trainer import Trainer

    model = _tiny_model("increasing", 2)
    trainer = Trainer()
    trainer.load(model.params, model.cfg, EncoderRun(task="increasing", seed=2, n_train=200, n_val=40, n_test=60))
    return trainer


@functools.lru_cache(maxsize=2)
def _tiny_model(task: str, seed: int):
    from core.lessons import inside

    return inside.train_default(task, seed, n_train=200, n_val=40, n_test=60, steps=20)


# The session hooks each page's own tests set (tiny data sets, few steps, fast polls).
HOOKS = {
    "inside_model": {"inside_model.data_sizes": (200, 40, 60), "inside_model.steps": 20},
    "training": {"training.data_sizes": (200, 40, 40), "training.poll_seconds": 0.2},
    "decoder": {"decoder.poll_seconds": 0.2},
}
# Session entries a scenario needs beyond the fields (made when the scenario runs).
MAKERS = {"trained_run": lambda: {"training.trainer": _finished_encoder_run()}}   # shared by two pages

# Values other than the defaults that the page can use as they stand, where a field's own range
# is not enough (a sentence and the matrices typed for it, a head count that divides d_model).
# A page may need several scenarios to draw every control (an encoder and a decoder); each field
# must be read back from its control in at least one of them. The names under ">" are set after the
# page's first run (which sets them from its other choices: a task's steps, a preset's model); None
# leaves a field at its default.
SCENARIOS = {
    "one_head": [{"sentence": "a b c", "source": "hand", "d_k": 3, "query": 2, "temperature": 2.0,
                  "Q": _matrix(3, 3), "K": _matrix(3, 3, 1.5)}],
    "multi_head": [{"T": 5, "d_k": 3, "H": 8, "open": 5, "row": 2, "g1": 6.5}
                   | {f"p{h}": "custom" for h in range(1, 9)}
                   | {f"q{h}": _matrix(5, 3, h) for h in range(1, 9)}
                   | {f"k{h}": _matrix(5, 3, -h) for h in range(1, 9)},
                   {"H": 8, "p1": "self", "p2": "nearby", "g2": 0.5} | {f"{m}{h}": None for m in "qk" for h in range(1, 9)}],
    "filter_bank": [{"wv": "custom", "wo": "swap", "gain": 6.5, "WV": _matrix(4, 4), "WO": _matrix(4, 4, 2.0)}],
    "parameters": [{">": ["arch", "pos", "lm", "tied"], "d_model": 96, "heads": 12, "ff_auto": False, "d_ff": 200, "preset": "bert_base",
                    "arch": "encoder-decoder", "pos": "sinusoidal", "lm": True, "tied": False}],
    "positional": [{"a": "dog bites man again", "b": "man bites dog again", "d": 130, "from": 3, "k": 4}],
    "masks": [{"lengths": "4, 2", "heads": "4", "sentence": "the cat sat", "source": "je suis", "target": "i am"}],
    "induction": [{"steps": 20, "seed": 1, "layer": 1, "head": 2, "example": 7}],
    "training": [{"heads": 2, "d_model": 16, "layers": 1, "steps": 5, "lr": "0.01", "positional": "learned",
                  "example": 3, "@": "trained_run"}],
    "inside_model": [{"source": "default", "task": "increasing", "seed": 1, "example": 3, "layer": 2, "mode": "mean", "show": "L2H3",
                      "remove": "L1H2,L2H1"},
                     {"source": "trained", "show": "L1H1", "remove": "L1H2", "layer": 1, "@": "trained_run"}],
    "decoder": [{">": ["steps"], "task": "lm", "steps": 5, "prompt": "the c", "top_k": "5", "top_p": 0.5, "temperature": 0.5,
                 "layer": 2, "head": 2, "step": 3},
                {">": ["steps"], "task": "sort", "steps": 5, "example": 3, "layer": 2, "head": 2, "step": 3, "top_k": "3"}],
    "real_model": [{"which": "minilm", "layer": 2, "head": 3, "how": "mean", "text": "The dog sat.",
                    "sentences": "One cat.\nTwo dogs."},
                   {"which": "tiny_gpt", "layer": 2, "head": 2, "how": "patch", "other": "a b c", "temperature": 1.5,
                    "top_k": 7, "top_p": 0.5, "n_new": 5, "seed": 3},
                   {"which": "other", "model": "/no/such/folder"}],
    "make_it_fast": [{"T": "6, 32", "H": 2, "dk": "8", "op": "without weights (fused)"}],
}
# Controls whose key is not the field's name: {control: (field, control value -> field value,
# field value -> control value)}. The multiselect of heads removed holds a list; the link holds
# it as "L1H2,L2H1".
ALIASES = {"inside_model": {"remove_heads": ("remove", ",".join, lambda text: text.split(","))}}


def _other(field: state.Field):
    """A value other than the field's default, within its range."""
    if field.kind == "int":
        return field.default + 1 if field.default + 1 <= field.hi else field.default - 1
    if field.kind == "float":
        return field.default + 1.0 if field.default + 1.0 <= field.hi else field.default - 1.0 \
            if field.default - 1.0 >= field.lo else (field.lo + field.default) / 2
    if field.kind == "bool":
        return not field.default
    if field.kind == "choice":
        return next(c for c in field.choices if c != field.default)
    if field.kind == "text":
        return (field.default + " again").strip()
    raise AssertionError("a matrix field needs its value in SCENARIOS (its shape is the page's)")


def _open(info, link=None, maker=None, values=None, spec=None) -> AppTest:
    """The page run once in a fresh session, opened from ``link``, with ``values`` in the session (and
    every question answered, so no control is locked)."""
    at = AppTest.from_file(str(info.file), default_timeout=180)
    answer_everything(at)
    for k, v in HOOKS.get(info.name, {}).items():
        at.session_state[k] = v
    for k, v in (MAKERS[maker]() if maker else {}).items():
        at.session_state[k] = v
    for name, text in (link or {}).items():
        at.query_params[name] = text
    return _set(at, info.name, spec or {}, values or {})


def _ran(at: AppTest) -> AppTest:
    assert not at.exception, [e.message for e in at.exception]
    return at


def _set(at: AppTest, page: str, spec: dict, values: dict) -> AppTest:
    """The values put in the session, as the page's widgets (and matrix editors) would, then a run.

    Set before a page's first run, a value needs no widget of the run before to accept it (a head
    that a smaller H did not offer)."""
    through = {field: (control, write) for control, (field, _, write) in ALIASES.get(page, {}).items()}
    for name, value in values.items():
        if name in through:
            at.session_state[state.key(page, through[name][0])] = through[name][1](value)
        elif spec[name].kind == "matrix":
            at.session_state[state.pending_key(page, name)] = value
        else:
            at.session_state[state.key(page, name)] = value
    return _ran(at.run())


def _walk(block):
    yield block
    for child in getattr(block, "children", {}).values():
        yield from _walk(child)


def controls(at: AppTest, page: str) -> dict:
    """Every control the page drew under its own keys, by the link field it stands for:
    ``{name: value shown}`` (an editable matrix as a float array)."""
    found = {}
    for node in [*_walk(at.main), *_walk(at.sidebar)]:
        if isinstance(node, Widget) and node.type not in ACTIONS and node.key and node.key.startswith(page + "."):
            name, value = node.key[len(page) + 1:], node.value
        elif node.type == "dataframe" and node.proto.editing_mode and f"-{page}." in node.proto.id:
            key = node.proto.id.split("-", 2)[2].split("#")[0]          # "$$ID-<hash>-one_head.Q#0"
            name = key[len(page) + 1:].split(".")[0]                     # "filter_bank.WO.identity" -> "WO"
            value = node.value.iloc[:, 1:].astype(float).to_numpy()      # after the row labels
        else:
            continue
        name, read, _ = ALIASES.get(page, {}).get(name, (name, None, None))
        found[name] = read(value) if read else value
    return found


def spec_of(at: AppTest, page: str) -> dict:
    specs = at.session_state[state.SPECS_KEY]
    assert page in specs, f"{page} restores its state but registered no link spec"
    return specs[page]


def shows(field: state.Field, shown, value) -> bool:
    if field.kind == "matrix":
        return np.shape(shown) == np.shape(value) and np.allclose(shown, value, rtol=0, atol=1e-12)
    return state.format_value(field, shown) == state.format_value(field, value)


@pytest.mark.parametrize("info", PAGES, ids=[p.name for p in PAGES])
def test_a_link_reopens_every_control_at_its_value(info):
    page = info.name
    default = _open(info)
    spec = spec_of(default, page)
    seen, read_back = set(controls(default, page)), set()                # the controls at the defaults
    for scenario in SCENARIOS.get(page, [{}]):
        scenario = dict(scenario)
        maker = scenario.pop("@", None)
        later = scenario.pop(">", ())
        values = {name: scenario[name] if name in scenario else _other(field) for name, field in spec.items()}
        values = {name: value for name, value in values.items() if value is not None}     # None: the default
        at = _open(info, maker=maker, spec=spec, values={n: v for n, v in values.items() if n not in later})
        at = _set(at, page, spec, {n: v for n, v in values.items() if n in later}) if later else at
        link = {name: at.query_params[name] for name in at.query_params}
        used = spec_of(at, page)                    # its defaults may follow a choice (a preset, a task)
        wanted = {name: state.format_value(used[name], value) for name, value in values.items()
                  if used[name].kind == "matrix" or value != used[name].default}      # defaults stay out
        assert link == wanted, f"{page}: the link does not hold the values set"
        again = _open(info, link=link, maker=maker)
        assert {name: again.query_params[name] for name in again.query_params} == link, f"{page}: the link changed"
        drawn = controls(again, page)
        seen |= set(controls(at, page)) | set(drawn)
        for name in set(drawn) & set(values):
            assert shows(spec[name], drawn[name], values[name]), \
                f"{page}: the link gave {name}={link.get(name)}, the reopened page shows {drawn[name]!r}"
            read_back.add(name)
    assert seen - set(spec) == set(), f"{page}: controls not kept in the link: {sorted(seen - set(spec))}"
    assert set(spec) - seen == set(), f"{page}: link fields with no control on the page: {sorted(set(spec) - seen)}"
    assert read_back == set(spec), f"{page}: fields never read back from their control: {sorted(set(spec) - read_back)}"


def _bad(field: state.Field, round_: int) -> str:
    """A value the field does not allow; each round picks another kind of mistake."""
    if field.kind == "int":
        options = [str(int(field.hi) + 1), "1e308", "NaN", "abc", str(int(field.lo) - 1), "2.5"]
    elif field.kind == "float":
        options = [repr(float(field.hi) * 2 + 1), "NaN", "inf", "abc", repr(float(field.lo) - 1), "-inf"]
    elif field.kind == "bool":
        options = ["maybe", "2"]
    elif field.kind == "choice":
        options = ["nope", ""]
    elif field.kind == "text":
        options = ["x" * 1000, "y " * (state.MAX_TEXT // 2 + 1)]
    else:
        options = ["1,2;3", "nan,0", "1,abc", "inf,1"]
    return options[round_ % len(options)]


UNKNOWN = {"tau": "NaN", "heads_per_layer": "999", "preset_name": "nope"}


@pytest.mark.parametrize("round_", [0, 1, 2])
@pytest.mark.parametrize("info", PAGES, ids=[p.name for p in PAGES])
def test_a_bad_link_is_named_and_leaves_the_address(info, round_):
    page = info.name
    spec = spec_of(_open(info), page)
    link = {name: _bad(field, round_ + i) for i, (name, field) in enumerate(spec.items())}
    link |= {name: raw for name, raw in UNKNOWN.items() if name not in spec}
    at = _open(info, link=link)
    warned = " ".join(w.value for w in at.warning)
    for name, raw in link.items():
        assert f"{name}={state.shown(raw)} in the link" in warned, f"{page}: {name}={raw[:40]!r} is not named"
        assert at.query_params.get(name) != raw, f"{page}: {name}={raw[:40]!r} stayed in the address"
        if name in at.query_params:                                  # then it holds the value used
            state.parse_value(spec[name], at.query_params[name], name)
    assert warned.count(" instead.") + warned.count("ignored") >= len(link)


# Values each field's range allows but the page cannot use, and what it must use instead.
PAGE_BAD = {
    "one_head": {"query": "16", "sentence": " ".join(["word"] * 20)},   # 16 words at most; the default has 8
    "multi_head": {"open": "8", "row": "16"},              # 4 heads, 6 tokens by default
    "positional": {"from": "300", "k": "200", "a": "", "b": " ".join(["w"] * 17)},   # 50 positions by default
    "inside_model": {"show": "L9H9", "layer": "4", "example": "99999", "remove": "L1H1,L7H7"},
    "decoder": {"example": "10000", "step": "64", "layer": "4", "head": "8", "top_k": "two"},
    "decoder_lm": {"task": "lm", "top_k": "0", "prompt": "x" * 200},    # the language model's context is shorter
    "real_model": {"layer": "96", "head": "64", "how": "patch", "sentences": "only one", "text": " "},
    "real_model_gpt": {"which": "tiny_gpt", "how": "patch", "other": ""},
    "masks": {"sentence": " ".join(["w"] * 17), "source": " ", "target": " ".join(["w"] * 30),
              "lengths": "6, three"},
    "make_it_fast": {"T": "6, abc"},
}


@pytest.mark.parametrize("page", sorted(PAGE_BAD))
def test_a_link_value_the_page_cannot_use_is_named_and_replaced(page):
    (info,) = [p for p in PAGES if p.name == page.split("_lm")[0].removesuffix("_gpt")]
    link = PAGE_BAD[page]
    at = _open(info, link=link)
    warned = " ".join(w.value for w in at.warning)
    usable = {"task", "which", "how"}           # set only to reach the field tested beside them
    for name, raw in ((n, r) for n, r in link.items() if n not in usable):
        assert f"{name}={state.shown(raw)} in the link" in warned, f"{page}: {name}={raw!r} is not named"
        assert at.query_params.get(name) != raw, f"{page}: {name}={raw!r} stayed in the address"


def test_a_number_box_refuses_what_it_cannot_take_and_says_so():
    """A huge, infinite, NaN or (in a whole-number box) fractional number typed into any page's
    number box is refused with a warning that names the box, and nothing changes: not the box, not
    the link. (In the browser a number outside the box's range is refused before it is sent, with
    the browser's own message; this is what happens when one arrives all the same.)"""
    checked = 0
    for info in PAGES:
        page = info.name
        at = _open(info)
        spec = spec_of(at, page)
        boxes = {w.key[len(page) + 1:]: w.value for w in at.number_input if w.key and w.key.startswith(page + ".")}
        link = dict(at.query_params)
        for typed in (1e308, -float("inf"), float("nan"), 2.5):
            refused = [name for name in boxes if spec[name].kind == "int" or typed != 2.5]
            for name in refused:
                at.number_input(key=state.key(page, name)).set_value(typed)
            for submit in [b for b in at.button if b.proto.is_form_submitter]:     # a box in a form
                submit.click()
            _ran(at.run())
            warned = " ".join(w.value for w in at.warning)
            for name in refused:
                assert f"{name} should be" in warned and "Keeping" in warned, f"{page}: {name}={typed} is not refused"
                assert at.number_input(key=state.key(page, name)).value == boxes[name], f"{page}: {name} changed"
                checked += 1
            assert dict(at.query_params) == link, f"{page}: the link changed"
    assert checked >= 4 * 20         # every page's boxes: about two dozen
