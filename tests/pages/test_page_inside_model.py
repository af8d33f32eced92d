"""The "Inside a trained model" page through AppTest: the numbers it shows are the forward cache's
and the ablation's, and each control moves what it should. A tiny default model (tiny data, few
steps) through the page's test hooks; the same model is rebuilt here, deterministic by seed."""
import functools
import inspect

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.kernels import reference
from core.lessons import inside
from core.lessons.questions import inside_model as questions
from core.model import multi_head, transformer
from core.training.encoder_runs import EncoderRun
from page_support import answer_everything, answer_question, heatmaps
from source_support import opened_source, source_names
from ui.trainer import Trainer

SIZES, STEPS = (200, 40, 60), 20


@functools.lru_cache(maxsize=4)
def model(task="sum", seed=0) -> inside.Model:
    return inside.train_default(task, seed, n_train=SIZES[0], n_val=SIZES[1], n_test=SIZES[2], steps=STEPS)


@functools.lru_cache(maxsize=4)
def report(task="sum", seed=0) -> inside.HeadReport:
    m = model(task, seed)
    return inside.head_ablation(m.params, m.cfg, m.data.X_test, m.data.y_test)


def page(link=None, *, answered=True) -> AppTest:
    at = AppTest.from_file("../../views/inside_model.py", default_timeout=120)
    at.session_state["inside_model.data_sizes"] = SIZES
    at.session_state["inside_model.steps"] = STEPS
    for name, value in (link or {}).items():
        at.query_params[name] = value
    if answered:
        answer_everything(at)
    return at.run()


def frames(at, first_column):
    return [d.value for d in at.dataframe if d.value.columns[0] == first_column]


def metric(at, start):
    found = [m for m in at.metric if m.label.startswith(start)]
    assert len(found) == 1, start
    return found[0]


def cache_of(m, example):
    return inside.forward(m.params, m.cfg, m.data.X_test[example:example + 1])[1]


def check_walkthrough(at, m, example, layer):
    """The LayerNorm tables, ReLU fraction and logits on the page equal the forward cache's."""
    cache = cache_of(m, example)
    steps = {s.name: s for s in inside.walkthrough(cache, m.params, m.cfg, layer, 0)}
    ln1, ln2 = frames(at, "token")
    for shown, name in ((ln1, "LayerNorm 1"), (ln2, "LayerNorm 2")):
        for column, values in inside.layernorm_table(steps[name]).items():
            np.testing.assert_array_equal(shown[column].to_numpy(), values, err_msg=column)
    np.testing.assert_array_equal(shown["mean before"].to_numpy(), cache[f"blocks.{layer}.ln2.mean"][0])
    (logits,) = frames(at, "class")
    np.testing.assert_array_equal(logits["logit"].to_numpy(), cache["logits"][0])
    off = np.mean(cache[f"blocks.{layer}.ffn.hidden"][0] == 0)
    assert metric(at, "ReLUs off").value == f"{off:.1%}"
    assert metric(at, "Predicted class").value == str(int(np.argmax(cache["logits"][0])))


def test_walkthrough_shows_the_cache_and_follows_example_and_layer():
    at = page()
    assert not at.exception and not at.error
    m = model()
    check_walkthrough(at, m, 0, 0)
    before = frames(at, "token")[0]
    at.number_input(key="inside_model.example").set_value(7).run()
    check_walkthrough(at, m, 7, 0)
    assert not before.equals(frames(at, "token")[0])
    at.slider(key="inside_model.layer").set_value(2).run()
    check_walkthrough(at, m, 7, 1)
    assert at.query_params["example"] == "7" and at.query_params["layer"] == "2"
    markdown = " ".join(md.value for md in at.markdown)
    assert "`(T, d_model) = (16, 32)`" in markdown and "`(T, d_ff) = (16, 64)`" in markdown
    assert "`(H, T, T) = (4, 16, 16)`" in markdown and "`(classes) = (2)`" in markdown
    assert len(at.latex) >= 3
    shown = {c.value.strip() for c in opened_source(at, "Source of these numbers").code}   # the functions that ran
    for fn in (inside.forward, transformer.forward, transformer.block, multi_head.attend,
               transformer.layer_norm, inside.walkthrough, inside.ablated_logits):
        assert inspect.getsource(fn).strip() in shown, fn.__qualname__


