"""The Induction heads page: the scores, losses and removals it shows are core.lessons.induction's,
the controls move what is shown, and every sentence that depends on the measures is checked in a
setting where it flips: few steps (no head formed), an early model (an induction head, no named
previous-token head, a removal that leaves most of the score) and the shipped default model (both
heads; the removal takes the induction score and the copying)."""
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.lessons import questions
from core.lessons import head_kinds as hs
from core.lessons import induction as I
from page_support import answer_everything, answer_question, button, heatmaps
from source_support import source_names

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "induction.py")
STEPS = 150            # no head formed yet
EARLY = 700            # seed 0: an induction head in layer 2, no layer-1 head one step back half the time


def _open(steps: int | None = STEPS, *, answered: bool = True, **link) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    if steps is not None:
        at.session_state["induction.steps"] = steps
    for name, value in link.items():
        at.query_params[name] = str(value)
    if answered:
        answer_everything(at)
    return at.run()


def _metric(at, label):
    found = [m.value for m in at.metric if m.label == label]
    assert len(found) == 1, label
    return float(found[0].rstrip("%"))


def _text(at) -> str:
    return " ".join(x.value for x in at.markdown)


def _remove(at, how: str = "zero") -> AppTest:
    at.toggle(key="induction.remove").set_value(True)
    at.radio(key="induction.how").set_value(how)
    return at.run()


def _model(steps: int, seed: int = 0):
    setup = I.InductionSetup(steps=steps)
    run = I.default_run(setup, seed=seed)
    data = I.held_out(setup, seed)
    return run, data, I.measure(run.params, run.cfg, data)


@pytest.fixture(scope="module")
def core_numbers():
    _, data, m = _model(STEPS)
    return data, m


@pytest.fixture(scope="module")
def at():
    return _open()


def test_the_numbers_shown_are_core_s(at, core_numbers):
    (tgt_in, tgt_out), m = core_numbers
    assert not at.exception and not at.error
    assert _metric(at, "loss, first occurrence") == pytest.approx(m.loss_first_occurrence, abs=5e-4)
    assert _metric(at, "loss, repeated segment") == pytest.approx(m.loss_repeated_segment, abs=5e-4)
    assert _metric(at, "accuracy, repeated segment") == pytest.approx(100 * m.acc_repeated_segment, abs=0.05)
    table = next(d.value for d in at.dataframe if "induction" in d.value.columns)
    assert table["head"].tolist() == [f"L{l}H{h}" for l in (1, 2) for h in range(1, I.InductionSetup().n_heads + 1)]
    np.testing.assert_allclose(table["induction"], m.induction.ravel(), atol=5e-5)
    np.testing.assert_allclose(table["previous token"], m.previous.ravel(), atol=5e-5)
    # default selection: layer 2, head 1 of held-out sequence 0
    assert _metric(at, "L2H1 induction") == pytest.approx(m.induction[1, 0], abs=5e-5)
    one = hs.induction(m.attn[1, 0, 0][None], tgt_in[0][None])
    assert _metric(at, "L2H1 induction, this sequence") == pytest.approx(float(one), abs=5e-5)
    text = _text(at)
    assert f"First occurrence **{m.loss_first_occurrence:.3f}**, repeated segment **{m.loss_repeated_segment:.3f}**" in text
    floor = I.first_occurrence_floor(tgt_in, tgt_out, I.InductionSetup().vocab_size)
    assert f"**{floor:.3f}** nats over these sequences" in text and f"costs **{m.loss_repeat_start:.3f}**" in text


