"""GGUF checkpoints (llama.cpp's single-file format), read in place.

    file.py       the header, metadata and tensor table; the tensors' bytes through a memory map
    quants.py     the weight formats (F16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) and the loops that unpack them
    matrix.py     quantised weights as compact matrices, widened to floats when a product needs them
    tokenizer.py  the tokenizer the metadata describes, as a ``tokenizers.Tokenizer``
    model.py      a Llama-family file's config, weights and tokenizer (``pretrained.load(path)`` runs it)

The packaged SmolLM2-135M-Instruct file is found by :mod:`core.model.smollm2_package`.
"""
