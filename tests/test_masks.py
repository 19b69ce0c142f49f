"""1-bit activation masks for the backward pass (autodiff's clamp_mask / mask_grad; kernels_c/tt_mask.c).

Where the backward reads a forward output y only to mask a gradient with it (int8_clamp_grad, act_grad of relu /
relu6 / relu_n1_to_1), autodiff saves ceil(n/8) bytes of bits instead of y. Checked here:
  - the numpy kernels' semantics (boundaries, NaN / inf, bit order, bit offsets);
  - training with masks is bit-identical to training without (losses and every trained tensor), float and int8,
    batch 1 and 2 (masks are per sample), and masks appear only where nothing else reads y after the forward;
  - memory: on MobileNetV2-w0.35 (TTE-like sparse plan) the saved activations and the peaks shrink, the mask is
    counted at ceil(n/8) bytes, and plan_memory's fast estimate follows the exact planner;
  - the C kernels against numpy on the host (ASan/UBSan), and warning-free for Cortex-M7; the generated programs
    of tests/test_codegen.py's cases call them (that test compares those programs with the numpy model).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_codegen import _data  # the same random int8 / float samples and labels
from tinytrain.stages import codegen
from tinytrain.stages.c_emit import ops_header
from tinytrain.stages.c_emit.literals import flit
from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden import train_step as te
from tinytrain.stages.autodiff import OptimizerSpec, QASOptions, build_training_graph
from tinytrain.stages.planning.arena import MemOptions, counted_bytes, plan_memory
from tinytrain.stages.planning.memory_model import MemoryModel, MemorySettings
from tinytrain.stages.reorder import plan_schedules
from tinytrain.stages.planning.schedule import plain_order
from tinytrain.stages.model.tflite_reader import read_model
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
KDIR = ROOT / "kernels_c"
CFLAGS = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]
F32 = np.float32


# ---- numpy kernels ---------------------------------------------------------------------------------------------

def test_clamp_mask_bit_order_and_int8_bounds():
    y = np.array([-128, -127, 0, 126, 127, 5, -128, 3, 9], np.int8)
    m = go.clamp_mask(y, -128, 127)
    assert m.dtype == np.uint8 and m.shape == (2,)
    bits = [(int(m[i // 8]) >> (i % 8)) & 1 for i in range(len(y))]
    assert bits == [0, 1, 1, 1, 0, 1, 0, 1, 1]        # strict: the clamped ends do not pass
    assert int(m[1]) == 1                              # unused high bits are 0
    # the same test as int8_clamp_grad
    dy = np.arange(1, 10, dtype=F32)
    assert np.array_equal(go.mask_grad(dy, m), np.where((y > -128) & (y < 127), dy, F32(0)))


@pytest.mark.parametrize("act,lo,hi", [("relu", 0.0, None), ("relu6", 0.0, 6.0), ("relu_n1_to_1", -1.0, 1.0)])
def test_float_masks_match_act_grad_at_the_boundaries(act, lo, hi):
    y = np.array([-np.inf, -1.0, -0.0, 0.0, 1e-45, 0.5, 1.0, 5.999999, 6.0, 7.0, np.inf, np.nan], F32)
    dy = np.linspace(-3, 3, len(y)).astype(F32)
    got = go.mask_grad(dy, go.clamp_mask(y, lo, hi))
    want = go.act_grad(dy, y, act)
    assert got.dtype == F32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_mask_grad_bit_offset_and_shape():
    rng = np.random.default_rng(0)
    y = rng.integers(-128, 128, size=(1, 5, 5, 3)).astype(np.int8)
    dy = rng.standard_normal(y.shape).astype(F32)
    m = go.clamp_mask(y, -10, 100)
    assert m.shape == ((y.size + 7) // 8,)
    full = go.mask_grad(dy, m)
    assert full.shape == y.shape
    for off in (0, 3, 8, 13, 70):
        part = go.mask_grad(dy.reshape(-1)[off:], m, bit_offset=off)
        assert np.array_equal(part, full.reshape(-1)[off:])


# ---- training graphs -------------------------------------------------------------------------------------------

def _plans(g):
    ops = TrainPlan.trainable_ops(g)
    return {"full": TrainPlan.full(g), "bias_only": TrainPlan.bias_only(g), "last_k": TrainPlan.last_k(g, 2),
            "partial": TrainPlan([LayerPlan(ops[-2], bias=True, weight_ratio=0.5),
                                  LayerPlan(ops[-1], bias=True, weight_ratio=1.0)])}


def _check_structure(tg):
    """Masks in the forward right after their activation's producer; y no longer read after the forward."""
    meta = tg.meta["train"]
    n_fwd = int(meta["phases"]["forward"])
    prod = {t: i for i, op in enumerate(tg.ops) for t in op.outputs}
    masks = {}
    for i, op in enumerate(tg.ops):
        if op.type == "clamp_mask":
            y, m = op.inputs[0], op.outputs[0]
            assert prod[y] < i < n_fwd
            assert all(o.type == "clamp_mask" for o in tg.ops[prod[y] + 1:i])   # right after the producer
            t = tg.tensors[m]
            n = int(np.prod(tg.tensors[y].shape))
            assert t.dtype == "uint8" and t.shape == [(n + 7) // 8] and t.data is None
            masks[m] = y
    for i, op in enumerate(tg.ops[n_fwd:], n_fwd):
        assert op.type != "clamp_mask"
        for t in op.inputs:
            assert t not in masks.values(), f"op #{i} {op.type} reads masked {t}"
        if op.type == "mask_grad":
            assert op.inputs[1] in masks and i < int(meta["sample_ops"])
    return len(masks)


CASES = ["mlp_float", "convnet_float", "dwsep_float", "residual_float", "mlp_int8", "convnet_int8", "dwsep_int8",
         "residual_int8", "digits_cnn_int8", "convnet_int8_floatio"]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", CASES)
def test_training_with_masks_is_bit_identical(name, batch):
    g = read_model(FIX / f"{name}.tflite")
    used = 0
    for scheme, plan in _plans(g).items():
        opt = OptimizerSpec("adam" if scheme == "partial" else "sgd", learning_rate=0.05)
        plain = build_training_graph(g, plan, "cross_entropy", opt, batch, masks=False)
        masked = build_training_graph(g, plan, "cross_entropy", opt, batch, masks=True)
        assert not any(op.type in ("clamp_mask", "mask_grad") for op in plain.ops)
        k = _check_structure(masked)
        used += k
        types = [op.type for op in masked.ops]
        assert types.count("mask_grad") == k
        # each mask replaced exactly one masking op
        assert (types.count("int8_clamp_grad") + types.count("act_grad") + k
                == sum(op.type in ("int8_clamp_grad", "act_grad") for op in plain.ops))
        x, y = _data(plain, 4 * batch)
        l0, s0 = te.train(plain, x, y, steps=4, seed=3)
        l1, s1 = te.train(masked, x, y, steps=4, seed=3)
        assert l0 == l1, scheme
        assert s0.keys() == s1.keys()
        for key in s0:
            assert s0[key].dtype == s1[key].dtype and s0[key].tobytes() == s1[key].tobytes(), (scheme, key)
    assert used > 0 or name == "mlp_float"


@pytest.mark.parametrize("name", ["act_arith", "prelu_slice", "bn_input"])
def test_elementwise_ops_models_with_masks_are_bit_identical(name):
    """mul / sub / hard_swish / leaky_relu / prelu / logistic / tanh / strided_slice (MSE, int8 and the float
    twin counted as int8, batch 2)."""
    from tinytrain.stages.planning.arena import int8_twin
    q = read_model(FIX / "ops" / f"{name}_int8.tflite")
    for g in (q, int8_twin(q)):
        for plan in (TrainPlan.full(g), TrainPlan.bias_only(g)):
            tgs = [build_training_graph(g, plan, "mse", OptimizerSpec("momentum", learning_rate=0.01), 2, masks=m)
                   for m in (False, True)]
            _check_structure(tgs[1])
            xt = tgs[0].tensors[g.inputs[0]]
            rng = np.random.default_rng(0)
            x = rng.standard_normal([4] + list(xt.shape[1:])).astype(F32)
            yt = tgs[0].tensors[tgs[0].meta["train"]["label_input"]]
            y = rng.standard_normal([4] + list(yt.shape[1:])).astype(F32)
            (l0, s0), (l1, s1) = (te.train(tg, x, y, steps=2, seed=1) for tg in tgs)
            assert l0 == l1
            assert all(s0[k].tobytes() == s1[k].tobytes() for k in s0)


def test_weight_gradient_reader_keeps_the_activation():
    """The input of a trained weight's gradient is read in the backward anyway: no mask for it."""
    g = read_model(FIX / "digits_cnn_int8.tflite")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec("sgd"), 1)
    masked = {op.inputs[0] for op in tg.ops if op.type == "clamp_mask"}
    for op in tg.ops:
        if op.type in ("dequantize_slice", "max_pool2d_grad", "dequantize"):
            assert op.inputs[0] not in masked
    kept = [op for op in tg.ops if op.type == "int8_clamp_grad"]
    assert kept and all(op.inputs[1] not in masked for op in kept)


