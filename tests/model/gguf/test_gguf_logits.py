"""The packaged SmolLM2 GGUF read by transformers (its own GGUF loader, made float64 all the way
through) and by us in float64: the same weights, the same token ids, logits within 1e-9 on one
short prompt, and the same greedy tokens.

One test, in steps: transformers' float64 model (about 1.1 GB) answers first and is dropped before
ours runs, compact, widening a block's weights as the pass reaches it."""
import gc
import os

import numpy as np

from core import pretrained
from core.model import generation
from core.model.compact import wide
from llama_oracle_support import float64_llama
from oracle_support import require

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
NEW_TOKENS = 4
LINEARS = {"attn.W_Q": "self_attn.q_proj", "attn.W_K": "self_attn.k_proj", "attn.W_V": "self_attn.v_proj",
           "attn.W_O": "self_attn.o_proj", "ffn.W_gate": "mlp.gate_proj", "ffn.W_1": "mlp.up_proj",
           "ffn.W_2": "mlp.down_proj"}


def transformers_answers(path: str, ours) -> tuple:
    """transformers' float64 model of the file: its weights checked against ours (compact, widened a
    weight at a time), then ``(token ids, logits (1, T, V), prompt + greedy tokens)`` for the prompt."""
    torch, transformers = require("torch"), require("transformers")
    require("gguf")
    folder, name = os.path.dirname(path), os.path.basename(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float64,
                                                               attn_implementation="eager").eval()
    state = theirs.state_dict()
    for i in range(ours.config.n_layers):
        for our_name, hf in LINEARS.items():
            expected = state[f"model.layers.{i}.{hf}.weight"].numpy().T            # (out, in) -> our (in, out)
            assert np.array_equal(wide(ours.params[f"blocks.{i}.{our_name}"]), expected), (i, our_name)
        assert np.array_equal(ours.params[f"blocks.{i}.ln1.g"], state[f"model.layers.{i}.input_layernorm.weight"])
        assert np.array_equal(ours.params[f"blocks.{i}.ln2.g"],
                              state[f"model.layers.{i}.post_attention_layernorm.weight"])
    embed = state["model.embed_tokens.weight"].numpy()
    for start in range(0, embed.shape[0], 8192):                     # a slice at a time: 38 MB, not 226
        rows = np.arange(start, min(start + 8192, embed.shape[0]))
        assert np.array_equal(ours.params["embed"].rows(rows), embed[rows]), start
    assert np.array_equal(ours.params["ln_final.g"], state["model.norm.weight"])

    ids = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name).encode(PROMPT)
    prompt = torch.tensor([ids])
    with float64_llama(theirs), torch.no_grad():
        logits = theirs(prompt).logits.numpy()
        greedy = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                 do_sample=False)[0].numpy()
    return ids, logits, greedy


def test_float64_weights_ids_logits_and_greedy_tokens_match_transformers(smollm2_file):
    ours = pretrained.load(smollm2_file, np.float64)
    their_ids, expected, their_greedy = transformers_answers(smollm2_file, ours)
    gc.collect()                                                      # transformers' 1.1 GB goes

    ids = ours.encode(PROMPT)
    assert ids.tolist() == their_ids
    logits, _ = ours.forward(ids[None])
    np.testing.assert_allclose(logits, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    run = generation.generate(ours.params, ours.config, prompt=ids, max_new_tokens=NEW_TOKENS, temperature=0)
    assert run.tokens.tolist() == their_greedy.tolist()
    assert ours.decode(run.tokens[len(ids):]) == "The capital of France"