def test_ablation_table_and_controls():
    at = page()
    m, r = model(), report()
    assert metric(at, "Test accuracy, every head in place").value == f"{r.baseline:.3f}"
    for mode in ("zero", "mean"):
        if mode == "mean":
            at.radio(key="inside_model.mode").set_value("mean").run()
        (table,) = frames(at, "head")
        assert list(table["head"]) == [f"L{i}H{h}" for i in (1, 2) for h in (1, 2, 3, 4)]
        np.testing.assert_array_equal(table["test accuracy without it"].to_numpy(), r.accuracy[mode].ravel())
        np.testing.assert_array_equal(table["change"].to_numpy(), r.change(mode).ravel())
        np.testing.assert_array_equal(table["focus of its mean map"].to_numpy(), r.focus.ravel())
    # the head shown beside the table
    at.selectbox(key="inside_model.show").set_value("L2H3").run()
    assert metric(at, "Removing L2H3").value == f"{r.change('mean')[1, 2]:+.3f}"
    # several heads at once
    none = metric(at, "Test accuracy with 0 head(s) removed (mean)")
    assert none.value == f"{r.baseline:.3f}" and not none.delta          # nothing removed: no change shown
    at.multiselect(key="inside_model.remove_heads").set_value(["L1H1", "L2H4"]).run()
    want = inside.ablated_accuracy(m.params, m.cfg, m.data.X_test, m.data.y_test, [(0, 0), (1, 3)], "mean",
                                   r.head_means)
    two = metric(at, "Test accuracy with 2 head(s) removed (mean)")
    assert two.value == f"{want:.3f}" and two.delta == f"{want - r.baseline:+.3f}"
    assert at.query_params["remove"] == "L1H1,L2H4"
    assert not at.exception and not at.error


def test_pooling_table_and_the_task_and_seed_controls():
    at = page()
    m = model()
    _, cache = inside.forward(m.params, m.cfg, m.data.X_test)
    mean_acc, single = inside.pooling_accuracy(cache, m.params, m.cfg, m.data.y_test)
    (pool,) = frames(at, "pooling")
    np.testing.assert_array_equal(pool["test accuracy"].to_numpy(), [mean_acc, single[0], single.max(), single.min()])
    at.number_input(key="inside_model.seed").set_value(1).run()
    assert metric(at, "Test accuracy, every head in place").value == f"{report('sum', 1).baseline:.3f}"
    check_walkthrough(at, model("sum", 1), 0, 0)
    at.selectbox(key="inside_model.task").set_value("increasing").run()
    check_walkthrough(at, model("increasing", 1), 0, 0)
    assert "`(T, d_model) = (8, 32)`" in " ".join(md.value for md in at.markdown)


def test_a_link_restores_the_settings():
    at = page({"example": "5", "layer": "2", "mode": "mean", "remove": "L1H2,bogus"})
    assert not at.exception and not at.error
    check_walkthrough(at, model(), 5, 1)
    assert at.multiselect(key="inside_model.remove_heads").value == ["L1H2"]
    assert metric(at, "Test accuracy with 1 head(s) removed (mean)")


def test_offers_the_training_pages_finished_run():
    trained = model("increasing", 2)            # stands in for a run finished on the training page
    trainer = Trainer()
    trainer.load(trained.params, trained.cfg, EncoderRun(task="increasing", seed=2, n_train=SIZES[0], n_val=SIZES[1],
                                                      n_test=SIZES[2]))
    at = AppTest.from_file("../../views/inside_model.py", default_timeout=120)
    at.session_state["inside_model.data_sizes"] = SIZES
    at.session_state["inside_model.steps"] = STEPS
    at.session_state["training.trainer"] = trainer
    at.run()
    assert not at.exception
    at.radio(key="inside_model.source").set_value("trained").run()
    assert any("your run" in c.value for c in at.caption)
    check_walkthrough(at, trained, 0, 0)
    assert at.selectbox(key="inside_model.task").disabled


