"""Bazel-like build cache: action keys (`keys`), the local store (`store`), an HTTP remote (`remote`)."""
