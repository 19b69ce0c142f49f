"""MediaPipe's selfie segmenter and its custom op `Convolution2DTransposeBias`, read as TRANSPOSE_CONV.

The custom op (mediapipe/util/tflite/operations/transpose_conv_bias.cc) is a float transposed convolution with a
bias: inputs (input, weights [O,KH,KW,I], bias), no output_shape operand, and custom_options that are the raw
bytes of TFLite's `TfLiteTransposeConvParams` (int32 padding enum 1 SAME / 2 VALID, stride_width,
stride_height). The reader turns it into an IR `transpose_conv` (with an int32[4] output_shape constant it
synthesises); the writer writes it back as a standard TRANSPOSE_CONV, which LiteRT runs: that is the oracle for
the float model here. The op's own semantics (bias first, then the scatter, padding pad // 2 at the top/left) are
checked against a NumPy transcription of the kernel's loop on small hand-built files with odd geometry.

Quantization (SQNR, int8 export bit-exact in LiteRT) runs through tests/test_thirdparty_models.py's MODELS table;
here the SQNR of the logits before the final LOGISTIC is also reported and bounded (see
test_selfie_logit_sqnr_reported for why the sigmoid output's SQNR says little on synthetic images).
"""

from __future__ import annotations

import struct
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
import tflite
from tflite.BuiltinOperator import BuiltinOperator as BO

from tinytrain.pipeline.errors import ModelError, UnsupportedOpError
from tinytrain.pipeline.spec_quantize import QuantizeSpec
from tinytrain.stages import quantize
from tinytrain.stages.quant import ptq
from tinytrain.stages.golden.forward import run_graph, run_op
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.model.tflite_writer import write_model

import litert_oracle as oracle
import test_thirdparty_models as tpm

SELFIE = tpm.THIRDPARTY / "selfie_segmentation.tflite"
CUSTOM = "Convolution2DTransposeBias"
SELFIE_OP = 244  # the custom op's operator index in the file


def _selfie_input(n: int, seed: int) -> np.ndarray:
    return tpm.synthetic_images((256, 256, 3), 0.0, 1.0, n, seed=seed)


# ---- the MediaPipe model --------------------------------------------------------------------------------------

def test_selfie_loads_fully_with_the_custom_op_as_transpose_conv():
    g = read_model(SELFIE)
    counts: dict[str, int] = {}
    for op in g.ops:
        counts[op.type] = counts.get(op.type, 0) + 1
    assert counts == {"dequantize": 110, "conv2d": 43, "relu": 22, "add": 14, "hard_swish": 11,
                      "depthwise_conv2d": 11, "logistic": 11, "average_pool2d": 10, "mul": 10,
                      "resize_bilinear": 3, "transpose_conv": 1}
    (tc,) = [op for op in g.ops if op.type == "transpose_conv"]
    assert tc.source_index == SELFIE_OP
    assert tc.attrs == {"stride_h": 2, "stride_w": 2, "padding": "same", "act": "none"}
    x, w, b, os_name = tc.inputs
    assert g.tensors[x].shape == [1, 128, 128, 16] and g.tensors[w].shape == [1, 2, 2, 16]
    assert g.tensors[b].shape == [1] and g.tensors[tc.outputs[0]].shape == [1, 256, 256, 1]
    os_t = g.tensors[os_name]
    assert os_t.dtype == "int32" and os_t.data.tolist() == [1, 256, 256, 1] and os_t.source_index is None
    assert os_t.role == "constant"
    # Weights and bias come through DEQUANTIZE (float16 in the file): their sources get the layer roles.
    srcs = {op.outputs[0]: op.inputs[0] for op in g.ops if op.type == "dequantize"}
    assert g.tensors[srcs[w]].role == "weight" and g.tensors[srcs[b]].role == "bias"
    assert g.tensors[g.inputs[0]].shape == [1, 256, 256, 3] and g.outputs == ["activation_10"]


def test_selfie_float_executor_runs_deterministically():
    g = read_model(SELFIE)
    x = _selfie_input(1, seed=3)
    a = run_graph(g, {g.inputs[0]: x})[g.outputs[0]]
    b = run_graph(g, {g.inputs[0]: x})[g.outputs[0]]
    assert a.shape == (1, 256, 256, 1) and a.dtype == np.float32
    assert np.array_equal(a, b) and np.all(np.isfinite(a)) and a.min() >= 0.0 and a.max() <= 1.0


