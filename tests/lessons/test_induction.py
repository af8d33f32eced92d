"""Induction heads, measured (core.lessons.induction): the kinds of next token and the measures on
hand-built sequences, the shipped two-layer attention-only model against the done-when figures, the
removal of its previous-token head, the heads' names, and a one-layer model trained the same way."""
import numpy as np
import pytest

from core.lessons import induction as I

SETUP = I.InductionSetup()
T = SETUP.length - 1


def test_next_tokens_are_sorted_into_first_occurrences_the_repeated_segment_and_the_repeat_start():
    #        prefix   segment    copy      copy (cut)
    seq = np.array([[9, 8, 1, 2, 3, 1, 2, 3, 1, 2]])
    first, repeated = I.next_token_kinds(seq[:, :-1], seq[:, 1:])
    # next tokens 8 1 2 3 | 1 (the repeat's first: neither) | 2 3 1 2
    assert first[0].tolist() == [True, True, True, True, False, False, False, False, False]
    assert repeated[0].tolist() == [False, False, False, False, False, True, True, True, True]
    np.testing.assert_array_equal(I.repeat_layout(seq[:, :-1], seq[:, 1:]), ([2], [3]))
    # the floor of the first occurrences: k = 1, 2, 3, 4 distinct tokens seen before each
    V = 12
    assert I.first_occurrence_floor(seq[:, :-1], seq[:, 1:], V) == pytest.approx(
        np.mean([np.log(V - k) for k in (1, 2, 3, 4)]))
    # a uniform causal map on these tokens: queries with an earlier copy are t = 5..8 (0-based)
    uniform_prev, uniform_ind = I.uniform_baselines(seq[:, :-1])
    assert uniform_prev == pytest.approx(np.mean([1 / (t + 1) for t in range(1, 9)]))
    assert uniform_ind == pytest.approx(np.mean([1 / (t + 1) for t in (5, 6, 7)] + [2 / 9]))   # t = 8: two copies


@pytest.fixture(scope="module")
def shipped():
    """The page's default model (read from the file shipped with the app) on its held-out sequences."""
    run = I.default_run(SETUP, seed=0)
    data = I.held_out(SETUP, 0)
    return run, data, I.measure(run.params, run.cfg, data)


def test_the_default_model_forms_both_heads_and_copies_the_repeat(shipped):
    run, _, m = shipped
    assert m.induction.shape == m.previous.shape == (2, SETUP.n_heads)
    prev, ind = I.head_verdicts(m)
    assert prev.formed and ind.formed
    assert m.induction[1].max() >= 0.9 and m.previous[0].max() >= 0.8
    assert m.loss_repeated_segment < 0.1 * m.loss_first_occurrence
    assert m.acc_repeated_segment > 0.95
    print(f"induction {m.induction.round(3).tolist()} previous {m.previous.round(3).tolist()} losses "
          f"{m.loss_first_occurrence:.3f} / {m.loss_repeated_segment:.3f}")


def test_removing_the_previous_token_head_takes_the_induction_and_the_copying_with_it(shipped):
    """Fails when the removal misses its head (another layer, another head, or no edit at all) or
    when the measures after it are the intact model's."""
    run, data, m = shipped
    prev, _ = I.head_verdicts(m)
    for how in I.ABLATIONS:
        a = I.ablation_effect(run.params, run.cfg, data, m, 0, prev.head, how)
        assert a.induction_before == pytest.approx(m.induction[1].max())
        assert a.induction_after <= 0.5 * a.induction_before, how
        assert a.acc_after < a.acc_before - 0.5 and a.loss_after > a.loss_before, how
        assert I.ablation_outcome(a) == I.FELL_TO_HALF_OR_LESS
    # the control: the other layer-1 head's removal leaves the copying
    table = I.layer_one_ablations(run.params, run.cfg, data, m)
    others = [a for h, a in enumerate(table) if h != prev.head]
    assert all(a.induction_after >= 0.9 * a.induction_before and a.acc_after >= 0.9 * a.acc_before for a in others)
    assert table[prev.head].induction_after == pytest.approx(
        I.ablate(run.params, run.cfg, data, 0, prev.head).induction[1].max())
    with pytest.raises(ValueError, match="'zero' or 'mean'"):
        I.ablate(run.params, run.cfg, data, 0, 0, "drop")


