"""Per-layer activation statistics of the int8 zoo model on our executor: is any layer dead?

    .venv/bin/python bench/activation_stats.py [--model zoo:mbv2-w0.35-128] [--n 8] [--domain shifted]

Runs stages/executor.run_graph with keep_intermediates on n images of bench/synth_images.py and prints, for every
op's output: the share of values at the tensor's zero point, the share of channels that never leave the zero
point on any input ("dead" channels: a ReLU6 that is always off passes no gradient), the spread over the batch
(the std over the inputs of each value, averaged, in real units: zero means every input gives the same output)
and the std of all the values. The seeded random-init MobileNetV2 the zoo shipped before showed block_16 and
Conv_1 (out_relu) 100% at the zero point with no spread: no gradient reaches any trained layer. The pretrained one
has no dead channel in any layer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import synth_images  # noqa: E402


def layer_stats(graph, x_uint8: np.ndarray) -> list[dict]:
    """One dict per op output (op index, type, short name, at_zero, dead_channels, batch_spread, std)."""
    from tinytrain.stages.golden.forward import run_graph
    from tinytrain.stages.golden.train_step import _feed

    inp = graph.tensors[graph.inputs[0]]
    x = _feed(synth_images.to_model_input(x_uint8), inp)
    vals = run_graph(graph, {inp.name: x}, keep_intermediates=True)
    rows = []
    for i, op in enumerate(graph.ops):
        t = graph.tensors[op.outputs[0]]
        v = vals[t.name]
        if t.quant is not None and t.dtype == "int8":
            s, z = float(t.quant.scale[0]), int(t.quant.zero_point[0])
        else:
            s, z = 1.0, 0
        real = (v.astype(np.float64) - z) * s
        at_zero = v == z
        chan = at_zero.reshape(-1, v.shape[-1]).all(axis=0)
        rows.append({"op": i, "type": op.type, "name": _short(t.name), "at_zero": float(at_zero.mean()),
                     "dead_channels": float(chan.mean()),
                     "batch_spread": float(real.reshape(len(v), -1).std(axis=0).mean()),
                     "std": float(real.std())})
    return rows


def _short(name: str) -> str:
    part = name.split(";")[0].split("/")
    return part[1] if len(part) > 1 else part[0]


def main(argv: list[str] | None = None) -> int:
    from tinytrain.stages.model import zoo
    from tinytrain.stages.model.tflite_reader import read_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:mbv2-w0.35-128")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--domain", default="shifted", choices=synth_images.DOMAINS)
    a = ap.parse_args(argv)
    path = zoo.resolve(a.model) if zoo.is_zoo_ref(a.model) else Path(a.model)
    g = read_model(path)
    rng = np.random.default_rng(0)
    x = synth_images.images(np.arange(a.n) % synth_images.CLASSES, rng, a.domain)
    print(f"{path.name}: {a.n} {a.domain} images")
    print(f"{'op':>3} {'type':<17} {'output of':<28} {'at zp':>6} {'dead ch':>7} {'batch spread':>12} {'std':>8}")
    for r in layer_stats(g, x):
        print(f"{r['op']:>3} {r['type']:<17} {r['name'][:28]:<28} {r['at_zero']:>6.1%} {r['dead_channels']:>7.1%} "
              f"{r['batch_spread']:>12.4f} {r['std']:>8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
