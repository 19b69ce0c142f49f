"""Stateful streaming models: resource variables read from the file, and the sequence semantics of running them.

A streaming model (microWakeWord's keyword spotters, any converter output of a tf.Variable-based streaming layer)
is one invocation per chunk of input frames; between invocations it keeps ring buffers of past activations in
resource variables. In the .tflite file:
  - subgraph #0 starts with CALL_ONCE(init subgraph), then VAR_HANDLE per variable (a resource handle named by
    container + shared_name), READ_VARIABLE(handle) -> the value at the start of this invocation, and
    ASSIGN_VARIABLE(handle, value) -> the value for the next invocation;
  - the init subgraph (run once, at the first invocation) holds VAR_HANDLE + ASSIGN_VARIABLE(handle, constant):
    each variable's initial value (zeros in every converter output we have seen; any constant is read).

The IR has no resource ops. At load the init subgraph is interpreted (each variable gets its initial value) and
each variable becomes a pair of ordinary tensors:
  - `read`: the READ_VARIABLE output, an extra graph input after the model's own inputs;
  - `assign`: the tensor ASSIGN_VARIABLE stores (produced by the graph; not a graph output).
graph.meta["state"] lists the variables in graph-input order ({"variable", "read", "assign", "init"}; `init`
is {"fill": v} for a uniform value, else the flat list of values). A variable that is read but never assigned
keeps its initial value; one assigned but never read is dropped (nothing sees it).

Semantics (what LiteRT and TFLite Micro do when a model is invoked T times): invocation t reads the values the
invocation t-1 assigned (the initial values at t = 0). An ASSIGN_VARIABLE copies bytes: the stored value keeps the
assigned tensor's bytes whatever its quantization, and the next READ reinterprets them with the read tensor's.
This module's `run_sequence` is that loop on the numpy executor.

Training (the choice made here): a sample is a sequence of T = model.sequence_length invocations, [T, *input
shape], run from the initial state (the state is reset per sample); the label applies to the output of the last
invocation. load unrolls the graph over the T invocations (`unroll`): one stateless program whose state tensors are
activations between the copies, so the later stages (quantize, the plan, autodiff, codegen, the firmware) need no
notion of state, and the emitted C keeps the state in the arena between invocations, planned by the memory plan
like any activation; the first invocation reads the initial values (constants), so every sample starts afresh. Gradients do not flow into the
state (truncated backprop): the parameters of the layers that feed the state are shared by every invocation, and
the train plan keeps them frozen, so the trainable layers are those after the last state read (microWakeWord: the
final FULLY_CONNECTED); `scheme: auto` picks among those. The cost: the program holds T copies of the ops that feed
the state (code and per-op tables in flash grow with T; the weights are not copied).

Inference (the library a product links): one invocation per call, as TFLite Micro runs the original file.
unroll records the one-invocation program in meta["unrolled"]["step"] (`step_program`: the original ops, tensor
descriptors, small constants, the variables); `step_graph` rebuilds it over the training graph's tensors, so its
weights are the trained ones, and stages/c_emit/stream.py emits it as tt_stream_step with each variable in a static
SRAM buffer between calls (tt_stream_reset: the initial values).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from tflite.BuiltinOperator import BuiltinOperator as BO

from tinytrain.stages.model.ir import Graph
from tinytrain.stages.ops import STRIDED_SLICE

STATE_CODES = {BO.CALL_ONCE: "CALL_ONCE", BO.VAR_HANDLE: "VAR_HANDLE", BO.READ_VARIABLE: "READ_VARIABLE",
               BO.ASSIGN_VARIABLE: "ASSIGN_VARIABLE"}
# What an init subgraph may contain: handles and assignments of constants.
_INIT_CODES = {BO.VAR_HANDLE, BO.ASSIGN_VARIABLE}


def is_state_code(code: int) -> bool:
    return code in STATE_CODES


@dataclass
class StateVar:
    variable: str              # container/shared_name as the file names it
    read: str                  # IR tensor: the value at the start of an invocation (a graph input)
    assign: str | None         # IR tensor: the value for the next invocation (None: never assigned)
    init: np.ndarray           # initial value, shaped and typed as `read`

    def to_json(self) -> dict[str, Any]:
        flat = self.init.reshape(-1)
        init: Any = {"fill": flat[0].item()} if flat.size and (flat == flat[0]).all() else flat.tolist()
        return {"variable": self.variable, "read": self.read, "assign": self.assign, "init": init}


def variables(graph: Graph) -> list[StateVar]:
    """The graph's state variables (empty for a stateless graph), in graph-input order."""
    out = []
    for d in graph.meta.get("state", []):
        t = graph.tensors[d["read"]]
        init = d["init"]
        arr = (np.full(t.shape, init["fill"], dtype=t.dtype) if isinstance(init, dict)
               else np.asarray(init, dtype=t.dtype).reshape(t.shape))
        out.append(StateVar(variable=d["variable"], read=d["read"], assign=d.get("assign"), init=arr))
    return out