def test_the_outcome_of_a_removal_is_read_from_the_scores():
    a = lambda before, after: I.Ablation(0, 0, "zero", before, after, 0.0, 0.0, 1.0, 1.0, None)  # noqa: E731
    assert I.ablation_outcome(a(0.8, 0.9)) == I.ROSE
    assert I.ablation_outcome(a(0.8, 0.41)) == I.FELL_LESS_THAN_HALF
    assert I.ablation_outcome(a(0.8, 0.4)) == I.FELL_TO_HALF_OR_LESS


def test_a_head_is_named_only_when_its_score_reaches_the_threshold():
    L, H, B = 2, 3, 1
    m = I.Measures(induction=np.array([[0.9, 0.0, 0.0], [0.05, 0.24, 0.1]]),
                   previous=np.array([[0.2, 0.6, 0.1], [0.99, 0.0, 0.0]]), loss_first=np.zeros(T),
                   loss_repeated=np.zeros(T), loss_first_occurrence=0.0, loss_repeated_segment=0.0,
                   acc_repeated_segment=0.0, loss_repeat_start=0.0, attn=np.zeros((L, B, H, T, T)))
    prev, ind = I.head_verdicts(m)
    assert (prev.layer, prev.head, prev.formed) == (0, 1, True)       # layer 1 only, however layer 2 scores
    assert (ind.layer, ind.head, ind.formed) == (1, 1, False)         # 0.24 < 0.25: not an induction head
    m.induction[1, 2] = I.INDUCTION_THRESHOLD
    assert I.head_verdicts(m)[1].formed and I.head_verdicts(m)[1].head == 2


def test_one_layer_trained_the_same_way_does_not_copy_the_repeat():
    """The same data, steps and optimiser with one attention layer: its keys hold no previous token,
    so it cannot find what followed the earlier copy. Fails when the data lets a head copy by a
    fixed offset (a segment always of one length, or always at one place)."""
    two = I.train_induction(SETUP, seed=0)
    one_setup = I.InductionSetup(n_layers=1)
    one = I.train_induction(one_setup, seed=0)
    data = I.held_out(SETUP, 0)
    m2, m1 = I.measure(two.params, two.cfg, data), I.measure(one.params, one.cfg, data)
    assert one.cfg.n_layers == 1 and one_setup.steps == SETUP.steps and one_setup.lr == SETUP.lr
    assert m2.loss_repeated_segment < 0.1
    assert m1.loss_repeated_segment > 10 * m2.loss_repeated_segment and m1.acc_repeated_segment < 0.5
    print(f"repeated segment: two layers {m2.loss_repeated_segment:.3f} ({m2.acc_repeated_segment:.1%}), "
          f"one layer {m1.loss_repeated_segment:.3f} ({m1.acc_repeated_segment:.1%})")


def test_best_heads_come_from_the_layers_the_lesson_names():
    """Fails when the previous-token head is chosen from layer 2's scores or the induction head from
    layer 1's: every layer's argmax differs here."""
    induction = np.array([[0.9, 0.1, 0.2, 0.3], [0.1, 0.2, 0.8, 0.3]])
    previous = np.array([[0.1, 0.2, 0.3, 0.7], [0.6, 0.2, 0.1, 0.0]])
    m = I.Measures(induction=induction, previous=previous, loss_first=np.zeros(4), loss_repeated=np.zeros(4),
                   loss_first_occurrence=0.0, loss_repeated_segment=0.0, acc_repeated_segment=0.0,
                   loss_repeat_start=0.0, attn=np.zeros((2, 1, 4, 4, 4)))
    assert I.best_heads(m) == (3, 2)      # layer 1's best previous-token head, layer 2's best induction head