def test_asking_for_a_trained_run_without_one_says_so():
    at = page({"source": "trained"})
    assert not at.exception
    assert any("no finished run" in i.value for i in at.info)
    check_walkthrough(at, model(), 0, 0)


@pytest.mark.parametrize("link", [{"example": "99999"}, {"layer": "4"}, {"seed": "-3"}, {"show": "L9H9"}])
def test_out_of_range_links_fall_back(link):
    at = page(link)
    assert not at.exception and not at.error


# ----------------------------------------------------------------------------------------------
# the opening question, and the sentences that follow the measured numbers
# ----------------------------------------------------------------------------------------------
def outcome_from_table(table) -> int:
    """What removing the most focused head did, read from the page's ablation table: 0 the largest
    drop of any head, 1 a drop but another head's is larger, 2 no drop."""
    change = table["change"].to_numpy()
    mine = change[int(np.argmax(table["focus of its mean map"].to_numpy()))]
    return 2 if mine >= 0 else 0 if mine <= change.min() else 1


def caption_with(at, start):
    found = [c.value for c in at.caption if c.value.startswith(start)]
    assert len(found) == 1, start
    return found[0]


def test_the_opening_question_locks_head_removal_and_its_answer_is_the_default_models():
    """On the model the page opens on (the shipped one): before the answer, heads cannot be removed
    and no change in accuracy is shown; after it, the page's own table says what the answer says
    about the head the question names."""
    at = AppTest.from_file("../../views/inside_model.py", default_timeout=120).run()
    assert not at.exception and not at.error
    assert at.multiselect(key="inside_model.remove_heads").disabled
    (table,) = frames(at, "head")
    assert list(table.columns) == ["head", "focus of its mean map"]
    assert not any(m.label.startswith(("Removing", "Test accuracy with")) for m in at.metric)
    assert not any("Change in test accuracy" in md.value for md in at.markdown)      # the bar chart's title
    answer_question(at, questions.STRIKING, questions.STRIKING.options[questions.STRIKING.answer])
    assert not at.multiselect(key="inside_model.remove_heads").disabled
    (table,) = frames(at, "head")
    focused = table["head"].iloc[int(np.argmax(table["focus of its mean map"]))]
    assert f"head {focused} has the most focused" in questions.STRIKING.prompt
    assert outcome_from_table(table) == questions.STRIKING.answer
    # removing that head alone gives the change the table shows
    at.multiselect(key="inside_model.remove_heads").set_value([focused]).run()
    change = table.set_index("head").loc[focused, "change"]
    assert metric(at, "Test accuracy with 1 head(s) removed (zero)").delta == f"{change:+.3f}"


@pytest.mark.parametrize("seed, says", [
    (7, "and removing no single head lowers the accuracy."),       # every change >= 0
    (4, "the largest drop of any single head."),                   # the most focused head is the worst
    (0, "while the largest drop comes from removing"),              # it changes nothing; another drops
])
def test_the_largest_drop_is_named_only_when_there_is_one(seed, says):
    at = page({"seed": str(seed)})
    (table,) = frames(at, "head")
    sentence = caption_with(at, "Focus = 1")
    assert says in sentence
    change = table["change"].to_numpy()
    if change.min() < 0:
        assert "largest drop" in sentence
        worst = table["head"].iloc[int(np.argmin(change))]
        assert outcome_from_table(table) == 0 or f"removing {worst} ({change.min():+.3f})" in sentence
    else:
        assert "largest drop" not in sentence


def test_the_layernorm_question_is_what_its_table_shows():
    """The answer ("a hair under 1") is the standard deviation of x-hat in the LayerNorm table of the
    example the page opens on; the caption says it only once the question is answered."""
    at = AppTest.from_file("../../views/inside_model.py", default_timeout=120).run()
    ln1 = frames(at, "token")[0]
    std = ln1["std of x-hat"].to_numpy()
    side = 1 if np.all(std < 1) and std.min() > 0.99 else None
    assert side == questions.LAYERNORM.answer
    assert not any("a hair under 1" in c.value for c in at.caption)
    answer_question(at, questions.LAYERNORM, questions.LAYERNORM.options[questions.LAYERNORM.answer])
    assert any("a hair under 1" in c.value for c in at.caption)