def model_inputs(graph: Graph) -> list[str]:
    """The graph inputs that are the model's own (not state reads)."""
    reads = {v["read"] for v in graph.meta.get("state", [])}
    return [n for n in graph.inputs if n not in reads]


def assigned(graph: Graph) -> list[str]:
    """The tensors the state assignments store: a pruned graph must keep computing them."""
    return [v["assign"] for v in graph.meta.get("state", []) if v.get("assign")]


def prune_meta(meta: dict[str, Any], inputs: list[str]) -> dict[str, Any]:
    """meta without the variables whose read is no longer a graph input (nothing the pruned graph computes
    reads them)."""
    if "state" in meta:
        meta["state"] = [v for v in meta["state"] if v["read"] in inputs]
        if not meta["state"]:
            del meta["state"]
    return meta


def for_training(graph: Graph, sequence_length: int | None, where: str) -> Graph:
    """load's graph for the later stages: a stateful graph unrolled over model.sequence_length invocations (a
    stateless graph is returned as it is). Without the length the stateful graph is kept (refuse_training stops
    it, with the hint)."""
    from tinytrain.pipeline.errors import ModelError

    if not graph.meta.get("state"):
        if sequence_length is not None:
            raise ModelError(f"{where}: model.sequence_length is set but the model has no state variables (it is "
                             f"not a stateful streaming model)", hint="remove model.sequence_length")
        return graph
    # The file's name, for refusals of later stages that see only the graph (quantize: a stateful int8 model has
    # no float copy to train).
    graph.meta["file"] = Path(where).name
    if sequence_length is None:
        return graph
    try:
        return unroll(graph, sequence_length)
    except ValueError as e:
        raise ModelError(f"{where}: cannot unroll the stateful model: {e}") from None


def summary(graph: Graph) -> str:
    """load's summary-line part for a stateful model: what was unrolled and what stays frozen ("" if stateless)."""
    u = graph.meta.get("unrolled")
    if u:
        frozen = sum(graph.tensors[n].role == "weight" for n in u["shared_parameters"] if n in graph.tensors)
        return (f"; stateful: {len(u['variables'])} state variables, unrolled over {u['steps']} invocations per "
                f"sample ({frozen} layer(s) feed the state and stay frozen)")
    if graph.meta.get("state"):
        return f"; stateful: {len(graph.meta['state'])} state variables (set model.sequence_length to train)"
    return ""


def check_sequence_samples(graph: Graph, sample_shape: tuple[int, ...], where: str) -> None:
    """For a graph load unrolled: samples must be sequences [T, *one invocation's input] (one line if not)."""
    u = graph.meta.get("unrolled")
    if not u:
        return
    want = [int(d) for d in graph.tensors[graph.inputs[0]].shape[1:]]
    got = [int(d) for d in sample_shape]
    if got != want:
        from tinytrain.pipeline.errors import UserError

        frame = want[1:]
        hint = (f"set model.sequence_length: {got[0]}" if got[1:] == frame and got else
                f"reshape x to [N, {u['steps']}, {', '.join(map(str, frame))}]")
        raise UserError(f"{where}: samples of a stateful model are sequences of model.sequence_length "
                        f"({u['steps']}) invocations, each {frame}: expected {want}, got {got}", hint=hint)


def refuse_training(graph: Graph, stage: str) -> None:
    """Stages that take one input per sample stop a stateful graph that load did not unroll, with the hint."""
    svars = graph.meta.get("state")
    if svars:
        from tinytrain.pipeline.errors import ModelError

        names = ", ".join(repr(v["variable"]) for v in svars[:3]) + (", ..." if len(svars) > 3 else "")
        raise ModelError(f"stateful streaming model ({len(svars)} state variables: {names}): {stage} needs each "
                         f"training sample as a sequence of invocations",
                         hint="set model.sequence_length: the invocations per sample (data samples are then "
                              "[sequence_length, *input shape]; the label applies to the last invocation)")


