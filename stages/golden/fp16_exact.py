"""The fp32 backward and loss kernels in the C kernels' order of operations, for fp16-mixed training graphs.

fp16-mixed rounds every op's fp32 result to fp16, so a last-bit difference in an fp32 sum (numpy's matrix products
and pairwise sums add in another order than kernels_c's loops) can move an fp16 rounding and the runs apart. Here the
ops a float training step uses whose golden kernel sums differently (grad_ops' fully_connected_grad_input /
_weight, conv2d_grad_input / _weight, bias_grad, the reduction of a broadcast operand by add_grad, sub_grad and
mul_grad) and the softmax cross-entropy (tt_math.h's own expf / logf,
ported operation for operation) add in exactly kernels_c's order, vectorised only across independent sums, so the
golden model gives the C's bits. Used by stages/golden/train_step.py for graphs of precision fp16-mixed and
int8 (EXACT_PRECISIONS: an int8/int32 update rounds its fp32 step, which a last-bit sum difference can move); any
other op keeps its kernel (the forward executor already sums in the C's order).

    outs = backward_op(op, v)        # a list of outputs, or None (the op's own kernel runs)
"""

from __future__ import annotations

import numpy as np

from tinytrain.stages.model.geometry import out_size_and_pad

F32 = np.float32


def _bits(x: float) -> np.uint32:
    return np.array(x, F32).view(np.uint32)[()]


def _from_bits(u: int) -> F32:
    return np.array(u & 0xFFFFFFFF, np.uint32).view(F32)[()]


def expf(x: F32) -> F32:
    """tt_math.h's tt_expf, float32 operation for operation."""
    x = F32(x)
    if x != x:
        return x
    if x > F32(88.7228394):
        return F32(np.inf)
    if x < F32(-103.972084):
        return F32(0.0)
    t = x * F32(1.44269502)
    n = int(t - F32(0.5)) if t < 0 else int(t + F32(0.5))
    r = x - F32(n) * F32(0.693145752)
    r = r - F32(n) * F32(1.42860677e-06)
    p = F32(1.0) + r * (F32(1.0) + r * (F32(0.5) + r * (F32(0.166666672) + r * (F32(0.0416666679) + r * (
        F32(0.00833333377) + r * (F32(0.00138888892) + r * F32(0.000198412701)))))))
    if n < -100:
        p = p * _from_bits(0x0D800000)
        n += 100
    return F32(p * _from_bits((n + 127) << 23))


def logf(x: F32) -> F32:
    """tt_math.h's tt_logf (fdlibm's reduction), float32 operation for operation."""
    x = F32(x)
    if x != x or x < 0:
        return F32(np.nan)
    if x == 0:
        return F32(-np.inf)
    ix = int(_bits(x))
    if ix >= 0x7F800000:
        return x
    k = 0
    if ix < 0x00800000:
        k -= 25
        x = x * F32(33554432.0)
        ix = int(_bits(x))
    k += (ix >> 23) - 127
    ix &= 0x007FFFFF
    i = (ix + (0x95F64 << 3)) & 0x800000
    x = _from_bits(ix | (i ^ 0x3F800000))
    k += i >> 23
    f = x - F32(1.0)
    s = f / (F32(2.0) + f)
    dk = F32(k)
    z = s * s
    w = z * z
    t1 = w * (F32(4.0000000596e-01) + w * (F32(2.2222198546e-01) + w * F32(1.5313838422e-01)))
    t2 = z * (F32(6.6666668653e-01) + w * (F32(2.8571429849e-01) + w * (F32(1.8183572590e-01)
                                                                         + w * F32(1.4798198640e-01))))
    R = t2 + t1
    hfsq = F32(0.5) * f * f
    return F32(dk * F32(6.9313812256e-01) - ((hfsq - (s * (hfsq + R) + dk * F32(9.0580006145e-06))) - f))


