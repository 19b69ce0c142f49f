"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR end to end: reader, executor (against LiteRT BUILTIN_REF and TFLite
Micro), PTQ, writer, backward (finite differences and PyTorch), C kernels and generated training code.

Fixture: tests/fixtures/ops/resize_{float,int8}.tflite (tests/make_resize_fixtures.py, converter-made): CONV_2D ->
RESIZE_BILINEAR half_pixel_centers (UpSampling2D bilinear) -> align_corners (down) -> neither -> CONV_2D 1x1 ->
RESIZE_NEAREST_NEIGHBOR neither -> align_corners (down) -> half_pixel_centers.

What is bit-exact against what:
  - int8 forward (both ops, every option): our executor == LiteRT BUILTIN_REF == TFLite Micro, on the converter's
    file, on our PTQ of the float file written by our writer, and on a sweep of single-op graphs (up/down sampling,
    output size 1, odd factors); the C kernels == the executor.
  - float forward: our executor == both runtimes bit for bit here (the test allows 1e-5, the project's float
    tolerance); the C kernels == the executor.
  - backward: grad_ops against float64 central differences and PyTorch's upsample_bilinear2d / nearest backward;
    the C kernels == grad_ops.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinytrain.stages.c_emit import ops_header
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages import quantize
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.ir import Graph, Op, QuantParams, Tensor
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model

import litert_oracle as oracle

HERE = Path(__file__).resolve().parent
OPS = HERE / "fixtures" / "ops"
FLOAT_RTOL = 1e-5
MODES = [(False, False), (True, False), (False, True)]  # (align_corners, half_pixel_centers)
RESIZE_OPS = ("resize_bilinear", "resize_nearest_neighbor")

needs_tflm = pytest.mark.skipif(not oracle.tflm_available(), reason="tflite_micro not installed")


def _batch(g: Graph, sample: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = np.concatenate([sample.astype(np.float32), (rng.normal(size=(3,) + sample.shape[1:]) * 3).astype(np.float32)])
    inp = g.tensors[g.inputs[0]]
    if inp.dtype != "int8":
        return x
    s, z = inp.quant.scale[0], inp.quant.zero_point[0]
    q = np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)
    return np.concatenate([q, rng.integers(-128, 128, size=(4,) + sample.shape[1:]).astype(np.int8)])


def _compare(g: Graph, path: Path, x: np.ndarray, runner, fc_requant: str = "fixed_point") -> list[str]:
    """Every activation of g against the runtime's tensor of the same file index; returns the op types checked."""
    checked = set(oracle.compare_activations(g, path, x, runner, fc_requant, float_rtol=FLOAT_RTOL))
    return [op.type for op in g.ops if op.outputs[0] in checked]


# ---- reader ------------------------------------------------------------------------------------------------------

def test_reader_maps_both_ops_and_their_options():
    g = read_model(OPS / "resize_float.tflite")
    got = [(op.type, op.attrs.get("align_corners"), op.attrs.get("half_pixel_centers")) for op in g.ops
           if op.type in RESIZE_OPS]
    assert got == [("resize_bilinear", False, True), ("resize_bilinear", True, False),
                   ("resize_bilinear", False, False), ("resize_nearest_neighbor", False, False),
                   ("resize_nearest_neighbor", True, False), ("resize_nearest_neighbor", False, True)]
    for op in g.ops:
        if op.type in RESIZE_OPS:
            size = g.tensors[op.inputs[1]]
            assert size.dtype == "int32" and list(size.data) == g.tensors[op.outputs[0]].shape[1:3]
            assert size.role == "constant"


def test_reader_rejects_a_size_that_disagrees_with_the_output(tmp_path):
    from tinytrain.pipeline.errors import ModelError

    g = _sweep_graph("float32", [((4, 5), "resize_bilinear", False, False)])
    g.tensors["size0"].data = np.array([4, 6], np.int32)
    path = tmp_path / "bad.tflite"
    write_model(g, path)
    with pytest.raises(ModelError, match="does not match input"):
        read_model(path)


def test_selfie_segmentation_gets_past_resize_bilinear():
    """MediaPipe's selfie segmenter: every RESIZE_BILINEAR is read (and the whole model loads now that its custom
    Convolution2DTransposeBias is read as TRANSPOSE_CONV: tests/test_thirdparty_selfie.py)."""
    path = HERE / "fixtures" / "thirdparty" / "selfie_segmentation.tflite"
    g = read_model(path)
    resizes = [op for op in g.ops if op.type == "resize_bilinear"]
    assert len(resizes) == 3
    assert all(g.tensors[op.outputs[0]].shape[1] >= g.tensors[op.inputs[0]].shape[1] for op in resizes)