def initial_state(graph: Graph, n: int) -> dict[str, np.ndarray]:
    """Each read tensor's initial value for a batch of n independent sequences."""
    return {v.read: np.broadcast_to(v.init, [n] + list(v.init.shape[1:])).copy() for v in variables(graph)}


def run_sequence(graph: Graph, x: np.ndarray, run: Callable[..., dict[str, np.ndarray]] | None = None,
                 **run_kwargs: Any) -> list[dict[str, np.ndarray]]:
    """Run a stateful graph over sequences: x is [N, T, *input shape without its batch dim]; each of the N
    sequences starts from the initial state. Returns, per step, the graph outputs ([N, ...] each).
    `run(graph, feeds, keep_intermediates=True, **run_kwargs)` is the executor (default: the numpy golden one)."""
    if run is None:
        from tinytrain.stages.golden.forward import run_graph as run
    own = model_inputs(graph)
    if len(own) != 1:
        raise ValueError(f"a sequence feeds one model input, the graph has {len(own)}: {own}")
    n, steps = x.shape[0], x.shape[1]
    state = initial_state(graph, n)
    svars = variables(graph)
    results = []
    for t in range(steps):
        values = run(graph, {own[0]: x[:, t], **state}, keep_intermediates=True, **run_kwargs)
        results.append({k: values[k] for k in graph.outputs})
        state = {v.read: _as_read(graph, v, values[v.assign]) if v.assign else state[v.read] for v in svars}
    return results


def _as_read(graph: Graph, v: StateVar, value: np.ndarray) -> np.ndarray:
    """The assigned bytes, seen through the read tensor's type (ASSIGN_VARIABLE copies bytes)."""
    want = np.dtype(graph.tensors[v.read].dtype)
    value = np.ascontiguousarray(value)
    return value if value.dtype == want else value.view(want)


# ---- unrolling: a training sample is a sequence ------------------------------------------------------

