"""Our older .npz weight files' names (core.model.formats.legacy_npz), translated to the one vocabulary.
The whole file read back through core.model.encoder_io is tested with the encoder that saves it."""
import numpy as np
import pytest

from core.model.formats import legacy_npz

# Every older name of a block, written out by hand, with the one vocabulary's name for it
BLOCK = {"W_Q": "attn.W_Q", "W_K": "attn.W_K", "W_V": "attn.W_V", "W_O": "attn.W_O",
         "b_Q": "attn.b_Q", "b_K": "attn.b_K", "b_V": "attn.b_V", "b_O": "attn.b_O",
         "ln1_g": "ln1.g", "ln1_b": "ln1.b", "ln2_g": "ln2.g", "ln2_b": "ln2.b",
         "W_1": "ffn.W_1", "b_1": "ffn.b_1", "W_2": "ffn.W_2", "b_2": "ffn.b_2"}


def test_every_older_name_becomes_the_vocabularys():
    old = {"embed": 0, "pos": 1, "W_cls": 2, "b_cls": 3}
    for i in (0, 1, 12):                                                  # a block number of two digits too
        old.update({f"layers.{i}.{short}": (i, short) for short in BLOCK})
    new = legacy_npz.params_from(old)
    assert new["embed"] == 0 and new["pos"] == 1 and new["classifier.W"] == 2 and new["classifier.b"] == 3
    for i in (0, 1, 12):
        for short, ours in BLOCK.items():
            assert new[f"blocks.{i}.{ours}"] == (i, short)
    assert len(new) == len(old)


def test_names_of_the_one_vocabulary_and_unknown_ones_are_left_alone():
    names = ["blocks.0.attn.W_Q", "classifier.W", "layers.0.W_cls", "layers.x.W_Q", "xlayers.0.W_Q", "W_Q"]
    assert list(legacy_npz.params_from(dict.fromkeys(names))) == names


def test_an_array_under_both_its_names_is_refused():
    with pytest.raises(ValueError, match="'blocks.1.ln2.b' twice, under its older and its new name"):
        legacy_npz.params_from({"blocks.1.ln2.b": np.zeros(2), "layers.1.ln2_b": np.zeros(2)})
