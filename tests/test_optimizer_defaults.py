"""Optimizer hyper-parameter defaults have one source (issue 11, point 5): the spec, the runtime.bin record the
firmware reads and the training graph's runtime_defaults (the golden model's values) agree, for every optimizer."""

from __future__ import annotations

import dataclasses

import pytest

from tinytrain.pipeline.spec import OptimizerSpec as SpecOptimizer
from tinytrain.stages import autodiff, emulate_run
from tinytrain.stages.train.runtime_config import OPTIMIZER_DEFAULTS, RuntimeConfig

# The names of the spec's fields for the runtime record's ones (RMSProp's decay is `rho` in the spec, as in Keras).
SPEC_NAME = {"momentum": "momentum", "beta1": "beta1", "beta2": "beta2", "eps": "eps", "alpha": "rho"}
KINDS = ("sgd", "momentum", "adam", "rmsprop")


def test_the_spec_shows_the_shared_defaults():
    spec = SpecOptimizer()
    for f in dataclasses.fields(OPTIMIZER_DEFAULTS):
        assert getattr(spec, SPEC_NAME[f.name]) == getattr(OPTIMIZER_DEFAULTS, f.name), f.name
    # The values users have always seen (the Keras ones), so no existing spec trains differently.
    assert (spec.eps, spec.rho, spec.beta1, spec.beta2, spec.momentum) == (1e-7, 0.9, 0.9, 0.999, 0.9)


@pytest.mark.parametrize("kind", KINDS)
def test_firmware_record_and_golden_model_get_the_same_values(kind):
    """What emulate-run writes into runtime.bin for a spec and what autodiff bakes into the training graph for the
    same spec (and for its own default OptimizerSpec, which tests and sparse-plan use) are the same numbers."""
    spec = SpecOptimizer(kind=kind)
    rc = emulate_run.runtime_config({"train.learning_rate": 0.01, "train.epochs": 1, "train.optimizer": spec})
    from_spec = autodiff._optimizer_from_config(spec).runtime_defaults()
    assert autodiff.OptimizerSpec(kind=kind).runtime_defaults() == from_spec
    for key, value in from_spec.items():
        if key != "learning_rate":
            assert getattr(rc, key) == value, key
    if kind != "momentum":
        assert rc.momentum == 0.0  # the firmware's plain SGD reads momentum too


def test_a_partial_optimizer_dict_falls_back_to_the_shared_defaults():
    rc = emulate_run.runtime_config({"train.learning_rate": 0.01, "train.epochs": 1,
                                     "train.optimizer": {"kind": "rmsprop"}})
    plain = RuntimeConfig()
    assert (rc.eps, rc.alpha, rc.beta1, rc.beta2) == (plain.eps, plain.alpha, plain.beta1, plain.beta2) == \
        (OPTIMIZER_DEFAULTS.eps, OPTIMIZER_DEFAULTS.alpha, OPTIMIZER_DEFAULTS.beta1, OPTIMIZER_DEFAULTS.beta2)
