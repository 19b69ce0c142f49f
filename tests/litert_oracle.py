"""Oracles we did not write: LiteRT's reference kernels and TFLite Micro, each run in a child process.

Why a child process: both interpreters can abort the whole process (a failed TFLITE_CHECK, a crash on a graph
they do not expect); a test must report that, not die with it. The child writes every tensor of every sample to
an .npz that the parent reads back.

    res = run_litert(path, [x_batch])      # OpResolverType.BUILTIN_REF, experimental_preserve_all_tensors
    res = run_tflm(path, [x_batch])        # tflite_micro, kPreserveAllTensors
    res.outputs[0]                         # [N, ...] (the file's batch-1 dim folded into N)
    res.tensors[file_tensor_index]         # [N, ...] for activations; constants as stored

Models are run one sample at a time (the fixtures have a static batch of 1), so N can be anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

CHILD_TIMEOUT_S = 120


class OracleCrashed(RuntimeError):
    """The interpreter process died or reported an error; `.stderr` has its last words."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(f"{message}\n{stderr[-3000:]}" if stderr else message)
        self.stderr = stderr


@dataclass
class OracleResult:
    outputs: list[np.ndarray]
    tensors: dict[int, np.ndarray] = field(default_factory=dict)
    input_indices: list[int] = field(default_factory=list)
    output_indices: list[int] = field(default_factory=list)


def probe_batch(g: Any, sample: np.ndarray) -> np.ndarray:
    """Inputs for compare_activations: the model's own sample, two wide random ones (x3 its scale), and for an int8
    input all quantized by its parameters plus the two extremes (every element -128, every element 127)."""
    inp = g.tensors[g.inputs[0]]
    rng = np.random.default_rng(7)
    x = np.concatenate([sample.astype(np.float32), (rng.normal(size=(2,) + sample.shape[1:]) * 3).astype(np.float32)])
    if inp.dtype != "int8":
        return x
    s, z = inp.quant.scale[0], inp.quant.zero_point[0]
    q = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
    edges = np.stack([np.full(sample.shape[1:], -128, np.int8), np.full(sample.shape[1:], 127, np.int8)])
    return np.concatenate([q, edges])


def compare_activations(g: Any, path: Path, x: np.ndarray, runner: Callable[..., OracleResult],
                        fc_requant: str = "fixed_point", float_rtol: float | None = None) -> list[str]:
    """Every activation of `g` (the IR read from `path`: its tensors without data), computed by our reference
    executor, against the oracle's (`runner`: run_litert or run_tflm) tensor of the same file index. int8 / int32
    bit for bit; float32 too, unless `float_rtol` is given (then within it, plus 1e-6 of the tensor's largest
    magnitude). Returns the names checked, in the IR's order; asserts that none differs (listing all that do)."""
    from tinytrain.stages.golden.forward import run_graph

    ours = run_graph(g, {g.inputs[0]: x}, keep_intermediates=True, fc_requant=fc_requant)
    res = runner(path, [x])
    checked, bad = [], []
    for name, t in g.tensors.items():
        if t.data is not None:
            continue
        theirs = res.tensors[t.source_index].reshape(ours[name].shape)
        checked.append(name)
        if t.dtype == "float32" and float_rtol is not None:
            atol = 1e-6 * max(1.0, float(np.abs(theirs).max(initial=0.0)))
            if not np.allclose(ours[name], theirs, rtol=float_rtol, atol=atol):
                bad.append(f"{name}: float mismatch, max |diff| {float(np.abs(ours[name] - theirs).max())}")
        elif not np.array_equal(ours[name], theirs):
            bad.append(f"{name} ({t.dtype}): {int((ours[name] != theirs).sum())} of {theirs.size} elements differ, "
                       f"max |diff| {float(np.abs(ours[name].astype(np.float64) - theirs).max())}")
    assert not bad, bad
    return checked


def tflm_available() -> bool:
    try:
        import tflite_micro  # noqa: F401
    except Exception:
        return False
    return True


def run_litert(model_path: Path, inputs: list[np.ndarray], timeout: float = CHILD_TIMEOUT_S,
               reference: bool = True) -> OracleResult:
    """reference=False: LiteRT's builtin (optimized) kernels without delegates, for ops whose newer versions the
    reference resolver lacks (e.g. DEPTH_TO_SPACE v2, int8)."""
    return _run_child("litert" if reference else "litert_builtin", model_path, inputs, timeout)


def run_tflm(model_path: Path, inputs: list[np.ndarray], timeout: float = CHILD_TIMEOUT_S) -> OracleResult:
    return _run_child("tflm", model_path, inputs, timeout)


def _run_child(backend: str, model_path: Path, inputs: list[np.ndarray], timeout: float) -> OracleResult:
    with tempfile.TemporaryDirectory(prefix=f"oracle-{backend}-") as tmp:
        in_path, out_path = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(in_path, **{f"in{i}": np.asarray(a) for i, a in enumerate(inputs)})
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), backend, str(model_path),
                                   str(in_path), str(out_path)],
                                  capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise OracleCrashed(f"{backend} did not finish {model_path.name} within {timeout}s") from None
        if proc.returncode != 0 or not out_path.exists():
            raise OracleCrashed(f"{backend} failed on {model_path.name} (exit code {proc.returncode})",
                                proc.stderr + proc.stdout)
        with np.load(out_path, allow_pickle=False) as z:
            res = OracleResult(outputs=[], input_indices=[int(i) for i in z["input_indices"]],
                               output_indices=[int(i) for i in z["output_indices"]])
            for k in z.files:
                if k.startswith("t"):
                    res.tensors[int(k[1:])] = z[k]
            res.outputs = [z[f"out{i}"] for i in range(len(res.output_indices))]
        return res


