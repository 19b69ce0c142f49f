"""Stage `codegen`: training IR + schedule + memory plan -> one C99 training program (DESIGN §3, §7).

    generate(train_graph, order, memplan_doc, out_dir) -> summary dict

Inputs: autodiff's `train_graph.json`/`train_tensors.npz`, reorder's `schedule.json` (op order) and `memplan.json`
(buffers with arena offsets). Outputs in the stage folder:
  tt_model.c     the program: `static uint8_t tt_arena[A]`, frozen constants `static const` (flash), trained
                 tensors and optimizer state in SRAM (at their planned arena offsets) initialised from flash
                 copies at start, requantization multipliers / shifts / QAS scales as const tables (computed here
                 with stages/golden/int8_arith.py, in double exactly as the numpy executor does), the schedule as
                 straight-line kernel calls, and `tt_main` implementing the firmware protocol of
                 stages/train/runtime_config.py (runtime.bin in; losses.bin, weights.bin, results.json out);
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

Where the C of an op is written: its op module's emitter (stages/ops/<family>.py, `OpDef.c(gen, op)`): every
forward op, and every op a training graph adds (the layers' gradients in stages/ops/conv_grad.py and fc_grad.py, the
masks and bias gradient in stages/ops/training.py). `_Gen` offers the emitters the places (loc, ploc, same_place,
row_io), the tables (const_table, uid, globals), the geometry (conv_dims, tconv_dims), the quantization parameters
(qp, requant, bcast), the split weights (split, weight_args) and copy_call. stages/c_emit/program.py writes the
program around the calls (arena, loops, evaluation, tt_main).

Compile-time options: -DTT_DUMP_TENSORS=1 makes the program write every trained tensor after each sample step
(`dump_<step>.bin`, weights.bin's layout) and appends the forward output of every evaluated sample to
`eval_out.bin`, for bit-exact checks against the numpy model (tests/test_codegen.py).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tinytrain.stages.golden import int8_arith as ia
from tinytrain.stages import ops
from tinytrain.stages.c_emit.literals import ACT_ENUM, CTYPE, CodegenError, c_array, numel
from tinytrain.stages.c_emit.program import api_parts, head_captures, program
from tinytrain.stages.model.geometry import out_size_and_pad
from tinytrain.stages.model.ir import Graph, Op, Tensor
from tinytrain.stages.planning import statics
from tinytrain.stages.planning.arena import fused_dequantize
from tinytrain.stages.c_emit.api import CKPT_HEADER, CKPT_VERSION
from tinytrain.stages.c_emit.api_header import model_header
from tinytrain.stages.c_emit.driver import driver_source
from tinytrain.stages.c_emit import hidden_stream, row_feed
from tinytrain.stages.c_emit.stream import stream_parts
from tinytrain.stages.ops import ROW_OPS, UPDATE_OPS, conv_forward, conv_grad, fp16_io
from tinytrain.stages.train.runtime_config import PROTOCOL
from tinytrain.stages.planning.streams import MAX_ROW_OPS, Stream, pad_rows, row_geometry

# Stack of the firmware (sources.json -> cross-compile -> the linker's __stack_size): "auto", the worst-case depth
# of the linked code (stages/device/stack_bound.py: every call path, plus the interrupts' exception frames), instead of a
# fixed reserve. Measured high-water marks (painted stack, QEMU) stay below it: digits 1104 B against a bound of
# 1248 B, where the old fixed 4 KB left ~3 KB of the board unused.
DEFAULT_STACK = "auto"


def _is_comment(line: str) -> bool:
    """A C line that is one /* ... */ comment (an op whose C is only comments emits no statement)."""
    ln = line.strip()
    return ln.startswith("/*") and ln.endswith("*/") and "*/" not in ln[2:-2]


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
        self.state: list[dict[str, Any]] = []  # what tt_init sets = what a checkpoint holds (stages/c_emit/api.py)
        self._uid = 0
        self.fused = fused_dequantize(g)      # fp32 weight copies that are never materialised
        self.split = self._split_weights()    # weight -> n: compact trained slice in the arena + flash original
        self.flash: dict[str, str] = {}       # split weight -> its whole const (flash) array
        self.static_bytes = 0                 # SRAM codegen puts outside the arena (fallbacks)
        self.input_feed: dict | None = None   # the model input fed row by row (c_emit/row_feed.py), if it is

    def _split_weights(self) -> dict[str, int]:
        """Partially trained int8 or float32 weights whose every reader has a split-weight kernel (the rule the
        plan counts by: planning/statics.split_weights)."""
        return statics.split_weights(self.g, self.trained, self.offset, self.fused)

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
        self.globals.append(f"static const {ctype} {name}[{max(len(vals), 1)}] = {c_array(ctype, vals)};")
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
                                f"{c_array(ct, data.tolist())};")
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
            self._add_state(name, expr, nbytes)
            if not data.any():
                self.init_lines.append(f"memset({expr}, 0, {nbytes}); /* {name} */")
            else:
                self.globals.append(f"/* initial {name} */\nstatic const {ct} tt_i{i}[{data.size}] = "
                                    f"{c_array(ct, data.tolist())};")
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
                            f"static const {ct} tt_c{i}[{data.size}] = {c_array(ct, data.tolist())};")
        self.const_bytes += data.size * data.dtype.itemsize
        self.flash[name] = f"tt_c{i}"
        expr = f"(({ct} *)(tt_arena + {self.offset[name]}))"
        size = data.dtype.itemsize
        self._add_state(name, expr, rows * n * size)
        self.init_lines.append(f"{{ uint32_t r; for (r = 0; r < {rows}u; ++r) {{ memcpy({expr} + r * {n}u, "
                               f"tt_c{i} + r * {cols}u, {n * size}); }} }} /* trained slice of {name} */")
        self.locs[name] = _Loc("arena", expr)
        return expr

    def _add_state(self, name: str, expr: str, nbytes: int) -> None:
        role = "weight" if name in self.trained else "optimizer"
        self.state.append({"name": name, "expr": expr, "nbytes": int(nbytes), "dtype": self.g.tensors[name].dtype,
                           "role": role})

    def const_check_flag(self, *names: str) -> str | None:
        """The name of a static int32_t, -1 at start, in which a kernel keeps its check of operands that never change
        (the *_rep kernels): every one of `names` const data in flash, which no step writes. None when one is written
        (a trained weight or bias, a split weight's slice): its kernel checks it at every call."""
        for n in names:
            self.loc(n)
            if self.locs[n].kind != "flash":
                return None
        flag = self.uid("tt_const_ok")
        self.globals.append(f"static int32_t {flag} = -1; /* the check of {', '.join(names)} (const) */")
        return flag

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
        """A const tt_requant_s8 of a layer: the per-output-channel multipliers the numpy kernels use
        (int8_arith.channel_multipliers), the zero points and the fused activation's clamp."""
        s_in, z_in = self.qp(x)
        s_out, z_out = self.qp(y)
        mult, shift = ia.channel_multipliers(s_in, self.g.tensors[w].quant.scale, s_out, channels)
        m = self.const_table("tt_mult", "int32_t", [int(v) for v in mult])
        sh = self.const_table("tt_shift", "int32_t", [int(v) for v in shift])
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

    # ---- ops -------------------------------------------------------------------------------------------------
    def emit(self, op: Op) -> list[str]:
        lines = self.calls_of(op)
        self.calls += sum(1 for ln in lines if ln.lstrip().startswith("tt_"))
        head = f"/* {op.type}: {', '.join(op.outputs)} */"
        return [head] + lines

    def calls_of(self, op: Op, **kw) -> list[str]:
        """The C of one op: its op module's emitter (stages/ops/, OpDef.c), or this class's op_<type>."""
        d = ops.get(op.type)
        if d is not None and d.c is not None:
            lines = d.c(self, op, **kw)
        else:
            fn = getattr(self, "op_" + op.type, None)
            if fn is None:
                raise CodegenError(f"codegen: no C for op {op.type!r}")
            lines = fn(op, **kw)
        skip = op.attrs.get("skip_if")
        # fp16-mixed: no update on a step whose gradients overflowed (stages/train/fp16_mixed.py); an op whose C is
        # only comments (a fused cast, an alias) gets no guard: `if (flag) {}` would guard nothing
        if skip is not None and any(not _is_comment(ln) for ln in lines):
            lines = [f"if ({self.loc(skip)}[0] == 0) {{", *["    " + ln for ln in lines], "}"]
        return lines

    def is_int8(self, name: str) -> bool:
        return self.g.tensors[name].dtype == "int8"

    def ploc(self, name: str) -> str:
        """loc(name), offset to the current output-channel chunk inside a channels stream (stream_channels)."""
        off = self.chunk_off.get(name)
        return self.loc(name) if off is None else f"({self.loc(name)} + {off})"

    def row_io(self, io: dict[str, str] | None, d: str, x: str, y: str) -> tuple[str, str, str]:
        """(&dims, x pointer, y pointer) of a kernel call: the op's own, or a streamed call's (stream_rows)."""
        if io is None:
            return f"&{d}", self.loc(x), self.loc(y)
        io["dims"] = d  # the whole op's geometry, which the streamed call copies and narrows
        return io["d"], f"({self.ctype(x)} const *){io['x']}", f"({self.ctype(y)} *){io['y']}"

    def tconv_dims(self, op: Op, x: str, y: str, kh: int, kw: int) -> str:
        """tt_conv_dims of a transpose_conv: in_* = x, out_* = y, pads from y's size (transpose_conv_geometry)."""
        xs, ys = self.g.tensors[x].shape, self.g.tensors[y].shape
        sh, sw, pt, pl = conv_forward.transpose_conv_geometry(op.attrs, xs, ys, kh, kw)
        name = self.uid("tt_cd")
        self.globals.append(f"static const tt_conv_dims {name} = {{{xs[0]}, {xs[1]}, {xs[2]}, {xs[3]}, {ys[1]}, {ys[2]}, "
                            f"{ys[3]}, {kh}, {kw}, {sh}, {sw}, 1, 1, {pt}, {pl}, 1}};")
        return name


    def copy_call(self, x: str, y: str) -> list[str]:
        """y = x (a no-op where the plan put both in one place)."""
        if self.same_place(x, y):
            return [f"/* {y} aliases {x} */"]
        n = numel(self.g.tensors[x].shape)
        suffix = "s8" if self.is_int8(x) else "f32"
        return [f"tt_copy_{suffix}({n}, {self.loc(x)}, {self.loc(y)});"]

    # ---- backward --------------------------------------------------------------------------------------------

    # ---- streamed groups (stages/planning/streams.py) -------------------------------------------------------------------
    def emit_stream(self, st: Stream) -> list[str]:
        lines = getattr(self, "stream_" + st.kind)(st)
        self.calls += sum(1 for ln in lines if ln.lstrip().startswith("tt_"))
        names = ", ".join(self.g.ops[i].type for i in st.ops)
        return [f"/* stream {st.kind}: {names} -> {', '.join(self.g.ops[st.ops[-1]].outputs)} */"] + lines

    def stream_rows(self, st: Stream) -> list[str]:
        """The group row by row (tt_stream_rows): a callback runs op k's kernel on a sub-problem of its rows (conv
        and depthwise: the op's dims narrowed at run time; pooling and row-local ops: the op's own C on a view of
        its tensors one output row high, stages/planning/streams.py)."""
        ops = [self.g.ops[i] for i in st.ops]
        if len(ops) > MAX_ROW_OPS:
            raise CodegenError(f"a row stream of more than {MAX_ROW_OPS} ops (TT_STREAM_MAX_OPS)")
        sources = st.info.get("sources") or [[k - 1] if k else [-1] for k in range(len(ops))]
        outside = st.info.get("outside") or [ops[0].inputs[0]]
        fn, table, bufs, ext = self.uid("tt_rows_fn"), self.uid("tt_rows"), self.uid("tt_rows_buf"), \
            self.uid("tt_rows_ext")
        # a fed model input: its row source is op 0 of the call (stages/c_emit/row_feed.py)
        feed = row_feed.RowFeed(self, st, [row_geometry(self.g, op) for op in ops], sources, outside)
        rows = feed.rows()
        cases: list[str] = []
        oks = self.uid("tt_rows_ok")   # the kernels' weight checks, kept for the stream run (reuses_weight_check)
        n_ok = 0
        for k, op in enumerate(ops):
            geo = feed.geos[k + feed.n]
            window = int(st.info["windows"].get(op.outputs[0], 0)) if k < len(ops) - 1 else 0
            src = list(feed.sources[k + feed.n]) + [0] * (2 - len(feed.sources[k + feed.n]))
            inr = list(geo["in_rows"]) + [0] * (2 - len(geo["in_rows"]))
            rows.append(f"{{{geo['in_h']}, {geo['out_h']}, {geo['stride']}, {geo['pad_top']}, {geo['span']}, "
                        f"{len(feed.sources[k + feed.n])}, {{{src[0]}, {src[1]}}}, {{{inr[0]}, {inr[1]}}}, {geo['out_row']}, "
                        f"{window}}}")
            if op.type in ROW_OPS:   # its C takes a row view of its dims struct
                io = {"d": "&d", "x": "xs[0]", "y": "y"}
                if conv_forward.reuses_weight_check(self, op):
                    io["w_ok"] = f"{oks}[{n_ok}]"
                    n_ok += 1
                call = self.calls_of(op, io=io)
                body = ["{", "    tt_conv_dims d;", f"    d = {io['dims']};", "    d.in_h = in_rows;",
                        "    d.pad_top = pad_top;", "    d.out_h = out_rows;", *[f"    {c}" for c in call], "}"]
            elif pad_rows(self.g, op) not in (None, (0, 0)):
                body = self._row_pad_call(op, geo)
            else:
                body = self._row_view_call(op, geo)
            cases += [f"    case {k + feed.n}:", *[f"        {c}" for c in body], "        break;"]
        if n_ok:   # the callback's weight-check flags (reset below before every run)
            self.globals.append(f"static int32_t {oks}[{n_ok}];")
        self.globals.append(f"static const tt_row_op {table}[{len(rows)}] = {{{', '.join(rows)}}};")
        self.globals.append("\n".join([
            f"static void {fn}(void *ctx, int32_t k, const uint8_t *const *xs, int32_t in_rows, int32_t pad_top,",
            "                  uint8_t *y, int32_t out_rows)", "{", "    (void)ctx;", "    (void)in_rows;",
            "    (void)pad_top;", "    (void)out_rows;", "    (void)xs;", "    switch (k) {",
            *cases, "    default:", "        break;", "    }", "}"]))
        wins = feed.bufs() + [f"(uint8_t *){self.loc(op.outputs[0])}" for op in ops[:-1]]
        exts = [feed.ext(t) for t in outside]
        reset: list[str] = []
        if n_ok:   # -1: not checked yet in this run (the weights may be trained between runs)
            reset = [f"{{ int32_t i; for (i = 0; i < {n_ok}; ++i) {oks}[i] = -1; }}"]
        return [*reset, f"{{ uint8_t *const {bufs}[{len(wins)}] = {{{', '.join(wins)}}};",
                f"  const uint8_t *const {ext}[{len(exts)}] = {{{', '.join(exts)}}};",
                f"  tt_stream_rows({table}, {len(rows)}, {ext}, {bufs}, "
                f"(uint8_t *){self.loc(ops[-1].outputs[0])}, {fn}, {feed.ctx()}); }}", *feed.after()]

    def _row_pad_call(self, op: Op, geo: dict[str, Any]) -> list[str]:
        """A PAD that pads H, one output row: the PAD's own C on the callback's input row with its W/C padding, or,
        where the output row is padding (no input row: in_rows == 0), the same C on an empty input padded by one
        row, which writes the pad value the whole op writes there."""
        pads = np.asarray(self.g.tensors[op.inputs[1]].data)
        inside, outside = pads.reshape(-1, 2).copy(), pads.reshape(-1, 2).copy()
        inside[1], outside[1] = 0, (1, 0)
        data = self._row_view_call(op, geo, paddings=inside.reshape(pads.shape))
        fill = self._row_view_call(op, geo, paddings=outside.reshape(pads.shape), in_rows=0)
        return ["if (in_rows == 0) {", *["    " + c for c in fill], "} else {", *["    " + c for c in data], "}"]

    def _row_view_call(self, op: Op, geo: dict[str, Any], paddings: np.ndarray | None = None,
                       in_rows: int | None = None) -> list[str]:
        """The op's own C on a view of its tensors one output row high (its streamed inputs `span` rows, or
        `in_rows`: pooling reads a window, runs unpadded, stages/streams.row_op_ok), pointing at the callback's rows;
        a PAD's `paddings` replaced by those given (_row_pad_call)."""
        saved_g, saved_locs = self.g, dict(self.locs)
        view = copy.copy(self.g)
        view.tensors = dict(self.g.tensors)
        y = op.outputs[0]
        view.tensors[y] = dataclasses.replace(self.g.tensors[y], shape=[1, 1, *self.g.tensors[y].shape[2:]])
        if paddings is not None:
            view.tensors[op.inputs[1]] = dataclasses.replace(self.g.tensors[op.inputs[1]], data=paddings)
        for n, j in enumerate(geo["inputs"]):
            t = op.inputs[j]
            rows = geo["span"] if in_rows is None else in_rows
            view.tensors[t] = dataclasses.replace(self.g.tensors[t], shape=[1, rows, *self.g.tensors[t].shape[2:]])
            self.locs[t] = _Loc("arena", f"(({CTYPE[self.g.tensors[t].dtype]} const *)xs[{n}])")
        self.locs[y] = _Loc("arena", f"(({CTYPE[self.g.tensors[y].dtype]} *)y)")
        if "padding" in op.attrs:
            op = dataclasses.replace(op, attrs={**op.attrs, "padding": "valid"})
        self.g = view
        try:
            return self.calls_of(op)
        finally:
            self.g, self.locs = saved_g, saved_locs

    def stream_channels(self, st: Stream) -> list[str]:
        """Weight gradient + its update, one output channel at a time (the gradient holds one channel). fp16-mixed:
        element-wise ops between them (rounding, unscaling), or a check instead of the update (stages/ops/fp16.py)."""
        gop, *mids, uop = [self.g.ops[i] for i in st.ops]
        dw = gop.outputs[0]
        if uop.type not in UPDATE_OPS:   # the check pass: no parameter advances
            self.chunk_off, self.chunk_rows = {}, 1
            try:
                body = [ln for op in (gop, *mids, uop) for ln in self.calls_of(op)]
            finally:
                self.chunk_off, self.chunk_rows = {}, None
            return ["{ int32_t o;", f"  for (o = 0; o < {int(st.info['channels'])}; ++o) {{",
                    *["    " + ln for ln in body], "  }", "}"]
        channels = int(st.info["channels"])
        self.chunk_rows = 1  # the weight gradient's C computes output channel o (conv_grad.c_conv2d_grad_weight)
        try:
            grad = self.calls_of(gop)
        finally:
            self.chunk_rows = None
        return ["{ int32_t o;", f"  for (o = 0; o < {channels}; ++o) {{",
                *["    " + ln for ln in grad + self.update_row(uop, dw, channels, mids)], "  }", "}"]

    def stream_hidden(self, st: Stream) -> list[str]:
        return hidden_stream.stream_hidden(self, st)

    def update_row(self, uop: Op, dw: str, channels: int, mids: Sequence[Op] = ()) -> list[str]:
        """The C of update `uop` for output channel `o` of its parameter, its gradient `dw` holding that channel;
        `mids`: element-wise ops on that channel of the gradient before the update (fp16-mixed's round / unscale)."""
        p = uop.inputs[0]
        rows, cols, n = self.trained_slice(p, dw)
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
            return [ln for op in mids for ln in self.calls_of(op)] + self.calls_of(uop)
        finally:
            self.chunk_off, self.chunk_rows = {}, None

    def stream_positions(self, st: Stream) -> list[str]:
        """mean_grad -> mask -> bias_grad / 1x1 conv2d_grad_input, one spatial position at a time (int8 weights:
        a block of channels of every position at a time, _stream_positions_blocks; the same buffers)."""
        mean, mask, *cons = [self.g.ops[i] for i in st.ops]
        g, t1, t2 = mean.inputs[0], mean.outputs[0], mask.outputs[0]
        n, h, w, c = self.g.tensors[t1].shape
        count = h * w
        if self._positions_by_channels(mask, cons, t1, t2, c, count):
            return self._stream_positions_blocks(mean, mask, cons, c, count)
        lines = ["{ int32_t p;"]
        for op in cons:
            if op.type == ops.BIAS_GRAD.name:
                lines.append(f"  memset({self.loc(op.outputs[0])}, 0, {c * 4});")
        # fp16-mixed: t1 / t2 may be fp16 (stages/train/fp16_mixed.fp16_written): their kernels' fp16 forms
        h1 = self.g.tensors[t1].dtype == "float16"
        if fp16_io.is_f16(self, g):   # an fp16 dy (OpDef.fp16_operands): the pointer-pair form
            grad = (f"tt_mean_hw_grad_positions_f16(1, {count}, {c}, {fp16_io.pair(self, g)}, "
                    f"{fp16_io.pair(self, t1, True)});")
        else:
            grad = (f"tt_mean_hw_grad_positions_f32{'_hy' if h1 else ''}(1, {count}, {c}, {self.loc(g)}, "
                    f"{self.loc(t1)});")
        loop = len(lines)   # where the position loop's block starts (declarations go before it)
        if self.same_place(t1, t2):   # the mask op writes over t1: its row is made again at every position
            lines += [f"  for (p = 0; p < {count}; ++p) {{", f"    {grad}"]
        else:   # the same row at every position: its quotients once
            lines += [f"  {grad}", f"  for (p = 0; p < {count}; ++p) {{"]
        y = mask.inputs[1]
        h2 = h1 or self.g.tensors[t2].dtype == "float16"
        if h2 and mask.type not in (ops.MASK_GRAD.name, ops.ACT_GRAD.name):
            raise CodegenError(f"positions stream: {mask.type} on an fp16 gradient")
        if mask.type == ops.MASK_GRAD.name and h2:
            lines.append(f"    tt_mask_grad_f16({c}, p * {c}, {self.loc(y)}, {fp16_io.pair(self, t1)}, "
                         f"{fp16_io.pair(self, t2, True)});")
        elif h2:   # act_grad: the forward output's position p, fp16 (the saved tensor itself) or fp32
            yp = (f"(const float *)0, {fp16_io.loc(self, y)} + p * {c}" if fp16_io.is_f16(self, y)
                  else f"{self.loc(y)} + p * {c}, (const uint16_t *)0")
            lines.append(f"    tt_act_grad_f16({c}, {ACT_ENUM[mask.attrs['act']]}, {fp16_io.pair(self, t1)}, {yp}, "
                         f"{fp16_io.pair(self, t2, True)});")
        else:
            lines.append("    " + self._position_mask_call(mask, str(c), self.loc(t1), f"p * {c}", self.loc(t2)))
        for op in cons:
            if op.type == ops.BIAS_GRAD.name:
                fn = "tt_bias_grad_acc_hy_f32" if self.g.tensors[t2].dtype == "float16" else "tt_bias_grad_acc_f32"
                lines.append(f"    {fn}(1, {c}, {self.loc(t2)}, {self.loc(op.outputs[0])});")
                continue
            ci = self.g.tensors[op.outputs[0]].shape[3]
            d = self.uid("tt_cd")
            self.globals.append(f"static const tt_conv_dims {d} = {{1, 1, 1, {ci}, 1, 1, {c}, 1, 1, 1, 1, 1, 1, 0, "
                                f"0, 1}};")
            io = {"d": f"&{d}", "dz": self.loc(t2), "dx": f"{self.loc(op.outputs[0])} + p * {ci}"}
            if conv_grad.reuses_weight_check(self, op):   # the kernel checks the weight at the first position only
                io["w_ok"] = self.uid("tt_gi_ok")
                lines.insert(loop, f"  int32_t {io['w_ok']} = -1;")
                loop += 1
            lines += ["    " + ln for ln in self.calls_of(op, io=io)]
        return lines + ["  }", "}"]

    def _position_mask_call(self, mask: Op, n: str, dy: str, at: str, dz: str) -> str:
        """The fp32 call of the positions stream's mask op over n gradient elements dy -> dz; `at`: the index of the
        first of them in the forward output (or its bit mask) the op reads."""
        y = self.loc(mask.inputs[1])
        if mask.type == ops.INT8_CLAMP_GRAD.name:
            return (f"tt_int8_clamp_grad_f32({n}, {int(mask.attrs['lo'])}, {int(mask.attrs['hi'])}, {dy}, "
                    f"{y} + {at}, {dz});")
        if mask.type == ops.ACT_GRAD.name:
            return f"tt_act_grad_f32({n}, {ACT_ENUM[mask.attrs['act']]}, {dy}, {y} + {at}, {dz});"
        return f"tt_mask_grad_f32({n}, {at}, {y}, {dy}, {dz});"

    def _positions_by_channels(self, mask: Op, cons: Sequence[Op], t1: str, t2: str, c: int, count: int) -> bool:
        """Whether the positions stream can run a block of channels of every position at a time: fp32 gradients,
        every input gradient reading an int8 weight (tt_conv2d_grad_input_qw_f32_oc) and room in the one-position
        buffers (c floats) for a block of count positions."""
        if c // count < 1 or any(self.g.tensors[t].dtype != "float32" for t in (t1, t2)):
            return False
        if mask.type not in (ops.INT8_CLAMP_GRAD.name, ops.ACT_GRAD.name, ops.MASK_GRAD.name):
            return False
        return all(op.type == ops.BIAS_GRAD.name or op.inputs[1] in self.fused for op in cons)

    def _stream_positions_blocks(self, mean: Op, mask: Op, cons: Sequence[Op], c: int, count: int) -> list[str]:
        """The positions stream a block of kb output channels at a time (kb = c // count: the block of every
        position fills the one-position buffer of t2): the mean gradient is the same row at every position, so
        t1 holds it once; per block, the mask and the bias gradient per position (each bias sum still adds the
        positions in order) and the input gradient of all positions over the block's channels (their sums carried
        in dx from block to block: the bits of the whole call). Each weight element is dequantized once per block
        of positions instead of once per position."""
        g, t1, t2 = mean.inputs[0], mean.outputs[0], mask.outputs[0]
        kb = c // count
        l1, l2 = self.loc(t1), self.loc(t2)
        lines = ["{ int32_t o, p;"]
        for op in cons:
            if op.type == ops.BIAS_GRAD.name:
                lines.append(f"  memset({self.loc(op.outputs[0])}, 0, {c * 4});")
        lines += [f"  tt_mean_hw_grad_positions_f32(1, {count}, {c}, {self.loc(g)}, {l1});",
                  f"  for (o = 0; o < {c}; o += {kb}) {{",
                  f"    const int32_t k = {c} - o < {kb} ? {c} - o : {kb};",
                  f"    for (p = 0; p < {count}; ++p) {{"]
        lines.append("      " + self._position_mask_call(mask, "k", f"{l1} + o", f"p * {c} + o", f"{l2} + p * k"))
        for op in cons:
            if op.type == ops.BIAS_GRAD.name:
                lines.append(f"      tt_bias_grad_acc_f32(1, k, {l2} + p * k, {self.loc(op.outputs[0])} + o);")
        lines.append("    }")
        for op in cons:
            if op.type == ops.BIAS_GRAD.name:
                continue
            wq = self.fused[op.inputs[1]]
            ci = self.g.tensors[op.outputs[0]].shape[3]
            sc, zp = self.dq_tables(wq, 0, self.g.tensors[wq].shape[0])
            whole, part, n = self.weight_args(wq)
            lines.append(f"    tt_conv2d_grad_input_qw_f32_oc({count}, {ci}, o, o + k, {l2}, {l1} + o, {whole}, "
                         f"{part}, {n}, {sc}, {zp}, {self.loc(op.outputs[0])});")
        return lines + ["  }", "}"]

    def trained_slice(self, p: str, gname: str) -> tuple[int, int, int]:
        """(rows, cols, n) of an update of parameter p with gradient gname: n trained channels of cols."""
        ps = self.g.tensors[p].shape
        cols = ps[-1] if ps else 1
        rows = numel(ps) // cols
        gs = self.g.tensors[gname].shape
        n = gs[-1] if gs else 1
        if p in self.split:
            return rows, n, n  # the compact slice: rows of n trained channels
        return rows, cols, n

# ---- the program ---------------------------------------------------------------------------------------------

def generate(tg: Graph, order: list[int], memplan_doc: dict[str, Any], out_dir: Path,
             kernels: str = "portable", stack_bytes: int | str = DEFAULT_STACK, wof_n_buffers: int | None = None,
             driver: bool = True) -> dict[str, Any]:
    """Write the program for training IR `tg` run in schedule `order` with memory plan `memplan_doc` (reorder's
    memplan.json) into `out_dir`; returns codegen.json's content. `wof_n_buffers`: the original model file's
    tensor count (the .wof header's; default one past the highest original index the graph knows). `driver`:
    also write the emulate-run firmware's tt_driver.c (the exported library has none)."""
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
    captures = head_captures(gen, loss_heads) if loss_heads else {}
    for i in order:
        op = tg.ops[i]
        if i in stream_of:
            if i != stream_of[i].ops[0]:
                continue
            lines = gen.emit_stream(stream_of[i])
        else:
            lines = gen.emit(op)
        if i < n_fwd and op.type != ops.CLAMP_MASK.name:  # inference needs no gradient masks
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
            rname = op.inputs[-1]
            r = gen.loc(rname)
            if rname not in {s["name"] for s in gen.state}:  # the PRNG stream is state a checkpoint keeps
                gen.state.append({"name": rname, "expr": r, "nbytes": 4, "dtype": "uint32", "role": "prng"})
            else:
                next(s for s in gen.state if s["name"] == rname)["role"] = "prng"
            stream = int(op.attrs["stream"])
            prng_inits.append(f"{{ uint32_t x = tt_cfg.seed + {stream}u * 0x6D2B79F5u; "
                              f"if (x == 0u) {{ x = 0x9E3779B9u; }} memcpy({r}, &x, 4); }}")
    for t in trained:
        gen.loc(t["name"])
    head = meta["prediction"]
    stream = stream_parts(gen, tg)  # a stateful model's per-frame API (None otherwise)
    api = api_parts(gen, x_name, lab, head, meta, trained, wof_n_buffers, regression, n_prof, loss_heads)
    api.stream = stream
    text = program(gen, fwd_lines, sample_lines, step_lines, prng_inits, api, n_prof)
    arena_end = max((int(b["offset"]) + int(b["size"]) for b in gen.plan["buffers"] if int(b["size"])), default=0)
    (out_dir / "tt_model.c").write_text(text)
    (out_dir / "tt_model.h").write_text(model_header(api))
    if driver:
        (out_dir / "tt_driver.c").write_text(driver_source(-(-arena_end // 4) * 4, api.loss_task))
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
          "precision": meta.get("precision", "float32"),
          "loss_scale": meta.get("loss_scale"),
          "weights_bytes": off,
          "checkpoint": {"bytes": CKPT_HEADER + api.state_bytes() + 4, "version": CKPT_VERSION,
                         "model_id": api.model_id(), "tensors": api.state_layout()},
          "wof": {"n_buffers": api.wof_n_buffers, "bytes": api.wof_layout()[1]}}
    if stream is not None:
        io["stream"] = stream.layout()
    if regression:  # classification layouts keep their bytes; regression says what the streams must carry
        io.update(loss="mse", num_targets=numel(h_t.shape))
    elif loss_heads:  # the heads' targets back to back in each record (stages/train/losses.py)
        io.update(loss=meta["loss"], num_targets=numel(tg.tensors[lab].shape),
                  heads=[{"output": h["output"], "loss": h["loss"], "weight": h["weight"],
                          "shape": list(tg.tensors[h["tensor"]].shape)} for h in loss_heads])
    (out_dir / "io_layout.json").write_text(json.dumps(io, indent=1) + "\n")
    summary = {"lines": text.count("\n"), "kernel_calls": gen.calls, "arena_bytes": gen.arena,
               "const_bytes": gen.const_bytes, "ops": len(order), "trained_tensors": len(trained),
               "split_weights": sorted(gen.split), "fused_dequantize": len(gen.fused),
               "sram_outside_arena_bytes": gen.static_bytes, "stack_bytes": stack_bytes}
    if stream is not None:
        summary["stream"] = stream.layout()
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