# ---- executor against LiteRT and TFLite Micro --------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["float", "int8"])
@pytest.mark.parametrize("runtime", ["litert", pytest.param("tflm", marks=needs_tflm)])
def test_converter_model_matches_the_runtimes(variant, runtime):
    path = OPS / f"resize_{variant}.tflite"
    g = read_model(path)
    x = _batch(g, np.load(OPS / "resize.input.npy"))
    runner = oracle.run_litert if runtime == "litert" else oracle.run_tflm
    seen = _compare(g, path, x, runner)
    assert seen.count("resize_bilinear") == 3 and seen.count("resize_nearest_neighbor") == 3


SWEEP_SIZES = [(10, 14), (3, 4), (1, 1), (1, 9), (16, 5), (5, 7), (13, 29), (2, 2), (4, 3)]


def _sweep_graph(dtype: str, cases) -> Graph:
    """One input [1,5,7,3] read by one resize op per case ((oh, ow), op type, align, half); every output is a graph
    output. int8: all tensors (0.05, -3) (the resizes keep their input's parameters)."""
    q = QuantParams([0.05], [-3]) if dtype == "int8" else None
    tensors = {"x": Tensor("x", [1, 5, 7, 3], dtype, role="input", quant=q)}
    ops, outs = [], []
    for i, ((oh, ow), t, al, hp) in enumerate(cases):
        tensors[f"size{i}"] = Tensor(f"size{i}", [2], "int32", role="constant", data=np.array([oh, ow], np.int32))
        tensors[f"y{i}"] = Tensor(f"y{i}", [1, oh, ow, 3], dtype, role="output", quant=q)
        ops.append(Op(t, ["x", f"size{i}"], [f"y{i}"], {"align_corners": al, "half_pixel_centers": hp}))
        outs.append(f"y{i}")
    return Graph(tensors=tensors, ops=ops, inputs=["x"], outputs=outs)


def _sweep_cases():
    return [(hw, t, al, hp) for hw in SWEEP_SIZES for t in RESIZE_OPS for al, hp in MODES]


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_single_op_sweep_matches_the_runtimes(dtype, tmp_path):
    """Every size of SWEEP_SIZES x both ops x the three coordinate modes, written by our writer, read back, run by
    us, LiteRT and TFLite Micro."""
    g = _sweep_graph(dtype, _sweep_cases())
    path = tmp_path / f"sweep_{dtype}.tflite"
    write_model(g, path)
    back = read_model(path)
    assert [(op.type, op.attrs) for op in back.ops] == [(op.type, op.attrs) for op in g.ops]
    rng = np.random.default_rng(11)
    if dtype == "int8":
        x = rng.integers(-128, 128, size=(6, 5, 7, 3)).astype(np.int8)
    else:
        x = (rng.normal(size=(6, 5, 7, 3)) * 4).astype(np.float32)
    runners = [oracle.run_litert] + ([oracle.run_tflm] if oracle.tflm_available() else [])
    for runner in runners:
        seen = _compare(back, path, x, runner)
        assert len(seen) == len(_sweep_cases())


def test_int8_bilinear_rounds_twice_like_the_reference():
    """ResizeBilinearInteger's default build rounds by +-2^19 away from zero and divides toward zero, so a negative
    tie goes away from zero; a single rounding ((acc + 2^19) >> 20) would give -1 for -1.5. The runtimes agree with
    the executor on the sweep above (which has such ties); here the tie itself."""
    g = _sweep_graph("int8", [((9, 14), "resize_bilinear", True, False)])
    x = np.zeros((1, 5, 7, 3), np.int8)
    x[0, :, 0, :] = np.array([-1, -2, 0, 1, 2])[:, None]
    y = run_graph(g, {"x": x})["y0"]
    # align_corners 5 -> 9 rows: output row 1 is halfway between rows 0 and 1, row 7 between rows 3 and 4
    assert y[0, 1, 0, 0] == -2 and y[0, 7, 0, 0] == 2


# ---- PTQ and writer ----------------------------------------------------------------------------------------------

