"""The shape of an op's definition in the registry (stages/ops/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

KINDS = ("forward", "backward", "loss", "update", "aux")


class Builtin(NamedTuple):
    """One way a .tflite file spells the op: a BuiltinOperator member name (or, with custom=True, a custom code)
    and the operand counts the reader accepts (outputs 0: any number, as SPLIT's)."""

    code: str
    min_inputs: int
    max_inputs: int
    outputs: int = 1
    custom: bool = False


def _dtype(graph, name) -> str | None:
    return None if name is None else graph.tensors[name].dtype


def input_dtype(graph, op) -> str | None:
    """The dtype of the op's first input (what TFLite's op versions mostly depend on)."""
    return _dtype(graph, op.inputs[0]) if op.inputs else None


def output_dtype(graph, op) -> str | None:
    return _dtype(graph, op.outputs[0])


def version_by_dtype(table: dict[str, int], of=input_dtype) -> Callable:
    """An op version rule (OpDef.version) that depends on one operand's dtype only; 1 for any other."""
    return lambda graph, op: table.get(of(graph, op), 1)


@dataclass(frozen=True)
class OpDef:
    """What the pipeline knows about one IR op type. Traits default to "no"."""

    name: str
    kind: str = "forward"
    # IR signature for the catalogue: "x, w[O,KH,KW,I], b? -> y" and its attrs.
    signature: str = ""
    attrs: tuple[str, ...] = ()
    note: str = ""
    # .tflite spellings; the first builtin (non-custom) one is what the writer writes.
    tflite: tuple[Builtin, ...] = ()
    # the file's operand index of each IR operand, when a .tflite orders them otherwise (the reader reorders, the
    # writer back; an operand past the file's count is absent). None: the same order
    file_operands: tuple[int, ...] | None = None
    bias_required: bool = False    # a .tflite must hold its bias operand: the writer adds a zero one if the IR has none
    # (c) -> attrs: the builtin options of a .tflite operator as IR attrs (c: the reader's _OpCtx: c.options(cls,
    # type), c.err(message), c.ins / c.outs); None: the reader's own parser table, or no attrs
    read_options: Callable | None = None
    # (builder, op) -> (BuiltinOptions union type, table offset): the writer's options; None: the writer's own table
    write_options: Callable | None = None
    # (graph, op) -> the op version TFLite's converter writes (tensorflow/lite/tools/versioning/op_version.cc) for
    # the cases our vocabulary produces; runtimes refuse versions they lack. None: 1.
    version: Callable | None = None
    # -- forward traits
    layer: bool = False            # weights at operand 1, optional bias at 2 (reader's weight/bias roles; ptq
    #                                quantizes the weights per output channel, the bias to int32)
    frozen_only: bool = False      # a layer whose parameters never train (the gradient flows through it)
    bn_fold: bool = False          # a BatchNorm MUL/ADD after it folds into its weights and bias
    # the step of a BatchNorm's per-channel affine it is, folded into a bn_fold layer before it (model/bn_fold.py):
    # "scale" (y * m: weights and bias times m), "shift" (y + a: bias + a), "unshift" (y - a only: bias - a)
    bn_affine: str | None = None
    # sparse-plan's fast float variant of its numpy kernel (golden/fast_float.py's table): "conv" (im2col + one
    # product), "depthwise", "fc", "pointwise_grad_input" / "pointwise_grad_weight" (a 1x1 stride-1 conv
    # gradient as one 2-D product)
    fast_float: str | None = None
    out_channel_axis: int = 0      # weights' output-channel axis (layers)
    int8: bool = True              # ptq quantizes it (forward ops)
    conversion: bool = False       # converts between float and int8 (no arithmetic of its own to quantize or
    #                                differentiate: a training graph keeps it, the dequantized graph drops it)
    unpacks_constants: bool = False   # a file may store constant weights compressed (float16 / int8) behind it:
    #                                the reader gives the constant its reader's role, ptq folds it to float32
    differentiable: bool = False   # autodiff emits its backward
    clamp_masked: bool = False     # its int8 output is requantized and clamped: int8_clamp_grad masks its gradient
    op_clamp: tuple[float, float | None] | None = None   # a standalone clamp (relu, relu6): (lo, hi) in real units
    shared_qparams: str | None = None    # int8 output shares the input's params: "first" input, or "all" inputs
    fixed_output: tuple[float, int] | None = None        # int8 output (scale, zero point) the kernels hard-code
    const_operands_per_tensor: bool = False   # a constant operand is quantized per tensor, like an activation
    # how the reorder stage may run it in a row stream (stages/planning/streams.py): "conv" (an output row reads a window of
    # input rows; its C takes a row view of its dims struct, io=), "pool" (a window, run unpadded on a row view),
    # "local" (output row r reads row r of each streamed input only: element-wise, activations, W/C padding)
    row_stream: str | None = None
    macs: Callable | None = None   # (graph, op) -> multiply-accumulates, for load's summary
    # -- memory traits (memplan): None, "any" (the output may take over any dying input), "first" (only the
    # first input), "channel" (the first input, computed one channel at a time through a scratch channel)
    in_place: str | None = None
    # (bb, op, i, dz) -> None: emits the op's backward through a BackwardBuilder (stages/ops/backward.py); None:
    # autodiff's own branch still does (ops not yet moved)
    backward: Callable | None = None
    # (ctx) -> [outputs]: the numpy reference kernel, float and int8 (ctx: executor._Ctx); every forward op has one
    forward: Callable | None = None
    # (op, v, shape, tensor) -> [outputs]: the numpy kernel of a backward / loss / mask / accumulation op (the
    # training executor's; v(j) the value of input j, shape(t) a tensor's shape, tensor(t) the tensor); ops of the
    # step phase (updates, step_counter) take a fifth argument hp(key) -> their runtime hyper-parameter; ops that
    # keep state change it in place and return []
    run: Callable | None = None
    # the operand at which its C kernel can read a weight split into its trained slice (arena) and its frozen rest
    # (flash), codegen's split weights; forward ops: their int8 kernel only. None: it reads the weight whole
    split_weight: int | None = None
    # (gen, op) -> C statements of the op's kernel call (gen: codegen's generator); None: codegen's op_<type>
    c: Callable | None = None
    # -- training-op traits
    of: str | None = None          # backward ops: the forward op they differentiate
    masks_gradient: bool = False   # dz = dy masked by the forward output (or its bit mask)
    broadcasts: bool = False       # its output is its input broadcast (mean_grad): streamable position by position
    channel_stream: bool = False   # a weight gradient the reorder stage may compute one output channel at a time
    # its role in a hidden-channel stream (stages/planning/channel_stream.py: a backward chain run one hidden
    # channel at a time): "mix" (a 1x1 input gradient: channel c of its output, or its sum over c), "channel"
    # (output channel c reads input channel c only), "mask" (dz = dy masked by a saved bit mask / int8 output),
    # "sum" (a per-channel reduction: bias gradient), "weight" (a 1x1 weight gradient: its output channel c)
    hidden_role: str | None = None
    grad_input: bool = False       # an input gradient reading the weights as operand 1 (fused int8 dequantize)
    # fp16-mixed (issue 13): the operands at which its C kernel reads an fp16 tensor itself, widening each element in
    # a register where it uses it (`_hx_` / `_hy_` / `_f16` kernels), so a cast_f16_f32 read only there is fused
    # into it (stages/planning/fp16_memory.fused_widen) and the saved fp16 activation gets no fp32 copy; "all":
    # every operand (a variadic op). Asked through ops.reads_fp16.
    fp16_operands: tuple[int, ...] | str = ()
    # fp16-mixed: its C kernel can write its float result as fp16 itself (fp32 arithmetic, one rounding per element on
    # store: the bits of its fp32 kernel followed by round_f16), so stages/train/fp16_mixed.py stores the result as
    # fp16 where every reader reads fp16 at that operand (fp16_operands) and no fp32 copy of it ever exists
    fp16_output: bool = False
    fused_input: bool = False      # a weight gradient that dequantizes a per-tensor int8 input (operand 1) as it
    #                                reads it (memplan.fused_input_dequantize: no fp32 copy of the saved input)
    optimizer: str | None = None   # update ops: the optimizer kind
    qas: bool = False              # update ops: of an int8 / int32 parameter (stages/quant/qas.py)
    eager: bool = False            # the schedule runs it as soon as it can (updates, accumulation)
    loss: str | None = None        # loss ops: the spec loss name it implements (train.loss, train.outputs)
    dropped_by: str | None = None  # an inference-only activation ending a head: the spec loss (on logits) before
    #                                which the training forward drops it (its output would be probabilities)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.in_place not in (None, "any", "first", "channel"):
            raise ValueError(f"op {self.name!r}: in_place {self.in_place!r}")

    @property
    def trainable(self) -> bool:
        """A layer whose bias / weights a plan may train."""
        return self.layer and not self.frozen_only

    @property
    def builtin(self) -> Builtin | None:
        """The builtin the writer writes."""
        return next((b for b in self.tflite if not b.custom), None)
