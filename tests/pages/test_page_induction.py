"""The Induction heads page: the scores and losses it shows are core.training.induction's, and the
example, layer and head controls move what is shown. Trained with few steps (the steps control, set
before the first run: the numbers must match core's, not reach the done-when figures)."""
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.model import head_scores as hs
from core.training import induction as I

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "induction.py")
STEPS = 150


def _open(**link) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["induction.steps"] = STEPS
    for name, value in link.items():
        at.query_params[name] = str(value)
    return at.run()


def _metric(at, label):
    found = [m.value for m in at.metric if m.label == label]
    assert len(found) == 1, label
    return float(found[0].rstrip("%"))


@pytest.fixture(scope="module")
def core_numbers():
    setup = I.InductionSetup(steps=STEPS)
    run = I.train_induction(setup, seed=0)
    data = I.held_out(setup, 0)
    return data, I.measure(run.params, run.cfg, data)


@pytest.fixture(scope="module")
def at():
    return _open()


def test_the_numbers_shown_are_core_s(at, core_numbers):
    (tgt_in, _), m = core_numbers
    assert not at.exception and not at.error
    assert _metric(at, "loss, first half") == pytest.approx(m.loss_first_half, abs=5e-4)
    assert _metric(at, "loss, repeated half") == pytest.approx(m.loss_second_half, abs=5e-4)
    assert _metric(at, "accuracy, repeated half") == pytest.approx(100 * m.acc_second_half, abs=0.05)
    table = next(d.value for d in at.dataframe if "induction" in d.value.columns)
    assert table["head"].tolist() == [f"L{l}H{h}" for l in (1, 2) for h in range(1, 5)]
    np.testing.assert_allclose(table["induction"], m.induction.ravel(), atol=5e-5)
    np.testing.assert_allclose(table["previous token"], m.previous.ravel(), atol=5e-5)
    # default selection: layer 2, head 1 of held-out sequence 0
    assert _metric(at, "L2H1 induction") == pytest.approx(m.induction[1, 0], abs=5e-5)
    one = hs.induction(m.attn[1, 0, 0][None], tgt_in[0][None])
    assert _metric(at, "L2H1 induction, this sequence") == pytest.approx(float(one), abs=5e-5)
    text = " ".join(x.value for x in at.markdown)
    assert f"First half **{m.loss_first_half:.3f}**" in text


def test_layer_head_and_example_move_what_is_shown(at, core_numbers):
    (tgt_in, _), m = core_numbers
    at.radio(key="induction.layer").set_value(1)
    at.radio(key="induction.head").set_value(3)
    at.run()
    assert _metric(at, "L1H3 induction") == pytest.approx(m.induction[0, 2], abs=5e-5)
    assert _metric(at, "L1H3 previous token") == pytest.approx(m.previous[0, 2], abs=5e-5)
    before = _metric(at, "L1H3 induction, this sequence")
    at.slider(key="induction.example").set_value(7)
    at.run()
    after = _metric(at, "L1H3 induction, this sequence")
    expected = hs.induction(m.attn[0, 7, 2][None], tgt_in[7][None])
    assert after == pytest.approx(float(expected), abs=5e-5) and after != before
    assert at.query_params["example"] == "7" and at.query_params["layer"] == "1"


def test_a_link_sets_the_controls_and_bad_links_warn():
    at = _open(layer=1, head=2, example=3)
    assert at.radio(key="induction.layer").value == 1 and at.slider(key="induction.example").value == 3
    assert any(mt.label.startswith("L1H2 induction") for mt in at.metric)
    bad = _open(head=9)
    assert bad.warning and not bad.exception
    assert bad.radio(key="induction.head").value == 1


def test_a_new_seed_trains_a_new_model_once_submitted(core_numbers):
    _, m0 = core_numbers
    at = _open()
    at.number_input(key="induction.seed").set_value(1)
    at.run()
    assert _metric(at, "loss, first half") == pytest.approx(m0.loss_first_half, abs=5e-4)   # not yet submitted
    at.number_input(key="induction.seed").set_value(1)
    at.button[0].click()                                       # the form's submit button
    at.run()
    setup = I.InductionSetup(steps=STEPS)
    run = I.train_induction(setup, seed=1)
    m1 = I.measure(run.params, run.cfg, I.held_out(setup, 1))
    assert _metric(at, "loss, first half") == pytest.approx(m1.loss_first_half, abs=5e-4)
    assert m1.loss_first_half != pytest.approx(m0.loss_first_half, abs=5e-4)
    assert at.query_params["seed"] == "1"


def _chart_titles(at) -> list[str]:
    """The titles of the page's Vega-Lite charts, read from the specs Streamlit sends."""
    import json
    titles = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        title = spec.get("title")
        titles.append(title.get("text") if isinstance(title, dict) else title)
    return [t for t in titles if t]


def test_few_steps_name_no_head_and_say_what_to_try(at, core_numbers):
    """150 steps: every layer-2 induction score is near a uniform map's; no chart may call a head
    "induction", and the page says plainly that none formed."""
    _, m = core_numbers
    assert m.induction[1].max() < I.INDUCTION_THRESHOLD              # the premise of this test
    warning = " ".join(w.value for w in at.warning)
    assert "No induction head formed" in warning and "more steps" in warning and "another seed" in warning
    titles = _chart_titles(at)
    assert not any(t.endswith(("induction", "previous token")) or ": induction (" in t for t in titles), titles
    assert any("highest induction score" in t for t in titles), titles
    text = " ".join(x.value for x in at.markdown)
    assert "diagonal just below the main one" not in text and "gathers at key" not in text


def test_the_caption_on_the_first_repeated_token_matches_the_loss_chart(at, core_numbers):
    _, m = core_numbers
    text = " ".join(x.value for x in at.markdown)
    assert "nothing announces" not in text
    assert f"Its loss here is **{m.loss_by_position[I.InductionSetup().half - 1]:.3f}**" in text


def test_enough_steps_form_an_induction_head_and_the_page_names_it():
    steps = 800
    setup = I.InductionSetup(steps=steps)
    run = I.train_induction(setup, seed=0)
    m = I.measure(run.params, run.cfg, I.held_out(setup, 0))
    prev, ind = I.head_verdicts(m)
    assert ind.formed                                                 # the premise of this test
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["induction.steps"] = steps
    at.run()
    assert not at.exception and not any("No induction head" in w.value for w in at.warning)
    titles = _chart_titles(at)
    assert f"Layer 2, head {ind.head + 1}: induction (score {ind.score:.3f} ≥ {ind.threshold:g})" in titles
    text = " ".join(x.value for x in at.markdown)
    assert "gathers at key" in text
    assert (f"Layer 1, head {prev.head + 1}: previous-token" in " ".join(titles)) == prev.formed
    # the loss there has been learned: the caption says so and the chart agrees
    assert m.loss_by_position[setup.half - 1] < 0.5 * np.log(setup.vocab_size)
    assert "learned like the repeated half's" in text
