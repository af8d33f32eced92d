"""What a transformer is: its settings (config.py), the readable forward and backward passes, the
sublayers, the encoder-decoder, the compiled steps (compiled/), generation and sampling, and the
checkpoints (GPT-2, BERT and our own ``.npz`` files)."""