def test_selfie_written_back_as_transpose_conv_matches_litert(tmp_path):
    """Our writer emits a standard TRANSPOSE_CONV (output_shape operand first); LiteRT BUILTIN_REF runs the
    rewritten float file (it has no kernel for the custom op) and agrees with our executor on the output and
    on every intermediate tensor within 1e-4 of the tensor's largest magnitude."""
    g = read_model(SELFIE)
    path = tmp_path / "selfie_rewritten.tflite"
    write_model(g, path)
    m = tflite.Model.GetRootAs(path.read_bytes(), 0)
    codes = [m.OperatorCodes(j) for j in range(m.OperatorCodesLength())]
    builtin = {max(c.BuiltinCode(), c.DeprecatedBuiltinCode()) for c in codes}
    assert BO.TRANSPOSE_CONV in builtin and BO.CUSTOM not in builtin
    back = read_model(path)
    (tc,) = [op for op in back.ops if op.type == "transpose_conv"]
    assert tc.attrs == {"stride_h": 2, "stride_w": 2, "padding": "same", "act": "none"}

    x = _selfie_input(2, seed=4)
    ours = run_graph(back, {back.inputs[0]: x}, keep_intermediates=True)
    res = oracle.run_litert(path, [x])
    out = back.outputs[0]
    theirs = res.outputs[0].reshape(ours[out].shape)
    scale = max(float(np.abs(theirs).max()), 1e-30)
    assert float(np.abs(ours[out] - theirs).max()) <= 1e-4 * scale
    checked, bad = 0, []
    for name, t in back.tensors.items():
        if t.data is not None or t.source_index not in res.tensors or name not in ours:
            continue
        th = res.tensors[t.source_index]
        if th.size != ours[name].size:
            continue  # DEQUANTIZE of a constant: LiteRT keeps one copy, we broadcast nothing
        th = th.reshape(ours[name].shape)
        checked += 1
        rel = float(np.abs(ours[name] - th).max()) / max(float(np.abs(th).max()), 1e-30)
        if rel > 1e-4:
            bad.append(f"{name}: {rel:.2e}")
    assert not bad, bad
    assert checked >= 130


def test_selfie_logit_sqnr_reported(record_property):
    """On synthetic images (no person) the model's sigmoid output is ~0 almost everywhere (mean ~1e-5), so its
    int8 SQNR (in test_thirdparty_models) is dominated by a handful of 1/256 steps and is far below 0 dB. The
    logits the transposed convolution produces carry the signal: their SQNR is reported and bounded here."""
    g, q, _, x = tpm._quantized(SELFIE.name)
    name = "segment"
    f = run_graph(g, {g.inputs[0]: x}, keep_intermediates=True)
    qi = q.tensors[q.inputs[0]]
    feed = np.clip(np.round(x / qi.quant.scale[0]) + qi.quant.zero_point[0], -128, 127).astype(np.int8)
    r = run_graph(q, {q.inputs[0]: feed}, keep_intermediates=True)
    t = q.tensors[name]
    real = (r[name].astype(np.float64) - t.quant.zero_point[0]) * t.quant.scale[0]
    ref = f[name].astype(np.float64)
    sqnr = quantize.sqnr_db(float(np.sum(ref * ref)), float(np.sum((ref - real) ** 2)))
    record_property("logit_sqnr_db", sqnr)
    print(f"selfie_segmentation: logit ('{name}') SQNR {sqnr:.2f} dB")
    assert sqnr > 10.0