# ---- memory: MobileNetV2 -----------------------------------------------------------------------------------------

def _bench_mbv2():
    bench = str(ROOT / "bench")
    sys.path.insert(0, bench)
    try:
        import memory_mbv2
    finally:
        sys.path.remove(bench)
    return memory_mbv2


@pytest.fixture(scope="module")
def mbv2():
    from tinytrain.stages.model import zoo
    g = read_model(zoo.resolve("zoo:mbv2-w0.35-128"))
    plan = _bench_mbv2().tte_like_plan(g)[0]
    qas = QASOptions(enabled=True, rounding="nearest", master_copy=False)
    tgs = {m: build_training_graph(g, plan, "cross_entropy", OptimizerSpec("sgd"), 1, qas, masks=m)
           for m in (False, True)}
    return g, plan, tgs


def _saved_bytes(tg) -> int:
    """SRAM bytes of forward tensors that are still needed after the forward (alive at the loss op)."""
    n_fwd = int(tg.meta["train"]["phases"]["forward"])
    sizes = counted_bytes(tg)
    made = {t for op in tg.ops[:n_fwd] for t in op.outputs}
    later = {t for op in tg.ops[n_fwd:] for t in op.inputs}
    return sum(sizes[t] for t in made & later if t in sizes and tg.tensors[t].data is None)


