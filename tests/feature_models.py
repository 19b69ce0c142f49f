"""Small float models for the data-rank and multi-output tests, written with the project's own TFLite writer
(stages/model/tflite_writer.py; TensorFlow is not installed here, so the converter cannot make them). Built in code at
test time, so no binary fixture is committed; the writer's output is read back by the same reader as any model.

- `features_mlp(features, hidden, classes)`: [1, F] -> FC + relu -> FC -> softmax (a classifier on flat features).
- `two_head_mlp(features)`: [1, F] -> FC + relu (shared trunk) -> `scores` [1, 3] (logits) and `boxes` [1, 4]
  (a detector's two heads: per-anchor scores and box regression), plus an untrained third output `aux`.
- `without_softmax(graph)`: a classifier made a regression model (its final softmax removed in the IR: the layer
  before it is the prediction).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_writer import write_model


class _Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []

    def t(self, name: str, shape, role="activation", data=None) -> str:
        self.tensors[name] = Tensor(name, list(shape), "float32", role=role, data=data)
        return name

    def fc(self, name: str, x: str, n_in: int, n_out: int, act: str = "none") -> str:
        w = (self.rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (self.rng.standard_normal(n_out) * 0.1).astype(np.float32)
        wt = self.t(f"{name}/w", w.shape, "weight", w)
        bt = self.t(f"{name}/b", b.shape, "bias", b)
        y = self.t(name, [1, n_out])
        self.ops.append(Op("fully_connected", [x, wt, bt], [y], {"act": act, "keep_num_dims": False}))
        return y

    def graph(self, inputs: list[str], outputs: list[str]) -> Graph:
        for o in outputs:
            self.tensors[o].role = "output"
        g = Graph(self.tensors, self.ops, inputs, outputs)
        g.validate()
        return g


def features_mlp(features: int = 64, hidden: int = 16, classes: int = 4, seed: int = 0) -> Graph:
    n = _Net(seed)
    x = n.t("features", [1, features], "input")
    h = n.fc("hidden", x, features, hidden, "relu")
    z = n.fc("logits", h, hidden, classes)
    y = n.t("probs", [1, classes])
    n.ops.append(Op("softmax", [z], [y], {"beta": 1.0}))
    return n.graph([x], [y])


def two_head_mlp(features: int = 16, hidden: int = 12, seed: int = 0) -> Graph:
    n = _Net(seed)
    x = n.t("features", [1, features], "input")
    h = n.fc("trunk", x, features, hidden, "relu")
    scores = n.fc("scores", h, hidden, 3)
    boxes = n.fc("boxes", h, hidden, 4)
    aux = n.fc("aux", x, features, 2)  # read from the input only: pruned when not trained
    return n.graph([x], [scores, boxes, aux])


def without_softmax(g: Graph) -> Graph:
    """`g` with its final softmax removed (in place): the softmax's input becomes the model's output."""
    sm = g.ops[-1]
    assert sm.type == "softmax"
    g.ops.pop()
    g.outputs = [sm.inputs[0]]
    del g.tensors[sm.outputs[0]]
    return g


def write(graph: Graph, path: Path) -> Path:
    write_model(graph, path)
    return path