# Why the logits reach only ~13 dB (re_lu_16, an SE block's squeeze, 1.3 dB) where BlazeFace reaches 22 dB: not
# our int8 kernels and not our ranges, but the float model, which amplifies small perturbations of its early
# full-resolution features. Measured on the same synthetic images (8 eval, 16 calibration):
#   - every int8 op alone (float inputs quantized with its int8 input params) is 20-48 dB, near its own
#     output-rounding floor; the int8 graph tracks a float simulation that fake-quantizes every activation with
#     the same (scale, zero point) within ~1 dB on every tensor (below), so the loss is the encodings', not a
#     kernel's (and the int8 export runs bit-exactly in LiteRT: test_thirdparty_models);
#   - calibration ranges recorded with LiteRT's float interpreter on the calibration set equal ours (max
#     relative difference 1e-6) and give the same 13.1 dB;
#   - quantizing the stem conv's output alone (29.9 dB on its own: range [-59, 58], most values small) takes
#     the logits to ~18 dB; 40 dB of white noise on that one tensor, in float, to ~28 dB; weights-only int8
#     (float activations) to ~25.5 dB.
# Other calibration inputs do not help (smooth multi-octave fields: -1.5 dB, synthetic head-and-torso blobs:
# 4.3 dB, each evaluated on its own kind); clipping outliers does, a little: logits 13.1 (minmax), 15.1 (mse),
# 18.2 (percentile 99.99), 19.3 dB (percentile 99.9).

def _fake_quant_run(fg, q, x, only: str | None = None) -> dict[str, np.ndarray]:
    """The prepared float graph `fg` run op by op in float, with `q`'s int8 weights and biases dequantized and
    every activation (or only the one named) fake-quantized with `q`'s (scale, zero point)."""
    vals = {}
    for n, t in fg.tensors.items():
        if t.data is not None:
            qt = q.tensors[n]
            if qt.quant is not None and qt.dtype in ("int8", "int32"):
                vals[n] = ptq._dequant(np.asarray(qt.data), qt.quant).astype(np.float32)
            else:
                vals[n] = t.data

    def fq(name, v):
        if only is not None and name != only:
            return v
        s, z = q.tensors[name].quant.scale[0], q.tensors[name].quant.zero_point[0]
        return ((np.clip(np.round(v / s) + z, -128, 127) - z) * s).astype(np.float32)

    vals[fg.inputs[0]] = fq(fg.inputs[0], x.astype(np.float32))
    for op in fg.ops:
        vals[op.outputs[0]] = fq(op.outputs[0], run_op(fg, op, vals, n=x.shape[0])[0])
    return vals


def _sqnr(ref, real) -> float:
    ref = np.asarray(ref, np.float64)
    return quantize.sqnr_db(float(np.sum(ref * ref)), float(np.sum((ref - np.asarray(real, np.float64)) ** 2)))


def test_selfie_int8_tracks_its_fake_quant_simulation():
    """The int8 graph loses what its encodings lose: per tensor, its SQNR against the float model is within
    1.5 dB of a float run that only rounds every activation to the same int8 grid (0.5 dB on the logits). An
    int8 kernel bug on one of this model's ops (MUL / ADD broadcasts, HARD_SWISH, squeeze-excite pooling,
    RESIZE_BILINEAR, TRANSPOSE_CONV, LOGISTIC) shows up here as a gap."""
    g, q, _, x = tpm._quantized(SELFIE.name)
    fg, _ = ptq.prepare(g)
    f = run_graph(fg, {fg.inputs[0]: x}, keep_intermediates=True)
    sim = _fake_quant_run(fg, q, x)
    qi = q.tensors[q.inputs[0]]
    feed = np.clip(np.round(x / qi.quant.scale[0]) + qi.quant.zero_point[0], -128, 127).astype(np.int8)
    r = run_graph(q, {q.inputs[0]: feed}, keep_intermediates=True)
    gaps = {}
    for op in q.ops:
        n = op.outputs[0]
        t = q.tensors[n]
        real = (r[n].astype(np.float64) - t.quant.zero_point[0]) * t.quant.scale[0]
        gaps[n] = _sqnr(f[n], real) - _sqnr(f[n], sim[n])
    assert len(gaps) == 114
    assert abs(gaps["segment"]) < 0.5, gaps["segment"]
    bad = {n: round(d, 2) for n, d in gaps.items() if abs(d) > 1.5}
    assert not bad, bad