def unroll(graph: Graph, steps: int) -> Graph:
    """The stateless graph of `steps` invocations from the initial state: its one input is the sequence
    [batch, steps, *input dims] (invocation t reads x[:, t] through a STRIDED_SLICE that drops the step axis), its
    outputs those of the last invocation. Invocation t's reads are invocation t-1's assigned tensors (constants
    holding the initial values at t = 0), so the state lives in the arena between invocations like any activation
    and every sample starts from the initial state. Constants (weights) are shared by the copies, not duplicated;
    ops of earlier invocations that the last one does not need (their heads) are dropped.

    Training on the result trains the last invocation's layers after the state (the gradient does not flow into
    the state): meta["unrolled"]["shared_parameters"] lists the constants earlier invocations read too, and the
    train plan (train_plan.TrainPlan.trainable_ops) keeps their layers frozen."""
    from tinytrain.stages.model.ir import Op, Tensor
    from tinytrain.stages.model.prune import needed_ops

    if steps < 1:
        raise ValueError(f"a sequence has at least one invocation, got {steps}")
    svars = variables(graph)
    own = model_inputs(graph)
    if len(own) != 1:
        raise ValueError(f"unrolling needs one model input besides the state, the graph has {len(own)}: {own}")
    x = graph.tensors[own[0]]
    if not x.shape or x.shape[0] != 1 or len(x.shape) > 3:
        raise ValueError(f"unrolling needs an input [1, ...] of rank <= 3 (the sequence adds an axis), "
                         f"got {x.shape}")
    # Copies of the Tensor records (the arrays are shared, read-only here): the unrolled graph is a graph of its own.
    tensors: dict[str, Tensor] = {n: copy.copy(t) for n, t in graph.tensors.items() if t.is_constant}
    seq_name = _fresh(f"{x.name}/sequence", graph.tensors)
    tensors[seq_name] = Tensor(name=seq_name, shape=[1, steps] + list(x.shape[1:]), dtype=x.dtype, role="input",
                               quant=x.quant)
    reads: dict[str, str] = {}
    for v in svars:
        t = graph.tensors[v.read]
        name = _fresh(f"{v.read}/initial", graph.tensors)
        tensors[name] = Tensor(name=name, shape=list(t.shape), dtype=t.dtype, role="constant", quant=t.quant,
                               data=v.init.copy())
        reads[v.read] = name
    rank = len(x.shape) + 1
    ops: list[Op] = []
    op_step: list[int] = []  # the invocation of each op
    for step in range(steps):
        suffix = "" if step == steps - 1 else f"@{step}"
        rename = dict(reads)
        xs = f"{x.name}{suffix}" if suffix else x.name
        tensors[xs] = Tensor(name=xs, shape=list(x.shape), dtype=x.dtype, quant=x.quant)
        operands = []
        for what, values in (("begin", [0, step] + [0] * (rank - 2)),
                             ("end", [1, step + 1] + list(x.shape[1:])), ("strides", [1] * rank)):
            name = _fresh(f"{seq_name}/{what}{step}", tensors)
            tensors[name] = Tensor(name=name, shape=[rank], dtype="int32", role="constant",
                                   data=np.asarray(values, dtype=np.int32))
            operands.append(name)
        op_step.append(step)
        ops.append(Op(STRIDED_SLICE.name, [seq_name] + operands, [xs],
                      {"starts": [0, step] + [0] * (rank - 2), "stops": [1, step + 1] + list(x.shape[1:]),
                       "strides": [1] * rank, "begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0,
                       "new_axis_mask": 0, "shrink_axis_mask": 2, "offset": False}))
        rename[x.name] = xs
        for op in graph.ops:
            outs = []
            for o in op.outputs:
                name = f"{o}{suffix}"
                t = graph.tensors[o]
                tensors[name] = Tensor(name=name, shape=list(t.shape), dtype=t.dtype, quant=t.quant,
                                       source_index=t.source_index if not suffix else None)
                rename[o] = name
                outs.append(name)
            op_step.append(step)
            ops.append(Op(op.type, [None if i is None else rename.get(i, i) for i in op.inputs], outs,
                          dict(op.attrs), source_index=op.source_index))
        reads = {v.read: _as_read_tensor(tensors, rename[v.assign], graph.tensors[v.read], ops) if v.assign
                 else reads[v.read] for v in svars}
    outputs = list(graph.outputs)
    keep = needed_ops([(op.inputs, op.outputs) for op in ops], outputs)
    op_step = [s for i, s in enumerate(op_step) if i in keep]
    ops = [op for i, op in enumerate(ops) if i in keep]
    used = {n for op in ops for n in (*op.inputs, *op.outputs) if n is not None} | set(outputs) | {seq_name}
    for name in outputs:
        tensors[name].role = "output"
    meta = {k: v for k, v in graph.meta.items() if k != "state"}
    # Constants that earlier invocations read too: their layers feed the state and must not train.
    read_by = [{n for op, s in zip(ops, op_step) if (s == steps - 1) == last for n in op.inputs if n is not None}
               for last in (False, True)]
    shared = sorted(n for n in read_by[0] & read_by[1] if tensors[n].is_constant)
    meta["unrolled"] = {"steps": steps, "input": x.name, "variables": [v.variable for v in svars],
                        "shared_parameters": shared, "step": step_program(graph)}
    out = Graph(tensors={n: t for n, t in tensors.items() if n in used}, ops=ops, inputs=[seq_name],
                outputs=outputs, meta=meta)
    out.validate()
    return out


# Constants of the one-invocation program kept in meta when the unrolled graph may not hold them (index arrays of
# the state's ring-buffer slices and reshapes); larger ones (weights) must be in the training graph.
STEP_CONSTANT_LIMIT = 1024


def step_program(graph: Graph) -> dict[str, Any]:
    """One invocation of the stateful graph, for the per-frame C API (stages/c_emit/stream.py): its ops with the
    original tensor names (the unrolled graph's last invocation keeps them; the reads are `read`, the model input
    `input`), the descriptors of its non-constant tensors, its small constants with their data, its outputs and its
    state variables (meta["state"]: read, assign, initial value). The training graph holds the weights by the same
    names, trained ones included, so the per-frame program reads the trained values."""
    const = {n: t for n, t in graph.tensors.items() if t.is_constant}
    used = {n for op in graph.ops for n in (*op.inputs, *op.outputs) if n is not None} | set(graph.inputs)
    enc = {k: v for k, v in graph.meta.get("output_uint8", {}).items() if k in graph.outputs}
    return {"input": model_inputs(graph)[0], "outputs": list(graph.outputs), "state": copy.deepcopy(graph.meta["state"]),
            "output_uint8": copy.deepcopy(enc),
            "ops": [op.to_json() for op in graph.ops],
            "tensors": [graph.tensors[n].to_json() for n in sorted(used) if n not in const],
            "constants": [{**const[n].to_json(), "data": np.asarray(const[n].data).reshape(-1).tolist()}
                          for n in sorted(used & set(const)) if const[n].data.size <= STEP_CONSTANT_LIMIT]}


