"""One conformance test over the op registry (issue 11, item 3): every registered forward op, from its cases in
tests/op_cases/, is checked against references we did not write.

  forward   each int8 instance of the op in a converter-made fixture, run by the numpy executor on the oracle's
            own input tensors, gives the oracle's output bit for bit: LiteRT's reference kernels (BUILTIN_REF;
            FULLY_CONNECTED in its double rescale, see executor.run_graph) and TFLite Micro (fixed point);
  backward  for differentiable ops whose backward the registry emits (OpDef.backward), the float instances' input
            gradients, run through the emitted backward ops' numpy kernels, match PyTorch autograd of the op's
            twin (rtol 1e-4) and central finite differences of our own forward along random directions;
  writer    the fixtures holding it, written back by tflite_writer, read as the same ops and run (LiteRT) to
            the same outputs;
  C         every instance (int8 and float) and every emitted backward op is written by codegen (OpDef.c or
            codegen's op_<type>), compiled with the kernel library under ASan/UBSan, run, and compared with the
            numpy executor: int8 bit-exact, float within 1e-5 relative.

A registered forward op without cases fails `test_every_forward_op_has_cases`; the exemption lists below say why
an op cannot have a case. The oracles run once per fixture and test process, the C build once for all cases.
"""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import litert_oracle as oracle
import op_cases
from tinytrain.stages.c_emit import ops_header
from tinytrain.stages import ops
from tinytrain.stages.golden.forward import run_graph, run_op
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.model.tflite_reader import read_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
KDIR = ROOT / "kernels_c"
CASES = op_cases.load()

# Differentiable forward ops whose backward the registry does not emit (an op module without OpDef.backward):
# none today; an entry would need a reason, and the test below fails on a stale one.
BACKWARD_IN_AUTODIFF: tuple[str, ...] = ()

FLOAT_RTOL = 1e-5
GRAD_RTOL = 1e-4
FD_RTOL = 2e-2
MAX_INSTANCES = 2   # per (op, fixture): enough to see two geometries without long C files


# ---- cases -----------------------------------------------------------------------------------------------------

def test_every_forward_op_has_cases():
    missing = [n for n in ops.FORWARD_OPS if n not in CASES]
    assert not missing, f"registered forward ops without cases in tests/op_cases/: {missing}"
    unknown = [n for n in CASES if n not in ops.FORWARD_OPS]
    assert not unknown, f"tests/op_cases/ names ops the registry does not have: {unknown}"
    for name, case in CASES.items():
        assert case.fixtures, name
        found = [f for f in case.fixtures if any(op.type == name for op in _graph(f).ops)]
        assert found == list(case.fixtures), f"{name}: fixtures without the op: {set(case.fixtures) - set(found)}"
        assert any(_int8_instances(f, name) for f in case.fixtures), f"{name}: no int8 instance to check"
        if _wants_backward(name):
            assert any(_float_instances(f, name) for f in case.fixtures), f"{name}: no float instance"


def test_backward_exemptions_are_current():
    for name in BACKWARD_IN_AUTODIFF:
        d = ops.REGISTRY[name]
        assert d.differentiable and d.backward is None, f"{name}: remove it from BACKWARD_IN_AUTODIFF"
    for name in ops.FORWARD_OPS:
        d = ops.REGISTRY[name]
        if d.differentiable and name not in BACKWARD_IN_AUTODIFF:
            assert d.backward is not None, f"{name} is differentiable but the registry has no backward for it"


def _wants_backward(name: str) -> bool:
    d = ops.REGISTRY[name]
    return d.differentiable and d.backward is not None


@functools.lru_cache(maxsize=None)
def _graph(fname: str) -> Graph:
    return read_model(FIXTURES / fname)


def _instances(fname: str, name: str, dtype_pred) -> list[int]:
    g = _graph(fname)
    idx = [i for i, op in enumerate(g.ops) if op.type == name and _data(g, op) is not None
           and dtype_pred(g.tensors[_data(g, op)].dtype)]
    return idx[:MAX_INSTANCES]