def test_the_example_s_layout_is_read_from_its_tokens(at, core_numbers):
    """Fails when the caption counts positions from 0 or describes another sequence."""
    (tgt_in, tgt_out), _ = core_numbers
    at.slider(key="induction.example").set_value(5)
    at.run()
    seq = np.concatenate([tgt_in[5, :1], tgt_out[5]])
    repeat = next(i for i in range(len(seq)) if seq[i] in seq[:i])           # 0-based: the repeat's start
    start = int(np.flatnonzero(seq == seq[repeat])[0])                        # the segment's start
    caption = next(c.value for c in at.caption if c.value.startswith("This sequence"))
    assert caption == (f"This sequence: a prefix of {start} tokens, the segment's {repeat - start} tokens at "
                       f"positions {start + 1} to {repeat}, its copies from position {repeat + 1} on (positions "
                       "counted from 1).")


def test_layer_head_and_example_move_what_is_shown(core_numbers):
    (tgt_in, _), m = core_numbers
    at = _open()
    at.radio(key="induction.layer").set_value(1)
    at.radio(key="induction.head").set_value(2)
    at.run()
    assert _metric(at, "L1H2 induction") == pytest.approx(m.induction[0, 1], abs=5e-5)
    assert _metric(at, "L1H2 previous token") == pytest.approx(m.previous[0, 1], abs=5e-5)
    before = _metric(at, "L1H2 induction, this sequence")
    at.slider(key="induction.example").set_value(7)
    at.run()
    after = _metric(at, "L1H2 induction, this sequence")
    expected = hs.induction(m.attn[0, 7, 1][None], tgt_in[7][None])
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
    assert _metric(at, "loss, first occurrence") == pytest.approx(m0.loss_first_occurrence, abs=5e-4)  # not submitted
    at.number_input(key="induction.seed").set_value(1)
    button(at, "Train").click()                              # the form's submit button
    at.run()
    _, _, m1 = _model(STEPS, seed=1)
    assert _metric(at, "loss, first occurrence") == pytest.approx(m1.loss_first_occurrence, abs=5e-4)
    assert m1.loss_first_occurrence != pytest.approx(m0.loss_first_occurrence, abs=5e-4)
    assert at.query_params["seed"] == "1"


def _chart_titles(at) -> list[str]:
    return list(heatmaps(at))


def _removal_sentence(at) -> str:
    found = [x.value for x in at.markdown if x.value.startswith("Without ")]
    assert len(found) == 1, found
    return found[0]


def test_few_steps_name_no_head_and_say_what_to_try(at, core_numbers):
    """150 steps: every layer-2 induction score is near a uniform map's; no chart may call a head
    "induction", the page says plainly that none formed, and the removal's sentence says what the
    removal measured (not that the copying went)."""
    (tgt_in, tgt_out), m = core_numbers
    assert m.induction[1].max() < I.INDUCTION_THRESHOLD              # the premise of this test
    warning = " ".join(w.value for w in at.warning)
    assert "No induction head formed" in warning and "more steps" in warning and "another seed" in warning
    titles = _chart_titles(at)
    assert not any(": induction (" in t or ": previous-token (" in t for t in titles), titles
    assert any("highest induction score" in t for t in titles), titles
    text = _text(at)
    assert "weight on the keys right after the earlier copies" not in text and "one step back, the diagonal" not in text
    run, data, m = _model(STEPS)
    prev, _ = I.head_verdicts(m)
    a = I.ablation_effect(run.params, run.cfg, data, m, 0, prev.head)
    assert I.ablation_outcome(a) != I.FELL_TO_HALF_OR_LESS           # the premise of the sentence checked
    sentence = _removal_sentence(_remove(_open()))
    assert "half or less" not in sentence and "The copying goes with it" not in sentence
    assert f"from {a.induction_before:.3f} to {a.induction_after:.3f}" in sentence
    assert ("does not lower it" in sentence) == (I.ablation_outcome(a) == I.ROSE)