def step_graph(trained: Graph) -> Graph | None:
    """The one-invocation program of an unrolled stateful model (meta["unrolled"]["step"], step_program) over the
    tensors of `trained` (autodiff's training graph, or any graph unroll made): the weights by name, so a trained
    weight is read where training writes it. Its inputs are the model input then the state reads; meta["state"]
    the variables. None for a graph that is not an unrolled stateful one; ValueError with the reason when the
    training graph no longer matches the step (a weight the training program dropped, a tensor retyped)."""
    from tinytrain.stages.model.ir import Op, QuantParams, Tensor

    step = trained.meta.get("unrolled", {}).get("step")
    if step is None:
        return None

    def tensor(d: dict[str, Any], data: Any = None) -> Tensor:
        return Tensor(name=d["name"], shape=list(d["shape"]), dtype=d["dtype"], role=d["role"],
                      quant=QuantParams.from_json(d["quant"]) if d["quant"] else None, source_index=d["source_index"],
                      data=None if data is None else np.asarray(data, dtype=d["dtype"]).reshape(d["shape"]))

    tensors = dict(trained.tensors)
    for d in step["tensors"]:
        t, have = tensor(d), tensors.get(d["name"])
        if have is None:
            tensors[t.name] = t
        elif have.is_constant or list(have.shape) != t.shape or have.dtype != t.dtype or (
                (have.quant is None) != (t.quant is None)) or (
                t.quant is not None and (list(have.quant.scale), list(have.quant.zero_point))
                != (list(t.quant.scale), list(t.quant.zero_point))):
            raise ValueError(f"tensor {t.name!r} of one invocation is {t.short_type()}, the training program's "
                             f"is {have.short_type()} (the model was converted after unrolling)")
    for d in step["constants"]:
        tensors.setdefault(d["name"], tensor(d, d["data"]))
    ops = [Op(type=o["type"], inputs=list(o["inputs"]), outputs=list(o["outputs"]), attrs=dict(o["attrs"]),
              source_index=o["source_index"]) for o in step["ops"]]
    missing = sorted({n for op in ops for n in op.inputs if n is not None and n not in tensors})
    if missing:
        raise ValueError(f"the training program no longer holds {', '.join(map(repr, missing[:3]))} that one "
                         f"invocation reads (model.sequence_length 1 keeps no earlier invocation that reads them)")
    reads = [v["read"] for v in step["state"]]
    g = Graph(tensors=tensors, ops=ops, inputs=[step["input"]] + reads, outputs=list(step["outputs"]),
              meta={"state": copy.deepcopy(step["state"]), "output_uint8": copy.deepcopy(step.get("output_uint8", {}))})
    used = {n for op in ops for n in (*op.inputs, *op.outputs) if n is not None} | set(g.inputs) | set(g.outputs)
    g.tensors = {n: t for n, t in tensors.items() if n in used}
    g.validate()
    return g


def _as_read_tensor(tensors: dict, assigned: str, read: Any, ops: list) -> str:
    """The next invocation's read: the assigned tensor itself when its type and quantization are the read's (every
    converter output we have seen); else a byte reinterpretation is not something the IR has: refuse."""
    a = tensors[assigned]
    if a.dtype != read.dtype or (a.quant is None) != (read.quant is None) or (
            a.quant is not None and (a.quant.scale, a.quant.zero_point) != (read.quant.scale, read.quant.zero_point)):
        raise ValueError(f"state {read.name!r} is assigned {assigned!r} of another type or quantization "
                         f"({a.dtype}, {a.quant}) than it is read with ({read.dtype}, {read.quant})")
    return assigned


def _fresh(name: str, taken: dict) -> str:
    while name in taken:
        name += "_"
    return name


# ---- reading the file ------------------------------------------------------------------------------