def test_mbv2_saved_activations_and_peaks_shrink(mbv2):
    g, plan, tgs = mbv2
    plain, masked = tgs[False], tgs[True]
    k = _check_structure(masked)
    assert k >= 20
    sizes = counted_bytes(masked)
    for op in masked.ops:
        if op.type == "clamp_mask":
            n = int(np.prod(masked.tensors[op.inputs[0]].shape))
            assert sizes[op.outputs[0]] == (n + 7) // 8
    before, after = _saved_bytes(plain), _saved_bytes(masked)
    assert after < before * 0.75, (before, after)
    p0 = plan_memory(plain, plain_order(plain), MemOptions())
    p1 = plan_memory(masked, plain_order(masked), MemOptions())
    assert p1.lower_bound < p0.lower_bound and p1.arena < p0.arena
    _, b0, _, _ = plan_schedules(plain, True)
    _, b1, _, c1 = plan_schedules(masked, True)
    assert b1.arena < b0.arena
    # the fast estimate follows the masks (and reorder's streams): within 2 % of the exact peak
    est = {m: MemoryModel(g, MemorySettings(masks=m)).estimate(plan)["total"] for m in (False, True)}
    assert est[True] < est[False]
    assert 0.98 <= est[True] / b1.arena <= 1.02


# ---- C kernels ---------------------------------------------------------------------------------------------------

_DRIVER = r"""
#include <stdio.h>
#include "tt_kernels.h"
#include "tt_mask.h"
%(data)s
int main(void)
{
    uint8_t m8[%(nb)d], mf[%(nb)d];
    float dz[%(n)d];
    int32_t i, off;
    tt_clamp_mask_s8(%(n)d, %(lo)d, %(hi)d, ys8, m8);
    tt_clamp_mask_f32(%(n)d, %(flo)s, %(fhi)s, yf, mf);
    for (i = 0; i < %(nb)d; ++i) printf("%%u %%u\n", (unsigned)m8[i], (unsigned)mf[i]);
    for (off = 0; off < 20; off += 7) {
        tt_mask_grad_f32(%(n)d - off, off, m8, dy + off, dz);
        for (i = 0; i < %(n)d - off; ++i) {
            union { float f; uint32_t u; } c;
            c.f = dz[i];
            printf("%%u\n", (unsigned)c.u);
        }
    }
    /* in place */
    tt_mask_grad_f32(%(n)d, 0, mf, dy, dy);
    for (i = 0; i < %(n)d; ++i) { union { float f; uint32_t u; } c; c.f = dy[i]; printf("%%u\n", (unsigned)c.u); }
    return 0;
}
"""