# ---- child side ---------------------------------------------------------------------------------

def _fold(samples: list[np.ndarray]) -> np.ndarray:
    """Per-sample arrays of the file's shape [1, ...] -> [N, ...]; other shapes are stacked."""
    first = samples[0]
    if first.ndim >= 1 and first.shape[0] == 1:
        return np.concatenate(samples, axis=0)
    return np.stack(samples, axis=0)


def _child_litert(model: str, feeds: list[np.ndarray], resolver: str = "BUILTIN_REF") -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interp = Interpreter(model_path=model, experimental_op_resolver_type=getattr(OpResolverType, resolver),
                         experimental_preserve_all_tensors=True, num_threads=1)
    interp.allocate_tensors()
    ins, outs = interp.get_input_details(), interp.get_output_details()
    details = interp.get_tensor_details()
    n = feeds[0].shape[0]
    per_tensor: dict[int, list[np.ndarray]] = {}
    per_output: list[list[np.ndarray]] = [[] for _ in outs]
    for s in range(n):
        for d, x in zip(ins, feeds):
            interp.set_tensor(d["index"], x[s:s + 1].astype(d["dtype"]))
        interp.invoke()
        for j, d in enumerate(outs):
            per_output[j].append(np.array(interp.get_tensor(d["index"])))
        for d in details:
            try:
                arr = np.array(interp.get_tensor(d["index"]))
            except ValueError:
                continue  # tensors without data (e.g. optional operands)
            if arr.dtype.kind in "fiub":  # not resource handles (stateful models' VAR_HANDLE outputs)
                per_tensor.setdefault(d["index"], []).append(arr)
    result = {f"out{j}": _fold(v) for j, v in enumerate(per_output)}
    result.update({f"t{i}": _fold(v) for i, v in per_tensor.items()})
    result["input_indices"] = np.array([d["index"] for d in ins])
    result["output_indices"] = np.array([d["index"] for d in outs])
    return result


def _child_tflm(model: str, feeds: list[np.ndarray]) -> dict[str, np.ndarray]:
    from tflite_micro.python.tflite_micro import runtime

    interp = runtime.Interpreter.from_file(model, arena_size=4 << 20,
                                           intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors)
    n_in = len(feeds)
    in_details = [interp.get_input_details(i) for i in range(n_in)]
    n_out = _count_outputs(model)
    n = feeds[0].shape[0]
    n_tensors = _count_tensors(model)
    per_tensor: dict[int, list[np.ndarray]] = {}
    per_output: list[list[np.ndarray]] = [[] for _ in range(n_out)]
    for s in range(n):
        for i, x in enumerate(feeds):
            interp.set_input(x[s:s + 1].astype(in_details[i]["dtype"]), i)
        interp.invoke()
        for j in range(n_out):
            per_output[j].append(np.array(interp.get_output(j)))
        for t in range(n_tensors):
            try:
                arr = interp.GetTensor(t, 0)
            except Exception:
                continue
            if isinstance(arr, dict):  # {'dtype', 'shape', 'tensor_data'} in the tflite_micro wheel
                arr = arr.get("tensor_data")
            arr = None if arr is None else np.asarray(arr)
            if arr is not None and arr.dtype.kind in "fiub":
                per_tensor.setdefault(t, []).append(arr.copy())
    result = {f"out{j}": _fold(v) for j, v in enumerate(per_output)}
    result.update({f"t{i}": _fold(v) for i, v in per_tensor.items()
                   if len({a.shape for a in v}) == 1})
    ins, outs = _io_indices(model)
    result["input_indices"] = np.array(ins)
    result["output_indices"] = np.array(outs)
    return result


def _subgraph0(model: str):
    import tflite

    buf = Path(model).read_bytes()
    return tflite.Model.GetRootAsModel(buf, 0).Subgraphs(0)


def _count_tensors(model: str) -> int:
    return _subgraph0(model).TensorsLength()


def _count_outputs(model: str) -> int:
    return _subgraph0(model).OutputsLength()


def _io_indices(model: str) -> tuple[list[int], list[int]]:
    sg = _subgraph0(model)
    return ([int(sg.Inputs(i)) for i in range(sg.InputsLength())],
            [int(sg.Outputs(i)) for i in range(sg.OutputsLength())])


def _child_main(argv: list[str]) -> int:
    backend, model, in_path, out_path = argv
    with np.load(in_path, allow_pickle=False) as z:
        feeds = [z[f"in{i}"] for i in range(len(z.files))]
    fn = {"litert": _child_litert, "tflm": _child_tflm,
          "litert_builtin": lambda m, f: _child_litert(m, f, "BUILTIN_WITHOUT_DEFAULT_DELEGATES")}[backend]
    result = fn(model, feeds)
    tmp = out_path + ".part.npz"
    np.savez(tmp, **result)
    os.replace(tmp, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
