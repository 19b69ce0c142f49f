"""A training run's inputs and run-time values: datasets, losses, runtime.bin and checkpoints."""
