"""Oracles for stateful (streaming) models: LiteRT's reference kernels, or TFLite Micro, invoking a model T times
per sequence.

    outs = run_litert_sequence(path, x)    # x [N, T, *input shape without batch] -> outputs [N, T, *output]
    vals = run_litert_sequence(path, x, tensor=17)   # the same for tensor 17 of the file (any activation)
    outs = run_tflm_sequence(path, x)      # TFLite Micro (its MicroResourceVariables), outputs only

Each sequence gets a fresh interpreter, so it starts from the variables' initial values (the CALL_ONCE init
subgraph runs at its first invocation) and the resource variables carry over between its invocations, as on a
device. Run in a child process (see litert_oracle.py for why); only the model's outputs are read back (reading
every tensor, as litert_oracle does, crashes LiteRT on some stateful models).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from litert_oracle import CHILD_TIMEOUT_S, OracleCrashed


def run_litert_sequence(model_path: Path, x: np.ndarray, timeout: float = CHILD_TIMEOUT_S,
                        tensor: int | None = None) -> np.ndarray:
    return _run("litert", model_path, x, timeout, tensor)


def run_tflm_sequence(model_path: Path, x: np.ndarray, timeout: float = CHILD_TIMEOUT_S) -> np.ndarray:
    return _run("tflm", model_path, x, timeout, None)


def _run(backend: str, model_path: Path, x: np.ndarray, timeout: float, tensor: int | None) -> np.ndarray:
    with tempfile.TemporaryDirectory(prefix="oracle-seq-") as tmp:
        in_path, out_path = Path(tmp) / "in.npy", Path(tmp) / "out.npy"
        np.save(in_path, np.asarray(x))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), backend, str(model_path), str(in_path),
                                   str(out_path), str(-1 if tensor is None else tensor)], capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise OracleCrashed(f"{backend} did not finish {model_path.name} within {timeout}s") from None
        if proc.returncode != 0 or not out_path.exists():
            raise OracleCrashed(f"{backend} failed on {model_path.name} (exit code {proc.returncode})",
                                proc.stderr + proc.stdout)
        return np.load(out_path, allow_pickle=False)


def _child(backend: str, model: str, in_path: str, out_path: str, tensor: str) -> int:
    x = np.load(in_path, allow_pickle=False)
    if backend == "tflm":
        return _child_tflm(model, x, out_path)
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    per_seq = []
    for seq in x:
        interp = Interpreter(model_path=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                             num_threads=1, experimental_preserve_all_tensors=int(tensor) >= 0)
        interp.allocate_tensors()
        d_in, d_out = interp.get_input_details()[0], interp.get_output_details()[0]
        read = d_out["index"] if int(tensor) < 0 else int(tensor)
        steps = []
        for frame in seq:
            interp.set_tensor(d_in["index"], frame[None].astype(d_in["dtype"]))
            interp.invoke()
            steps.append(np.array(interp.get_tensor(read))[0])
        per_seq.append(np.stack(steps))
    np.save(out_path, np.stack(per_seq))
    return 0


def _child_tflm(model: str, x: np.ndarray, out_path: str) -> int:
    from tflite_micro.python.tflite_micro import runtime

    per_seq = []
    for seq in x:
        # A fresh interpreter per sequence: its resource variables start from the init subgraph's values. (Reading
        # every tensor, kPreserveAllTensors as litert_oracle.py does, crashes on a stateful model.)
        interp = runtime.Interpreter.from_file(model, arena_size=4 << 20)
        dtype = interp.get_input_details(0)["dtype"]
        steps = []
        for frame in seq:
            interp.set_input(frame[None].astype(dtype), 0)
            interp.invoke()
            steps.append(np.array(interp.get_output(0))[0])
        per_seq.append(np.stack(steps))
    np.save(out_path, np.stack(per_seq))
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:]))
