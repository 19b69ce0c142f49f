"""Stage `codegen`: training IR + schedule + memory plan -> one C99 training program (DESIGN §3, §7).

    generate(train_graph, order, memplan_doc, out_dir) -> summary dict

Inputs: autodiff's `train_graph.json`/`train_tensors.npz`, reorder's `schedule.json` (op order) and `memplan.json`
(buffers with arena offsets). Outputs in the stage folder:
  tt_model.c     the program: `static uint8_t tt_arena[A]`, frozen constants `static const` (flash), trained
                 tensors and optimizer state in SRAM (at their planned arena offsets) initialised from flash
                 copies at start, requantization multipliers / shifts / QAS scales as const tables (computed here
                 with stages/int8_arith.py, in double exactly as the numpy executor does), the schedule as
                 straight-line kernel calls, and `tt_main` implementing the firmware protocol of
                 stages/runtime_config.py (runtime.bin in; losses.bin, weights.bin, results.json out);
  sources.json   {"kernels": null (every kernels_c/*.c), "defines": {}, "stack_bytes": ...} for cross-compile;
  io_layout.json where weights.bin's tensors are, the model input's quantization, the output, arena bytes;
  codegen.json   lines of C, kernel calls, const bytes, arena bytes.

Placement: every SRAM tensor of the plan lives at its buffer's offset in the arena (tensors written in place over
each other share one). The in-place ops of the plan (elementwise, reshape, int8_clamp_grad, depthwise with one
channel of scratch) are emitted as in-place kernel calls. The dequantize of an int8 weight that only input
gradients read (memplan.fused_dequantize) emits no code: those ops run as `*_grad_input_qw_f32` kernels reading
the int8 weight. A weight trained on a channel slice (ratio < 1) is split: the compact trained slice
[..., :n] lives at its planned arena offset (what the plan counts), the whole original weight stays `const` in
flash for the frozen channels; int8 conv2d (forward, input gradient) and the QAS update read the split weight,
weights.bin gets the merged tensor. A partially trained weight that some other op reads (float weights, FC,
depthwise) falls back to a whole static SRAM array outside the arena: codegen.json's `sram_outside_arena_bytes`
reports it, and it shows in size.json's .bss.

Element-wise ops with numpy broadcasting (ADD with a smaller operand, SUB, MUL, PRELU's alpha) get a
`tt_broadcast` (rank-4 output shape + per-operand strides, 0 on broadcast axes), and their backward reduces over
the broadcast axes with the same struct (tt_unbroadcast_f32, tt_mul_grad_f32). LOGISTIC, TANH, HARD_SWISH,
LEAKY_RELU, PRELU, MUL and SUB run in int8 with the executor's default (TFLite Micro) arithmetic, their parameters
computed here with int8_arith exactly as stages/executor.py computes them.

Compile-time options: -DTT_DUMP_TENSORS=1 makes the program write every trained tensor after each sample step
(`dump_<step>.bin`, weights.bin's layout) and appends the forward output of every evaluated sample to
`eval_out.bin`, for bit-exact checks against the numpy model (tests/test_codegen.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinytrain.stages import int8_arith as ia
from tinytrain.stages.geometry import out_size_and_pad
from tinytrain.stages.ir import Graph, Op, Tensor
from tinytrain.stages.losses import HUBER_DELTA, LOSS_OPS
from tinytrain.stages.memplan import fused_dequantize
from tinytrain.stages.runtime_config import PROTOCOL
from tinytrain.stages.streams import Stream, row_geometry

CTYPE = {"int8": "int8_t", "int32": "int32_t", "float32": "float", "uint8": "uint8_t", "int16": "int16_t",
         "int64": "int64_t"}
ACT_ENUM = {"none": "TT_ACT_NONE", "relu": "TT_ACT_RELU", "relu6": "TT_ACT_RELU6",
            "relu_n1_to_1": "TT_ACT_RELU_N1_TO_1"}
FLOAT_BOUNDS = {"none": (-math.inf, math.inf), "relu": (0.0, math.inf), "relu6": (0.0, 6.0),
                "relu_n1_to_1": (-1.0, 1.0)}
RUNTIME_FIELDS = {"learning_rate": "learning_rate", "momentum": "momentum", "beta1": "beta1", "beta2": "beta2",
                  "eps": "eps", "alpha": "alpha", "weight_decay": "weight_decay"}
# The arena is painted with this 32-bit word before the run and scanned by word afterwards (tt_arena_used): as
# int8 bytes it reads -17, -66, -83, -34 and as a float -6.3e18, so data that happens to equal it is very unlikely
# (a one-byte paint was: an int8 activation of -91 is common).
PAINT = 0xDEADBEEF
# Stack of the firmware (sources.json -> cross-compile -> the linker's __stack_size). Measured high-water marks
# (painted stack, QEMU): digits 776 B, MobileNetV2-w0.35@128 TTE-like sparse ~1 KB: every kernel is a leaf with a
# small frame and the program's deepest chain is tt_main -> tt_write_results -> tt_snprintf. 4 KB leaves a
# margin of ~3x; the default 16 KB would cost 12 KB of the 320 KB board for nothing.
DEFAULT_STACK = 4 * 1024
SPLIT_READERS = ("conv2d", "dequantize") + ("qas_sgd_update", "qas_momentum_update", "qas_adam_update",
                                             "qas_rmsprop_update")


class CodegenError(NotImplementedError):
    pass


def flit(x: float) -> str:
    """A float32 constant as an exact C literal."""
    v = float(np.float32(x))
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    if math.isnan(v):
        raise CodegenError("NaN constant")
    return f"{v.hex()}f" if v != 0 else ("-0.0f" if math.copysign(1, v) < 0 else "0.0f")


def numel(shape) -> int:
    return int(np.prod(list(shape), dtype=np.int64)) if len(shape) else 1


def _c_array(ctype: str, values, per_line: int = 16) -> str:
    vals = list(values)
    if not vals:
        return "{0}"
    items = []
    for v in vals:
        if ctype == "float":
            items.append(flit(v))
        elif ctype == "int32_t" and int(v) == -(1 << 31):
            items.append("INT32_MIN")
        else:
            items.append(str(int(v)))
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return "{\n    " + ",\n    ".join(lines) + "\n}"


@dataclass
class _Loc:
    kind: str     # arena | flash | static
    expr: str     # C expression of the pointer to the first element


class _Gen:
    def __init__(self, g: Graph, order: list[int], plan: dict[str, Any]):
        self.g = g
        self.order = order
        self.plan = plan
        self.meta = g.meta["train"]
        self.globals: list[str] = []      # const tables and static arrays
        self.const_bytes = 0
        self.calls = 0
        self.ids: dict[str, int] = {}
        self.arena = int(plan["arena_bytes"])
        self.offset: dict[str, int] = {}
        self.scratch: dict[str, int] = {}
        for b in plan["buffers"]:
            if b["name"].startswith("scratch/") and not b["tensors"]:
                self.scratch[b["name"][len("scratch/"):]] = int(b["offset"])
            for t in b["tensors"]:
                self.offset[t] = int(b["offset"])
        self.trained = dict(self.meta["trained"])
        self.chunk_off: dict[str, str] = {}      # tensor -> element offset of the chunk (stream_channels)
        self.chunk_rows: int | None = None       # parameter rows one chunk updates
        self.written = {t for op in g.ops for t in op.outputs}
        self.locs: dict[str, _Loc] = {}
        self.init_lines: list[str] = []
        self._uid = 0
        self.fused = fused_dequantize(g)      # fp32 weight copies that are never materialised
        self.split = self._split_weights()    # weight -> n: compact trained slice in the arena + flash original
        self.flash: dict[str, str] = {}       # split weight -> its whole const (flash) array
        self.static_bytes = 0                 # SRAM codegen puts outside the arena (fallbacks)

    def _split_weights(self) -> dict[str, int]:
        """Partially trained int8 weights whose every reader has a split-weight kernel."""
        out = {}
        for p, info in self.trained.items():
            t = self.g.tensors[p]
            n = info.get("n")
            if n is None or int(n) >= int(t.shape[-1]) or t.dtype != "int8" or p not in self.offset \
                    or len(t.shape) < 2:
                continue  # trained whole (or not splittable): one tensor at its arena offset
            ok = True
            for op in self.g.ops:
                for k, name in enumerate(op.inputs):
                    if name != p:
                        continue
                    if op.type == "conv2d" and k == 1 and self.g.tensors[op.inputs[0]].dtype == "int8":
                        continue
                    if op.type == "dequantize" and op.outputs[0] in self.fused and all(
                            o.type == "conv2d_grad_input" for o in self.g.ops if op.outputs[0] in o.inputs):
                        continue
                    if op.type in SPLIT_READERS[2:] and k == 0:
                        continue
                    ok = False
            if ok:
                out[p] = int(n)
        return out

    # ---- names and places ------------------------------------------------------------------------------------
    def cid(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.ids)
        return self.ids[name]

    def uid(self, prefix: str) -> str:
        self._uid += 1
        return f"{prefix}{self._uid}"

    def const_table(self, prefix: str, ctype: str, values) -> str:
        name = self.uid(prefix)
        vals = list(values)
        self.globals.append(f"static const {ctype} {name}[{max(len(vals), 1)}] = {_c_array(ctype, vals)};")
        self.const_bytes += max(len(vals), 1) * {"float": 4, "int32_t": 4, "int8_t": 1}.get(ctype, 4)
        return name

    def ctype(self, name: str) -> str:
        return CTYPE[self.g.tensors[name].dtype]

    def loc(self, name: str) -> str:
        if name in self.locs:
            return self.locs[name].expr
        t = self.g.tensors[name]
        ct = CTYPE[t.dtype]
        i = self.cid(name)
        if t.data is not None and name not in self.written:
            data = np.ascontiguousarray(np.asarray(t.data).astype(t.dtype)).reshape(-1)
            self.globals.append(f"/* {name} */\nstatic const {ct} tt_c{i}[{max(data.size, 1)}] = "
                                f"{_c_array(ct, data.tolist())};")
            self.const_bytes += max(data.size, 1) * np.dtype(t.dtype).itemsize
            self.locs[name] = _Loc("flash", f"tt_c{i}")
            return self.locs[name].expr
        if t.data is not None:
            # Written by the step: SRAM, initialised from a flash copy at start (zeros: a memset).
            data = np.ascontiguousarray(np.asarray(t.data).astype(t.dtype)).reshape(-1)
            if name in self.split:
                return self._split_loc(name, t, data, i)
            n = self.trained[name].get("n") if name in self.trained else None
            partial = n is not None and int(n) < int(t.shape[-1])  # autodiff sets n = C_in for whole weights too
            if partial or name not in self.offset:
                self.static_bytes += data.size * data.dtype.itemsize
                self.globals.append(f"/* {name}: partially trained, a reader has no split kernel: whole in SRAM, "
                                    f"outside the arena */\nstatic {ct} tt_s{i}[{max(data.size, 1)}];")
                expr = f"tt_s{i}"
                kind = "static"
            else:
                expr = f"(({ct} *)(tt_arena + {self.offset[name]}))"
                kind = "arena"
            nbytes = data.size * data.dtype.itemsize
            if not data.any():
                self.init_lines.append(f"memset({expr}, 0, {nbytes}); /* {name} */")
            else:
                self.globals.append(f"/* initial {name} */\nstatic const {ct} tt_i{i}[{data.size}] = "
                                    f"{_c_array(ct, data.tolist())};")
                self.const_bytes += nbytes
                self.init_lines.append(f"memcpy({expr}, tt_i{i}, {nbytes}); /* {name} */")
            self.locs[name] = _Loc(kind, expr)
            return expr
        if name not in self.offset:
            raise CodegenError(f"tensor {name!r} has no place in the memory plan")
        self.locs[name] = _Loc("arena", f"(({ct} *)(tt_arena + {self.offset[name]}))")
        return self.locs[name].expr

    def _split_loc(self, name: str, t: Tensor, data: np.ndarray, i: int) -> str:
        """A split weight: the whole original `const` in flash (frozen channels), the compact trained slice
        [..., :n] at its arena offset, filled from the flash copy at start."""
        ct = CTYPE[t.dtype]
        n, cols = self.split[name], int(t.shape[-1])
        rows = data.size // cols
        self.globals.append(f"/* {name}: whole original (flash); channels [0, {n}) are trained in the arena */\n"
                            f"static const {ct} tt_c{i}[{data.size}] = {_c_array(ct, data.tolist())};")
        self.const_bytes += data.size * data.dtype.itemsize
        self.flash[name] = f"tt_c{i}"
        expr = f"(({ct} *)(tt_arena + {self.offset[name]}))"
        self.init_lines.append(f"{{ uint32_t r; for (r = 0; r < {rows}u; ++r) {{ memcpy({expr} + r * {n}u, "
                               f"tt_c{i} + r * {cols}u, {n}); }} }} /* trained slice of {name} */")
        self.locs[name] = _Loc("arena", expr)
        return expr

    def weight_args(self, w: str) -> tuple[str, str, int]:
        """(whole weight, trained slice or 0, n) of a weight a split-aware kernel reads."""
        slice_ = self.loc(w)
        if w in self.split:
            return self.flash[w], slice_, self.split[w]
        return slice_, "0", 0

    def dq_tables(self, w: str, axis_expected: int, channels: int) -> tuple[str, str]:
        """Per-output-channel scale / zero-point tables of an int8 weight a *_qw kernel dequantizes."""
        q = self.g.tensors[w].quant
        scales, zps = list(q.scale), list(q.zero_point)
        if len(scales) == 1:
            scales, zps = scales * channels, zps * channels
        elif int(q.axis) % len(self.g.tensors[w].shape) != axis_expected or len(scales) != channels:
            raise CodegenError(f"weight {w!r} is quantized along axis {q.axis}, not its output channels")
        return self.const_table("tt_dqs", "float", scales), self.const_table("tt_dqz", "int32_t", zps)

    def same_place(self, a: str, b: str) -> bool:
        return a in self.offset and b in self.offset and self.offset[a] == self.offset[b] \
            and self.locs.get(a, _Loc("arena", "")).kind == "arena"

    # ---- quantization helpers --------------------------------------------------------------------------------
    def qp(self, name: str) -> tuple[float, int]:
        t = self.g.tensors[name]
        return float(t.quant.scale[0]), int(t.quant.zero_point[0])

    def requant(self, x: str, w: str, y: str, act: str, channels: int) -> str:
        w_t = self.g.tensors[w]
        s_in, z_in = self.qp(x)
        s_out, z_out = self.qp(y)
        scales = list(w_t.quant.scale)
        if len(scales) == 1:
            scales = scales * channels
        pairs = [ia.quantize_multiplier(float(s_in) * float(s) / float(s_out)) for s in scales]
        m = self.const_table("tt_mult", "int32_t", [p[0] for p in pairs])
        sh = self.const_table("tt_shift", "int32_t", [p[1] for p in pairs])
        lo, hi = ia.activation_range(act, s_out, z_out)
        name = self.uid("tt_rq")
        self.globals.append(f"static const tt_requant_s8 {name} = {{{z_in}, {z_out}, {lo}, {hi}, {m}, {sh}, 1}};")
        return name

    def conv_dims(self, op: Op, x: str, y: str, kh: int, kw: int, mult: int = 1) -> str:
        a = op.attrs
        xs, ys = self.g.tensors[x].shape, self.g.tensors[y].shape
        sh, sw = int(a["stride_h"]), int(a["stride_w"])
        dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
        oh, pt = out_size_and_pad(a["padding"], xs[1], kh, sh, dh)
        ow, pl = out_size_and_pad(a["padding"], xs[2], kw, sw, dw)
        if oh != ys[1] or ow != ys[2]:
            raise CodegenError(f"{op.type}: output {ys} does not match the geometry")
        name = self.uid("tt_cd")
        self.globals.append(f"static const tt_conv_dims {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {oh}, {ow}, "
                            f"{ys[3]}, {kh}, {kw}, {sh}, {sw}, {dh}, {dw}, {pt}, {pl}, {mult}}};")
        return name

    def pool_dims(self, op: Op, x: str) -> str:
        a = op.attrs
        xs = self.g.tensors[x].shape
        kh, kw, sh, sw = int(a["filter_h"]), int(a["filter_w"]), int(a["stride_h"]), int(a["stride_w"])
        oh, pt = out_size_and_pad(a["padding"], xs[1], kh, sh, 1)
        ow, pl = out_size_and_pad(a["padding"], xs[2], kw, sw, 1)
        name = self.uid("tt_pd")
        self.globals.append(f"static const tt_pool_dims {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {oh}, {ow}, "
                            f"{kh}, {kw}, {sh}, {sw}, {pt}, {pl}}};")
        return name

    def bcast(self, out: str, a: str, b: str | None = None) -> str:
        """tt_broadcast of a binary op (numpy broadcasting, shapes aligned to the right as the executor's numpy
        does; constants have no batch axis): the output's rank-4 shape and each operand's element strides, 0 along
        the axes it is broadcast over."""
        def pad(name: str) -> list[int]:
            sh = [int(d) for d in self.g.tensors[name].shape]
            if len(sh) > 4:
                raise CodegenError(f"broadcasting op on a rank-{len(sh)} tensor {name!r} (at most 4)")
            return [1] * (4 - len(sh)) + sh

        shape = pad(out)
        vals = list(shape)
        for name in (a, b) if b is not None else (a, a):
            p = pad(name)
            if any(d not in (1, o) for d, o in zip(p, shape)):
                raise CodegenError(f"{name!r} {p} does not broadcast to {shape}")
            st, acc = [0] * 4, 1
            for d in range(3, -1, -1):
                st[d] = acc if p[d] != 1 else 0
                acc *= p[d]
            vals += st
        name = self.uid("tt_bc")
        self.globals.append(f"static const tt_broadcast {name} = {{{{{', '.join(map(str, vals[:4]))}}}, "
                            f"{{{', '.join(map(str, vals[4:8]))}}}, {{{', '.join(map(str, vals[8:]))}}}}};")
        return name

    def add_sub_params(self, a: str, b: str, y: str, act: str) -> str:
        """add.cc / sub.cc 8-bit general path (executor._add_or_sub): left shift 20, `2 * max(s1, s2)` in float,
        the multipliers in double."""
        s1, z1 = self.qp(a)
        s2, z2 = self.qp(b)
        so, zo = self.qp(y)
        left_shift = 20
        twice_max = float(np.float32(2) * np.float32(max(s1, s2)))
        m1, sh1 = ia.quantize_multiplier_smaller_than_one_exp(s1 / twice_max)
        m2, sh2 = ia.quantize_multiplier_smaller_than_one_exp(s2 / twice_max)
        mo, sho = ia.quantize_multiplier_smaller_than_one_exp(
            twice_max / float(np.float32((1 << left_shift) * np.float32(so))))
        lo, hi = ia.activation_range(act, so, zo)
        name = self.uid("tt_ap")
        self.globals.append(f"static const tt_add_params_s8 {name} = {{{z1}, {z2}, {zo}, {left_shift}, {m1}, "
                            f"{sh1}, {m2}, {sh2}, {mo}, {sho}, {lo}, {hi}}};")
        return name

    def slice_params(self, x: str, y: str, attrs: dict) -> str:
        """tt_strided_slice_params: x's rank-4 view; axis 0 (the batch) whole as in the executor, the others the
        reader's resolved (start, stop, step); a shrunk axis has extent 1."""
        xs = [int(d) for d in self.g.tensors[x].shape]
        if len(xs) > 4:
            raise CodegenError(f"strided_slice of a rank-{len(xs)} tensor (at most 4)")
        ext, start, stride = [xs[0]], [0], [1]
        for ax in range(1, len(xs)):
            a, b, st = int(attrs["starts"][ax]), int(attrs["stops"][ax]), int(attrs["strides"][ax])
            ext.append(len(range(a, b, st)))
            start.append(a)
            stride.append(st)
        if numel(ext) != numel(self.g.tensors[y].shape):
            raise CodegenError(f"strided_slice {y!r}: {ext} does not match the output {self.g.tensors[y].shape}")
        k = 4 - len(xs)
        xs, ext, start, stride = [1] * k + xs, [1] * k + ext, [0] * k + start, [1] * k + stride
        name = self.uid("tt_ss")
        self.globals.append(f"static const tt_strided_slice_params {name} = {{{{{', '.join(map(str, xs))}}}, "
                            f"{{{', '.join(map(str, ext))}}}, {{{', '.join(map(str, start))}}}, "
                            f"{{{', '.join(map(str, stride))}}}}};")
        return name

    # ---- ops -------------------------------------------------------------------------------------------------
    def emit(self, op: Op) -> list[str]:
        fn = getattr(self, "op_" + op.type, None)
        if fn is None:
            raise CodegenError(f"codegen: no C for op {op.type!r}")
        lines = fn(op)
        self.calls += sum(1 for ln in lines if ln.lstrip().startswith("tt_"))
        head = f"/* {op.type}: {', '.join(op.outputs)} */"
        return [head] + lines

    def _int8(self, name: str) -> bool:
        return self.g.tensors[name].dtype == "int8"

    def ploc(self, name: str) -> str:
        """loc(name), offset to the current output-channel chunk inside a channels stream (stream_channels)."""
        off = self.chunk_off.get(name)
        return self.loc(name) if off is None else f"({self.loc(name)} + {off})"

    def _io(self, io: dict[str, str] | None, d: str, x: str, y: str) -> tuple[str, str, str]:
        """(&dims, x pointer, y pointer) of a kernel call: the op's own, or a streamed call's (stream_rows)."""
        if io is None:
            return f"&{d}", self.loc(x), self.loc(y)
        io["dims"] = d  # the whole op's geometry, which the streamed call copies and narrows
        return io["d"], f"({self.ctype(x)} const *){io['x']}", f"({self.ctype(y)} *){io['y']}"

    def op_conv2d(self, op: Op, io: dict[str, str] | None = None) -> list[str]:
        x, w, b = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None
        y = op.outputs[0]
        o, kh, kw, ci = self.g.tensors[w].shape
        d, xe, ye = self._io(io, self.conv_dims(op, x, y, kh, kw), x, y)
        bias = self.loc(b) if b else "0"
        act = op.attrs.get("act", "none")
        if self._int8(x):
            q = self.requant(x, w, y, act, o)
            if w in self.split:
                whole, part, n = self.weight_args(w)
                return [f"tt_conv2d_s8_split({d}, &{q}, {xe}, {whole}, {part}, {n}, {bias}, {ye});"]
            return [f"tt_conv2d_s8({d}, &{q}, {xe}, {self.loc(w)}, {bias}, {ye});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_conv2d_f32({d}, {flit(lo)}, {flit(hi)}, {xe}, {self.loc(w)}, {bias}, {ye});"]

    def tconv_dims(self, op: Op, x: str, y: str, kh: int, kw: int) -> str:
        """tt_conv_dims of a transpose_conv: in_* = x, out_* = y, pads from y's size (executor.transpose_conv_geometry)."""
        from tinytrain.stages.executor import transpose_conv_geometry
        xs, ys = self.g.tensors[x].shape, self.g.tensors[y].shape
        sh, sw, pt, pl = transpose_conv_geometry(op.attrs, xs, ys, kh, kw)
        name = self.uid("tt_cd")
        self.globals.append(f"static const tt_conv_dims {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {ys[1]}, {ys[2]}, "
                            f"{ys[3]}, {kh}, {kw}, {sh}, {sw}, 1, 1, {pt}, {pl}, 1}};")
        return name

    def op_transpose_conv(self, op: Op) -> list[str]:
        x, w = op.inputs[0], op.inputs[1]
        b = op.inputs[2] if len(op.inputs) > 2 else None
        y = op.outputs[0]
        o, kh, kw, _ = self.g.tensors[w].shape
        d = self.tconv_dims(op, x, y, kh, kw)
        bias = self.loc(b) if b else "0"
        act = op.attrs.get("act", "none")
        if self._int8(x):
            q = self.requant(x, w, y, act, o)
            return [f"tt_transpose_conv_s8(&{d}, &{q}, {self.loc(x)}, {self.loc(w)}, {bias}, {self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_transpose_conv_f32(&{d}, {flit(lo)}, {flit(hi)}, {self.loc(x)}, {self.loc(w)}, {bias}, "
                f"{self.loc(y)});"]

    def op_transpose_conv_grad_input(self, op: Op) -> list[str]:
        dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        _, kh, kw, _ = self.g.tensors[w].shape
        d = self.tconv_dims(op, dx, dz, kh, kw)
        return [f"tt_transpose_conv_grad_input_f32(&{d}, {self.loc(dz)}, {self.loc(w)}, {self.loc(dx)});"]

    def op_transpose_conv_grad_weight(self, op: Op) -> list[str]:
        dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
        o, kh, kw, ci = [int(v) for v in op.attrs["w_shape"]]
        k = int(op.attrs.get("in_channels", ci))
        if int(self.g.tensors[x].shape[-1]) != ci:
            raise CodegenError(f"transpose_conv_grad_weight {dw!r}: reads a {self.g.tensors[x].shape} input "
                               f"(a sliced int8 input is not supported)")
        d = self.tconv_dims(op, x, dz, kh, kw)
        return [f"tt_transpose_conv_grad_weight_f32(&{d}, {k}, {self.loc(dz)}, {self.loc(x)}, {self.loc(dw)});"]

    def op_depthwise_conv2d(self, op: Op, io: dict[str, str] | None = None) -> list[str]:
        x, w, b = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None
        y = op.outputs[0]
        _, kh, kw, o = self.g.tensors[w].shape
        mult = o // self.g.tensors[x].shape[3]
        d = self.conv_dims(op, x, y, kh, kw, mult)
        bias = self.loc(b) if b else "0"
        act = op.attrs.get("act", "none")
        if io is not None:
            dd, xe, ye = self._io(io, d, x, y)
            if self._int8(x):
                q = self.requant(x, w, y, act, o)
                return [f"tt_depthwise_conv2d_s8({dd}, &{q}, {xe}, {self.loc(w)}, {bias}, {ye});"]
            lo, hi = FLOAT_BOUNDS[act]
            return [f"tt_depthwise_conv2d_f32({dd}, {flit(lo)}, {flit(hi)}, {xe}, {self.loc(w)}, {bias}, {ye});"]
        inplace = self.same_place(x, y)
        if inplace:
            if y not in self.scratch:
                raise CodegenError(f"in-place depthwise {y} has no scratch buffer in the plan")
            scr = f"({self.ctype(y)} *)(tt_arena + {self.scratch[y]})"
        if self._int8(x):
            q = self.requant(x, w, y, act, o)
            if inplace:
                return [f"tt_depthwise_conv2d_s8_inplace(&{d}, &{q}, {self.loc(x)}, {self.loc(w)}, {bias}, {scr});"]
            return [f"tt_depthwise_conv2d_s8(&{d}, &{q}, {self.loc(x)}, {self.loc(w)}, {bias}, {self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        if inplace:
            return [f"tt_depthwise_conv2d_f32_inplace(&{d}, {flit(lo)}, {flit(hi)}, {self.loc(x)}, {self.loc(w)}, "
                    f"{bias}, {scr});"]
        return [f"tt_depthwise_conv2d_f32(&{d}, {flit(lo)}, {flit(hi)}, {self.loc(x)}, {self.loc(w)}, {bias}, "
                f"{self.loc(y)});"]

    def op_fully_connected(self, op: Op) -> list[str]:
        x, w, b = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None
        y = op.outputs[0]
        o, depth = self.g.tensors[w].shape
        rows = numel(self.g.tensors[x].shape) // depth
        bias = self.loc(b) if b else "0"
        act = op.attrs.get("act", "none")
        if self._int8(x):
            q = self.requant(x, w, y, act, o)
            return [f"tt_fully_connected_s8({rows}, {depth}, {o}, &{q}, {self.loc(x)}, {self.loc(w)}, {bias}, "
                    f"{self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_fully_connected_f32({rows}, {depth}, {o}, {flit(lo)}, {flit(hi)}, {self.loc(x)}, "
                f"{self.loc(w)}, {bias}, {self.loc(y)});"]

    def op_add(self, op: Op) -> list[str]:
        a, b = op.inputs[0], op.inputs[1]
        y = op.outputs[0]
        n = numel(self.g.tensors[y].shape)
        act = op.attrs.get("act", "none")
        same = self.g.tensors[a].shape == self.g.tensors[b].shape
        if self._int8(a):
            p = self.add_sub_params(a, b, y, act)
            if same:
                return [f"tt_add_s8(&{p}, {n}, {self.loc(a)}, {self.loc(b)}, {self.loc(y)});"]
            return [f"tt_add_s8_broadcast(&{p}, &{self.bcast(y, a, b)}, {self.loc(a)}, {self.loc(b)}, "
                    f"{self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        if same:
            return [f"tt_add_f32({n}, {flit(lo)}, {flit(hi)}, {self.loc(a)}, {self.loc(b)}, {self.loc(y)});"]
        return [f"tt_add_f32_broadcast(&{self.bcast(y, a, b)}, {flit(lo)}, {flit(hi)}, {self.loc(a)}, "
                f"{self.loc(b)}, {self.loc(y)});"]

    def op_sub(self, op: Op) -> list[str]:
        a, b = op.inputs[0], op.inputs[1]
        y = op.outputs[0]
        act = op.attrs.get("act", "none")
        bc = self.bcast(y, a, b)
        if self._int8(a):
            p = self.add_sub_params(a, b, y, act)
            return [f"tt_sub_s8(&{p}, &{bc}, {self.loc(a)}, {self.loc(b)}, {self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_sub_f32(&{bc}, {flit(lo)}, {flit(hi)}, {self.loc(a)}, {self.loc(b)}, {self.loc(y)});"]

    def op_mul(self, op: Op) -> list[str]:
        a, b = op.inputs[0], op.inputs[1]
        y = op.outputs[0]
        act = op.attrs.get("act", "none")
        bc = self.bcast(y, a, b)
        if self._int8(a):
            s1, z1 = self.qp(a)
            s2, z2 = self.qp(b)
            so, zo = self.qp(y)
            # TFLite Micro's CalculateOpDataMul: the ratio of the float32 scales in double (executor._mul default).
            m, sh = ia.quantize_multiplier(ia.f32(s1) * ia.f32(s2) / ia.f32(so))
            lo, hi = ia.activation_range(act, so, zo)
            name = self.uid("tt_mu")
            self.globals.append(f"static const tt_mul_params_s8 {name} = {{{z1}, {z2}, {zo}, {m}, {sh}, {lo}, {hi}}};")
            return [f"tt_mul_s8(&{name}, &{bc}, {self.loc(a)}, {self.loc(b)}, {self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_mul_f32(&{bc}, {flit(lo)}, {flit(hi)}, {self.loc(a)}, {self.loc(b)}, {self.loc(y)});"]

    def _logistic_tanh(self, op: Op, kind: str) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        n = numel(self.g.tensors[x].shape)
        if self._int8(x):
            s_in, z_in = self.qp(x)
            s_out, z_out = self.qp(y)
            want = (1.0 / 256, -128) if kind == "logistic" else (1.0 / 128, 0)
            if z_out != want[1] or abs(s_out - want[0]) > 1e-6 * want[0]:
                raise CodegenError(f"int8 {kind} output must have scale {want[0]:g} and zero point {want[1]}")
            m, ls, radius = ia.logistic_tanh_params(s_in)
            return [f"tt_{kind}_s8({n}, {z_in}, {m}, {ls}, {radius}, {self.loc(x)}, {self.loc(y)});"]
        return [f"tt_{kind}_f32({n}, {self.loc(x)}, {self.loc(y)});"]

    def op_logistic(self, op: Op) -> list[str]:
        return self._logistic_tanh(op, "logistic")

    def op_tanh(self, op: Op) -> list[str]:
        return self._logistic_tanh(op, "tanh")

    def op_hard_swish(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        n = numel(self.g.tensors[x].shape)
        if self._int8(x):
            s_in, z_in = self.qp(x)
            s_out, z_out = self.qp(y)
            try:
                om, oe, rm, re_ = ia.hard_swish_params(s_in, s_out)
            except ValueError as e:
                raise CodegenError(f"hard_swish {y!r}: {e}") from None
            name = self.uid("tt_hs")
            self.globals.append(f"static const tt_hard_swish_params_s8 {name} = {{{z_in}, {z_out}, {om}, {oe}, "
                                f"{rm}, {re_}}};")
            return [f"tt_hard_swish_s8(&{name}, {n}, {self.loc(x)}, {self.loc(y)});"]
        return [f"tt_hard_swish_f32({n}, {self.loc(x)}, {self.loc(y)});"]

    def op_leaky_relu(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        n = numel(self.g.tensors[x].shape)
        alpha = np.float32(op.attrs.get("alpha", 0.2))
        if self._int8(x):
            s_in, z_in = self.qp(x)
            s_out, z_out = self.qp(y)
            # LeakyReluPrepare forms both ratios in float (executor._leaky_relu).
            mi, shi = ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
            ma, sha = ia.quantize_multiplier(ia.f32(np.float32(np.float32(s_in) * alpha) / np.float32(s_out)))
            return [f"tt_leaky_relu_s8({n}, {z_in}, {z_out}, {mi}, {shi}, {ma}, {sha}, {self.loc(x)}, "
                    f"{self.loc(y)});"]
        return [f"tt_leaky_relu_f32({n}, {flit(alpha)}, {self.loc(x)}, {self.loc(y)});"]

    def op_prelu(self, op: Op) -> list[str]:
        x, al, y = op.inputs[0], op.inputs[1], op.outputs[0]
        bc = self.bcast(y, x, al)
        if self._int8(x):
            s_in, z_in = self.qp(x)
            s_a, z_a = self.qp(al)
            s_out, z_out = self.qp(y)
            # PreluPrepare's float (not double) ratios (executor._prelu).
            m1, sh1 = ia.quantize_multiplier(ia.f32(np.float32(s_in) / np.float32(s_out)))
            m2, sh2 = ia.quantize_multiplier(ia.f32(np.float32(np.float32(s_in) * np.float32(s_a)) /
                                                    np.float32(s_out)))
            name = self.uid("tt_pr")
            self.globals.append(f"static const tt_prelu_params_s8 {name} = {{{z_in}, {z_a}, {z_out}, {m1}, {sh1}, "
                                f"{m2}, {sh2}}};")
            return [f"tt_prelu_s8(&{name}, &{bc}, {self.loc(x)}, {self.loc(al)}, {self.loc(y)});"]
        return [f"tt_prelu_f32(&{bc}, {self.loc(x)}, {self.loc(al)}, {self.loc(y)});"]

    def op_strided_slice(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        if self.same_place(x, y):
            raise CodegenError(f"strided_slice {y!r} planned in place over its input (the kernel cannot)")
        p = self.slice_params(x, y, op.attrs)
        suffix = "s8" if self._int8(x) else "f32"
        return [f"tt_strided_slice_{suffix}(&{p}, {self.loc(x)}, {self.loc(y)});"]

    def resize_params(self, x: str, y: str, attrs: dict) -> str:
        """tt_resize_params of a resize from x [N,H,W,C] to y [N,OH,OW,C] (the batch of the planned tensors)."""
        xs, ys = [int(d) for d in self.g.tensors[x].shape], [int(d) for d in self.g.tensors[y].shape]
        if len(xs) != 4 or len(ys) != 4 or xs[0] != ys[0] or xs[3] != ys[3]:
            raise CodegenError(f"resize {y!r}: shapes {xs} -> {ys} are not NHWC with equal batch and channels")
        name = self.uid("tt_rs")
        self.globals.append(f"static const tt_resize_params {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {ys[1]}, "
                            f"{ys[2]}, {int(bool(attrs.get('align_corners')))}, "
                            f"{int(bool(attrs.get('half_pixel_centers')))}}};")
        return name

    def _resize(self, op: Op, kind: str) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        if self.same_place(x, y):
            raise CodegenError(f"{op.type} {y!r} planned in place over its input (the kernel cannot)")
        p = self.resize_params(x, y, op.attrs)
        suffix = "s8" if self._int8(x) else "f32"
        return [f"tt_resize_{kind}_{suffix}(&{p}, {self.loc(x)}, {self.loc(y)});"]

    def op_resize_bilinear(self, op: Op) -> list[str]:
        return self._resize(op, "bilinear")

    def op_resize_nearest_neighbor(self, op: Op) -> list[str]:
        return self._resize(op, "nearest")

    def _pool(self, op: Op, kind: str) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        d = self.pool_dims(op, x)
        act = op.attrs.get("act", "none")
        if self._int8(x):
            lo, hi = ia.activation_range(act, *self.qp(y))
            return [f"tt_{kind}_s8(&{d}, {lo}, {hi}, {self.loc(x)}, {self.loc(y)});"]
        lo, hi = FLOAT_BOUNDS[act]
        return [f"tt_{kind}_f32(&{d}, {flit(lo)}, {flit(hi)}, {self.loc(x)}, {self.loc(y)});"]

    def op_average_pool2d(self, op: Op) -> list[str]:
        return self._pool(op, "average_pool2d")

    def op_max_pool2d(self, op: Op) -> list[str]:
        return self._pool(op, "max_pool2d")

    def _mean_axes(self, op: Op) -> tuple[int, int, int, int]:
        x = op.inputs[0]
        xs = self.g.tensors[x].shape
        axes = sorted({int(v) % len(xs) for v in np.asarray(self.g.tensors[op.inputs[1]].data).reshape(-1)})
        if len(xs) != 4 or axes != [1, 2]:
            raise CodegenError(f"mean over axes {axes} of a rank-{len(xs)} tensor (only H, W of NHWC)")
        return xs[0], xs[1], xs[2], xs[3]

    def op_mean(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        b, h, w, c = self._mean_axes(op)
        if self._int8(x):
            s_in, z_in = self.qp(x)
            s_out, z_out = self.qp(y)
            count = h * w
            mult, shift = ia.quantize_multiplier(float(s_in) / float(s_out))
            extra = min(count.bit_length() - 1, 32, 31 + shift)
            mult = int((mult << extra) // count) if extra >= 0 else int((mult >> -extra) // count)
            shift -= extra
            name = self.uid("tt_mp")
            self.globals.append(f"static const tt_mean_params_s8 {name} = {{{z_in}, {z_out}, {mult}, {shift}}};")
            return [f"tt_mean_hw_s8(&{name}, {b}, {h}, {w}, {c}, {self.loc(x)}, {self.loc(y)});"]
        return [f"tt_mean_hw_f32({b}, {h}, {w}, {c}, {self.loc(x)}, {self.loc(y)});"]

    def op_softmax(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        xs = self.g.tensors[x].shape
        depth = xs[-1]
        rows = numel(xs) // depth
        beta = float(op.attrs.get("beta", 1.0))
        if self._int8(x):
            m, ls, dmin = ia.softmax_params(beta, self.qp(x)[0])
            return [f"tt_softmax_s8({rows}, {depth}, {m}, {ls}, {dmin}, {self.loc(x)}, {self.loc(y)});"]
        return [f"tt_softmax_f32({rows}, {depth}, {flit(beta)}, {self.loc(x)}, {self.loc(y)});"]

    def _relu(self, op: Op, lo: float, hi: float | None) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        n = numel(self.g.tensors[x].shape)
        if self._int8(x):
            s_in, z_in = self.qp(x)
            s_out, z_out = self.qp(y)
            mult, shift = ia.quantize_multiplier(float(s_in) / float(s_out))
            qlo, qhi = ia.relu_op_range(lo, hi, s_out, z_out)
            return [f"tt_relu_s8({n}, {z_in}, {z_out}, {mult}, {shift}, {qlo}, {qhi}, {self.loc(x)}, "
                    f"{self.loc(y)});"]
        return [f"tt_clamp_f32({n}, {flit(lo)}, {flit(math.inf if hi is None else hi)}, {self.loc(x)}, "
                f"{self.loc(y)});"]

    def op_relu(self, op: Op) -> list[str]:
        return self._relu(op, 0.0, None)

    def op_relu6(self, op: Op) -> list[str]:
        return self._relu(op, 0.0, 6.0)

    def _copy(self, x: str, y: str) -> list[str]:
        if self.same_place(x, y):
            return [f"/* {y} aliases {x} */"]
        n = numel(self.g.tensors[x].shape)
        suffix = "s8" if self._int8(x) else "f32"
        return [f"tt_copy_{suffix}({n}, {self.loc(x)}, {self.loc(y)});"]

    def op_reshape(self, op: Op) -> list[str]:
        return self._copy(op.inputs[0], op.outputs[0])

    def op_reshape_grad(self, op: Op) -> list[str]:
        return self._copy(op.inputs[0], op.outputs[0])

    def _pads(self, x: str, p: str) -> tuple[str, str]:
        xs = list(self.g.tensors[x].shape)
        pads = np.asarray(self.g.tensors[p].data).reshape(len(xs), 2).astype(int).tolist()
        while len(xs) < 4:
            xs.insert(0, 1)
            pads.insert(0, [0, 0])
        shp = self.const_table("tt_shape", "int32_t", xs)
        pd = self.const_table("tt_pads", "int32_t", [v for pr in pads for v in pr])
        return shp, pd

    def op_pad(self, op: Op) -> list[str]:
        x, p, y = op.inputs[0], op.inputs[1], op.outputs[0]
        shp, pd = self._pads(x, p)
        if self._int8(x):
            return [f"tt_pad_s8({shp}, {pd}, {self.qp(y)[1]}, {self.loc(x)}, {self.loc(y)});"]
        return [f"tt_pad_f32({shp}, {pd}, 0.0f, {self.loc(x)}, {self.loc(y)});"]

    def op_pad_grad(self, op: Op) -> list[str]:
        dy, p, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        shp, pd = self._pads(dx, p)
        return [f"tt_pad_grad_f32({shp}, {pd}, {self.loc(dy)}, {self.loc(dx)});"]

    def _concat_geo(self, names: list[str], axis: int, out: str) -> tuple[str, int]:
        ys = self.g.tensors[out].shape
        axis %= len(ys)
        outer = numel(ys[:axis])
        inner = [numel(self.g.tensors[n].shape[axis:]) for n in names]
        return self.const_table("tt_inner", "int32_t", inner), outer

    def op_concatenation(self, op: Op) -> list[str]:
        names = [n for n in op.inputs if n is not None]
        y = op.outputs[0]
        inner, outer = self._concat_geo(names, int(op.attrs.get("axis", -1)), y)
        act = op.attrs.get("act", "none")
        ptrs = self.uid("tt_in")
        ct = self.ctype(y)
        lines = [f"{{ const {ct} *const {ptrs}[{len(names)}] = {{{', '.join(self.loc(n) for n in names)}}};"]
        if self._int8(y):
            so, zo = self.qp(y)
            same = all(self.qp(n) == (so, zo) for n in names) and act == "none"
            q = "0"
            if not same:
                sc = self.const_table("tt_cs", "float", [self.qp(n)[0] for n in names])
                zp = self.const_table("tt_cz", "int32_t", [self.qp(n)[1] for n in names])
                lo, hi = ia.activation_range(act, so, zo)
                q = self.uid("tt_cq")
                self.globals.append(f"static const tt_concat_params_s8 {q} = {{{sc}, {zp}, {flit(so)}, {zo}, "
                                    f"{lo}, {hi}}};")
                q = "&" + q
            lines.append(f"  tt_concatenation_s8({len(names)}, {ptrs}, {inner}, {outer}, {q}, {self.loc(y)}); }}")
        else:
            lo, hi = FLOAT_BOUNDS[act]
            lines.append(f"  tt_concatenation_f32({len(names)}, {ptrs}, {inner}, {outer}, {flit(lo)}, {flit(hi)}, "
                         f"{self.loc(y)}); }}")
        return lines

    def op_concatenation_grad(self, op: Op) -> list[str]:
        dy = op.inputs[0]
        sizes, axis, which = op.attrs["sizes"], int(op.attrs["axis"]), op.attrs["which"]
        ys = self.g.tensors[dy].shape
        axis %= len(ys)
        outer = numel(ys[:axis])
        rest = numel(ys[axis + 1:])
        inner = self.const_table("tt_inner", "int32_t", [int(s) * rest for s in sizes])
        # Parts that need no gradient (not in `which`) get NULL: the kernel skips them.
        dst = ["0"] * len(sizes)
        for j, name in zip(which, op.outputs):
            dst[int(j)] = self.loc(name)
        ptrs = self.uid("tt_out")
        return [f"{{ float *const {ptrs}[{len(sizes)}] = {{{', '.join(dst)}}};",
                f"  tt_concatenation_grad_f32({len(sizes)}, {inner}, {outer}, {self.loc(dy)}, {ptrs}); }}"]

    def op_quantize(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        n = numel(self.g.tensors[x].shape)
        so, zo = self.qp(y)
        if self.g.tensors[x].dtype == "float32":
            return [f"tt_quantize_f32_s8({n}, {flit(so)}, {zo}, {self.loc(x)}, {self.loc(y)});"]
        si, zi = self.qp(x)
        m, s = ia.quantize_multiplier(float(si) / float(so))
        return [f"tt_requantize_s8({n}, {zi}, {zo}, {m}, {s}, {self.loc(x)}, {self.loc(y)});"]

    def op_dequantize(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        if y in self.fused:
            return [f"/* fused: the input-gradient kernels dequantize {x.split(';')[0]} as they read it */"]
        t = self.g.tensors[x]
        n = numel(t.shape)
        if t.quant.per_channel:
            ax = int(t.quant.axis) % len(t.shape)
            outer, ch, inner = numel(t.shape[:ax]), t.shape[ax], numel(t.shape[ax + 1:])
            sc = self.const_table("tt_dqs", "float", t.quant.scale)
            zp = self.const_table("tt_dqz", "int32_t", t.quant.zero_point)
            return [f"tt_dequantize_per_channel_s8_f32({outer}, {ch}, {inner}, {sc}, {zp}, {self.loc(x)}, "
                    f"{self.loc(y)});"]
        s, z = self.qp(x)
        return [f"tt_dequantize_s8_f32({n}, {flit(s)}, {z}, {self.loc(x)}, {self.loc(y)});"]

    def op_dequantize_slice(self, op: Op) -> list[str]:
        x, y = op.inputs[0], op.outputs[0]
        t = self.g.tensors[x]
        k = int(op.attrs["channels"])
        depth = int(op.attrs.get("depth", t.shape[-1]))
        rows = numel(t.shape) // depth
        s, z = self.qp(x)
        if y in self.fused:
            return [f"/* fused: the weight-gradient kernels dequantize {x.split(';')[0]} as they read it */"]
        return [f"tt_dequantize_slice_s8_f32({rows}, {depth}, {k}, {flit(s)}, {z}, {self.loc(x)}, {self.loc(y)});"]

    # ---- backward --------------------------------------------------------------------------------------------
    def op_act_grad(self, op: Op) -> list[str]:
        dy, y, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        n = numel(self.g.tensors[dy].shape)
        return [f"tt_act_grad_f32({n}, {ACT_ENUM[op.attrs['act']]}, {self.loc(dy)}, {self.loc(y)}, {self.loc(dx)});"]

    def op_int8_clamp_grad(self, op: Op) -> list[str]:
        dy, y, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        n = numel(self.g.tensors[dy].shape)
        return [f"tt_int8_clamp_grad_f32({n}, {int(op.attrs['lo'])}, {int(op.attrs['hi'])}, {self.loc(dy)}, "
                f"{self.loc(y)}, {self.loc(dx)});"]

    def op_clamp_mask(self, op: Op) -> list[str]:
        """autodiff's 1-bit mask of a forward output (kernels_c/tt_mask.h): bit i = lo < y[i] < hi."""
        y, mask = op.inputs[0], op.outputs[0]
        n = numel(self.g.tensors[y].shape)
        lo, hi = op.attrs["lo"], op.attrs.get("hi")
        if self._int8(y):
            return [f"tt_clamp_mask_s8({n}, {int(lo)}, {int(hi)}, {self.loc(y)}, {self.loc(mask)});"]
        return [f"tt_clamp_mask_f32({n}, {flit(lo)}, {flit(math.inf if hi is None else hi)}, {self.loc(y)}, "
                f"{self.loc(mask)});"]

    def op_mask_grad(self, op: Op) -> list[str]:
        """dz = dy where the mask bit is set (in place over dy when the plan shares their buffer)."""
        dy, mask, dz = op.inputs[0], op.inputs[1], op.outputs[0]
        n = numel(self.g.tensors[dy].shape)
        return [f"tt_mask_grad_f32({n}, 0, {self.loc(mask)}, {self.loc(dy)}, {self.loc(dz)});"]

    def _grad_geo(self, op: Op, x_shape, w_shape, dy: str, depthwise: bool, in_c: int | None = None) -> str:
        """tt_conv_dims of the forward conv from the gradient op's attrs (x: the forward input's shape)."""
        a = op.attrs
        kh, kw = w_shape[1], w_shape[2]
        sh, sw = int(a["stride_h"]), int(a["stride_w"])
        dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
        oh, pt = out_size_and_pad(a["padding"], x_shape[1], kh, sh, dh)
        ow, pl = out_size_and_pad(a["padding"], x_shape[2], kw, sw, dw)
        ys = self.g.tensors[dy].shape
        c_in = x_shape[3] if in_c is None else in_c
        mult = int(a.get("multiplier") or a.get("depth_multiplier") or (w_shape[3] // x_shape[3] if depthwise else 1)) \
            if depthwise else 1
        name = self.uid("tt_cd")
        self.globals.append(f"static const tt_conv_dims {name} = {{{x_shape[0]}, {x_shape[1]}, {x_shape[2]}, {c_in}, "
                            f"{oh}, {ow}, {ys[3]}, {kh}, {kw}, {sh}, {sw}, {dh}, {dw}, {pt}, {pl}, {mult}}};")
        return name

    def op_conv2d_grad_input(self, op: Op, io: dict[str, str] | None = None) -> list[str]:
        dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        if io is None:
            d = "&" + self._grad_geo(op, self.g.tensors[dx].shape, self.g.tensors[w].shape, dz, False)
            dze, dxe = self.loc(dz), self.loc(dx)
        else:
            d, dze, dxe = io["d"], io["dz"], io["dx"]
        if w in self.fused:
            wq = self.fused[w]
            sc, zp = self.dq_tables(wq, 0, self.g.tensors[wq].shape[0])
            whole, part, n = self.weight_args(wq)
            return [f"tt_conv2d_grad_input_qw_f32({d}, {dze}, {whole}, {part}, {n}, {sc}, {zp}, {dxe});"]
        return [f"tt_conv2d_grad_input_f32({d}, {dze}, {self.loc(w)}, {dxe});"]

    # ---- streamed groups (stages/streams.py) -------------------------------------------------------------------
    def emit_stream(self, st: Stream) -> list[str]:
        lines = getattr(self, "stream_" + st.kind)(st)
        self.calls += sum(1 for ln in lines if ln.lstrip().startswith("tt_"))
        names = ", ".join(self.g.ops[i].type for i in st.ops)
        return [f"/* stream {st.kind}: {names} -> {', '.join(self.g.ops[st.ops[-1]].outputs)} */"] + lines

    def stream_rows(self, st: Stream) -> list[str]:
        """The chain row by row (tt_stream_rows): a callback runs op k's kernel on a sub-problem of its rows."""
        ops = [self.g.ops[i] for i in st.ops]
        if len(ops) > 16:
            raise CodegenError("a row stream of more than 16 ops (TT_STREAM_MAX_OPS)")
        fn, table, bufs = self.uid("tt_rows_fn"), self.uid("tt_rows"), self.uid("tt_rows_buf")
        rows = []
        cases = []
        for k, op in enumerate(ops):
            geo = row_geometry(self.g, op)
            window = int(st.info["windows"].get(op.outputs[0], 0)) if k < len(ops) - 1 else 0
            rows.append(f"{{{geo['in_h']}, {geo['out_h']}, {geo['stride']}, {geo['pad_top']}, {geo['span']}, "
                        f"{geo['in_row']}, {geo['out_row']}, {window}}}")
            io = {"d": "&d", "x": "x", "y": "y"}
            call = getattr(self, "op_" + op.type)(op, io=io)
            cases += [f"    case {k}:", f"        d = {io['dims']};", "        d.in_h = in_rows;",
                      "        d.pad_top = pad_top;", "        d.out_h = out_rows;", *[f"        {c}" for c in call],
                      "        break;"]
        self.globals.append(f"static const tt_row_op {table}[{len(ops)}] = {{{', '.join(rows)}}};")
        self.globals.append("\n".join([
            f"static void {fn}(void *ctx, int32_t k, const uint8_t *x, int32_t in_rows, int32_t pad_top, uint8_t *y,",
            "                  int32_t out_rows)", "{", "    tt_conv_dims d;", "    (void)ctx;", "    switch (k) {",
            *cases, "    default:", "        break;", "    }", "}"]))
        wins = [f"(uint8_t *){self.loc(op.outputs[0])}" for op in ops[:-1]]
        return [f"{{ uint8_t *const {bufs}[{len(wins)}] = {{{', '.join(wins)}}};",
                f"  tt_stream_rows({table}, {len(ops)}, (const uint8_t *){self.loc(ops[0].inputs[0])}, {bufs}, "
                f"(uint8_t *){self.loc(ops[-1].outputs[0])}, {fn}, 0); }}"]

    def stream_channels(self, st: Stream) -> list[str]:
        """Weight gradient + its update, one output channel at a time (the gradient holds one channel)."""
        gop, uop = [self.g.ops[i] for i in st.ops]
        p, dw = uop.inputs[0], gop.outputs[0]
        channels = int(st.info["channels"])
        rows, cols, n = self._slice(p, dw)
        rpc = rows // channels
        # the parameter (its SRAM rows: the compact slice of a split weight) and every per-element state (master
        # copy, optimizer moments: [rows, n]) advance by one channel's rows; the gradient chunk and scalars do not
        off = {p: f"o * {rpc * cols}"}
        for t in uop.inputs[2:]:
            if t is not None and numel(self.g.tensors[t].shape) == rows * n:
                off[t] = f"o * {rpc * n}"
        if uop.type.startswith("qas_"):
            scale = uop.inputs[2]
            off.pop(scale, None)
            if numel(self.g.tensors[scale].shape) != 1:
                off[scale] = "o"
        self.chunk_off, self.chunk_rows = off, rpc
        try:
            grad = getattr(self, "op_" + gop.type)(gop)
            upd = getattr(self, "op_" + uop.type)(uop)
        finally:
            self.chunk_off, self.chunk_rows = {}, None
        return ["{ int32_t o;", f"  for (o = 0; o < {channels}; ++o) {{", *["    " + ln for ln in grad + upd],
                "  }", "}"]

    def stream_positions(self, st: Stream) -> list[str]:
        """mean_grad -> mask -> bias_grad / 1x1 conv2d_grad_input, one spatial position at a time."""
        mean, mask, *cons = [self.g.ops[i] for i in st.ops]
        g, t1, t2 = mean.inputs[0], mean.outputs[0], mask.outputs[0]
        n, h, w, c = self.g.tensors[t1].shape
        count = h * w
        lines = ["{ int32_t p;"]
        for op in cons:
            if op.type == "bias_grad":
                lines.append(f"  memset({self.loc(op.outputs[0])}, 0, {c * 4});")
        lines += [f"  for (p = 0; p < {count}; ++p) {{",
                  f"    tt_mean_hw_grad_positions_f32(1, {count}, {c}, {self.loc(g)}, {self.loc(t1)});"]
        y = mask.inputs[1]
        if mask.type == "int8_clamp_grad":
            lines.append(f"    tt_int8_clamp_grad_f32({c}, {int(mask.attrs['lo'])}, {int(mask.attrs['hi'])}, "
                         f"{self.loc(t1)}, {self.loc(y)} + p * {c}, {self.loc(t2)});")
        elif mask.type == "act_grad":
            lines.append(f"    tt_act_grad_f32({c}, {ACT_ENUM[mask.attrs['act']]}, {self.loc(t1)}, "
                         f"{self.loc(y)} + p * {c}, {self.loc(t2)});")
        else:
            lines.append(f"    tt_mask_grad_f32({c}, p * {c}, {self.loc(y)}, {self.loc(t1)}, {self.loc(t2)});")
        for op in cons:
            if op.type == "bias_grad":
                lines.append(f"    tt_bias_grad_acc_f32(1, {c}, {self.loc(t2)}, {self.loc(op.outputs[0])});")
                continue
            ci = self.g.tensors[op.outputs[0]].shape[3]
            d = self.uid("tt_cd")
            self.globals.append(f"static const tt_conv_dims {d} = {{1, 1, 1, {ci}, 1, 1, {c}, 1, 1, 1, 1, 1, 1, 0, "
                                f"0, 1}};")
            lines += ["    " + ln for ln in self.op_conv2d_grad_input(
                op, io={"d": f"&{d}", "dz": self.loc(t2), "dx": f"{self.loc(op.outputs[0])} + p * {ci}"})]
        return lines + ["  }", "}"]

    def op_depthwise_conv2d_grad_input(self, op: Op) -> list[str]:
        dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        ws = self.g.tensors[w].shape
        xs = self.g.tensors[dx].shape
        d = self._grad_geo(op, xs, ws, dz, True)
        # memplan may put dx over a dying dz (depth multiplier 1): channel by channel through a scratch channel
        inplace = self.same_place(dz, dx)
        if inplace and dx not in self.scratch:
            raise CodegenError(f"in-place depthwise input gradient {dx} has no scratch buffer in the plan")
        scr = f"(float *)(tt_arena + {self.scratch[dx]})" if inplace else ""
        if w in self.fused:
            wq = self.fused[w]
            sc, zp = self.dq_tables(wq, 3, ws[3])
            if inplace:
                return [f"tt_depthwise_conv2d_grad_input_qw_f32_inplace(&{d}, {self.loc(dx)}, {self.loc(wq)}, {sc}, "
                        f"{zp}, {scr});"]
            return [f"tt_depthwise_conv2d_grad_input_qw_f32(&{d}, {self.loc(dz)}, {self.loc(wq)}, {sc}, {zp}, "
                    f"{self.loc(dx)});"]
        if inplace:
            return [f"tt_depthwise_conv2d_grad_input_f32_inplace(&{d}, {self.loc(dx)}, {self.loc(w)}, {scr});"]
        return [f"tt_depthwise_conv2d_grad_input_f32(&{d}, {self.loc(dz)}, {self.loc(w)}, {self.loc(dx)});"]

    def op_conv2d_grad_weight(self, op: Op) -> list[str]:
        dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
        ws = list(op.attrs["w_shape"])
        k = int(op.attrs.get("in_channels") or ws[3])
        if x in self.fused:  # the int8 activation itself, all its channels (memplan.fused_input_dequantize)
            xq = self.fused[x]
            xs = self.g.tensors[xq].shape
            d = self._grad_geo(op, xs, ws, dz, False, in_c=xs[3])
            s, z = self.qp(xq)
            o0, o1 = ("o", "o + 1") if self.chunk_rows is not None else ("0", str(ws[0]))
            return [f"tt_conv2d_grad_weight_qx_f32_range(&{d}, {k}, {o0}, {o1}, {self.loc(dz)}, {self.loc(xq)}, "
                    f"{flit(s)}, {z}, {self.loc(dw)});"]
        xs = self.g.tensors[x].shape
        d = self._grad_geo(op, xs, ws, dz, False, in_c=xs[3])
        if self.chunk_rows is not None:
            return [f"tt_conv2d_grad_weight_f32_range(&{d}, {k}, o, o + 1, {self.loc(dz)}, {self.loc(x)}, "
                    f"{self.loc(dw)});"]
        return [f"tt_conv2d_grad_weight_f32(&{d}, {k}, {self.loc(dz)}, {self.loc(x)}, {self.loc(dw)});"]

    def op_depthwise_conv2d_grad_weight(self, op: Op) -> list[str]:
        dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
        ws = list(op.attrs["w_shape"])
        xs = self.g.tensors[x].shape
        k = int(op.attrs.get("in_channels") or xs[3])
        mult = int(op.attrs.get("multiplier") or 0) or ws[3] // xs[3]
        a = op.attrs
        kh, kw = ws[1], ws[2]
        sh, sw = int(a["stride_h"]), int(a["stride_w"])
        dh, dwl = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
        oh, pt = out_size_and_pad(a["padding"], xs[1], kh, sh, dh)
        ow, pl = out_size_and_pad(a["padding"], xs[2], kw, sw, dwl)
        ys = self.g.tensors[dz].shape
        name = self.uid("tt_cd")
        self.globals.append(f"static const tt_conv_dims {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {oh}, {ow}, "
                            f"{ys[3]}, {kh}, {kw}, {sh}, {sw}, {dh}, {dwl}, {pt}, {pl}, {mult}}};")
        return [f"tt_depthwise_conv2d_grad_weight_f32(&{name}, {k}, {self.loc(dz)}, {self.loc(x)}, {self.loc(dw)});"]

    def op_fully_connected_grad_input(self, op: Op) -> list[str]:
        dz, w, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        o, depth = self.g.tensors[w].shape
        rows = numel(self.g.tensors[dx].shape) // depth
        if w in self.fused:
            wq = self.fused[w]
            sc, zp = self.dq_tables(wq, 0, o)
            return [f"tt_fully_connected_grad_input_qw_f32({rows}, {depth}, {o}, {self.loc(dz)}, {self.loc(wq)}, "
                    f"{sc}, {zp}, {self.loc(dx)});"]
        return [f"tt_fully_connected_grad_input_f32({rows}, {depth}, {o}, {self.loc(dz)}, {self.loc(w)}, "
                f"{self.loc(dx)});"]

    def op_fully_connected_grad_weight(self, op: Op) -> list[str]:
        dz, x, dw = op.inputs[0], op.inputs[1], op.outputs[0]
        o, depth = op.attrs["w_shape"]
        k = int(op.attrs.get("in_channels") or depth)
        rows = numel(self.g.tensors[dz].shape) // o
        xdepth = numel(self.g.tensors[x].shape) // rows  # the int8 path hands over only the k trained columns
        if xdepth == k and k != depth:
            depth_arg = k
        else:
            depth_arg = depth
        if self.chunk_rows is not None:
            return [f"tt_fully_connected_grad_weight_f32_range({rows}, {depth_arg}, {o}, {k}, o, o + 1, "
                    f"{self.loc(dz)}, {self.loc(x)}, {self.loc(dw)});"]
        return [f"tt_fully_connected_grad_weight_f32({rows}, {depth_arg}, {o}, {k}, {self.loc(dz)}, {self.loc(x)}, "
                f"{self.loc(dw)});"]

    def op_bias_grad(self, op: Op) -> list[str]:
        dz, db = op.inputs[0], op.outputs[0]
        c = self.g.tensors[dz].shape[-1]
        rows = numel(self.g.tensors[dz].shape) // c
        return [f"tt_bias_grad_f32({rows}, {c}, {self.loc(dz)}, {self.loc(db)});"]

    def _unbroadcast(self, dz: str, d: str, sign: float) -> list[str]:
        if sign > 0 and self.g.tensors[d].shape == self.g.tensors[dz].shape:
            return self._copy(dz, d)
        n = numel(self.g.tensors[d].shape)
        return [f"tt_unbroadcast_f32(&{self.bcast(dz, d)}, {flit(sign)}, {self.loc(dz)}, {self.loc(d)}, {n});"]

    def op_add_grad(self, op: Op) -> list[str]:
        dz = op.inputs[0]
        lines = []
        for o in op.outputs:
            lines += self._unbroadcast(dz, o, 1.0)
        return lines

    def op_sub_grad(self, op: Op) -> list[str]:
        dz = op.inputs[0]
        lines = []
        for o, j in zip(op.outputs, op.attrs["which"]):
            lines += self._unbroadcast(dz, o, -1.0 if int(j) == 1 else 1.0)
        return lines

    def op_mul_grad(self, op: Op) -> list[str]:
        dz, other, d = op.inputs[0], op.inputs[1], op.outputs[0]
        n = numel(self.g.tensors[d].shape)
        return [f"tt_mul_grad_f32(&{self.bcast(dz, d, other)}, {self.loc(dz)}, {self.loc(other)}, {self.loc(d)}, "
                f"{n});"]

    def _elementwise_grad(self, op: Op, kind: str, *extra: str) -> list[str]:
        dy, v, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        n = numel(self.g.tensors[dy].shape)
        pre = "".join(f"{e}, " for e in extra)
        return [f"tt_{kind}_grad_f32({n}, {pre}{self.loc(dy)}, {self.loc(v)}, {self.loc(dx)});"]

    def op_logistic_grad(self, op: Op) -> list[str]:
        return self._elementwise_grad(op, "logistic")

    def op_tanh_grad(self, op: Op) -> list[str]:
        return self._elementwise_grad(op, "tanh")

    def op_hard_swish_grad(self, op: Op) -> list[str]:
        return self._elementwise_grad(op, "hard_swish")

    def op_leaky_relu_grad(self, op: Op) -> list[str]:
        return self._elementwise_grad(op, "leaky_relu", flit(op.attrs["alpha"]))

    def op_prelu_grad(self, op: Op) -> list[str]:
        dy, x, al, dx = op.inputs[0], op.inputs[1], op.inputs[2], op.outputs[0]
        return [f"tt_prelu_grad_f32(&{self.bcast(dy, x, al)}, {self.loc(dy)}, {self.loc(x)}, {self.loc(al)}, "
                f"{self.loc(dx)});"]

    def op_strided_slice_grad(self, op: Op) -> list[str]:
        dy, dx = op.inputs[0], op.outputs[0]
        if self.same_place(dy, dx):
            raise CodegenError(f"strided_slice_grad {dx!r} planned in place over dy (the kernel cannot)")
        p = self.slice_params(dx, dy, op.attrs)
        return [f"tt_strided_slice_grad_f32(&{p}, {self.loc(dy)}, {self.loc(dx)});"]

    def _resize_grad(self, op: Op, kind: str) -> list[str]:
        dy, dx = op.inputs[0], op.outputs[0]
        if self.same_place(dy, dx):
            raise CodegenError(f"{op.type} {dx!r} planned in place over dy (the kernel cannot)")
        p = self.resize_params(dx, dy, op.attrs)
        return [f"tt_resize_{kind}_grad_f32(&{p}, {self.loc(dy)}, {self.loc(dx)});"]

    def op_resize_bilinear_grad(self, op: Op) -> list[str]:
        return self._resize_grad(op, "bilinear")

    def op_resize_nearest_neighbor_grad(self, op: Op) -> list[str]:
        return self._resize_grad(op, "nearest")

    def op_average_pool2d_grad(self, op: Op) -> list[str]:
        dy, dx = op.inputs[0], op.outputs[0]
        d = self.pool_dims(op, dx)
        return [f"tt_average_pool2d_grad_f32(&{d}, {self.loc(dy)}, {self.loc(dx)});"]

    def op_max_pool2d_grad(self, op: Op) -> list[str]:
        dy, x, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        d = self.pool_dims(op, x)
        if self._int8(x):
            return [f"tt_max_pool2d_grad_s8(&{d}, {self.loc(dy)}, {self.loc(x)}, {self.loc(dx)});"]
        return [f"tt_max_pool2d_grad_f32(&{d}, {self.loc(dy)}, {self.loc(x)}, {self.loc(dx)});"]

    def op_mean_grad(self, op: Op) -> list[str]:
        dy, dx = op.inputs[0], op.outputs[0]
        xs = self.g.tensors[dx].shape
        axes = sorted({int(v) % len(xs) for v in np.asarray(self.g.tensors[op.inputs[1]].data).reshape(-1)})
        if len(xs) != 4 or axes != [1, 2]:
            raise CodegenError("mean_grad other than over H, W")
        return [f"tt_mean_hw_grad_f32({xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {self.loc(dy)}, {self.loc(dx)});"]

    def op_softmax_grad(self, op: Op) -> list[str]:
        dy, y, dx = op.inputs[0], op.inputs[1], op.outputs[0]
        ys = self.g.tensors[y].shape
        return [f"tt_softmax_grad_f32({numel(ys) // ys[-1]}, {ys[-1]}, {flit(op.attrs.get('beta', 1.0))}, "
                f"{self.loc(dy)}, {self.loc(y)}, {self.loc(dx)});"]

    def op_grad_accumulate(self, op: Op) -> list[str]:
        y = op.outputs[0]
        n = numel(self.g.tensors[y].shape)
        ptrs = self.uid("tt_g")
        return [f"{{ const float *const {ptrs}[{len(op.inputs)}] = {{{', '.join(self.loc(t) for t in op.inputs)}}};",
                f"  tt_sum_f32({len(op.inputs)}, {ptrs}, {n}, {self.loc(y)}); }}"]

    def op_batch_accumulate(self, op: Op) -> list[str]:
        acc, g = op.inputs
        n = numel(self.g.tensors[acc].shape)
        return [f"tt_accumulate_f32({n}, {self.loc(acc)}, {self.loc(g)});"]

    def op_softmax_ce_loss(self, op: Op) -> list[str]:
        return self._loss(op)

    def op_mse_loss(self, op: Op) -> list[str]:
        # grad_ops.mse_loss: per sample mean over its elements of (y - t)^2, summed over the rows; dy = 2 (y - t) / per.
        # tt_mse_f32 computes dy in that order (bit-exact); the loss sums sequentially (numpy sums pairwise from 8
        # elements on, so the loss may differ in the last ulp for K >= 8).
        return self._loss(op)

    def op_bce_logits_loss(self, op: Op) -> list[str]:
        return self._loss(op)

    def op_huber_loss(self, op: Op) -> list[str]:
        return self._loss(op)

    def _loss(self, op: Op) -> list[str]:
        """A loss op (stages/losses.py): its kernel on the head's slice of the target (attr offset, several heads),
        then the head's weight (attr weight) on loss and gradient."""
        y, t = op.inputs
        loss, dy = op.outputs
        ys, ts = self.g.tensors[y].shape, self.g.tensors[t].shape
        off = op.attrs.get("offset")
        if off is None:  # one head: the target tensor is exactly this head's
            want = numel(ys) // ys[-1] if op.type == "softmax_ce_loss" else numel(ys)
            if numel(ts) != want:
                raise CodegenError(f"{op.type}: target {t!r} {ts} does not fit the prediction {ys}")
        lines = loss_call(op.type, ys, self.loc(y), self.loc(t), self.g.tensors[t].dtype, int(off or 0),
                          self.loc(dy), f"{self.loc(loss)}[0]", float(op.attrs.get("delta", HUBER_DELTA)))
        if "weight" in op.attrs:
            lines.append(f"{self.loc(loss)}[0] = tt_loss_weight_f32({numel(ys)}, {flit(float(op.attrs['weight']))}, "
                         f"{self.loc(loss)}[0], {self.loc(dy)});")
        return lines

    def op_loss_sum(self, op: Op) -> list[str]:
        # losses.loss_sum: 0 + l0 + l1 + ... in head order, float32.
        out = f"{self.loc(op.outputs[0])}[0]"
        return [f"{out} = 0.0f;"] + [f"{out} += {self.loc(t)}[0];" for t in op.inputs]

    # ---- updates ---------------------------------------------------------------------------------------------
    def rt(self, op: Op, key: str) -> str:
        ref = op.attrs.get(f"{key}_ref")
        if ref is None:
            if key == "weight_decay":
                return "0.0f"
            return flit(self.meta["runtime_defaults"][key])
        name = ref.split(".", 1)[1] if ref.startswith("runtime.") else ref
        if name not in RUNTIME_FIELDS:
            raise CodegenError(f"runtime value {name!r} is not in runtime.bin")
        return f"tt_cfg.{RUNTIME_FIELDS[name]}"

    def _slice(self, p: str, gname: str) -> tuple[int, int, int]:
        ps = self.g.tensors[p].shape
        cols = ps[-1] if ps else 1
        rows = numel(ps) // cols
        gs = self.g.tensors[gname].shape
        n = gs[-1] if gs else 1
        if p in self.split:
            return rows, n, n  # the compact slice: rows of n trained channels
        return rows, cols, n

    def _reset(self, op: Op, gname: str) -> list[str]:
        if op.attrs.get("reset_grad"):
            return [f"memset({self.loc(gname)}, 0, {numel(self.g.tensors[gname].shape) * 4});"]
        return []

    def _float_update(self, op: Op, body) -> list[str]:
        p, gname = op.inputs[0], op.inputs[1]
        rows, cols, n = self._slice(p, gname)
        rows = self.chunk_rows or rows
        sl = self.uid("tt_sl")
        self.globals.append(f"static const tt_slice {sl} = {{{rows}, {cols}, {n}}};")
        scale = flit(1.0 / float(op.attrs.get("batch_size", 1)))
        return body(sl, scale) + self._reset(op, gname)

    def op_sgd_update(self, op: Op) -> list[str]:
        p, g = op.inputs[0], op.inputs[1]
        return self._float_update(op, lambda sl, sc: [
            f"{{ const tt_sgd_params pp = {{{self.rt(op, 'learning_rate')}, {sc}, {self.rt(op, 'weight_decay')}}};",
            f"  tt_sgd_f32(&{sl}, &pp, {self.ploc(p)}, {self.ploc(g)}); }}"])

    def op_momentum_update(self, op: Op) -> list[str]:
        p, g, buf = op.inputs[:3]
        return self._float_update(op, lambda sl, sc: [
            f"{{ const tt_momentum_params pp = {{{self.rt(op, 'learning_rate')}, {self.rt(op, 'momentum')}, {sc}, "
            f"{self.rt(op, 'weight_decay')}}};",
            f"  tt_momentum_f32(&{sl}, &pp, {self.ploc(p)}, {self.ploc(g)}, {self.ploc(buf)}); }}"])

    def op_adam_update(self, op: Op) -> list[str]:
        p, g, m, v, step = op.inputs[:5]
        return self._float_update(op, lambda sl, sc: [
            "{ tt_adam_params pp;",
            f"  tt_adam_prepare((double){self.rt(op, 'learning_rate')}, (double){self.rt(op, 'beta1')}, "
            f"(double){self.rt(op, 'beta2')}, (double){self.rt(op, 'eps')}, {self.ploc(step)}[0], {sc}, "
            f"{self.rt(op, 'weight_decay')}, &pp);",
            f"  tt_adam_f32(&{sl}, &pp, {self.ploc(p)}, {self.ploc(g)}, {self.ploc(m)}, {self.ploc(v)}); }}"])

    def op_rmsprop_update(self, op: Op) -> list[str]:
        p, g, sq = op.inputs[:3]
        return self._float_update(op, lambda sl, sc: [
            f"{{ const tt_rmsprop_params pp = {{{self.rt(op, 'learning_rate')}, {self.rt(op, 'alpha')}, "
            f"(float)(1.0 - (double){self.rt(op, 'alpha')}), {self.rt(op, 'eps')}, {sc}, "
            f"{self.rt(op, 'weight_decay')}}};",
            f"  tt_rmsprop_f32(&{sl}, &pp, {self.ploc(p)}, {self.ploc(g)}, {self.ploc(sq)}); }}"])

    def op_step_counter(self, op: Op) -> list[str]:
        return [f"{self.loc(op.inputs[0])}[0] += 1;"]

    def _qas(self, op: Op) -> list[str]:
        a = op.attrs
        kind = op.type[len("qas_"):-len("_update")]
        p, gname, scale = op.inputs[:3]
        ns = {"sgd": 0, "momentum": 1, "adam": 2, "rmsprop": 1}[kind]
        states = op.inputs[3:3 + ns]
        pos = 3 + ns
        step = None
        if kind == "adam":
            step = op.inputs[pos]
            pos += 1
        master = None
        if a.get("master"):
            master = op.inputs[pos]
            pos += 1
        rng = op.inputs[pos] if a.get("rounding") == "stochastic" and master is None else None
        pt = self.g.tensors[p]
        rows, cols, n = self._slice(p, gname)
        axis = int(a["axis"]) % max(len(pt.shape), 1)
        if len(pt.shape) <= 1 or axis == len(pt.shape) - 1:
            rpc = 0
        elif axis == 0:
            rpc = rows // pt.shape[0]
        else:
            raise CodegenError(f"QAS scale along axis {axis} of {pt.shape}")
        sc_count = numel(self.g.tensors[scale].shape)
        if self.chunk_rows is not None:
            if rpc <= 0:
                raise CodegenError(f"streamed QAS update of {p}: scales not along the output channels")
            rows = self.chunk_rows
        lo, hi = a["bounds"]
        kinds = {"sgd": "TT_OPT_SGD", "momentum": "TT_OPT_MOMENTUM", "adam": "TT_OPT_ADAM",
                 "rmsprop": "TT_OPT_RMSPROP"}
        rounding = "TT_ROUND_STOCHASTIC" if a.get("rounding") == "stochastic" else "TT_ROUND_NEAREST"
        wd = self.rt(op, "weight_decay") if "weight_decay_ref" in a else "0.0f"
        lines = ["{ tt_qas_params pp;",
                 "  memset(&pp, 0, sizeof pp);",
                 f"  pp.kind = {kinds[kind]}; pp.qas = {1 if a.get('qas', True) else 0}; pp.rounding = {rounding};",
                 f"  pp.lo = {'INT32_MIN' if int(lo) == -(1 << 31) else int(lo)}; pp.hi = {int(hi)};",
                 f"  pp.batch_scale = {flit(1.0 / float(a.get('batch_size', 1)))}; "
                 f"pp.lr = {self.rt(op, 'learning_rate')}; pp.weight_decay = {wd};"]
        if kind == "momentum":
            lines.append(f"  pp.momentum = {self.rt(op, 'momentum')};")
        elif kind == "adam":
            lines += ["  { tt_adam_params ap;",
                      f"    tt_adam_prepare((double){self.rt(op, 'learning_rate')}, (double){self.rt(op, 'beta1')}, "
                      f"(double){self.rt(op, 'beta2')}, (double){self.rt(op, 'eps')}, {self.ploc(step)}[0], 1.0f, "
                      "0.0f, &ap);",
                      "    pp.one_minus_beta1 = ap.one_minus_beta1; pp.beta2 = ap.beta2; "
                      "pp.one_minus_beta2 = ap.one_minus_beta2;",
                      "    pp.lr_over_bc1 = ap.lr_over_bc1; pp.sqrt_bc2 = ap.sqrt_bc2; pp.eps = ap.eps; }"]
        elif kind == "rmsprop":
            lines.append(f"  pp.alpha = {self.rt(op, 'alpha')}; pp.one_minus_alpha = "
                         f"(float)(1.0 - (double){self.rt(op, 'alpha')}); pp.eps = {self.rt(op, 'eps')};")
        st0 = self.ploc(states[0]) if ns >= 1 else "0"
        st1 = self.ploc(states[1]) if ns >= 2 else "0"
        ms = self.ploc(master) if master else "0"
        rg = f"(uint32_t *){self.ploc(rng)}" if rng else "0"
        lines.append(f"  tt_qas_update(&pp, {rows}, {cols}, {n}, {rpc}, {sc_count}, {self.ploc(scale)}, "
                     f"{self.ploc(p)}, {1 if pt.dtype == 'int32' else 0}, {self.ploc(gname)}, {st0}, {st1}, {ms}, "
                     f"{rg}); }}")
        return lines + self._reset(op, gname)

    op_qas_sgd_update = _qas
    op_qas_momentum_update = _qas
    op_qas_adam_update = _qas
    op_qas_rmsprop_update = _qas


def loss_call(op_type: str, shape: list[int], pred: str, target: str, target_dtype: str, offset: int, grad: str,
              result: str, delta: float = HUBER_DELTA) -> list[str]:
    """C lines computing `result = loss` and the gradient `grad` of one loss op type (stages/losses.py) on a
    prediction `pred` of `shape`, reading the targets at `target` + `offset` (one float class index for
    cross-entropy on a float target row). Shared by the training step and the evaluation of several heads."""
    rows, per = (int(shape[0]), numel(shape[1:])) if len(shape) > 1 else (1, numel(shape))
    tgt = f"{target} + {offset}" if offset else target
    if op_type == "softmax_ce_loss":
        depth = int(shape[-1])
        if target_dtype == "int32":
            return [f"{result} = tt_softmax_cross_entropy_f32({numel(shape) // depth}, {depth}, {pred}, {tgt}, "
                    f"{grad});"]
        if numel(shape) != depth:
            raise CodegenError(f"softmax_ce_loss on a float target row: one row of logits, not {list(shape)}")
        return [f"{{ const int32_t tt_lab = (int32_t)({target}[{offset}]);",
                f"  {result} = tt_softmax_cross_entropy_f32(1, {depth}, {pred}, &tt_lab, {grad}); }}"]
    if op_type == "mse_loss":
        return [f"{result} = tt_mse_f32({rows}, {per}, {pred}, {tgt}, {grad});"]
    if op_type == "bce_logits_loss":
        return [f"{result} = tt_bce_logits_f32({rows}, {per}, {pred}, {tgt}, {grad});"]
    if op_type == "huber_loss":
        return [f"{result} = tt_huber_f32({rows}, {per}, {flit(delta)}, {pred}, {tgt}, {grad});"]
    raise CodegenError(f"no C kernel for loss op {op_type}")


# ---- the program ---------------------------------------------------------------------------------------------

def _program(gen: _Gen, fwd_lines: list[str], sample_lines: list[str], step_lines: list[str], x_name: str,
             lab_name: str, head: str, loss: str, batch_size: int, trained: list[dict], prng_inits: list[str],
             stack_bytes: int, n_prof: int = 0, regression: bool = False,
             loss_heads: list[dict[str, Any]] | None = None) -> str:
    g = gen.g
    x_t = g.tensors[x_name]
    head_t = g.tensors[head]
    x_bytes = x_t.nbytes
    n_classes = head_t.shape[-1]
    argmax = "tt_argmax_s8" if head_t.dtype == "int8" else "tt_argmax_f32"
    ttds_dtype = {"int8": "TT_TTDS_INT8", "float32": "TT_TTDS_FLOAT32"}.get(x_t.dtype)
    if ttds_dtype is None:
        raise CodegenError(f"model input of dtype {x_t.dtype}")
    wb_lines = []
    for t in trained:
        loc = gen.loc(t["name"])
        if t["name"] in gen.split:  # the merged tensor: trained slice + frozen channels from flash
            whole, part, n = gen.weight_args(t["name"])
            cols = int(t["shape"][-1])
            wb_lines.append(f"    tt_write_split(fd, {whole}, {part}, {t['nbytes'] // cols}u, {cols}u, {n}u);")
            continue
        wb_lines.append(f"    if (tt_write(fd, {loc}, {t['nbytes']}) != 0) {{ tt_fail(\"cannot write weights.bin\"); }}")
    write_split = """
/* weights.bin holds whole tensors: a split weight is written row by row, channels [0, n) from its trained slice and
 * the rest from the flash original, through a small buffer (few semihosting calls, little stack). */
static void tt_write_split(int fd, const int8_t *whole, const int8_t *part, uint32_t rows, uint32_t cols, uint32_t n)
{
    static int8_t buf[256];
    uint32_t r, used = 0, c;
    for (r = 0; r < rows; ++r) {
        for (c = 0; c < cols; ++c) {
            buf[used++] = c < n ? part[r * n + c] : whole[r * cols + c];
            if (used == sizeof buf) {
                if (tt_write(fd, buf, used) != 0) {
                    tt_fail("cannot write weights.bin");
                }
                used = 0;
            }
        }
    }
    if (used != 0 && tt_write(fd, buf, used) != 0) {
        tt_fail("cannot write weights.bin");
    }
}
""" if gen.split else ""
    arena_end = max((int(b["offset"]) + int(b["size"]) for b in gen.plan["buffers"] if int(b["size"])), default=0)
    ind = lambda ls, n: "\n".join(" " * n + ln for ln in ls)  # noqa: E731
    if loss_heads:
        eval_fn, eval_fmt, read_record, targets_check = _loss_parts(gen, x_name, lab_name, loss_heads, ttds_dtype)
    elif regression:
        eval_fn, eval_fmt, read_record, targets_check = _regression_parts(gen, x_name, lab_name, head, ttds_dtype)
    else:
        eval_fn = f"""static void tt_evaluate(uint32_t *correct, uint32_t *total)
{{
    tt_ttds s;
    int32_t label;
    int rc = tt_ttds_open(&s, "test.ttds");
    *correct = 0;
    *total = 0;
    if (rc != 0) {{
        tt_fail("cannot open test.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("test.ttds: samples do not match the model input");
    }}
    while ((rc = tt_ttds_next(&s, &label, {gen.loc(x_name)})) == 1) {{
        tt_forward();
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
        {{ /* the forward output of every test sample, for bit-exact checks against the executor */
            const int dfd = tt_open("eval_out.bin", TT_APPEND);
            if (dfd < 0 || tt_write(dfd, {gen.loc(head)}, {head_t.nbytes}) != 0) {{
                tt_fail("cannot write eval_out.bin");
            }}
            tt_close(dfd);
        }}
#endif
        *correct += ({argmax}(TT_NUM_CLASSES, {gen.loc(head)}) == label) ? 1u : 0u;
        *total += 1;
    }}
    if (rc < 0) {{
        tt_fail("test.ttds: read error");
    }}
    tt_ttds_close(&s);
}}

"""
        eval_fmt = ('"{\\"protocol\\": ' + str(PROTOCOL) + ', \\"acc_before\\": {\\"correct\\": %lu, \\"total\\": %lu}, "\n'
                    '        "\\"acc_after\\": {\\"correct\\": %lu, \\"total\\": %lu}, \\"steps\\": %lu, \\"samples\\": %lu, "')
        read_record = f"""                rc = tt_ttds_next(&s, &label, {gen.loc(x_name)});
                if (rc != 1) {{
                    tt_fail("train.ttds: read error");
                }}
                if (label < 0 || label >= TT_NUM_CLASSES) {{
                    tt_fail("train.ttds: label out of range");
                }}
                {gen.loc(lab_name)}[0] = label;
"""
        targets_check = ""
    return f"""/* Generated by tinytrain codegen (stages/codegen.py): the training program of one model.
 * Protocol {PROTOCOL}: see stages/runtime_config.py. Do not edit: regenerate. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tt_kernels.h"
#include "tt_train_ops.h"
#include "tt_platform.h"
#include "tt_ttds.h"

#define TT_ARENA_SIZE {max(gen.arena, 16)}u
#define TT_ARENA_PLANNED {gen.arena}u
/* The planned end of the last buffer (max offset + size), rounded up to the 4-byte word the arena is scanned by:
 * what tt_arena_used() must find (the arena's own size adds the 16-byte alignment padding nobody writes). */
#define TT_ARENA_END {-(-arena_end // 4) * 4}u
#define TT_BATCH_SIZE {batch_size}u
#define TT_NUM_CLASSES {n_classes}
#define TT_INPUT_BYTES {x_bytes}u
#define TT_PAINT 0x{PAINT:08X}u

static uint8_t tt_arena[TT_ARENA_SIZE] __attribute__((aligned(16)));

/* runtime.bin, parsed field by field (little-endian) so no struct padding or byte order leaks in. */
typedef struct {{
    float learning_rate;
    uint32_t epochs, seed, batch_size;
    float momentum, beta1, beta2, eps, alpha, weight_decay;
    uint32_t max_train_samples, flags;
}} tt_runtime_config;

static tt_runtime_config tt_cfg;

/* Per-op instruction profile of the training step (-DTT_PROFILE=1 only; bench/profile_mbv2.py): op k's
 * instructions and calls, written to profile.bin (little-endian uint64 instructions[N], then uint32 calls[N]). */
#if defined(TT_PROFILE) && TT_PROFILE
#define TT_PROF_N {max(n_prof, 1)}
static uint64_t tt_prof_insns[TT_PROF_N];
static uint32_t tt_prof_calls[TT_PROF_N];
static uint64_t tt_prof_t0;
#define TT_PROF_BEGIN() (tt_prof_t0 = tt_instructions())
#define TT_PROF_END(k) (tt_prof_insns[(k)] += tt_instructions() - tt_prof_t0, ++tt_prof_calls[(k)])
static void tt_prof_write(void)
{{
    const int fd = tt_open("profile.bin", TT_WRITE);
    if (fd < 0 || tt_write(fd, tt_prof_insns, sizeof tt_prof_insns) != 0 ||
        tt_write(fd, tt_prof_calls, sizeof tt_prof_calls) != 0) {{
        tt_fail("cannot write profile.bin");
    }}
    tt_close(fd);
}}
#else
#define TT_PROF_BEGIN() ((void)0)
#define TT_PROF_END(k) ((void)0)
#endif

{chr(10).join(gen.globals)}
{write_split}
static uint32_t tt_le32(const uint8_t *p)
{{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}}

static float tt_lef32(const uint8_t *p)
{{
    const uint32_t u = tt_le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}}

static void tt_read_config(void)
{{
    uint8_t b[64];
    const long n = tt_read_file("runtime.bin", b, sizeof b);
    if (n != 56) {{
        tt_fail("runtime.bin missing or not 56 bytes");
    }}
    if (b[0] != 'T' || b[1] != 'T' || b[2] != 'R' || b[3] != 'C' || tt_le32(b + 4) != 1u) {{
        tt_fail("runtime.bin: bad magic or version");
    }}
    tt_cfg.learning_rate = tt_lef32(b + 8);
    tt_cfg.epochs = tt_le32(b + 12);
    tt_cfg.seed = tt_le32(b + 16);
    tt_cfg.batch_size = tt_le32(b + 20);
    tt_cfg.momentum = tt_lef32(b + 24);
    tt_cfg.beta1 = tt_lef32(b + 28);
    tt_cfg.beta2 = tt_lef32(b + 32);
    tt_cfg.eps = tt_lef32(b + 36);
    tt_cfg.alpha = tt_lef32(b + 40);
    tt_cfg.weight_decay = tt_lef32(b + 44);
    tt_cfg.max_train_samples = tt_le32(b + 48);
    tt_cfg.flags = tt_le32(b + 52);
    if (tt_cfg.batch_size != TT_BATCH_SIZE) {{
        tt_fail("runtime.bin: batch_size differs from the compiled batch size");
    }}
}}

static void tt_init_state(void)
{{
{ind(gen.init_lines, 4)}
{ind(prng_inits, 4)}
}}

/* Forward only (evaluation): the schedule's forward ops in its order. */
static void tt_forward(void)
{{
{ind(fwd_lines, 4)}
}}

/* One sample: forward, loss, backward{', accumulation' if batch_size > 1 else ', in-place updates'}. */
static void tt_sample_step(void)
{{
{ind(sample_lines, 4)}
}}

/* Once per batch: the updates (empty when they run in the sample step). */
static void tt_update_step(void)
{{
{ind(step_lines, 4) if step_lines else '    /* updates run inside the sample step (batch 1, in-place order) */'}
}}

static void tt_write_weights(const char *name)
{{
    const int fd = tt_open(name, TT_WRITE);
    if (fd < 0) {{
        tt_fail("cannot open weights file");
    }}
{chr(10).join(wb_lines)}
    tt_close(fd);
}}

{eval_fn}/* The arena is painted word by word before the run; the used size is the end of the last word that no longer
 * holds the paint (a byte-wise scan read data bytes equal to a one-byte paint as unused). */
static void tt_arena_paint(void)
{{
    const uint32_t p = TT_PAINT;
    uint32_t i;
    for (i = 0; i + 4u <= TT_ARENA_SIZE; i += 4u) {{
        memcpy(tt_arena + i, &p, 4);
    }}
}}

static uint32_t tt_arena_used(void)
{{
    uint32_t i = TT_ARENA_SIZE - TT_ARENA_SIZE % 4u;
    while (i > 0) {{
        uint32_t w;
        memcpy(&w, tt_arena + i - 4u, 4);
        if (w != TT_PAINT) {{
            break;
        }}
        i -= 4u;
    }}
    return i;
}}

static void tt_write_results(uint32_t cb, uint32_t tb, uint32_t ca, uint32_t ta, uint32_t steps,
                             uint32_t samples, uint64_t itotal, uint64_t imin, uint64_t imax, int nan)
{{
    static char buf[768];
    const uint64_t imean = steps ? itotal / steps : 0;
    const int n = tt_snprintf(buf, sizeof buf,
        {eval_fmt}
        "\\"instructions_total_train\\": %llu, \\"instructions_per_step_min\\": %llu, "
        "\\"instructions_per_step_max\\": %llu, \\"instructions_per_step_mean\\": %llu, "
        "\\"arena_bytes_planned\\": %lu, \\"arena_end_planned\\": %lu, \\"arena_bytes_used\\": %lu, "
        "\\"loss_nan\\": %s}}\\n",
        (unsigned long)cb, (unsigned long)tb, (unsigned long)ca, (unsigned long)ta, (unsigned long)steps,
        (unsigned long)samples, (unsigned long long)itotal, (unsigned long long)imin, (unsigned long long)imax,
        (unsigned long long)imean, (unsigned long)TT_ARENA_PLANNED, (unsigned long)TT_ARENA_END,
        (unsigned long)tt_arena_used(),
        nan ? "true" : "false");
    if (n <= 0 || tt_write_file("results.json", buf, (size_t)n) != 0) {{
        tt_fail("cannot write results.json");
    }}
}}

int tt_main(void)
{{
    uint32_t cb = 0, tb = 0, ca = 0, ta = 0, steps = 0, samples = 0, epoch, used, i;
    uint64_t itotal = 0, imin = 0, imax = 0;
    int32_t label;
    int lfd, rc;
    tt_ttds s;
    tt_read_config();
    tt_arena_paint();
    tt_init_state();
    if (tt_cfg.flags & 1u) {{
        tt_evaluate(&cb, &tb);
    }}
    if (tt_ttds_open(&s, "train.ttds") != 0) {{
        tt_fail("cannot open train.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("train.ttds: samples do not match the model input");
    }}{targets_check}
    used = s.count;
    if (tt_cfg.max_train_samples != 0 && tt_cfg.max_train_samples < used) {{
        used = tt_cfg.max_train_samples;
    }}
    used -= used % TT_BATCH_SIZE; /* a last partial batch is dropped, as train_executor.train does */
    lfd = tt_open("losses.bin", TT_WRITE);
    if (lfd < 0) {{
        tt_fail("cannot open losses.bin");
    }}
    for (epoch = 0; epoch < tt_cfg.epochs; ++epoch) {{
        if (tt_ttds_seek(&s, 0) != 0) {{
            tt_fail("train.ttds: seek failed");
        }}
        for (i = 0; i < used; i += TT_BATCH_SIZE) {{
            const uint64_t t0 = tt_instructions();
            uint64_t dt;
            uint32_t j;
            for (j = 0; j < TT_BATCH_SIZE; ++j) {{
                float lv;
                uint8_t lb[4];
                uint32_t bits;
{read_record}                tt_sample_step();
                lv = {gen.loc(loss)}[0];
                bits = tt_f32_bits(lv);
                lb[0] = (uint8_t)bits; lb[1] = (uint8_t)(bits >> 8); lb[2] = (uint8_t)(bits >> 16); lb[3] = (uint8_t)(bits >> 24);
                if (tt_write(lfd, lb, 4) != 0) {{
                    tt_fail("cannot write losses.bin");
                }}
                ++samples;
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
                {{
                    char name[32];
                    tt_snprintf(name, sizeof name, "dump_%lu.bin", (unsigned long)samples);
                    tt_write_weights(name);
                }}
#endif
                if (!(lv == lv) || lv - lv != 0.0f) {{
                    static char msg[64];
                    tt_close(lfd);
                    tt_write_results(cb, tb, ca, ta, steps, samples, itotal, imin, imax, 1);
                    tt_snprintf(msg, sizeof msg, "loss is NaN at step %lu", (unsigned long)(samples - 1));
                    tt_fail(msg);
                }}
            }}
            tt_update_step();
            dt = tt_instructions() - t0;
            if (steps == 0 || dt < imin) {{
                imin = dt;
            }}
            if (dt > imax) {{
                imax = dt;
            }}
            itotal += dt;
            ++steps;
            tt_progress(steps, (used / TT_BATCH_SIZE) * tt_cfg.epochs, "training steps");
        }}
    }}
    tt_close(lfd);
    tt_ttds_close(&s);
    if (tt_cfg.flags & 2u) {{
        tt_evaluate(&ca, &ta);
    }}
    tt_write_weights("weights.bin");
#if defined(TT_PROFILE) && TT_PROFILE
    tt_prof_write();
#endif
    tt_write_results(cb, tb, ca, ta, steps, samples, itotal, imin, imax, 0);
    (void)tt_arena_used;
    return 0;
}}
"""


def _regression_parts(gen: _Gen, x_name: str, lab_name: str, head: str, ttds_dtype: str) -> tuple[str, str, str, str]:
    """The MSE (regression) variants of the program's pieces: tt_evaluate computing the test split's mean squared
    error, results.json's mse fields, the train loop's record read (float targets straight into the target
    tensor) and the check that the streams carry as many targets as the model has outputs.

    tt_evaluate keeps the classification signature (a, total): `a` is the IEEE-754 bit pattern of the MSE (results.json
    holds integers only; stages/emulate_run.py decodes it). Per sample the error is that of tt_mse_f32 / grad_ops
    .mse_loss (mean over the sample's outputs); the MSE is their mean over the samples, summed in float in file order."""
    g = gen.g
    head_t, lab_t = g.tensors[head], g.tensors[lab_name]
    k = numel(head_t.shape)
    if numel(lab_t.shape) != k:
        raise CodegenError(f"mse target {lab_name!r} {lab_t.shape} does not match the prediction {head_t.shape}")
    if head_t.dtype == "int8":
        # The loss reads the dequantized head (autodiff's dequantize): evaluate on the same real values.
        s, z = gen.qp(head)
        pred_decl = "    static float pred[TT_NUM_TARGETS];\n"
        pred = (f"        tt_dequantize_s8_f32(TT_NUM_TARGETS, {flit(s)}, {z}, {gen.loc(head)}, pred);\n"
                "        y = pred;\n")
    elif head_t.dtype == "float32":
        pred_decl, pred = "", f"        y = {gen.loc(head)};\n"
    else:
        raise CodegenError(f"mse on a {head_t.dtype} prediction")
    eval_fn = f"""#define TT_NUM_TARGETS {k}u

static void tt_evaluate(uint32_t *mse_bits, uint32_t *total)
{{
    static float target[TT_NUM_TARGETS];
{pred_decl}    tt_ttds s;
    int32_t label;
    float sum = 0.0f;
    int rc = tt_ttds_open(&s, "test.ttds");
    *mse_bits = 0;
    *total = 0;
    if (rc != 0) {{
        tt_fail("cannot open test.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("test.ttds: samples do not match the model input");
    }}
    if (s.targets != TT_NUM_TARGETS) {{
        tt_fail("test.ttds: the records' float targets do not match the model's outputs");
    }}
    while ((rc = tt_ttds_next_target(&s, &label, target, {gen.loc(x_name)})) == 1) {{
        const float *y;
        float acc = 0.0f;
        uint32_t k;
        tt_forward();
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
        {{ /* the forward output of every test sample, for bit-exact checks against the executor */
            const int dfd = tt_open("eval_out.bin", TT_APPEND);
            if (dfd < 0 || tt_write(dfd, {gen.loc(head)}, {head_t.nbytes}) != 0) {{
                tt_fail("cannot write eval_out.bin");
            }}
            tt_close(dfd);
        }}
#endif
{pred}        for (k = 0; k < TT_NUM_TARGETS; ++k) {{
            const float d = y[k] - target[k];
            acc += d * d;
        }}
        sum += acc / (float)TT_NUM_TARGETS;
        *total += 1;
    }}
    if (rc < 0) {{
        tt_fail("test.ttds: read error");
    }}
    tt_ttds_close(&s);
    *mse_bits = tt_f32_bits(*total ? sum / (float)*total : 0.0f);
}}

"""
    eval_fmt = ('"{\\"protocol\\": ' + str(PROTOCOL) + ', \\"task\\": \\"regression\\", '
                '\\"mse_before_bits\\": %lu, \\"mse_before_total\\": %lu, "\n'
                '        "\\"mse_after_bits\\": %lu, \\"mse_after_total\\": %lu, \\"steps\\": %lu, '
                '\\"samples\\": %lu, "')
    read_record = f"""                rc = tt_ttds_next_target(&s, &label, {gen.loc(lab_name)}, {gen.loc(x_name)});
                if (rc != 1) {{
                    tt_fail("train.ttds: read error");
                }}
"""
    targets_check = """
    if (s.targets != TT_NUM_TARGETS) {
        tt_fail("train.ttds: the records' float targets do not match the model's outputs");
    }"""
    return eval_fn, eval_fmt, read_record, targets_check


def _head_captures(gen: _Gen, heads: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Several heads: evaluation copies each head into its own static buffer right after the forward op that writes
    it (later forward ops may reuse its arena bytes once its loss has read it in the training schedule)."""
    out: dict[str, list[str]] = {}
    for j, h in enumerate(heads):
        t = gen.g.tensors[h["tensor"]]
        ctype = "int8_t" if t.dtype == "int8" else "float"
        gen.globals.append(f"static {ctype} tt_eval_head{j}[{numel(t.shape)}];")
        out.setdefault(h["tensor"], []).append(f"memcpy(tt_eval_head{j}, {gen.loc(h['tensor'])}, {t.nbytes}u);")
    return out


def _loss_parts(gen: _Gen, x_name: str, lab_name: str, heads: list[dict[str, Any]],
                ttds_dtype: str) -> tuple[str, str, str, str]:
    """Training on a float target row other than a single MSE head (several heads; one bce or huber head): the
    evaluation is the test split's mean training loss (every head's weighted loss, summed as loss_sum does) with the
    loss kernels themselves on the heads captured during the forward, into static scratch gradients. results.json
    holds its IEEE-754 bits (`loss_before_bits`, `loss_after_bits`; task "loss"). Records are TTDS version 2 whose K
    float targets are the heads' targets back to back (stages/losses.py)."""
    g = gen.g
    k = numel(g.tensors[lab_name].shape)
    biggest = max(numel(g.tensors[h["tensor"]].shape) for h in heads)
    body, off = [], 0
    for j, h in enumerate(heads):
        t = g.tensors[h["tensor"]]
        n = numel(t.shape)
        pred = f"tt_eval_head{j}"
        if t.dtype == "int8":
            sc, z = gen.qp(h["tensor"])
            body.append(f"        tt_dequantize_s8_f32({n}, {flit(sc)}, {z}, tt_eval_head{j}, tt_eval_pred);")
            pred = "tt_eval_pred"
        op_type = LOSS_OPS[h["loss"]]
        body += ["        " + ln for ln in loss_call(op_type, list(t.shape), pred, "target",
                                                       "float32", off if len(heads) > 1 else 0,
                                                       "tt_eval_grad", "l")]
        if float(h.get("weight", 1.0)) != 1.0:
            body.append(f"        l = l * {flit(float(h['weight']))};")
        body.append("        acc += l;")
        off += 1 if h["loss"] == "cross_entropy" else n
    if off != k:
        raise CodegenError(f"the heads take {off} target values per sample but the target row has {k}")
    # int8 heads are dequantized into one scratch buffer first (the losses read real values).
    pred_decl = f"static float tt_eval_pred[{biggest}];\n" if any("tt_eval_pred" in ln for ln in body) else ""
    eval_fn = f"""#define TT_NUM_TARGETS {k}u

static float tt_eval_grad[{biggest}];
{pred_decl}
static void tt_evaluate(uint32_t *loss_bits, uint32_t *total)
{{
    static float target[TT_NUM_TARGETS];
    tt_ttds s;
    int32_t label;
    float sum = 0.0f;
    int rc = tt_ttds_open(&s, "test.ttds");
    *loss_bits = 0;
    *total = 0;
    if (rc != 0) {{
        tt_fail("cannot open test.ttds");
    }}
    if (s.sample_bytes != TT_INPUT_BYTES || s.dtype != {ttds_dtype}) {{
        tt_fail("test.ttds: samples do not match the model input");
    }}
    if (s.targets != TT_NUM_TARGETS) {{
        tt_fail("test.ttds: the records' float targets do not match the trained outputs");
    }}
    while ((rc = tt_ttds_next_target(&s, &label, target, {gen.loc(x_name)})) == 1) {{
        float acc = 0.0f, l = 0.0f;
        tt_forward();
#if defined(TT_DUMP_TENSORS) && TT_DUMP_TENSORS
        {{ /* the first head of every test sample, for bit-exact checks against the executor */
            const int dfd = tt_open("eval_out.bin", TT_APPEND);
            if (dfd < 0 || tt_write(dfd, tt_eval_head0, sizeof tt_eval_head0) != 0) {{
                tt_fail("cannot write eval_out.bin");
            }}
            tt_close(dfd);
        }}
#endif
{chr(10).join(body)}
        sum += acc;
        *total += 1;
    }}
    if (rc < 0) {{
        tt_fail("test.ttds: read error");
    }}
    tt_ttds_close(&s);
    *loss_bits = tt_f32_bits(*total ? sum / (float)*total : 0.0f);
}}

"""
    eval_fmt = ('"{\\"protocol\\": ' + str(PROTOCOL) + ', \\"task\\": \\"loss\\", '
                '\\"loss_before_bits\\": %lu, \\"loss_before_total\\": %lu, "\n'
                '        "\\"loss_after_bits\\": %lu, \\"loss_after_total\\": %lu, \\"steps\\": %lu, '
                '\\"samples\\": %lu, "')
    read_record = f"""                rc = tt_ttds_next_target(&s, &label, {gen.loc(lab_name)}, {gen.loc(x_name)});
                if (rc != 1) {{
                    tt_fail("train.ttds: read error");
                }}
"""
    targets_check = """
    if (s.targets != TT_NUM_TARGETS) {
        tt_fail("train.ttds: the records' float targets do not match the trained outputs");
    }"""
    return eval_fn, eval_fmt, read_record, targets_check


def generate(tg: Graph, order: list[int], memplan_doc: dict[str, Any], out_dir: Path,
             kernels: str = "portable", stack_bytes: int = DEFAULT_STACK) -> dict[str, Any]:
    """Write the program for training IR `tg` run in schedule `order` with memory plan `memplan_doc` (reorder's
    memplan.json) into `out_dir`; returns codegen.json's content."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = tg.meta["train"]
    gen = _Gen(tg, list(order), memplan_doc)
    n_fwd = int(meta["phases"]["forward"])
    split = int(meta["sample_ops"])
    bsz = int(meta["batch_size"])
    lab = meta["label_input"]
    x_names = [n for n in tg.inputs if n != lab]
    if len(x_names) != 1:
        raise CodegenError("models with several inputs")
    x_name = x_names[0]
    fwd_lines: list[str] = []
    sample_lines: list[str] = []
    step_lines: list[str] = []
    n_prof = 0
    streams = [Stream.from_json(d) for d in memplan_doc.get("streams", [])]
    stream_of = {i: st for st in streams for i in st.ops}
    # Float targets other than one MSE head (several heads, bce, huber): evaluation by the mean training loss.
    regression = meta.get("loss") == "mse"
    loss_heads = meta.get("heads") if tg.tensors[lab].dtype == "float32" and not regression else None
    captures = _head_captures(gen, loss_heads) if loss_heads else {}
    for i in order:
        op = tg.ops[i]
        if i in stream_of:
            if i != stream_of[i].ops[0]:
                continue
            lines = gen.emit_stream(stream_of[i])
        else:
            lines = gen.emit(op)
        if i < n_fwd and op.type != "clamp_mask":  # inference needs no gradient masks
            fwd_lines += lines
            for j in (stream_of[i].ops if i in stream_of else [i]):
                for t in tg.ops[j].outputs:
                    fwd_lines += captures.get(t, [])
        # Training-step ops are bracketed for the per-op instruction profile (bench/profile_mbv2.py); the macros
        # are empty unless the firmware is built with -DTT_PROFILE=1, so a normal build compiles to the same code.
        prof = [lines[0], "TT_PROF_BEGIN();", *lines[1:], f"TT_PROF_END({n_prof});"]
        n_prof += 1
        if bsz > 1 and i >= split:
            step_lines += prof
        else:
            sample_lines += prof
    # Trained tensors in io_layout order (meta order), their whole bytes.
    trained = []
    off = 0
    for p in meta["trained"]:
        t = tg.tensors[p]
        trained.append({"name": p, "dtype": t.dtype, "shape": list(t.shape), "offset": off, "nbytes": t.nbytes,
                        "source_index": t.source_index})
        off += t.nbytes
    prng_inits = []
    for op in tg.ops:
        if op.type.startswith("qas_") and op.attrs.get("rounding") == "stochastic" and not op.attrs.get("master"):
            r = gen.loc(op.inputs[-1])
            stream = int(op.attrs["stream"])
            prng_inits.append(f"{{ uint32_t x = tt_cfg.seed + {stream}u * 0x6D2B79F5u; "
                              f"if (x == 0u) {{ x = 0x9E3779B9u; }} memcpy({r}, &x, 4); }}")
    for t in trained:
        gen.loc(t["name"])
    head = meta["prediction"]
    text = _program(gen, fwd_lines, sample_lines, step_lines, x_name, lab, head, meta["loss_tensor"], bsz,
                    trained, prng_inits, stack_bytes, n_prof, regression=regression, loss_heads=loss_heads)
    (out_dir / "tt_model.c").write_text(text)
    (out_dir / "sources.json").write_text(json.dumps({"kernels": None, "defines": {}, "stack_bytes": stack_bytes},
                                                     indent=1) + "\n")
    x_t, h_t = tg.tensors[x_name], tg.tensors[head]

    def _q(t: Tensor):
        if t.quant is None:
            return None, None
        return [float(s) for s in t.quant.scale], [int(z) for z in t.quant.zero_point]
    xs, xz = _q(x_t)
    hs, hz = _q(h_t)
    io = {"protocol": PROTOCOL, "trained_tensors": trained,
          "input": {"name": x_name, "shape": list(x_t.shape), "dtype": x_t.dtype,
                    "scale": xs[0] if xs else None, "zero_point": xz[0] if xz else None},
          "output": {"name": head, "shape": list(h_t.shape), "dtype": h_t.dtype,
                     "scale": hs[0] if hs else None, "zero_point": hz[0] if hz else None},
          "arena_bytes": gen.arena, "num_classes": int(h_t.shape[-1]), "batch_size": bsz,
          "weights_bytes": off}
    if regression:  # classification layouts keep their bytes; regression says what the streams must carry
        io.update(loss="mse", num_targets=numel(h_t.shape))
    elif loss_heads:  # the heads' targets back to back in each record (stages/losses.py)
        io.update(loss=meta["loss"], num_targets=numel(tg.tensors[lab].shape),
                  heads=[{"output": h["output"], "loss": h["loss"], "weight": h["weight"],
                          "shape": list(tg.tensors[h["tensor"]].shape)} for h in loss_heads])
    (out_dir / "io_layout.json").write_text(json.dumps(io, indent=1) + "\n")
    summary = {"lines": text.count("\n"), "kernel_calls": gen.calls, "arena_bytes": gen.arena,
               "const_bytes": gen.const_bytes, "ops": len(order), "trained_tensors": len(trained),
               "split_weights": sorted(gen.split), "fused_dequantize": len(gen.fused),
               "sram_outside_arena_bytes": gen.static_bytes, "stack_bytes": stack_bytes}
    (out_dir / "codegen.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def summary_line(s: dict[str, Any]) -> str:
    return (f"C: {s['lines']} lines, {s['kernel_calls']} kernel calls, arena {s['arena_bytes'] / 1024:.1f} KB, "
            f"const {s['const_bytes'] / 1024:.1f} KB")


def run(ctx) -> Any:
    """Stage `codegen`: autodiff's training IR + reorder's schedule.json and memplan.json -> C sources."""
    from tinytrain.pipeline.contract import StageResult

    tg = Graph.load(ctx.input_dir("autodiff"), stem="train_")
    rdir = Path(ctx.input_dir("reorder"))
    order = json.loads((rdir / "schedule.json").read_text())["order"]
    plan = json.loads((rdir / "memplan.json").read_text())
    kernels = ctx.config.get("target.kernels", "portable") or "portable"
    s = generate(tg, order, plan, ctx.out_dir, kernels=str(kernels))
    return StageResult(summary=summary_line(s), metrics=s)