def softmax_ce(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tt_softmax_cross_entropy_f32: (loss summed over rows, dlogits)."""
    z2 = np.asarray(logits, F32).reshape(-1, np.asarray(logits).shape[-1])
    lab = np.asarray(labels).reshape(-1).astype(np.int64)
    d = np.zeros_like(z2)
    loss = F32(0.0)
    for r in range(z2.shape[0]):
        z = z2[r]
        mx = z[0]
        for c in range(1, z.shape[0]):
            if z[c] > mx:
                mx = z[c]
        s = F32(0.0)
        for c in range(z.shape[0]):
            d[r, c] = expf(z[c] - mx)
            s = s + d[r, c]
        loss = loss + (logf(s) - (z[lab[r]] - mx))
        d[r] = d[r] / s
        d[r, lab[r]] = d[r, lab[r]] - F32(1.0)
    return np.array(loss, F32), d.reshape(np.asarray(logits).shape)


def fc_grad_input(dy, w, x_shape) -> np.ndarray:
    dy, w = np.asarray(dy, F32), np.asarray(w, F32)
    d2 = dy.reshape(-1, w.shape[0])
    s = np.zeros((d2.shape[0], w.shape[1]), F32)
    for o in range(w.shape[0]):
        s += d2[:, o:o + 1] * w[o]
    return s.reshape(x_shape)


def fc_grad_weight(dy, x, w_shape, k=None) -> np.ndarray:
    dy, x = np.asarray(dy, F32), np.asarray(x, F32)
    o, depth = w_shape
    k = depth if k is None else int(k)
    d2 = dy.reshape(-1, o)
    xr = x.reshape(d2.shape[0], -1)[:, :k]
    s = np.zeros((o, k), F32)
    for r in range(d2.shape[0]):
        s += d2[r][:, None] * xr[r][None, :]
    return s


def bias_grad(dy) -> np.ndarray:
    dy = np.asarray(dy, F32)
    d2 = dy.reshape(-1, dy.shape[-1])
    db = np.zeros(d2.shape[1], F32)
    for r in range(d2.shape[0]):
        db += d2[r]
    return db


def unbroadcast(dy, shape) -> np.ndarray:
    """tt_unbroadcast_f32 (add_grad): a dx of dy's size is dy; a smaller one sums, for each of its elements, its dy
    positions in dy's row-major order from +0 (the broadcast axes, in order, are the inner ones of that order)."""
    dy = np.asarray(dy, F32)
    shape = tuple(int(d) for d in shape)
    if int(np.prod(shape, dtype=np.int64)) == dy.size:
        return dy.reshape(shape).copy()
    xs = (1,) * (dy.ndim - len(shape)) + shape
    bcast = [d for d in range(dy.ndim) if xs[d] == 1 and dy.shape[d] != 1]
    kept = [d for d in range(dy.ndim) if d not in bcast]
    t = np.transpose(dy, kept + bcast).reshape(int(np.prod([dy.shape[d] for d in kept], dtype=np.int64)), -1)
    acc = np.zeros(t.shape[0], F32)
    for i in range(t.shape[1]):
        acc = acc + t[:, i]
    return acc.reshape(shape)


def _geo(x_shape, kh, kw, a):
    sh, sw = int(a["stride_h"]), int(a["stride_w"])
    dh, dw = int(a.get("dilation_h", 1)), int(a.get("dilation_w", 1))
    oh, pt = out_size_and_pad(a["padding"], x_shape[1], kh, sh, dh)
    ow, pl = out_size_and_pad(a["padding"], x_shape[2], kw, sw, dw)
    return sh, sw, dh, dw, oh, ow, pt, pl


def conv2d_grad_input(dy, w, x_shape, a) -> np.ndarray:
    """tt_conv2d_grad_input_f32: dx[iy, ix, :] = 0, then per tap (ky, kx) in order += (sum over o in order)."""
    dy, w = np.asarray(dy, F32), np.asarray(w, F32)
    o_c, kh, kw, ci = w.shape
    n, h, wd = int(x_shape[0]), int(x_shape[1]), int(x_shape[2])
    sh, sw, dh, dwl, oh, ow, pt, pl = _geo(x_shape, kh, kw, a)
    dx = np.zeros((n, h, wd, ci), F32)
    for ky in range(kh):
        for kx in range(kw):
            # input rows iy whose output row oy = (iy + pt - ky*dh) / sh is whole and inside
            for iy in range(h):
                ny = iy + pt - ky * dh
                if ny < 0 or ny % sh or ny // sh >= oh:
                    continue
                xs = [ix for ix in range(wd) if (ix + pl - kx * dwl) >= 0 and (ix + pl - kx * dwl) % sw == 0
                      and (ix + pl - kx * dwl) // sw < ow]
                if not xs:
                    continue
                oxs = [(ix + pl - kx * dwl) // sw for ix in xs]
                g = dy[:, ny // sh, oxs, :]                       # [n, len, O]
                s = np.zeros((n, len(xs), ci), F32)
                for o in range(o_c):
                    s += g[:, :, o:o + 1] * w[o, ky, kx]
                dx[:, iy, xs, :] += s
    return dx


def conv2d_grad_weight(dy, x, w_shape, a, k=None) -> np.ndarray:
    """tt_conv2d_grad_weight_f32: per tap, dw = 0 then += over the output positions in row-major order."""
    dy, x = np.asarray(dy, F32), np.asarray(x, F32)
    o_c, kh, kw, ci = (int(v) for v in w_shape)
    k = ci if k is None else int(k)
    n, h, wd = x.shape[0], x.shape[1], x.shape[2]
    sh, sw, dh, dwl, oh, ow, pt, pl = _geo(x.shape, kh, kw, a)
    dw = np.zeros((o_c, kh, kw, k), F32)
    for ky in range(kh):
        for kx in range(kw):
            acc = np.zeros((o_c, k), F32)
            for b in range(n):
                for oy in range(oh):
                    iy = oy * sh - pt + ky * dh
                    if iy < 0 or iy >= h:
                        continue
                    for ox in range(ow):
                        ix = ox * sw - pl + kx * dwl
                        if ix < 0 or ix >= wd:
                            continue
                        acc += dy[b, oy, ox, :][:, None] * x[b, iy, ix, :k][None, :]
            dw[:, ky, kx, :] = acc
    return dw


def run_softmax_ce(op, v, shape):
    if np.asarray(v(1)).dtype.kind not in "iu":
        return None   # a float class-index row (several heads): its own kernel
    from tinytrain.stages.train import losses
    return losses.run_loss_op(op, v, softmax_ce, class_target=True)


def run_bias_grad(op, v, shape):
    return [bias_grad(v(0))]


def run_add_grad(op, v, shape):
    return [unbroadcast(v(0), shape(o)) for o in op.outputs]


def run_sub_grad(op, v, shape):
    """tt_unbroadcast_f32 with sign -1 for operand b: each term negated before it is summed (a sum negated after
    would turn the +0 of an exact cancellation into -0)."""
    dz = np.asarray(v(0), F32)
    return [unbroadcast(-dz if int(j) == 1 else dz, shape(o)) for o, j in zip(op.outputs, op.attrs["which"])]


def run_mul_grad(op, v, shape):
    """tt_mul_grad_f32: unbroadcast(dz * other), each product in fp32, summed in tt_unbroadcast_f32's order."""
    dz, other = np.asarray(v(0), F32), np.asarray(v(1), F32)
    return [unbroadcast(dz * other, shape(op.outputs[0]))]


def run_fc_grad_input(op, v, shape):
    return [fc_grad_input(v(0), v(1), shape(op.outputs[0]))]


def run_fc_grad_weight(op, v, shape):
    return [fc_grad_weight(v(0), v(1), list(op.attrs["w_shape"]), op.attrs.get("in_channels"))]


def run_conv2d_grad_input(op, v, shape):
    return [conv2d_grad_input(v(0), v(1), shape(op.outputs[0]), op.attrs)]


def run_conv2d_grad_weight(op, v, shape):
    return [conv2d_grad_weight(v(0), v(1), list(op.attrs["w_shape"]), op.attrs, op.attrs.get("in_channels"))]


def backward_op(graph):
    """fn(op, v): the op's outputs in the C's order of operations, or None to let its own kernel run (the op -> kernel
    table is stages/ops/fp16.py's EXACT_KERNELS: op names live in the op modules)."""
    from tinytrain.stages.ops.fp16 import exact_kernels

    table = exact_kernels()

    def shape(name: str) -> list[int]:
        return list(graph.tensors[name].shape)

    def run(op, v):
        fn = table.get(op.type)
        return None if fn is None else fn(op, v, shape)
    return run
