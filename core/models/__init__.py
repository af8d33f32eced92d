"""The trainable models: the decoder (encoder-decoder and decoder-only), their layers and sampling."""