def test_our_int8_export_is_bit_exact_in_both_runtimes(tmp_path):
    g = read_model(OPS / "resize_float.tflite")
    sample = np.load(OPS / "resize.input.npy")
    calib = np.random.default_rng(3).normal(size=(64,) + sample.shape[1:]).astype(np.float32)
    q, report = quantize.quantize_model(g, calib, QuantizeSpec(), sample)
    assert report["model"]["output_sqnr_db"] > 20
    for op in q.ops:
        if op.type in RESIZE_OPS:  # interpolation of raw int8 values: the output keeps the input's parameters
            assert q.tensors[op.outputs[0]].quant == q.tensors[op.inputs[0]].quant
            assert q.tensors[op.inputs[1]].dtype == "int32"
    path = tmp_path / "resize_ours_int8.tflite"
    write_model(q, path)
    back = read_model(path)
    x = _batch(back, sample)
    _compare(back, path, x, oracle.run_litert, fc_requant="litert_double")
    if oracle.tflm_available():
        _compare(back, path, x, oracle.run_tflm)


@pytest.mark.parametrize("variant", ["float", "int8"])
def test_writer_round_trip_keeps_ops_options_and_versions(variant, tmp_path):
    import tflite

    src = OPS / f"resize_{variant}.tflite"
    g = read_model(src)
    path = tmp_path / f"rt_{variant}.tflite"
    write_model(g, path)
    back = read_model(path)
    assert [(o.type, o.inputs, o.attrs) for o in back.ops] == [(o.type, o.inputs, o.attrs) for o in g.ops]

    def versions(p):
        m = tflite.Model.GetRootAs(p.read_bytes(), 0)
        sg = m.Subgraphs(0)
        out = {}
        for i in range(sg.OperatorsLength()):
            oc = m.OperatorCodes(sg.Operators(i).OpcodeIndex())
            code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
            if code in (23, 97):  # RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR
                out[code] = max(out.get(code, 0), oc.Version())
        return out

    assert versions(path) == versions(src)  # the converter's per-builtin maximum
    x = _batch(g, np.load(OPS / "resize.input.npy"))
    a, b = oracle.run_litert(src, [x]), oracle.run_litert(path, [x])
    np.testing.assert_array_equal(a.outputs[0], b.outputs[0])


# ---- backward ----------------------------------------------------------------------------------------------------

def _fwd64(op_type, x, out_hw, al, hp):
    """The forward in float64 (same coordinate math as the executor, float64 products): for finite differences."""
    from tinytrain.stages.ops.resize import resize_bilinear_axis, resize_nearest_axis

    if op_type == "resize_nearest_neighbor":
        iy = resize_nearest_axis(x.shape[1], out_hw[0], al, hp)
        ix = resize_nearest_axis(x.shape[2], out_hw[1], al, hp)
        return x[:, iy][:, :, ix]
    y0, y1, wy0, wy1 = resize_bilinear_axis(x.shape[1], out_hw[0], al, hp)
    x0, x1, wx0, wx1 = resize_bilinear_axis(x.shape[2], out_hw[1], al, hp)
    wy0, wy1, wx0, wx1 = (w.astype(np.float64) for w in (wy0, wy1, wx0, wx1))
    wy0, wy1, wx0, wx1 = wy0[:, None, None], wy1[:, None, None], wx0[None, :, None], wx1[None, :, None]
    return (x[:, y0][:, :, x0] * wy0 * wx0 + x[:, y1][:, :, x0] * wy1 * wx0
            + x[:, y0][:, :, x1] * wy0 * wx1 + x[:, y1][:, :, x1] * wy1 * wx1)


@pytest.mark.parametrize("op_type", RESIZE_OPS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_hw", [(9, 11), (3, 2), (1, 1)])
def test_grads_against_finite_differences(op_type, mode, out_hw):
    from test_grad_ops import close, fd_grad

    al, hp = mode
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 4, 5, 3)).astype(np.float32)
    r = rng.normal(size=(2,) + out_hw + (3,)).astype(np.float32)
    y = run_graph(_one_op(op_type, "float32", (4, 5, 3), out_hw, al, hp), {"x": x})["y"]
    np.testing.assert_allclose(y, _fwd64(op_type, x.astype(np.float64), out_hw, al, hp), rtol=1e-5, atol=1e-6)
    fn = go.resize_bilinear_grad if op_type == "resize_bilinear" else go.resize_nearest_neighbor_grad
    got = fn(r, x.shape, {"align_corners": al, "half_pixel_centers": hp})
    assert got.dtype == np.float32 and got.shape == x.shape
    close(got, fd_grad(lambda v: _fwd64(op_type, v, out_hw, al, hp), x, r))