def _data(g: Graph, op: Op) -> str | None:
    """The op's first non-constant operand (SPLIT's comes after its axis), None for an op on constants only."""
    return next((t for t in op.inputs if t is not None and not g.tensors[t].is_constant), None)


def _int8_instances(fname: str, name: str) -> list[int]:
    """Instances with an int8 operand (quantize: its output)."""
    g = _graph(fname)
    return [i for i in _instances(fname, name, lambda d: True)
            if any(g.tensors[t].dtype == "int8" for t in [*g.ops[i].inputs, *g.ops[i].outputs] if t is not None)]


def _float_instances(fname: str, name: str) -> list[int]:
    return _instances(fname, name, lambda d: d == "float32")


@functools.lru_cache(maxsize=None)
def _batch(fname: str) -> np.ndarray:
    """The fixture's saved samples (quantized for int8 inputs), plus for int8 inputs uniform noise and the two
    extremes, to drive every saturation path."""
    g = _graph(fname)
    inp = g.tensors[g.inputs[0]]
    stem = Path(fname).name[:-len(".tflite")]
    for suffix in ("_int8_floatio", "_float", "_int8", "_f16"):
        if stem.endswith(suffix):
            stem = stem[:-len(suffix)]
            break
    sample = np.load(FIXTURES / Path(fname).parent / f"{stem}.input.npy").astype(np.float32)
    if inp.dtype != "int8":
        return sample
    s, z = inp.quant.scale[0], inp.quant.zero_point[0]
    shape = tuple(inp.shape[1:])
    q = np.clip(np.round(sample / s) + z, -128, 127).astype(np.int8)
    noise = np.random.default_rng(7).integers(-128, 128, size=(2,) + shape).astype(np.int8)
    edges = np.stack([np.full(shape, -128, np.int8), np.full(shape, 127, np.int8)])
    return np.concatenate([q, noise, edges])


# ---- forward: LiteRT and TFLite Micro ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _oracle(fname: str, backend: str) -> oracle.OracleResult:
    """The fixture through LiteRT ("litert": reference kernels, "litert_builtin") or TFLite Micro ("tflm"), a
    child process of ~0.3 s, once per test process."""
    if backend == "tflm":
        return oracle.run_tflm(FIXTURES / fname, [_batch(fname)])
    return oracle.run_litert(FIXTURES / fname, [_batch(fname)], reference=backend == "litert")


def _op_vs_oracle(fname: str, i: int, res: oracle.OracleResult, fc_requant: str) -> list[str]:
    """Op i of the fixture on the oracle's own input tensors: its outputs against the oracle's."""
    g = _graph(fname)
    op = g.ops[i]
    n = _batch(fname).shape[0]
    values = {t.name: t.data for t in g.constants()}
    for t in op.inputs:
        if t is not None and not g.tensors[t].is_constant:
            values[t] = res.tensors[g.tensors[t].source_index].reshape((n,) + tuple(g.tensors[t].shape[1:]))
    outs = run_op(g, op, values, index=i, n=n, fc_requant=fc_requant)
    problems = []
    for name, mine in zip(op.outputs, outs):
        theirs = res.tensors.get(g.tensors[name].source_index)
        if theirs is None:
            problems.append(f"{name}: the oracle kept no tensor")
            continue
        theirs = theirs.reshape(mine.shape)
        if not np.array_equal(mine, theirs):
            d = np.abs(mine.astype(np.int64) - theirs.astype(np.int64))
            problems.append(f"{name}: {int((d > 0).sum())}/{d.size} differ, max |diff| {int(d.max())}")
    return problems


@pytest.mark.parametrize("name", sorted(CASES))
def test_int8_forward_matches_litert_and_tflm(name):
    case = CASES[name]
    checked = 0
    for f in case.fixtures:
        for i in _int8_instances(f, name):
            problems = _op_vs_oracle(f, i, _oracle(f, "litert" if case.litert_ref else "litert_builtin"),
                                     "litert_double")
            assert not problems, f"{name} in {f} (op {i}) vs LiteRT: {problems}"
            if oracle.tflm_available() and case.tflm is None:
                problems = _op_vs_oracle(f, i, _oracle(f, "tflm"), "fixed_point")
                assert not problems, f"{name} in {f} (op {i}) vs TFLite Micro: {problems}"
            checked += 1
    assert checked


