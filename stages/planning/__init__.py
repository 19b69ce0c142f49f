"""Planning: what to train (train_plan, contribution analysis, budget search, the analytic memory model), in which order ops run (schedule, streams) and where tensors live (arena)."""
