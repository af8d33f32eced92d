"""The questions of the page "Masks and cross-attention"."""
import numpy as np

from core import masks
from core.lessons.predictions import Prediction

PAGE = "masks"

# The padding question: one sequence of a batch padded to T positions.
PAD_T, PAD_LENGTH = 6, 3
_keys_read = int(np.isfinite(masks.padding([PAD_LENGTH], PAD_T)).sum())      # keys left at 0, not −∞

QUESTIONS: tuple[Prediction, ...] = (
    Prediction(
        f"{PAGE}.causal_row", PAGE,
        "One head reads a sentence of at least 5 tokens, with the causal mask added to its scores. "
        "What weight does query 2 put on key 5, and what do query 2's weights add up to?",
        0,
        "The mask adds −∞ to a score before the softmax. What is e^(−∞), and what does the softmax "
        "divide by?",
        "e^(−∞) = 0, so key 5 gets exactly 0. The softmax then divides by the sum over the keys left "
        "(1 and 2), so the row still adds up to 1: the share the future keys would have taken goes to "
        "the keys query 2 may read. Turn the causal mask on below and read row 2.",
        options=(
            "Exactly 0 on key 5; the row still adds up to 1.",
            "Exactly 0 on key 5; the row adds up to less than 1 (key 5's share is lost).",
            "A small weight on key 5 (its score is only lowered); the row adds up to 1.",
            "The same weight as without the mask: the mask only changes the later rows.",
        ),
    ),
    Prediction(
        f"{PAGE}.padded_keys", PAGE,
        f"A batch is padded to T = {PAD_T} positions, and one of its sequences has length {PAD_LENGTH} "
        "(no causal mask). How many keys does each query of that sequence read (weight above 0)?",
        _keys_read,
        f"The padding mask puts −∞ on that sequence's keys {PAD_LENGTH + 1} to {PAD_T}, for every query.",
        f"Keys 1 to {PAD_LENGTH} are real and the rest are padding, so every query of that sequence, "
        f"padded queries included, reads exactly {_keys_read} keys. Type lengths below and read the "
        "keys-read table.",
    ),
    Prediction(
        f"{PAGE}.cross_queries", PAGE,
        "In the decoder of an encoder-decoder Transformer, where do the queries of the cross-attention "
        "sublayer come from?",
        1,
        "The cross-attention map on this page has one row per query: count its rows.",
        "The decoder asks and the encoder answers: queries come from the decoder's stream, keys and "
        "values from the encoder's output. That is why the cross-attention map is rectangular, one row "
        "per target token and one column per source token.",
        options=(
            "The encoder's output states",
            "The decoder's own stream, i.e. the output of the masked self-attention sublayer before it",
            "The target embeddings alone, before any layer",
            "The positional encoding table",
        ),
    ),
    Prediction(
        f"{PAGE}.which_architecture", PAGE,
        "You need to label each review in a collection as positive or negative. Which family fits best?",
        0,
        "Does the task write a new sequence, or read a given one and give it a label?",
        "The task is to understand a given sequence, not to produce a new one: an encoder reads the "
        "whole review in both directions at once and a small classifier sits on top. Decoder-only "
        "models are built to generate; encoder-decoder models to map one sequence to another "
        "(translation, summaries).",
        options=("Encoder-only (like BERT)", "Decoder-only (like GPT)", "Encoder-decoder (like T5)"),
    ),
)