@pytest.mark.parametrize("name", sorted(CASES))
def test_writer_round_trip(name, tmp_path):
    """The op's fixtures written back by tflite_writer read as the same ops and attrs, and LiteRT runs the written
    file to the same outputs as the converter's (the options, op versions and operand order the writer writes)."""
    from tinytrain.stages.model.tflite_writer import model_bytes

    case = CASES[name]
    for f in case.fixtures:
        if not _int8_instances(f, name):
            continue
        g = _graph(f)
        path = tmp_path / Path(f).name
        path.write_bytes(model_bytes(g))
        back = read_model(path)
        assert [(op.type, op.attrs) for op in back.ops] == [(op.type, op.attrs) for op in g.ops], f
        mine = oracle.run_litert(path, [_batch(f)], reference=case.litert_ref).outputs
        theirs = _oracle(f, "litert" if case.litert_ref else "litert_builtin").outputs
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: {f} written back")


# ---- backward: PyTorch and finite differences -------------------------------------------------------------------

class _Backward:
    """A BackwardBuilder (stages/ops/backward.py) over a one-op float graph: every non-constant input gets a
    gradient, the emitted ops are collected."""

    def __init__(self, g: Graph):
        self.g, self.ops, self.grads = g, [], {}

    def share(self, t, i):
        if t is None or self.g.tensors[t].is_constant:
            return None
        name = f"grad/{t}"
        self.g.tensors[name] = Tensor(name, list(self.g.tensors[t].shape), "float32")
        self.grads[t] = name
        return name

    def real(self, t):
        return t

    def emit(self, type_, inputs, outputs, **attrs):
        self.ops.append(Op(type_, list(inputs), list(outputs), attrs))

    def gradient(self, name, like):
        self.g.tensors[name] = Tensor(name, list(self.g.tensors[like].shape), "float32")
        return name

    # Parameters do not train here: the layers' input gradient is what this test checks; their weight and bias
    # gradients are checked against PyTorch through whole training runs (tests/test_autodiff_torch.py).
    def weight_channels(self, w):
        return 0

    def trains_bias(self, b):
        return False

    def param_grad(self, p, i, shape):
        raise AssertionError("no parameter trains in a conformance case")

    def real_slice(self, x, k, depth):
        raise AssertionError("no parameter trains in a conformance case")


def _one_op(fname: str, i: int, drop_act: bool) -> tuple[Graph, Op, dict[str, np.ndarray]]:
    """Op i of the fixture alone (its non-constant inputs as graph inputs, without its fused activation when
    drop_act: autodiff masks that part before the op's backward), and its input values on the first sample."""
    g = _graph(fname)
    values = run_graph(g, {g.inputs[0]: _batch(fname)[:1]}, keep_intermediates=True)
    op = copy.deepcopy(g.ops[i])
    if drop_act and "act" in op.attrs:
        op.attrs["act"] = "none"
    names = [t for t in op.inputs if t is not None] + list(op.outputs)
    tensors = {t: copy.deepcopy(g.tensors[t]) for t in names}
    ins = [t for t in op.inputs if t is not None and not tensors[t].is_constant]
    one = Graph(tensors=tensors, ops=[op], inputs=list(dict.fromkeys(ins)), outputs=list(op.outputs))
    return one, op, {t: values[t] for t in one.inputs}


def _torch_twin(name: str):
    twin = CASES[name].torch
    if twin is not None:
        return twin
    from torch_mirror import TorchMirror

    return lambda attrs, ins, out_shapes: TorchMirror._op(None, name, attrs, ins, out_shapes[0], 1)