def test_an_early_model_names_its_induction_head_only_and_keeps_most_of_it_without_either_layer_1_head():
    """700 steps: layer 2 has an induction head but no layer-1 head looks one step back half the
    time, and removing the best of them leaves more than half the induction score. The page must say
    so: the paragraph on the left chart and the removal's sentence both flip from the default's."""
    run, data, m = _model(EARLY)
    prev, ind = I.head_verdicts(m)
    a = I.ablation_effect(run.params, run.cfg, data, m, 0, prev.head)
    assert ind.formed and not prev.formed and I.ablation_outcome(a) == I.FELL_LESS_THAN_HALF   # the premises
    at = _open(EARLY)
    assert not at.exception and not any("No induction head" in w.value for w in at.warning)
    text = _text(at)
    assert f"Left: no layer-1 head puts, on average, {prev.threshold:g} of its weight one step back" in text
    assert f"L{ind.layer + 1}H{ind.head + 1} puts on average {ind.score:.0%} of its weight on the keys" in text
    assert f"L1H{prev.head + 1} (highest previous-token score, not named)" in text
    sentence = _removal_sentence(_remove(at))
    assert "more than half of the score stays" in sentence and "half or less" not in sentence
    assert "copying goes with it" not in sentence


@pytest.fixture(scope="module")
def default():
    """The page opened with its defaults (the shipped model), the previous-token head removed."""
    return _remove(_open(None))


def test_the_default_model_names_both_heads_and_its_removal_takes_the_copying(default):
    run, data, m = _model(I.InductionSetup().steps)
    assert run.shipped
    prev, ind = I.head_verdicts(m)
    at = default
    assert not at.exception and not at.error and not at.warning
    titles = _chart_titles(at)
    assert f"Layer 1, head {prev.head + 1}: previous-token (score {prev.score:.3f} ≥ {prev.threshold:g})" in titles
    assert f"Layer 2, head {ind.head + 1}: induction (score {ind.score:.3f} ≥ {ind.threshold:g})" in titles
    text = _text(at)
    assert f"Left: L1H{prev.head + 1} puts on average {prev.score:.0%} of its weight one step back" in text
    a = I.ablation_effect(run.params, run.cfg, data, m, 0, prev.head, "zero")
    name = f"L1H{prev.head + 1}"
    assert _metric(at, f"best layer-2 induction score without {name}") == pytest.approx(a.induction_after, abs=5e-4)
    assert _metric(at, f"accuracy, repeated segment, without {name}") == pytest.approx(100 * a.acc_after, abs=0.05)
    assert _metric(at, f"loss, repeated segment, without {name}") == pytest.approx(a.loss_after, abs=5e-4)
    sentence = _removal_sentence(at)
    assert f"from {a.induction_before:.3f} to {a.induction_after:.3f}" in sentence
    assert "half or less" in sentence and "The copying goes with it" in sentence
    # the control table: every layer-1 head removed in turn
    table = next(d.value for d in at.dataframe if d.value.columns[0] == "head removed")
    rows = I.layer_one_ablations(run.params, run.cfg, data, m, "zero")
    assert table["head removed"].tolist() == ["none"] + [f"L1H{h + 1}" for h in range(len(rows))]
    np.testing.assert_allclose(table["best layer-2 induction score"],
                               [a.induction_before] + [r.induction_after for r in rows], atol=5e-5)
    np.testing.assert_allclose(table["accuracy, repeated segment"], [a.acc_before] + [r.acc_after for r in rows],
                               atol=5e-5)
    # the induction head's map without the previous-token head, on the example shown
    after = heatmaps(at)[f"Layer 2, head {ind.head + 1} with {name} removed"]
    np.testing.assert_allclose(after, a.after.attn[1, 0, ind.head], atol=1e-6)
    assert np.abs(after - m.attn[1, 0, ind.head]).max() > 0.5


def test_mean_ablation_is_the_one_measured_when_chosen(default):
    run, data, m = _model(I.InductionSetup().steps)
    prev, _ = I.head_verdicts(m)
    zero = I.ablation_effect(run.params, run.cfg, data, m, 0, prev.head, "zero")
    mean = I.ablation_effect(run.params, run.cfg, data, m, 0, prev.head, "mean")
    assert abs(zero.induction_after - mean.induction_after) > 1e-3            # the premise
    at = _remove(_open(None), "mean")
    label = f"best layer-2 induction score without L1H{prev.head + 1}"
    assert _metric(at, label) == pytest.approx(mean.induction_after, abs=5e-4)