@pytest.mark.parametrize("op_type,mode,torch_mode", [
    ("resize_bilinear", (True, False), dict(mode="bilinear", align_corners=True)),
    ("resize_bilinear", (False, True), dict(mode="bilinear", align_corners=False)),
    ("resize_nearest_neighbor", (False, False), dict(mode="nearest")),
    ("resize_nearest_neighbor", (False, True), dict(mode="nearest-exact")),
])
@pytest.mark.parametrize("out_hw", [(8, 10), (7, 3), (2, 13)])
def test_grads_match_pytorch(op_type, mode, torch_mode, out_hw):
    """PyTorch's interpolate backward for the same coordinate mapping (bilinear align_corners=False is TF's
    half_pixel_centers; nearest is TF's legacy floor(i * in/out), nearest-exact its half-pixel form)."""
    torch = pytest.importorskip("torch")
    al, hp = mode
    rng = np.random.default_rng(9)
    x = rng.normal(size=(2, 5, 6, 4)).astype(np.float32)
    r = rng.normal(size=(2,) + out_hw + (4,)).astype(np.float32)
    xt = torch.tensor(x.transpose(0, 3, 1, 2), dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.interpolate(xt, size=out_hw, **torch_mode)
    (yt * torch.tensor(r.transpose(0, 3, 1, 2), dtype=torch.float64)).sum().backward()
    want = xt.grad.numpy().transpose(0, 2, 3, 1)
    fn = go.resize_bilinear_grad if op_type == "resize_bilinear" else go.resize_nearest_neighbor_grad
    got = fn(r, x.shape, {"align_corners": al, "half_pixel_centers": hp})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # and the forward agrees with PyTorch's too
    g = _one_op(op_type, "float32", (5, 6, 4), out_hw, al, hp)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], yt.detach().numpy().transpose(0, 2, 3, 1),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["float", "int8"])