def _run_backward(g: Graph, bops: list[Op], values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from tinytrain.stages.golden.train_step import _backward

    values = dict(values)
    for t in g.constants():
        values.setdefault(t.name, t.data)
    for bop in bops:
        outs = _backward(bop, lambda j, o=bop: values[o.inputs[j]], lambda t: list(g.tensors[t].shape),
                         lambda t: g.tensors[t])
        values.update(zip(bop.outputs, outs))
    return values


def _backward_instances(name: str) -> list[tuple[str, int]]:
    return [(f, i) for f in CASES[name].fixtures for i in _float_instances(f, name)]


@functools.lru_cache(maxsize=None)
def _backward_case(fname: str, i: int):
    """(one-op graph + its backward tensors, backward ops, values of the inputs and dz, input -> gradient)."""
    g, op, xs = _one_op(fname, i, drop_act=True)
    rng = np.random.default_rng(11 + i)
    # Inputs drawn afresh (N(0,1)): the fixture's own activations hold exact zeros and ties (after a ReLU) where
    # a kink makes finite differences meaningless; the fixture gives the geometry and the constants.
    xs = {t: rng.standard_normal(v.shape).astype(np.float32) for t, v in xs.items()}
    ys = run_op(g, op, {**{t.name: t.data for t in g.constants()}, **xs}, index=0, n=1)
    dzs = []
    for y, v in zip(op.outputs, ys):
        xs[y] = v   # a backward may read the forward output (logistic, tanh)
        dz = f"grad/{y}"
        g.tensors[dz] = Tensor(dz, list(g.tensors[y].shape), "float32")
        xs[dz] = rng.standard_normal(v.shape).astype(np.float32)
        dzs.append(dz)
    bb = _Backward(g)
    ops.REGISTRY[op.type].backward(bb, op, 0, dzs[0] if len(dzs) == 1 else dzs)
    vals = _run_backward(g, bb.ops, xs)
    return g, op, bb.ops, xs, dzs, {x: vals[gname] for x, gname in bb.grads.items()}


@pytest.mark.parametrize("name", sorted(n for n in CASES if _wants_backward(n)))
def test_backward_matches_torch_and_finite_differences(name):
    torch = pytest.importorskip("torch")
    twin = _torch_twin(name)
    for fname, i in _backward_instances(name):
        g, op, bops, xs, dzs, grads = _backward_case(fname, i)
        assert grads, f"{name} in {fname}: the backward computes no input gradient"
        consts = {t.name: t.data for t in g.constants()}

        # PyTorch autograd of the twin, in float64
        tin = {t: torch.tensor(xs[t].astype(np.float64), requires_grad=True) for t in g.inputs}
        ins = []
        for t in op.inputs:
            if t is None:
                ins.append(None)
            elif t in tin:
                ins.append(tin[t])
            elif np.issubdtype(np.asarray(consts[t]).dtype, np.floating):
                ins.append(torch.tensor(np.asarray(consts[t], np.float64)))
            else:
                ins.append(consts[t])
        out = twin(op.attrs, ins, [list(g.tensors[y].shape) for y in op.outputs])
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        ours = run_op(g, op, {**consts, **xs}, index=0, n=1)
        loss = 0
        for o, mine, dz in zip(outs, ours, dzs):
            np.testing.assert_allclose(o.detach().numpy().reshape(mine.shape), mine, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}: the torch twin's forward differs from ours")
            loss = loss + (o.reshape(mine.shape) * torch.tensor(xs[dz].astype(np.float64))).sum()
        loss.backward()
        for x, gx in grads.items():
            want = tin[x].grad.numpy()
            scale = float(np.abs(want).max(initial=0.0)) + 1e-12
            np.testing.assert_allclose(gx, want, rtol=GRAD_RTOL, atol=1e-6 * scale,
                                       err_msg=f"{name} in {fname}: d/d{x} vs PyTorch")

        # central differences of our own float32 forward along sparse random directions: outputs the direction
        # does not reach give identical float64 terms in both sums and cancel exactly, and few perturbed elements
        # make crossing a kink (ReLU-like, a max switching) within +-eps unlikely (a crossing costs O(1))
        rng = np.random.default_rng(5)

        def loss_at(vals):
            ys = run_op(g, op, {**consts, **vals}, index=0, n=1)
            return sum(float(np.sum(y.astype(np.float64) * xs[dz])) for y, dz in zip(ys, dzs))

        for x, gx in grads.items():
            size = xs[x].size
            for _ in range(3):
                u = np.zeros(size, np.float32)
                pick = rng.choice(size, size=max(1, size // 20), replace=False)
                u[pick] = rng.standard_normal(len(pick))
                u = u.reshape(xs[x].shape)
                eps = 1e-4 * max(float(np.sqrt(np.mean(xs[x].astype(np.float64) ** 2))), 1e-3)
                plus, minus = dict(xs), dict(xs)
                plus[x] = (xs[x] + eps * u).astype(np.float32)
                minus[x] = (xs[x] - eps * u).astype(np.float32)
                fd = (loss_at(plus) - loss_at(minus)) / (2 * eps)
                an = float(np.sum(gx.astype(np.float64) * u))
                assert abs(fd - an) <= FD_RTOL * (abs(an) + np.linalg.norm(gx * u)) + 1e-4, \
                    f"{name} in {fname}: d/d{x} along a random direction: FD {fd:.6g}, backward {an:.6g}"


# ---- C: codegen + kernels (ASan/UBSan) against numpy -----------------------------------------------------------

def _c_cases() -> list[tuple[str, Graph, list[Op], dict[str, np.ndarray]]]:
    """(label, graph, ops to emit in order, input values) of every forward instance (int8 and float) and of the
    backward ops of every float instance of a differentiable op."""
    out = []
    for name in sorted(CASES):
        for f in CASES[name].fixtures:
            for i in _int8_instances(f, name) + _float_instances(f, name):
                g, op, xs = _one_op(f, i, drop_act=False)
                out.append((f"{name} {g.tensors[_data(g, op)].dtype} {f}#{i}", g, [op], xs))
        if _wants_backward(name):
            for f, i in _backward_instances(name):
                g, op, bops, xs, dzs, _ = _backward_case(f, i)
                feeds = {t: v for t, v in xs.items()}
                out.append((f"{name} backward {f}#{i}", g, bops, feeds))
    return out


def _c_unit(k: int, g: Graph, emitted: list[Op], feeds: dict[str, np.ndarray]) -> tuple[str, dict, int]:
    """One translation unit `tt_case_<k>(uint8_t *tt_arena)` written by codegen's generator, with every
    non-constant tensor at its own 16-byte aligned arena offset; returns (C text, offsets, arena bytes)."""
    from tinytrain.stages.codegen import _Gen

    offsets, end = {}, 0
    for name, t in g.tensors.items():
        if t.is_constant and name not in feeds:
            continue
        offsets[name] = end
        end += -(-max(t.nbytes, 1) // 16) * 16
    gg = Graph(tensors=g.tensors, ops=list(emitted), inputs=list(feeds), outputs=[], meta={"train": {"trained": {}}})
    plan = {"arena_bytes": end, "buffers": [{"name": n, "offset": o, "tensors": [n]} for n, o in offsets.items()]}
    gen = _Gen(gg, list(range(len(emitted))), plan)
    body = [ln for op in emitted for ln in gen.emit(op)]
    text = "\n".join(["#include <math.h>", "#include <stdint.h>", "#include <string.h>", '#include "tt_kernels.h"',
                      "", *gen.globals, "", f"void tt_case_{k}(uint8_t *tt_arena);",
                      f"void tt_case_{k}(uint8_t *tt_arena)", "{", *["    " + ln for ln in gen.init_lines + body],
                      "}", ""])
    return text, offsets, end


def _kernel_sources() -> list[Path]:
    return sorted(KDIR.glob("*.c")) + sorted(KDIR.glob("ops/*.c"))


def test_c_kernels_match_numpy(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no host C compiler")
    cases = _c_cases()
    units, layouts = [], []
    for k, (label, g, emitted, feeds) in enumerate(cases):
        text, offsets, size = _c_unit(k, g, emitted, feeds)
        p = tmp_path / f"case{k}.c"
        p.write_text(f"/* {label} */\n" + text)
        units.append(p)
        layouts.append((offsets, size))
    decls = "".join(f"void tt_case_{k}(uint8_t *a);\n" for k in range(len(cases)))
    table = ", ".join(f"tt_case_{k}" for k in range(len(cases)))
    (tmp_path / "main.c").write_text(f"""#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
{decls}
static void (*const CASES[])(uint8_t *) = {{{table}}};
/* main K BYTES IN OUT: the arena from IN, case K, the arena to OUT */
int main(int argc, char **argv)
{{
    long n;
    uint8_t *arena;
    FILE *f;
    if (argc != 5) {{
        return 2;
    }}
    n = atol(argv[2]);
    arena = (uint8_t *)malloc((size_t)n);
    f = fopen(argv[3], "rb");
    if (!arena || !f || fread(arena, 1, (size_t)n, f) != (size_t)n) {{
        return 3;
    }}
    fclose(f);
    CASES[atoi(argv[1])](arena);
    f = fopen(argv[4], "wb");
    if (!f || fwrite(arena, 1, (size_t)n, f) != (size_t)n) {{
        return 4;
    }}
    fclose(f);
    free(arena);
    return 0;
}}
""")
    exe = tmp_path / "cases"
    flags = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off", "-O1", "-g",
             "-fsanitize=address,undefined", "-fno-sanitize-recover=all", f"-I{KDIR}", f"-I{ops_header.include_dir()}"]
    sources = [*_kernel_sources(), *units, tmp_path / "main.c"]
    objects = [tmp_path / f"o{k}.o" for k in range(len(sources))]

    def compile_one(pair):
        src, obj = pair
        return subprocess.run([cc, *flags, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=2) as pool:   # the ASan build of the kernels dominates: two at a time
        failed = [r.stderr for r in pool.map(compile_one, zip(sources, objects)) if r.returncode != 0]
    assert not failed, "the generated C or a kernel does not build:\n" + "\n".join(failed)[-4000:]
    res = subprocess.run([cc, *flags, *map(str, objects), "-lm", "-o", str(exe)], capture_output=True, text=True)
    assert res.returncode == 0, f"link failed:\n{res.stderr[-4000:]}"

    for k, ((label, g, emitted, feeds), (offsets, size)) in enumerate(zip(cases, layouts)):
        arena = bytearray(size)
        for t, v in feeds.items():
            raw = np.ascontiguousarray(v.astype(g.tensors[t].dtype)).tobytes()
            arena[offsets[t]:offsets[t] + len(raw)] = raw
        (tmp_path / "in.bin").write_bytes(bytes(arena))
        run = subprocess.run([str(exe), str(k), str(size), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                             capture_output=True, text=True)
        assert run.returncode == 0, f"{label}: the C failed ({run.returncode}):\n{run.stderr[-3000:]}"
        got = (tmp_path / "out.bin").read_bytes()
        want = dict(feeds)
        for t in g.constants():
            want.setdefault(t.name, t.data)
        if emitted[0].type in ops.FORWARD_OPS:
            outs = run_op(g, emitted[0], want, index=0, n=1)
            want.update(zip(emitted[0].outputs, outs))
        else:
            want = _run_backward(g, emitted, want)
        for op in emitted:
            for y in op.outputs:
                t = g.tensors[y]
                mine = np.frombuffer(got[offsets[y]:offsets[y] + t.nbytes], dtype=t.dtype).reshape(want[y].shape)
                if t.dtype == "float32":
                    scale = float(np.abs(want[y]).max(initial=0.0))
                    np.testing.assert_allclose(mine, want[y], rtol=FLOAT_RTOL, atol=1e-6 * max(scale, 1e-6),
                                               err_msg=f"{label}: {y}")
                else:
                    np.testing.assert_array_equal(mine, want[y], err_msg=f"{label}: {y}")
