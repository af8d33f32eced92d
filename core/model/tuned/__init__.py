"""The compiled training steps (the tuned track of the models): the encoder's whole step and the
decoder's gradient, each one call into Numba, built from compiled sublayers.

- ``products``: matrix products as register tiles (:func:`products.project`, :func:`products.gram`);
- ``elementwise``: elementwise steps over ``(features, N)`` rows (biases, ReLU, LayerNorm) and Adam;
- ``attention``: the multi-head attention core, one SIMD vector of sequences at a time;
- ``ends``: embedding in; mean pooling, classifier and cross-entropy out;
- ``sublayers``: the parameters' layout in the flat buffer, self-attention and feed-forward sublayers
  with their backward passes;
- ``encoder_step``: the encoder's forward, gradient or whole Adam step (:func:`encoder_step.run`);
- ``decoder_gradient``: the decoder's loss and gradient (cross-attention, causal masks).

Numba's on-disk cache keys a compiled function on its own file only: after editing a kernel here,
clear the caches (``find core -name __pycache__ -exec rm -rf {} +``) or a step in another file
keeps running the old machine code.

No full ``fastmath``: the softmax relies on ``exp`` and comparisons behaving exactly. ``REDUCE``
lets LLVM reassociate sums (so they vectorise) and fuse multiply-adds; it changes roundings, never
how NaN or infinity behave. ``nogil``: two Streamlit sessions training at once run side by side.
"""
REDUCE = {"reassoc", "contract"}
# error_model="numpy": a float division by zero gives inf as in IEEE arithmetic, not Python's
# ZeroDivisionError, whose check in every division keeps a loop out of SIMD lanes.
JIT = dict(cache=True, nogil=True, error_model="numpy")
JIT_REDUCE = dict(JIT, fastmath=REDUCE)