def _c_floats(a) -> str:
    out = []
    for v in a:
        v = float(v)
        out.append("NAN" if np.isnan(v) else ("INFINITY" if v == np.inf else ("(-INFINITY)" if v == -np.inf
                                                                                else flit(v))))
    return ", ".join(out)


@pytest.mark.parametrize("simd", [False, True], ids=["portable", "host-simd"])
@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_c_kernels_match_numpy(tmp_path, act, simd):
    """Bit for bit against numpy; host-simd: the native host build's SSE2 path of mask_grad (on x86-64)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    rng = np.random.default_rng(1)
    n = 77                                             # not a multiple of 8: a partial last byte
    ys8 = rng.integers(-128, 128, n).astype(np.int8)
    ys8[:4] = [-128, 127, -5, 100]
    yf = (rng.standard_normal(n) * 4).astype(F32)
    yf[:8] = [0.0, -0.0, 6.0, np.inf, -np.inf, np.nan, 5.999999, 1e-45]
    dy = rng.standard_normal(n).astype(F32)
    dy[8:12] = [-0.0, np.nan, np.inf, -np.inf]         # a mask passes their bits or gives +0.0
    lo, hi = -5, 100
    flo, fhi = (0.0, None) if act == "relu" else (0.0, 6.0)
    data = (f"static const int8_t ys8[{n}] = {{{', '.join(str(int(v)) for v in ys8)}}};\n"
            f"static const float yf[{n}] = {{{_c_floats(yf)}}};\n"
            f"static float dy[{n}] = {{{_c_floats(dy)}}};\n")
    src = tmp_path / "drv.c"
    src.write_text("#include <math.h>\n" + _DRIVER % dict(data=data, n=n, nb=(n + 7) // 8, lo=lo, hi=hi,
                                                         flo=flit(flo),
                                                         fhi="INFINITY" if fhi is None else flit(fhi)))
    exe = tmp_path / "drv"
    simd_flags = ["-DTT_USE_HOST_SIMD=1"] if simd else []
    cmd = [cc, *CFLAGS, *simd_flags, "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", f"-I{KDIR}",
           f"-I{ops_header.include_dir()}", str(KDIR / "tt_mask.c"), str(KDIR / "ops" / "tt_mask_grad.c"), str(src), "-lm", "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    nb = (n + 7) // 8
    pairs = np.array([ln.split() for ln in out[:nb]], np.int64)
    want8, wantf = go.clamp_mask(ys8, lo, hi), go.clamp_mask(yf, flo, fhi)
    assert np.array_equal(pairs[:, 0], want8) and np.array_equal(pairs[:, 1], wantf)
    vals = [int(v) for v in out[nb:] if v]
    pos = 0
    for off in range(0, 20, 7):
        got = np.array(vals[pos:pos + n - off], np.uint32)
        pos += n - off
        assert np.array_equal(got, go.mask_grad(dy[off:], want8, bit_offset=off).view(np.uint32)), off
    got = np.array(vals[pos:pos + n], np.uint32)
    assert np.array_equal(got, go.act_grad(dy, yf, act).view(np.uint32))


def test_c_kernels_build_for_cortex_m7(tmp_path):
    cc = shutil.which("arm-none-eabi-gcc")
    if cc is None:
        pytest.skip("no arm-none-eabi-gcc")
    flags = ["-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard", *CFLAGS, "-O2", "-c"]
    for src in (KDIR / "tt_mask.c", KDIR / "ops" / "tt_mask_grad.c"):
        res = subprocess.run([cc, *flags, f"-I{KDIR}", str(src), "-o", str(tmp_path / "m.o")],
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name,scheme", [("digits_cnn_int8", "full"), ("dwsep_float", "last_k"),
                                         ("residual_int8", "bias_only"), ("convnet_float", "full")])
def test_generated_programs_call_the_mask_kernels(name, scheme, tmp_path):
    """tests/test_codegen.py runs these programs against the numpy model; here: the masks are in them."""
    g = read_model(FIX / f"{name}.tflite")
    tg = build_training_graph(g, _plans(g)[scheme], "cross_entropy", OptimizerSpec("sgd"), 1)
    assert any(op.type == "clamp_mask" for op in tg.ops)
    _, mp, _, _ = plan_schedules(tg, True)
    codegen.generate(tg, mp.order, mp.to_json(), tmp_path / "prog")
    src = (tmp_path / "prog" / "tt_model.c").read_text()
    assert "tt_clamp_mask_" in src and "tt_mask_grad_f32(" in src