@pytest.mark.slow  # a diagnosis of the model (10 s), not of our code: CI's slow run keeps it
def test_selfie_stem_quantization_alone_costs_the_logits():
    """The model property behind the low SQNR: rounding only the stem conv's output (pre-HARD_SWISH, ~30 dB on
    its own) to its int8 grid, everything else float, already takes the logits below 22 dB."""
    g, q, _, x = tpm._quantized(SELFIE.name)
    fg, _ = ptq.prepare(g)
    (stem,) = [op for op in fg.ops if fg.inputs[0] in op.inputs]
    assert stem.type == "conv2d" and stem.outputs[0] == "conv2d"
    f = run_graph(fg, {fg.inputs[0]: x}, keep_intermediates=True)
    own = _fake_quant_run(fg, q, x, only="conv2d")
    assert _sqnr(f["conv2d"], own["conv2d"]) > 28.0
    assert _sqnr(f["segment"], own["segment"]) < 22.0


@pytest.mark.slow  # a diagnosis of the model (10 s), not of our code: CI's slow run keeps it
def test_selfie_percentile_calibration_logit_sqnr(record_property):
    """Clipping activation outliers (percentile 99.9) buys ~6 dB on the logits over minmax (19.3 vs 13.1 dB)."""
    g, _, _, x = tpm._quantized(SELFIE.name)
    calib = tpm.synthetic_images((256, 256, 3), 0.0, 1.0, tpm.N_CALIB, seed=1)
    q, _ = quantize.quantize_model(g, calib, QuantizeSpec(calibration="percentile", percentile=99.9), x)
    fg, _ = ptq.prepare(g)
    f = run_graph(fg, {fg.inputs[0]: x}, keep_intermediates=True)
    qi = q.tensors[q.inputs[0]]
    feed = np.clip(np.round(x / qi.quant.scale[0]) + qi.quant.zero_point[0], -128, 127).astype(np.int8)
    r = run_graph(q, {q.inputs[0]: feed}, keep_intermediates=True)
    t = q.tensors["segment"]
    sqnr = _sqnr(f["segment"], (r["segment"].astype(np.float64) - t.quant.zero_point[0]) * t.quant.scale[0])
    record_property("logit_sqnr_db_percentile_99_9", sqnr)
    assert sqnr > 16.0


# ---- hand-built files with the custom op ----------------------------------------------------------------------

