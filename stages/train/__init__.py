"""A training run's inputs and run-time values: datasets, losses, runtime.bin, checkpoints, and the fp16-mixed rewrite of the
training graph."""
