"""What we train the models on, and how: the toy tasks, the training loop, the runs' settings, the
two tracks of a training step (readable and compiled), the encoder's and the decoders' runs, the
induction model, and the default models shipped with the app. ``python -m core.training`` trains
one from the command line."""