def test_the_removal_is_locked_until_the_opening_question_is_answered_and_its_answer_is_shown():
    """Before an answer the toggle and the choice of ablation are disabled and no removal is shown;
    answered, the page's own numbers give the opening question's answer."""
    opening = questions.opening("induction")
    at = _open(None, answered=False)
    assert at.toggle(key="induction.remove").disabled and at.radio(key="induction.how").disabled
    assert not any("without" in mt.label for mt in at.metric)
    at = answer_question(at, opening, opening.options[0])                     # a wrong first try: a hint
    assert at.toggle(key="induction.remove").disabled
    at = answer_question(at, opening, opening.options[opening.answer])
    assert not at.toggle(key="induction.remove").disabled
    at = _remove(at)
    table = next(d.value for d in at.dataframe if d.value.columns[0] == "head removed").set_index("head removed")
    prev = next(t for t in table.index if t != "none" and f"without {t}" in " ".join(mt.label for mt in at.metric))
    before, after = table.loc["none", "best layer-2 induction score"], table.loc[prev, "best layer-2 induction score"]
    shown = I.Ablation(0, 0, "zero", before, after, 0.0, 0.0, 0.0, 0.0, None)
    assert I.ablation_outcome(shown) == opening.answer
    assert opening.key == "induction.remove_previous_token" and prev in opening.prompt


def test_the_your_turn_question_sits_under_the_removal(default):
    later = questions.of_page("induction")[1]
    texts = [x.value for x in default.markdown]
    asked = next(i for i, t in enumerate(texts) if later.prompt in t)
    removal = next(i for i, t in enumerate(texts) if t.startswith("Without "))
    assert asked > removal


def test_the_source_names_the_functions_that_ran_and_no_other():
    """The measures and the verdicts always run; the removal of each layer-1 head only once the page
    shows it: then, and only then, the source holds the removals' code."""
    at = _open()
    kept = source_names(at, "Source")
    assert {"core.training.induction_runs.held_out", "core.lessons.induction.measure",
            "core.lessons.induction.head_verdicts", "core.model.decoder.forward"} <= set(kept)
    removal = {"core.lessons.induction.layer_one_ablations", "core.lessons.induction.ablate",
               "core.lessons.induction.ablation_effect", "core.lessons.induction.ablation_outcome"}
    assert not removal & set(kept)
    assert removal <= set(source_names(_remove(at), "Source"))


# --- the numbers the page claims, recomputed from the model ------------------------------------------

@pytest.fixture(scope="module")
def induction_numbers():
    setup = I.InductionSetup(steps=STEPS)             # the page test's model
    data = I.held_out(setup, 0)
    return data, I.measure(I.train_induction(setup, seed=0).params, setup.config, data)


def test_induction_page_draws_each_layers_best_head(induction_numbers):
    """Fails when a chart draws the other layer's head, or when the best heads are chosen from the
    wrong layers' scores: the heads are recomputed here as layer 1's best previous-token head and
    layer 2's best induction head, and each chart's cells must be that head's map."""
    _, m = induction_numbers
    prev_head, ind_head = int(np.argmax(m.previous[0])), int(np.argmax(m.induction[1]))
    at = _open(example=4)
    assert not at.exception and not at.error
    maps = heatmaps(at)
    # the titles name the role only when the score reaches its threshold: find each chart by its head
    left, = [cells for title, cells in maps.items() if title.startswith(f"Layer 1, head {prev_head + 1}: ")]
    right, = [cells for title, cells in maps.items() if title.startswith(f"Layer 2, head {ind_head + 1}: ")]
    np.testing.assert_allclose(left, m.attn[0, 4, prev_head], atol=1e-6)
    np.testing.assert_allclose(right, m.attn[1, 4, ind_head], atol=1e-6)