def test_the_source_names_the_functions_that_ran_and_no_other():
    """Before the opening answer the page only tables the single removals: the functions that read
    them for the page's sentence are not in the source; after it, they are."""
    locked = source_names(page(answered=False), "Source of these numbers")
    assert {"core.lessons.inside.forward", "core.model.transformer.forward", "core.lessons.inside.walkthrough",
            "core.lessons.inside.head_ablation", "core.lessons.inside.pooling_accuracy"} <= set(locked)
    read = {"core.lessons.inside.largest_drop", "core.lessons.inside.focused_head_outcome"}
    assert not read & set(locked)
    assert read <= set(source_names(page(), "Source of these numbers"))


# --- the numbers the page claims, recomputed from the model ------------------------------------------

def test_inside_model_layernorm_tables_describe_the_residual_sum():
    """Fails when the walkthrough's LayerNorm step shows the LayerNorm's output as its input, or when
    the residual sum drops the residual: the table's "before" columns must be the statistics of
    ``x + MHA(x)`` (LayerNorm 1) and ``x + FFN(x)`` (LayerNorm 2), taken from the cache's sublayer
    outputs here."""
    at = page()
    assert not at.exception and not at.error
    m = model()
    cache = cache_of(m, 0)
    at_ = lambda name: cache[f"blocks.0.{name}"][0]           # noqa: E731
    ln1, ln2 = frames(at, "token")
    r1 = at_("resid_pre") + at_("attn.output")
    r2 = at_("resid_mid") + at_("ffn.output")
    for shown, r in ((ln1, r1), (ln2, r2)):
        np.testing.assert_allclose(shown["mean before"].to_numpy(), r.mean(axis=-1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(shown["std before"].to_numpy(), r.std(axis=-1), rtol=1e-5, atol=1e-6)


def _layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def test_inside_model_heatmaps_follow_the_block_formulas():
    """Fails when a walkthrough chart draws another array than its title names (LayerNorm 1's output
    as the residual sum r1, or the FFN's input as its output) or when a residual sum drops the
    residual: each chart is recomputed here from the charts before it, the embeddings and the
    parameters, following the post-norm block r1 = x + MHA(x), x = LN1(r1), r2 = x + FFN(x)."""
    at = page()
    at.slider(key="inside_model.layer").set_value(2).run()
    assert not at.exception and not at.error
    m, example = model(), 0
    p = {name.removeprefix("blocks.1."): value for name, value in m.params.items() if name.startswith("blocks.1.")}
    eps, maps = m.cfg.ln_eps, heatmaps(at)
    tokens = m.data.X_test[example]
    np.testing.assert_allclose(maps["token embeddings E[tok_t]"], m.params["embed"][tokens], atol=1e-6)
    np.testing.assert_allclose(maps["E[tok_t] + PE_t"], m.params["embed"][tokens] + reference.sinusoidal(
        len(tokens), m.cfg.d_model), atol=1e-5)
    h = cache_of(m, example)["blocks.1.resid_pre"][0]    # layer 2's input: layer 1's output
    r1 = maps["r₁ = x + MHA(x)"]
    np.testing.assert_allclose(r1, h + maps["MHA(x)"], atol=1e-5)
    np.testing.assert_allclose(maps["MHA(x)"], maps["concat"] @ p["attn.W_O"] + p["attn.b_O"], atol=1e-5)
    x = maps["LN₁(r₁)"]
    np.testing.assert_allclose(x, _layer_norm(r1, p["ln1.g"], p["ln1.b"], eps), atol=1e-4)
    hidden = maps["relu(x W₁ + b₁)"]
    np.testing.assert_allclose(hidden, np.maximum(x @ p["ffn.W_1"] + p["ffn.b_1"], 0), atol=1e-5)
    np.testing.assert_allclose(maps["FFN(x)"], hidden @ p["ffn.W_2"] + p["ffn.b_2"], atol=1e-5)
    r2 = maps["r₂ = x + FFN(x)"]
    np.testing.assert_allclose(r2, x + maps["FFN(x)"], atol=1e-5)
    np.testing.assert_allclose(maps["the output of layer 2"], _layer_norm(r2, p["ln2.g"], p["ln2.b"], eps),
                               atol=1e-4)
