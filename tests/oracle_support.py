"""The outside oracles (PyTorch, transformers): skipped where they are not installed, except in CI.

``.ci/run`` installs them from ``requirements-oracle.txt`` and sets ``REQUIRE_ORACLES=1``; there a
missing oracle fails the test instead of skipping it, so no comparison silently drops out.
"""
import importlib
import os

import pytest


def require(module_name):
    """The module, imported; a skip where it is missing, or a failure under ``REQUIRE_ORACLES=1``."""
    if os.environ.get("REQUIRE_ORACLES") == "1":
        return importlib.import_module(module_name)
    return pytest.importorskip(module_name, reason=f"{module_name} is not installed: the comparison is skipped")


def random_model(model_class, config, seed: int = 0, *, is_gain, keep=lambda name: False):
    """``model_class`` built from ``config`` (no download), in eval mode, with eager attention (so it
    returns its attention maps) and every parameter random: norm gains (``is_gain(name)``) near 1,
    everything else, biases included, ``N(0, 0.08^2)``; parameters ``keep(name)`` stay as built."""
    torch = require("torch")
    torch.manual_seed(seed)
    model = model_class._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if keep(name):
                continue
            if is_gain(name):
                value.copy_(1.0 + 0.2 * torch.randn_like(value))          # LayerNorm gains near 1
            else:
                value.copy_(0.08 * torch.randn_like(value))
    return model


def random_gpt2(settings: dict, seed: int = 0):
    """A `GPT2LMHeadModel` with every parameter random, LayerNorm gains and biases included."""
    transformers = require("transformers")
    config = transformers.GPT2Config(**settings, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return random_model(transformers.GPT2LMHeadModel, config, seed,
                        is_gain=lambda name: name.endswith("weight") and ".ln_" in name
                        or name.startswith("transformer.ln_f.weight"))


# A GPT-2 small enough for every format test: transformers' config names
TINY_GPT2 = dict(vocab_size=50, n_positions=32, n_embd=16, n_head=4, n_layer=2)
