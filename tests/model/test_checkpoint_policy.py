"""The instructor's setting for other checkpoints (core.model.checkpoint_policy): which Hub names, which
folders, and the size cap, each refusal naming what refused it."""
import os

import pytest

from core import limits
from core.model import checkpoint_policy as cp

CHECKPOINTS, ROOT = "ATTENTION_CHECKPOINTS", "ATTENTION_CHECKPOINT_ROOT"


@pytest.fixture
def setting(monkeypatch):
    """``setting(checkpoints=None, root=None)`` sets the two variables (None: unset)."""
    def set_to(checkpoints=None, root=None):
        for name, value in ((CHECKPOINTS, checkpoints), (ROOT, root)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))
    set_to()
    return set_to


@pytest.fixture
def folders(tmp_path):
    """A root with a checkpoint folder inside it, and one outside: ``(root, inside, outside)``."""
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    for folder in (root / "tiny", outside):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 64)
    return root, root / "tiny", outside


def test_by_default_any_name_and_any_folder(setting, folders):
    root, inside, outside = folders
    for source in ("gpt2", "someone/some-model", str(inside), str(outside)):
        cp.check_checkpoint_request(source)


def test_off_refuses_every_name_and_folder(setting, folders):
    setting("off")
    for source in ("gpt2", str(folders[1])):
        with pytest.raises(ValueError, match="no other checkpoints.*ATTENTION_CHECKPOINTS=off"):
            cp.check_checkpoint_request(source)


def test_a_list_takes_its_names_only_and_no_folder(setting, folders):
    setting("gpt2, distilgpt2")
    cp.check_checkpoint_request("gpt2")
    cp.check_checkpoint_request("distilgpt2")
    for name in ("gpt2-medium", "someone/gpt2", "GPT2"):
        with pytest.raises(ValueError, match="only these Hub checkpoints: distilgpt2, gpt2 .ATTENTION_CHECKPOINTS."):
            cp.check_checkpoint_request(name)
    with pytest.raises(ValueError, match="no checkpoint folders.*ATTENTION_CHECKPOINT_ROOT is not set"):
        cp.check_checkpoint_request(str(folders[1]))


def test_a_root_takes_folders_inside_it_only(setting, folders, monkeypatch):
    root, inside, outside = folders
    for checkpoints in (None, "gpt2"):
        setting(checkpoints, root)
        cp.check_checkpoint_request(str(inside))
        cp.check_checkpoint_request(str(root))
        monkeypatch.chdir(root)
        cp.check_checkpoint_request("./tiny")                    # relative to where the server runs
        (root.parent / "root2").mkdir(exist_ok=True)                # a sibling whose name starts with the root's
        for source in (str(outside), str(inside / ".." / ".." / "elsewhere"), "../elsewhere", "/", str(root) + "2"):
            with pytest.raises(ValueError, match="not inside .*root, the folder this server reads checkpoints "
                                                 "from .ATTENTION_CHECKPOINT_ROOT."):
                cp.check_checkpoint_request(source)


def test_a_link_inside_the_root_to_a_folder_outside_is_refused(setting, folders):
    root, inside, outside = folders
    os.symlink(outside, root / "link")
    setting(root=root)
    with pytest.raises(ValueError, match="ATTENTION_CHECKPOINT_ROOT"):
        cp.check_checkpoint_request(str(root / "link"))
    os.symlink(root.parent, root / "up")
    with pytest.raises(ValueError, match="ATTENTION_CHECKPOINT_ROOT"):
        cp.check_checkpoint_request(str(root / "up" / "elsewhere"))


def test_a_folder_spelt_like_a_hub_name_is_a_folder(setting, folders, monkeypatch):
    """The loader reads a folder before it asks the Hub, so the setting judges it as a folder."""
    root, inside, outside = folders
    monkeypatch.chdir(outside.parent)
    assert cp.is_hub_name_request("gpt2") and not cp.is_hub_name_request("elsewhere")
    setting("elsewhere", root)                                   # the name is listed, the folder is outside
    with pytest.raises(ValueError, match="ATTENTION_CHECKPOINT_ROOT"):
        cp.check_checkpoint_request("elsewhere")


def test_a_setting_that_is_not_one_is_refused(setting):
    for value in ("gpt2 distilgpt2", "../secrets", ",", "gpt2,owner/name/extra"):
        setting(value)
        with pytest.raises(ValueError, match="ATTENTION_CHECKPOINTS=.* is not a setting: give 'any', 'off'"):
            cp.check_checkpoint_request("gpt2")
    setting("ANY")
    cp.check_checkpoint_request("gpt2")


def test_the_cap_keeps_gpt2_and_distilgpt2_and_refuses_gpt2_medium():
    """The Hub's sizes of each checkpoint's three files (model.safetensors, tokenizer.json, config.json)."""
    cp.check_checkpoint_size("gpt2", {"model.safetensors": 548_105_171, "tokenizer.json": 1_355_256,
                                      "config.json": 665})
    cp.check_checkpoint_size("distilgpt2", {"model.safetensors": 352_824_413, "tokenizer.json": 1_355_256,
                                            "config.json": 762})
    with pytest.raises(ValueError, match=r"gpt2-medium is 1,521 MB \(model.safetensors: 1,520 MB\), over this "
                                         r"server's limit of 600 MB for a checkpoint \(core.limits.MAX_CHECKPOINT_MB\)"):
        cp.check_checkpoint_size("gpt2-medium", {"model.safetensors": 1_520_013_706, "tokenizer.json": 1_355_256,
                                                 "config.json": 718})


def test_a_folder_over_the_cap_is_refused_before_its_weights_are_read(setting, folders, monkeypatch):
    root, inside, outside = folders
    weights = inside / "model.safetensors"
    with open(weights, "r+b") as f:                              # sparse: no disk used, nothing to read
        f.truncate(limits.MAX_CHECKPOINT_MB * 1_000_000 + 1)
    with pytest.raises(ValueError, match=f"{inside} is 600 MB .*limit of 600 MB.*MAX_CHECKPOINT_MB"):
        cp.check_checkpoint_request(str(inside))
    with pytest.raises(ValueError, match="MAX_CHECKPOINT_MB"):
        cp.check_checkpoint_request(str(weights))                # a weights file given itself
    with open(weights, "r+b") as f:
        f.truncate(limits.MAX_CHECKPOINT_MB * 1_000_000)
    cp.check_checkpoint_request(str(inside))
