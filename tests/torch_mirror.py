"""A PyTorch twin of a forward IR graph, built from the IR's own weights (test helper for test_autodiff_torch.py).

Activations stay NHWC as in the IR (convolutions permute around torch's NCHW). TFLite geometry: SAME pads
total//2 before and the rest after (explicit F.pad, since torch's own padding is symmetric); average pooling
divides by the number of in-image taps. One nn.Parameter per IR tensor, so a constant the converter shares
between two ops is shared here too and its gradient is summed, as autodiff does.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tinytrain.stages.model.ir import Graph

PARAM_OPS = ("conv2d", "depthwise_conv2d", "fully_connected")


def _pads(n: int, k: int, s: int, d: int, padding: str) -> tuple[int, int]:
    eff = (k - 1) * d + 1
    out = (n + s - 1) // s if padding == "same" else (n + s - eff) // s
    total = max((out - 1) * s + eff - n, 0)
    return total // 2, total - total // 2


def _act(y: torch.Tensor, act: str) -> torch.Tensor:
    if act == "none":
        return y
    if act == "relu":
        return F.relu(y)
    if act == "relu6":
        return F.hardtanh(y, 0.0, 6.0)  # gradient on (0, 6) exclusive, as the IR's mask
    if act == "relu_n1_to_1":
        return F.hardtanh(y, -1.0, 1.0)
    if act == "tanh":
        return torch.tanh(y)
    raise NotImplementedError(f"activation {act!r}")


class TorchMirror(nn.Module):
    def __init__(self, graph: Graph):
        super().__init__()
        self.graph = graph
        self.names: list[str] = []
        for op in graph.ops:
            if op.type in PARAM_OPS:
                for name in op.inputs[1:3]:
                    if name is not None and name not in self.names:
                        self.names.append(name)
        self.params = nn.ParameterList(
            [nn.Parameter(torch.tensor(np.array(graph.tensors[n].data, dtype=np.float32))) for n in self.names])
        self.index = {n: i for i, n in enumerate(self.names)}

    def param(self, name: str) -> nn.Parameter:
        return self.params[self.index[name]]

    def _val(self, vals: dict, name: str | None):
        if name is None:
            return None
        if name in self.index:
            return self.param(name)
        if name in vals:
            return vals[name]
        return self.graph.tensors[name].data  # a constant operand (axes, paddings)

    def forward(self, x: torch.Tensor, upto: str | None = None) -> torch.Tensor:
        g = self.graph
        vals = {g.inputs[0]: x}
        for op in g.ops:
            a = op.attrs
            ins = [self._val(vals, n) for n in op.inputs]
            y = self._op(op.type, a, ins, g.tensors[op.outputs[0]].shape, x.shape[0])
            vals[op.outputs[0]] = y
            if op.outputs[0] == upto:
                return y
        return vals[upto or g.outputs[0]]

    def _op(self, t: str, a: dict, ins: list, out_shape: list[int], batch: int) -> torch.Tensor:
        act = a.get("act", "none")
        if t in ("conv2d", "depthwise_conv2d"):
            x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
            kh, kw = w.shape[1], w.shape[2]
            sh, sw = int(a["stride_h"]), int(a["stride_w"])
            dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
            pt, pb = _pads(x.shape[1], kh, sh, dh, a["padding"])
            pl, pr = _pads(x.shape[2], kw, sw, dw, a["padding"])
            xc = F.pad(x.permute(0, 3, 1, 2), (pl, pr, pt, pb))
            if t == "conv2d":
                wt, groups = w.permute(0, 3, 1, 2), 1
            else:
                wt, groups = w[0].permute(2, 0, 1).unsqueeze(1), x.shape[3]
            y = F.conv2d(xc, wt, b, stride=(sh, sw), dilation=(dh, dw), groups=groups).permute(0, 2, 3, 1)
            return _act(y, act)
        if t == "fully_connected":
            x, w, b = ins[0], ins[1], ins[2] if len(ins) > 2 else None
            y = F.linear(x.reshape(-1, w.shape[1]), w, b)
            y = y.reshape(tuple(x.shape[:-1]) + (w.shape[0],)) if a.get("keep_num_dims") else \
                y.reshape([batch] + list(out_shape[1:]))
            return _act(y, act)
        if t == "add":
            return _act(ins[0] + ins[1], act)
        if t in ("average_pool2d", "max_pool2d"):
            x = ins[0]
            kh, kw, sh, sw = int(a["filter_h"]), int(a["filter_w"]), int(a["stride_h"]), int(a["stride_w"])
            pt, pb = _pads(x.shape[1], kh, sh, 1, a["padding"])
            pl, pr = _pads(x.shape[2], kw, sw, 1, a["padding"])
            xc = x.permute(0, 3, 1, 2)
            if t == "max_pool2d":
                y = F.max_pool2d(F.pad(xc, (pl, pr, pt, pb), value=float("-inf")), (kh, kw), (sh, sw))
            else:
                s = F.avg_pool2d(F.pad(xc, (pl, pr, pt, pb)), (kh, kw), (sh, sw), divisor_override=1)
                ones = F.pad(torch.ones((1, 1) + tuple(xc.shape[2:])), (pl, pr, pt, pb))
                y = s / F.avg_pool2d(ones, (kh, kw), (sh, sw), divisor_override=1)
            return _act(y.permute(0, 2, 3, 1), act)
        if t == "mean":
            axes = sorted({int(v) % ins[0].dim() for v in np.asarray(ins[1]).reshape(-1)})
            return ins[0].mean(dim=axes, keepdim=bool(a.get("keep_dims")))
        if t == "reshape":
            return ins[0].reshape([batch] + list(a["new_shape"])[1:])
        if t == "pad":
            p = np.asarray(ins[1]).reshape(-1, 2)
            flat = [int(v) for pair in p[::-1] for v in pair]
            return F.pad(ins[0], flat)
        if t == "concatenation":
            return _act(torch.cat([v for v in ins if v is not None], dim=int(a.get("axis", -1))), act)
        if t == "relu":
            return F.relu(ins[0])
        if t == "relu6":
            return F.hardtanh(ins[0], 0.0, 6.0)
        if t == "softmax":
            return torch.softmax(ins[0] * float(a.get("beta", 1.0)), dim=-1)
        if t in ("mul", "sub"):
            u, v = _t(ins[0]), _t(ins[1])
            return _act(u * v if t == "mul" else u - v, act)
        if t == "logistic":
            return torch.sigmoid(ins[0])
        if t == "tanh":
            return torch.tanh(ins[0])
        if t == "hard_swish":
            return F.hardswish(ins[0])
        if t == "leaky_relu":
            return F.leaky_relu(ins[0], float(a.get("alpha", 0.2)))
        if t == "prelu":
            # alpha broadcasts over x without the batch axis (F.prelu wants NCHW channels); where(x > 0) gives
            # the kink at 0 the slope alpha, as F.prelu's backward does.
            x, alpha = ins[0], _t(ins[1])
            return torch.where(x > 0, x, x * alpha)
        if t == "strided_slice":
            # torch slicing has no negative steps: gather each axis's resolved index range instead.
            y = ins[0]
            for ax in range(1, y.dim()):
                idx = torch.arange(int(a["starts"][ax]), int(a["stops"][ax]), int(a["strides"][ax]))
                y = y.index_select(ax, idx)
            return y.reshape([batch] + list(out_shape[1:]))
        raise NotImplementedError(f"torch mirror: op {t!r}")


def _t(v) -> torch.Tensor:
    """A constant operand (numpy, from the IR) as a float32 tensor; activations pass through."""
    return v if isinstance(v, torch.Tensor) else torch.tensor(np.asarray(v, dtype=np.float32))
