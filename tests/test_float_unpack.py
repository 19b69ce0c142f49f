"""Float training (fp32, fp16-mixed) of a model whose file stores its weights compressed: float16 (or int8) constants
behind DEQUANTIZE ops, the format of TFLite's float16 quantization and of the MediaPipe models. The quantize stage's
float path (quantize.enabled: false) unpacks them to float32 constants (quantize.float_graph), as int8 calibration
does; before, the layers read DEQUANTIZE results, not constants, so sparse-plan found "no trainable layer" and every
fp16-weight MediaPipe model stopped there in fp32 and fp16-mixed (bench/coverage_fp16-mixed.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tinytrain.stages import quantize
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.memory_model import MemoryModel
from tinytrain.stages.planning.train_plan import TrainPlan
from tinytrain.stages.train.fp16_mixed import to_fp16_mixed
from test_quantize import litert

FIX = Path(__file__).parent / "fixtures"


def test_float16_weights_become_trainable_float32_constants(tmp_path):
    """convnet_f16 (the real converter's float16 weights): every DEQUANTIZE goes, each layer reads a float32
    constant holding the float16 value exactly, with its weight / bias role, and the graph computes what LiteRT
    computes on the file."""
    src = read_model(FIX / "convnet_f16.tflite")
    stored = {op.outputs[0]: src.tensors[op.inputs[0]] for op in src.ops if op.type == "dequantize"}
    assert stored and all(t.dtype == "float16" for t in stored.values())
    assert not MemoryModel(src).layers   # what sparse-plan refused

    g, notes = quantize.float_graph(src)
    assert len(notes) == len(stored) and not any(op.type == "dequantize" for op in g.ops)
    layers = [op for op in g.ops if op.type in ("conv2d", "fully_connected")]
    assert len(layers) == 3 and len(MemoryModel(g).layers) == 3
    for op in layers:
        for name, role in ((op.inputs[1], "weight"), (op.inputs[2], "bias")):
            t = g.tensors[name]
            assert t.dtype == "float32" and t.role == role
            np.testing.assert_array_equal(t.data, np.asarray(stored[name].data).astype(np.float32))
    x = np.load(FIX / "convnet.input.npy").astype(np.float32)
    ours = np.concatenate([run_graph(g, {g.inputs[0]: x[i:i + 1]})[g.outputs[0]] for i in range(len(x))])
    np.testing.assert_allclose(ours, litert(FIX / "convnet_f16.tflite", x, tmp_path), rtol=1e-5, atol=1e-6)


def test_unpacked_float16_model_trains_in_fp16_mixed():
    """The unpacked graph makes an fp16-mixed training graph with fp32 master weights for every layer."""
    g, _ = quantize.float_graph(read_model(FIX / "convnet_f16.tflite"))
    tg = to_fp16_mixed(build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec(), 1),
                       {"kind": "dynamic"})
    trained = {op.inputs[1] for op in g.ops if op.type in ("conv2d", "fully_connected")}
    assert all(tg.tensors[n].dtype == "float32" for n in trained)
    assert any(t.dtype == "float16" for t in tg.tensors.values())


def test_a_float32_model_passes_through_unchanged():
    g = read_model(FIX / "convnet_float.tflite")
    out, notes = quantize.float_graph(g)
    assert notes == [] and [op.type for op in out.ops] == [op.type for op in g.ops]
