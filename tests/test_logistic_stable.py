"""The float LOGISTIC of the reference executor: no overflow warning for large |x| (issue 10), same values as
TFLite's reference_ops::Logistic (computed here in float64 with its cut-offs, then rounded to float32)."""

import math
import warnings

import numpy as np

from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.ir import Graph, Op, Tensor


def _reference(v: float) -> float:
    # reference_ops::Logistic: 1 above 16.619047..., exp(x) below -9, else 1 / (1 + exp(-x)).
    if v > 16.619047164916992:
        return 1.0
    if v < -9.0:
        return math.exp(v)
    return 1.0 / (1.0 + math.exp(-v))


def test_logistic_extremes_silent_and_right():
    x = np.array([[-1e30, -3.4e38, -1000.0, -89.0, -50.0, -9.5, -9.0, -1.0, 0.0, 1.0, 16.0, 17.0, 89.0, 1000.0,
                   3.4e38]], np.float32)
    g = Graph(tensors={"x": Tensor("x", list(x.shape), "float32", role="input"),
                       "y": Tensor("y", list(x.shape), "float32", role="output")},
              ops=[Op("logistic", ["x"], ["y"])], inputs=["x"], outputs=["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # any RuntimeWarning (overflow) fails the test
        y = run_graph(g, {"x": x})["y"]
    want = np.array([[_reference(float(v)) for v in x[0]]], np.float64).astype(np.float32)
    np.testing.assert_allclose(y, want, rtol=2e-7, atol=0)
    assert np.all(np.isfinite(y))