class Scan:
    """The resource-variable structure of a model file, read with the tflite reader's accessors (`reader` is the
    tflite_reader._Reader; `codes` its (builtin code, custom code) per opcode index)."""

    def __init__(self, reader: Any, codes: list[tuple[int, str]]):
        self.reader, self.codes = reader, codes
        self.model = reader.model

    def _code(self, op: Any) -> int:
        k = op.OpcodeIndex()
        if k >= len(self.codes):
            raise self.reader.err(f"corrupt file: an operator uses opcode index {k} of {len(self.codes)}")
        return self.codes[k][0]

    def init_subgraphs(self) -> set[int]:
        """Subgraphs that subgraph #0's CALL_ONCE ops run."""
        import tflite

        sg = self.model.Subgraphs(0)
        out = set()
        for idx in range(self.reader.length(sg.OperatorsLength(), "operator table")):
            op = sg.Operators(idx)
            if self._code(op) == BO.CALL_ONCE:
                o = tflite.CallOnceOptions()
                table = op.BuiltinOptions()
                if table is None:
                    raise self.reader.err(f"operator {idx} (CALL_ONCE) has no options")
                o.Init(table.Bytes, table.Pos)
                out.add(int(o.InitSubgraphIndex()))
        return out

    def main_state_ops(self) -> tuple[set[int], list[int]]:
        """Subgraph #0's resource-variable op indices, and the tensors its ASSIGN_VARIABLE ops store."""
        sg = self.model.Subgraphs(0)
        idx, stored = set(), []
        for i in range(self.reader.length(sg.OperatorsLength(), "operator table")):
            op = sg.Operators(i)
            code = self._code(op)
            if code in STATE_CODES:
                idx.add(i)
                ins = _ints(op.InputsAsNumpy())
                if code == BO.ASSIGN_VARIABLE and len(ins) == 2:
                    stored.append(ins[1])
        return idx, stored

    def problems(self, n_subgraphs: int) -> list[str]:
        """Why the extra subgraphs are not all variable initialisers (empty: they are, the model can be read)."""
        inits = self.init_subgraphs()
        found = []
        for i in range(1, n_subgraphs):
            sg = self.model.Subgraphs(i)
            if i not in inits:
                found.append(f"subgraph #{i} is not run by CALL_ONCE (control flow or a second signature)")
                continue
            others = sorted({STATE_CODES.get(c, _code_name(c)) for c in
                             (self._code(sg.Operators(j))
                              for j in range(self.reader.length(sg.OperatorsLength(), "operator table")))
                             if c not in _INIT_CODES})
            if others:
                found.append(f"init subgraph #{i} computes ({', '.join(others)}); only assigning constants "
                             f"to variables is supported")
        for i in sorted(inits):
            if not 0 < i < n_subgraphs:
                found.append(f"CALL_ONCE runs subgraph #{i}, which does not exist")
        return found

    def handles(self, sg: Any, ops: list[tuple[int, Any]]) -> dict[int, str]:
        """Resource tensor index -> variable name, for the VAR_HANDLE ops of one subgraph."""
        import tflite

        out = {}
        for idx, op in ops:
            if self._code(op) != BO.VAR_HANDLE:
                continue
            o = tflite.VarHandleOptions()
            table = op.BuiltinOptions()
            if table is not None:
                o.Init(table.Bytes, table.Pos)
            container = _text(o.Container()) if table is not None else ""
            shared = _text(o.SharedName()) if table is not None else ""
            outs = _ints(op.OutputsAsNumpy())
            if len(outs) != 1:
                raise self.reader.err(f"operator {idx} (VAR_HANDLE) has {len(outs)} outputs, expected 1")
            out[outs[0]] = f"{container}/{shared}" if container else shared
        return out

    def initial_values(self) -> dict[str, np.ndarray]:
        """Variable name -> initial value, from the init subgraphs' ASSIGN_VARIABLE(handle, constant)."""
        values: dict[str, np.ndarray] = {}
        for i in sorted(self.init_subgraphs()):
            sg = self.model.Subgraphs(i)
            ops = [(j, sg.Operators(j)) for j in range(self.reader.length(sg.OperatorsLength(), "operator table"))]
            handles = self.handles(sg, ops)
            for j, op in ops:
                if self._code(op) != BO.ASSIGN_VARIABLE:
                    continue
                ins = _ints(op.InputsAsNumpy())
                if len(ins) != 2 or ins[0] not in handles:
                    raise self.reader.err(f"init subgraph #{i}, operator {j} (ASSIGN_VARIABLE): the first operand "
                                          f"is not a VAR_HANDLE output")
                values[handles[ins[0]]] = self._constant(sg, ins[1], f"init subgraph #{i}, operator {j}")
        return values

    def _constant(self, sg: Any, i: int, where: str) -> np.ndarray:
        from tinytrain.stages.model.tflite_reader import tensor_dtype

        if not 0 <= i < sg.TensorsLength():
            raise self.reader.err(f"corrupt file: {where} reads tensor {i} of {sg.TensorsLength()}")
        t = sg.Tensors(i)
        name = _text(t.Name())
        shape = _ints(t.ShapeAsNumpy())
        dtype = tensor_dtype(t.Type())
        raw = self.reader._buffer(t, name, shape)
        if raw is None or dtype is None:
            raise self.reader.err(f"{where} (ASSIGN_VARIABLE) assigns {name!r}, which is not a constant of a "
                                  f"supported type; only constant initial values are supported")
        return self.reader._decode_data(raw, dtype, shape, name)

    def attach(self, state_ops: list[tuple[int, int, Any]], tensors: dict, inputs: list[str], meta: dict) -> None:
        """Turn subgraph #0's resource ops (idx, code, op) into state: reads appended to `inputs`, the variables
        to meta["state"]. Checks the order LiteRT's semantics need for reads to be the invocation's start value."""
        if not state_ops:
            return
        names = self.reader.names
        handles = self.handles(self.reader.sg, [(i, op) for i, c, op in state_ops])
        init = self.initial_values()
        reads: dict[str, list[int]] = {}
        assigns: dict[str, tuple[int, int]] = {}
        for idx, code, op in state_ops:
            ins, outs = _ints(op.InputsAsNumpy()), _ints(op.OutputsAsNumpy())
            if code == BO.READ_VARIABLE:
                if len(ins) != 1 or len(outs) != 1 or ins[0] not in handles:
                    raise self.reader.err(f"operator {idx} (READ_VARIABLE) does not read a VAR_HANDLE output")
                var = handles[ins[0]]
                if var in assigns:
                    raise self.reader.err(f"operator {idx} (READ_VARIABLE) reads {var!r} after operator "
                                          f"{assigns[var][0]} assigned it in the same invocation; only reads "
                                          f"before the assignment are supported")
                reads.setdefault(var, []).append(outs[0])
            elif code == BO.ASSIGN_VARIABLE:
                if len(ins) != 2 or ins[0] not in handles:
                    raise self.reader.err(f"operator {idx} (ASSIGN_VARIABLE) does not assign a VAR_HANDLE output")
                var = handles[ins[0]]
                if var in assigns:
                    raise self.reader.err(f"operator {idx} (ASSIGN_VARIABLE) assigns {var!r} a second time "
                                          f"(first at operator {assigns[var][0]})")
                assigns[var] = (idx, ins[1])
        state = []
        for var, outs in reads.items():
            if var not in init:
                raise self.reader.err(f"variable {var!r} is read but no init subgraph assigns it an initial value")
            read = names[outs[0]]
            if len(outs) > 1:
                raise self.reader.err(f"variable {var!r} is read twice ({read!r} and {names[outs[1]]!r}); "
                                      f"one READ_VARIABLE per variable is supported")
            t = tensors[read]
            value = init[var]
            if value.size * value.itemsize != t.nbytes:
                raise self.reader.err(f"variable {var!r}: initial value {list(value.shape)} {value.dtype} does not "
                                      f"fill its read {list(t.shape)} {t.dtype}")
            value = np.ascontiguousarray(value).view(t.dtype).reshape(t.shape)
            assign = None
            if var in assigns:
                idx, a = assigns[var]
                assign = names[a]
                at = tensors[assign]
                if at.nbytes != t.nbytes or list(at.shape) != list(t.shape):
                    raise self.reader.err(f"operator {idx} (ASSIGN_VARIABLE) stores {assign!r} "
                                          f"{at.shape} {at.dtype} into {var!r}, read as {t.shape} {t.dtype}")
            state.append(StateVar(variable=var, read=read, assign=assign, init=value))
        for sv in state:
            inputs.append(sv.read)
        meta["state"] = [sv.to_json() for sv in state]


def _code_name(code: int) -> str:
    from tinytrain.stages.model.tflite_reader import _OP_NAMES

    return _OP_NAMES.get(code, f"BUILTIN_{code}")


def _text(b: bytes | None) -> str:
    return b.decode("utf-8", errors="replace") if b else ""


def _ints(arr: Any) -> list[int]:
    return [] if isinstance(arr, int) else [int(x) for x in arr]