def test_autodiff_trains_through_the_resizes(variant):
    from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
    from tinytrain.stages.planning.train_plan import TrainPlan

    g = read_model(OPS / f"resize_{variant}.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "mse", OptimizerSpec("sgd"), 1)
    tg.validate()
    grads = [op for op in tg.ops if op.type.startswith("resize_")]
    assert sorted(op.type for op in grads).count("resize_bilinear_grad") == 3
    assert sum(op.type == "resize_nearest_neighbor_grad" for op in grads) == 3
    resized = {op.outputs[0] for op in g.ops if op.type in RESIZE_OPS}
    # int8: the resizes never clamp, so no straight-through mask reads their outputs
    assert not any(op.type in ("int8_clamp_grad", "clamp_mask") and op.inputs[-1] in resized for op in tg.ops)


# ---- C kernels ---------------------------------------------------------------------------------------------------

@pytest.fixture
def kbatch(tmp_path_factory, tmp_path):
    from test_kernels_c import HOST_FLAGS, KDIR, DRIVER, Batch, kernel_sources

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    out = tmp_path_factory.mktemp("ttk_resize") / "tt_test_driver"
    cmd = [cc, *HOST_FLAGS, f"-I{KDIR}", f"-I{ops_header.include_dir()}", *map(str, kernel_sources()), str(DRIVER), "-lm", "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return Batch(out, tmp_path)


def _kernel_cases(rng):
    for _ in range(40):
        n = int(rng.integers(1, 3))
        ih, iw, c = int(rng.integers(1, 8)), int(rng.integers(1, 8)), int(rng.integers(1, 5))
        oh, ow = int(rng.integers(1, 17)), int(rng.integers(1, 17))
        al, hp = MODES[int(rng.integers(0, 3))]
        yield n, ih, iw, c, oh, ow, al, hp


def test_c_forward_kernels_match_the_executor(kbatch):
    rng = np.random.default_rng(21)
    refs = []
    for n, ih, iw, c, oh, ow, al, hp in _kernel_cases(rng):
        ints = [n, ih, iw, c, oh, ow, int(al), int(hp)]
        for t, kind in (("resize_bilinear", "bilinear"), ("resize_nearest_neighbor", "nearest")):
            g8 = _one_op(t, "int8", (ih, iw, c), (oh, ow), al, hp)
            x8 = rng.integers(-128, 128, size=(n, ih, iw, c)).astype(np.int8)
            refs.append((kbatch.add(f"resize_{kind}_s8", ints, [], [x8, np.zeros((n, oh, ow, c), np.int8)]),
                         run_graph(g8, {"x": x8})["y"]))
            gf = _one_op(t, "float32", (ih, iw, c), (oh, ow), al, hp)
            xf = (rng.normal(size=(n, ih, iw, c)) * 3).astype(np.float32)
            refs.append((kbatch.add(f"resize_{kind}_f32", ints, [], [xf, np.zeros((n, oh, ow, c), np.float32)]),
                         run_graph(gf, {"x": xf})["y"]))
    res = kbatch.run()
    for k, want in refs:
        np.testing.assert_array_equal(res[k][1], want)


def test_c_backward_kernels_match_grad_ops(kbatch):
    rng = np.random.default_rng(22)
    refs = []
    for n, ih, iw, c, oh, ow, al, hp in _kernel_cases(rng):
        ints = [n, ih, iw, c, oh, ow, int(al), int(hp)]
        attrs = {"align_corners": al, "half_pixel_centers": hp}
        dy = rng.normal(size=(n, oh, ow, c)).astype(np.float32)
        for kind, fn in (("bilinear", go.resize_bilinear_grad), ("nearest", go.resize_nearest_neighbor_grad)):
            refs.append((kbatch.add(f"resize_{kind}_grad_f32", ints, [],
                                    [dy, np.full((n, ih, iw, c), np.nan, np.float32)]),
                         fn(dy, (n, ih, iw, c), attrs)))
    res = kbatch.run()
    for k, want in refs:
        np.testing.assert_array_equal(res[k][1], want)


def _one_op(t, dtype, in_hwc, out_hw, al, hp) -> Graph:
    q = QuantParams([0.1], [5]) if dtype == "int8" else None
    ih, iw, c = in_hwc
    tensors = {"x": Tensor("x", [1, ih, iw, c], dtype, role="input", quant=q),
               "size": Tensor("size", [2], "int32", role="constant", data=np.array(out_hw, np.int32)),
               "y": Tensor("y", [1, out_hw[0], out_hw[1], c], dtype, role="output", quant=q)}
    return Graph(tensors=tensors, ops=[Op(t, ["x", "size"], ["y"], {"align_corners": al, "half_pixel_centers": hp})],
                 inputs=["x"], outputs=["y"])


def test_c_kernels_cross_compile_for_cortex_m7(tmp_path):
    arm = shutil.which("arm-none-eabi-gcc")
    if arm is None:
        pytest.skip("arm-none-eabi-gcc not installed")
    kdir = HERE.parent / "kernels_c"
    for extra in ([], ["-mfpu=fpv5-d16", "-mfloat-abi=hard"]):
        for name in ("tt_resize_bilinear.c", "tt_resize_nearest_neighbor.c"):
            cmd = [arm, "-mcpu=cortex-m7", "-mthumb", *extra, "-std=c99", "-Wall", "-Wextra", "-Werror", "-O2", "-c",
                   str(kdir / "ops" / name), f"-I{kdir}", f"-I{ops_header.include_dir()}", "-o", str(tmp_path / "tt_resize.o")]
            res = subprocess.run(cmd, capture_output=True, text=True)
            assert res.returncode == 0 and not res.stderr, res.stderr


# ---- generated training code -------------------------------------------------------------------------------------

RESIZE_CALLS = {
    "resize_int8": ["tt_resize_bilinear_s8(", "tt_resize_nearest_s8(", "tt_resize_bilinear_grad_f32(",
                    "tt_resize_nearest_grad_f32("],
    "resize_float": ["tt_resize_bilinear_f32(", "tt_resize_nearest_f32(", "tt_resize_bilinear_grad_f32(",
                     "tt_resize_nearest_grad_f32("],
}


@pytest.mark.parametrize("fixture", sorted(RESIZE_CALLS))
def test_generated_code_trains_like_the_golden_model(fixture, tmp_path, monkeypatch):
    """test_codegen's converter-fixture harness (classifier head, 20 steps on the host with ASan/UBSan): int8
    forward bit-exact, losses and parameters as the numpy training executor."""
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no host C compiler")
    import test_codegen as tc

    monkeypatch.setitem(tc.OP_CASES, fixture, RESIZE_CALLS[fixture])
    tc.test_new_ops_train_like_the_golden_model(fixture, tmp_path)
