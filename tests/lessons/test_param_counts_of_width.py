"""Attention whose heads keep their own width: the count read off the arrays themselves."""
import numpy as np
import pytest

from core.lessons import param_counts


def arrays(d_model, n_heads, d_k, bias):
    """The arrays of such a layer, allocated: W_Q, W_K, W_V (d_model, H·d_k), W_O (H·d_k, d_model)."""
    wide = n_heads * d_k
    found = [np.zeros((d_model, wide)) for _ in range(3)] + [np.zeros((wide, d_model))]
    if bias:
        found += [np.zeros(wide) for _ in range(3)] + [np.zeros(d_model)]
    return found


@pytest.mark.parametrize("d_model, n_heads, d_k", [(512, 16, 64), (512, 8, 64), (96, 3, 7), (8, 1, 32), (1, 5, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_count_is_the_size_of_the_arrays(d_model, n_heads, d_k, bias):
    built = sum(a.size for a in arrays(d_model, n_heads, d_k, bias))
    assert param_counts.mha_param_count_of_width(d_model, n_heads, d_k, bias) == built


@pytest.mark.parametrize("bias", [False, True])
def test_heads_that_split_d_model_give_the_usual_count(bias):
    for d_model, n_heads in ((512, 8), (384, 6), (64, 16), (4, 2)):
        assert param_counts.mha_param_count_of_width(d_model, n_heads, d_model // n_heads, bias) == \
            param_counts.mha_param_count(d_model, n_heads, bias)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_a_size_that_is_not_a_positive_whole_number_is_refused(bad):
    for args in ((bad, 2, 4), (8, bad, 4), (8, 2, bad)):
        with pytest.raises(ValueError, match="positive whole number"):
            param_counts.mha_param_count_of_width(*args)
