"""Run .tflite models in LiteRT with the reference kernels, or in TFLite Micro's Python interpreter,
in a child process (both can abort the whole process on a bad graph, which must fail one test, not
kill pytest).

    python writer_litert.py jobs.json
jobs.json: [{"model": path, "feeds": npz with in0, in1, ... (the subgraph inputs in order), "out": npz to write,
              "runtime": "litert" (default) or "tflm", "n_out": number of outputs (tflm only)}]
The out npz holds out0, out1, ... (the subgraph outputs in order). Positional keys because
converter tensor names contain characters that do not make good zip member names.
"""

import json
import sys

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType


def run(model: str, feeds: list[np.ndarray]) -> list[np.ndarray]:
    it = Interpreter(model_path=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    inputs = it.get_input_details()
    for d, x in zip(inputs, feeds):
        if list(d["shape"]) != list(x.shape):
            it.resize_tensor_input(d["index"], list(x.shape))
    it.allocate_tensors()
    for d, x in zip(inputs, feeds):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def run_tflm(model: str, feeds: list[np.ndarray], n_out: int) -> list[np.ndarray]:
    from tflite_micro.python.tflite_micro import runtime

    with open(model, "rb") as f:
        it = runtime.Interpreter.from_bytes(f.read())
    for i, x in enumerate(feeds):
        it.set_input(x, i)
    it.invoke()
    return [np.array(it.get_output(i)) for i in range(n_out)]


def main() -> None:
    for job in json.load(open(sys.argv[1])):
        with np.load(job["feeds"], allow_pickle=False) as z:
            feeds = [z[f"in{i}"] for i in range(len(z.files))]
        if job.get("runtime", "litert") == "tflm":
            outs = run_tflm(job["model"], feeds, job["n_out"])
        else:
            outs = run(job["model"], feeds)
        np.savez(job["out"], **{f"out{i}": y for i, y in enumerate(outs)})


if __name__ == "__main__":
    main()