def _custom_model(x_shape, w_shape, y_shape, options: bytes | None, seed: int = 0, code: str = CUSTOM,
                  with_bias: bool = True) -> bytes:
    """x -> CUSTOM(code)(x, w, b) -> y, float32 constants, custom_options `options` as raw bytes."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=w_shape).astype(np.float32)
    bias = rng.normal(size=[w_shape[0]]).astype(np.float32)
    tensors = [("x", x_shape, None), ("w", w_shape, w), ("b", [w_shape[0]], bias), ("y", y_shape, None)]
    if not with_bias:
        tensors = tensors[:2] + tensors[3:]
    b = flatbuffers.Builder(1024)

    def ints(start, values):
        start(b, len(values))
        for v in reversed(values):
            b.PrependInt32(v)
        return b.EndVector()

    def offsets(start, values):
        start(b, len(values))
        for v in reversed(values):
            b.PrependUOffsetTRelative(v)
        return b.EndVector()

    buffers = []
    tflite.BufferStart(b)
    buffers.append(tflite.BufferEnd(b))
    t_offs = []
    for name, shape, data in tensors:
        buf_index = 0
        if data is not None:
            vec = b.CreateNumpyVector(np.frombuffer(data.tobytes(), np.uint8))
            tflite.BufferStart(b)
            tflite.BufferAddData(b, vec)
            buffers.append(tflite.BufferEnd(b))
            buf_index = len(buffers) - 1
        n = b.CreateString(name)
        s = ints(tflite.TensorStartShapeVector, list(shape))
        tflite.TensorStart(b)
        tflite.TensorAddName(b, n)
        tflite.TensorAddShape(b, s)
        tflite.TensorAddType(b, 0)  # FLOAT32
        tflite.TensorAddBuffer(b, buf_index)
        t_offs.append(tflite.TensorEnd(b))
    n_t = len(tensors)
    ins = ints(tflite.OperatorStartInputsVector, list(range(n_t - 1)))
    outs = ints(tflite.OperatorStartOutputsVector, [n_t - 1])
    opts = b.CreateNumpyVector(np.frombuffer(options, np.uint8)) if options else None
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, 0)
    tflite.OperatorAddInputs(b, ins)
    tflite.OperatorAddOutputs(b, outs)
    if opts is not None:
        tflite.OperatorAddCustomOptions(b, opts)
    op = tflite.OperatorEnd(b)
    t_vec = offsets(tflite.SubGraphStartTensorsVector, t_offs)
    o_vec = offsets(tflite.SubGraphStartOperatorsVector, [op])
    i_vec = ints(tflite.SubGraphStartInputsVector, [0])
    out_vec = ints(tflite.SubGraphStartOutputsVector, [n_t - 1])
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, t_vec)
    tflite.SubGraphAddOperators(b, o_vec)
    tflite.SubGraphAddInputs(b, i_vec)
    tflite.SubGraphAddOutputs(b, out_vec)
    sg = tflite.SubGraphEnd(b)
    c = b.CreateString(code)
    tflite.OperatorCodeStart(b)
    tflite.OperatorCodeAddBuiltinCode(b, BO.CUSTOM)
    tflite.OperatorCodeAddDeprecatedBuiltinCode(b, BO.CUSTOM)
    tflite.OperatorCodeAddCustomCode(b, c)
    oc = tflite.OperatorCodeEnd(b)
    code_vec = offsets(tflite.ModelStartOperatorCodesVector, [oc])
    sg_vec = offsets(tflite.ModelStartSubgraphsVector, [sg])
    buf_vec = offsets(tflite.ModelStartBuffersVector, buffers)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, code_vec)
    tflite.ModelAddSubgraphs(b, sg_vec)
    tflite.ModelAddBuffers(b, buf_vec)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _params(padding: int, stride_w: int, stride_h: int) -> bytes:
    return struct.pack("<3i", padding, stride_w, stride_h)


def _mp_out(padding: str, n: int, k: int, s: int) -> int:
    pad = max(0, k - (n - 1) % s - 1) if padding == "same" else 0
    return s * (n - 1) + k - pad


def _mediapipe_reference(x, w, b, sh, sw, padding):
    """transpose_conv_bias.cc's Eval in NumPy (float64): the output starts at the bias; every input pixel adds
    x * w[:, ky, kx, :] at (iy * sh - pad_h // 2 + ky, ix * sw - pad_w // 2 + kx) where that lies inside."""
    n, h, wd, _ = x.shape
    o, kh, kw, _ = w.shape
    ph = max(0, kh - (h - 1) % sh - 1) if padding == "same" else 0
    pw = max(0, kw - (wd - 1) % sw - 1) if padding == "same" else 0
    oh, ow = sh * (h - 1) + kh - ph, sw * (wd - 1) + kw - pw
    full = np.zeros((n, (h - 1) * sh + kh, (wd - 1) * sw + kw, o))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for ky in range(kh):
        for kx in range(kw):
            full[:, ky:ky + (h - 1) * sh + 1:sh, kx:kx + (wd - 1) * sw + 1:sw, :] += x64 @ w64[:, ky, kx, :].T
    return b.astype(np.float64) + full[:, ph // 2:ph // 2 + oh, pw // 2:pw // 2 + ow, :]


# (x [N,H,W,C], w [O,KH,KW,I], strides (h, w), padding): odd SAME paddings on both axes, VALID, stride 1.
GEOMETRIES = [
    ([1, 5, 6, 2], [3, 3, 4, 2], (2, 3), "same"),
    ([1, 4, 4, 3], [2, 3, 3, 3], (2, 2), "same"),
    ([1, 4, 3, 2], [2, 3, 2, 2], (2, 1), "valid"),
    ([1, 6, 5, 1], [1, 5, 5, 1], (1, 1), "same"),
]


@pytest.mark.parametrize("x_shape,w_shape,strides,padding", GEOMETRIES)
def test_custom_op_matches_mediapipe_kernel_and_litert(tmp_path, x_shape, w_shape, strides, padding):
    sh, sw = strides
    y_shape = [x_shape[0], _mp_out(padding, x_shape[1], w_shape[1], sh),
               _mp_out(padding, x_shape[2], w_shape[2], sw), w_shape[0]]
    src = tmp_path / "custom.tflite"
    src.write_bytes(_custom_model(x_shape, w_shape, y_shape, _params({"same": 1, "valid": 2}[padding], sw, sh)))
    g = read_model(src)
    (op,) = g.ops
    assert op.type == "transpose_conv" and op.source_index == 0
    assert op.attrs == {"stride_h": sh, "stride_w": sw, "padding": padding, "act": "none"}
    x = np.random.default_rng(7).normal(size=[3] + x_shape[1:]).astype(np.float32)
    ours = run_graph(g, {g.inputs[0]: x})[g.outputs[0]]
    w, b = g.tensors[op.inputs[1]].data, g.tensors[op.inputs[2]].data
    ref = _mediapipe_reference(x, w, b, sh, sw, padding)
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)
    out = tmp_path / "rewritten.tflite"
    write_model(g, out)
    res = oracle.run_litert(out, [x])
    np.testing.assert_allclose(ours, res.outputs[0].reshape(ours.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options,match", [
    (None, r"custom_options hold 0 bytes"),
    (b"\x01\x00\x00\x00\x02\x00\x00\x00", r"custom_options hold 8 bytes"),
    (_params(1, 2, 2) + b"\x00", r"custom_options hold 13 bytes"),
    (_params(0, 2, 2), r"custom_options padding code 0 is not SAME \(1\) or VALID \(2\)"),
    (_params(3, 2, 2), r"custom_options padding code 3"),
    (_params(1, 0, 2), r"stride_w must be >= 1"),
    (_params(1, 2, -1), r"stride_h must be >= 1"),
], ids=["missing", "short", "ragged", "padding-unknown", "padding-3", "stride-w-0", "stride-h-negative"])
def test_malformed_custom_options_are_a_clear_model_error(tmp_path, options, match):
    p = tmp_path / "bad.tflite"
    p.write_bytes(_custom_model([1, 4, 4, 2], [3, 2, 2, 2], [1, 8, 8, 3], options))
    with pytest.raises(ModelError, match=rf"operator 0 \(CUSTOM\({CUSTOM}\)\): {match}"):
        read_model(p)


def test_longer_custom_options_are_read(tmp_path):
    """Newer TfLiteTransposeConvParams append fields (activation, bias type); the first 12 bytes decide."""
    p = tmp_path / "long.tflite"
    p.write_bytes(_custom_model([1, 4, 4, 2], [3, 2, 2, 2], [1, 8, 8, 3], _params(1, 2, 2) + bytes(8)))
    assert read_model(p).ops[0].attrs == {"stride_h": 2, "stride_w": 2, "padding": "same", "act": "none"}


@pytest.mark.parametrize("y_shape", [[1, 9, 8, 3], [1, 8, 8, 4], [1, 7, 7, 3]])
def test_output_shape_against_the_stride_and_padding_rule(tmp_path, y_shape):
    p = tmp_path / "shape.tflite"
    p.write_bytes(_custom_model([1, 4, 4, 2], [3, 2, 2, 2], y_shape, _params(1, 2, 2)))
    with pytest.raises(ModelError, match=rf"operator 0 \(CUSTOM\({CUSTOM}\)\): output shape \[1, .*\] differs "
                                         r"from \[1, 8, 8, 3\]"):
        read_model(p)


def test_custom_op_needs_its_bias(tmp_path):
    p = tmp_path / "nobias.tflite"
    p.write_bytes(_custom_model([1, 4, 4, 2], [3, 2, 2, 2], [1, 8, 8, 3], _params(1, 2, 2), with_bias=False))
    with pytest.raises(ModelError, match=rf"operator 0 \(CUSTOM\({CUSTOM}\)\) has 2 inputs"):
        read_model(p)


def test_other_custom_ops_stay_refused_with_name_and_index(tmp_path):
    p = tmp_path / "other.tflite"
    p.write_bytes(_custom_model([1, 4, 4, 2], [3, 2, 2, 2], [1, 8, 8, 3], _params(1, 2, 2),
                                code="Convolution2DTransposeBiasX"))
    with pytest.raises(UnsupportedOpError, match=r"unsupported op CUSTOM\(Convolution2DTransposeBiasX\) at "
                                                 r"operator index 0"):
        read_model(p)
