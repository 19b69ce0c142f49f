"""The numpy golden model: forward.py runs a forward IR (float or int8, bit-exact with TFLite Micro), train_step.py a training IR; the generated C must match both bit for bit."""
