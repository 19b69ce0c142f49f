"""Every backward kernel of stages/golden/grad_ops.py against float64 central finite differences.

The float64 forwards here are written independently of the kernels; each is first checked against the reference
executor (stages/golden/forward.py, TFLite geometry) so that FD differentiates the right function. The scalar probed is
L = Σ R ⊙ f(x) for a fixed random R; kernels run in float32, so the tolerance is that of float32 (rtol 1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest

from tinytrain.stages.golden import grad_ops as go
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.model.ir import Graph, Op, Tensor

RTOL, ATOL = 1e-4, 2e-5


# ---- float64 reference forwards --------------------------------------------------------------------------------

def _pads(n, k, s, d, padding):
    eff = (k - 1) * d + 1
    out = (n + s - 1) // s if padding == "same" else (n + s - eff) // s
    total = max((out - 1) * s + eff - n, 0)
    return out, total // 2, total - total // 2


def _windows(x, kh, kw, a, value=0.0):
    """[N, OH, OW, KH*KW, C] windows of x (float64), plus the in-image mask [OH, OW, KH*KW]."""
    sh, sw = a["stride_h"], a["stride_w"]
    dh, dw = a.get("dilation_h", 1), a.get("dilation_w", 1)
    oh, pt, pb = _pads(x.shape[1], kh, sh, dh, a["padding"])
    ow, pl, pr = _pads(x.shape[2], kw, sw, dw, a["padding"])
    xp = np.pad(x, ((0, 0), (pt, pb + sh), (pl, pr + sw), (0, 0)), constant_values=value)
    mp = np.pad(np.ones(x.shape[1:3]), ((pt, pb + sh), (pl, pr + sw)))
    wins, masks = [], []
    for ky in range(kh):
        for kx in range(kw):
            ys = [oy * sh + ky * dh for oy in range(oh)]
            xs = [ox * sw + kx * dw for ox in range(ow)]
            wins.append(xp[:, ys][:, :, xs])
            masks.append(mp[ys][:, xs])
    return np.stack(wins, axis=3), np.stack(masks, axis=2)


def f_conv(x, w, a):
    o, kh, kw, ci = w.shape
    win, _ = _windows(x, kh, kw, a)
    return np.einsum("nhwtc,otc->nhwo", win, w.reshape(o, kh * kw, ci))


def f_dw(x, w, a):
    _, kh, kw, o = w.shape
    m = o // x.shape[3]
    win, _ = _windows(np.repeat(x, m, axis=-1), kh, kw, a)
    return np.einsum("nhwtc,tc->nhwc", win, w[0].reshape(kh * kw, o))


def f_avg(x, a):
    win, mask = _windows(x, a["filter_h"], a["filter_w"], a)
    return win.sum(axis=3) / mask.sum(axis=2)[None, :, :, None]


def f_max(x, a):
    win, _ = _windows(x, a["filter_h"], a["filter_w"], a, value=-np.inf)
    return win.max(axis=3)


# ---- helpers ---------------------------------------------------------------------------------------------------

def fd_grad(f, x, r, eps=1e-6):
    """d/dx Σ r·f(x) by central differences in float64."""
    x = x.astype(np.float64).copy()
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = float((r * f(x)).sum())
        x[i] = old - eps
        fm = float((r * f(x)).sum())
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


def close(got, want):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=ATOL)


def executor_forward(op_type, x, attrs, w=None, out_shape=None):
    tensors = {"x": Tensor("x", [1] + list(x.shape[1:]), "float32", role="input"),
               "y": Tensor("y", [1] + list(out_shape[1:]), "float32")}
    inputs = ["x"]
    if w is not None:
        tensors["w"] = Tensor("w", list(w.shape), "float32", role="weight", data=w.astype(np.float32))
        inputs.append("w")
    g = Graph(tensors=tensors, ops=[Op(op_type, inputs, ["y"], dict(attrs))], inputs=["x"], outputs=["y"])
    return run_graph(g, {"x": x.astype(np.float32)})["y"]


rng = np.random.default_rng(7)


def rnd(*shape):
    return rng.standard_normal(shape)


CONV_CASES = [
    dict(stride_h=1, stride_w=1, padding="same"),
    dict(stride_h=2, stride_w=2, padding="same"),  # odd total padding: the extra pixel goes after
    dict(stride_h=2, stride_w=1, padding="valid"),
    dict(stride_h=1, stride_w=1, dilation_h=2, dilation_w=2, padding="same"),
    dict(stride_h=2, stride_w=2, dilation_h=1, dilation_w=2, padding="valid"),
]


@pytest.mark.parametrize("a", CONV_CASES)
def test_conv2d_grads(a):
    x, w = rnd(2, 6, 7, 3), rnd(4, 3, 3, 3)
    y = f_conv(x, w, a)
    np.testing.assert_allclose(executor_forward("conv2d", x, a, w, y.shape), y, rtol=1e-5, atol=1e-5)
    r = rnd(*y.shape)
    close(go.conv2d_grad_input(r, w, x.shape, a), fd_grad(lambda v: f_conv(v, w, a), x, r))
    full = fd_grad(lambda v: f_conv(x, v, a), w, r)
    close(go.conv2d_grad_weight(r, x, w.shape, a), full)
    close(go.conv2d_grad_weight(r, x, w.shape, a, k=2), full[..., :2])  # sparse: input channels [0, 2)
    close(go.bias_grad(r), r.reshape(-1, 4).sum(0))


@pytest.mark.parametrize("a", CONV_CASES)
@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_grads(a, mult):
    x, w = rnd(2, 6, 5, 3), rnd(1, 3, 3, 3 * mult)
    a = dict(a, depth_multiplier=mult)
    y = f_dw(x, w, a)
    np.testing.assert_allclose(executor_forward("depthwise_conv2d", x, a, w, y.shape), y, rtol=1e-5, atol=1e-5)
    r = rnd(*y.shape)
    close(go.depthwise_conv2d_grad_input(r, w, x.shape, a), fd_grad(lambda v: f_dw(v, w, a), x, r))
    full = fd_grad(lambda v: f_dw(x, v, a), w, r)
    close(go.depthwise_conv2d_grad_weight(r, x, w.shape, a), full)
    close(go.depthwise_conv2d_grad_weight(r, x, w.shape, a, k=1), full[..., :mult])


def test_fully_connected_grads():
    x, w = rnd(3, 2, 5), rnd(4, 5)  # keep_num_dims style: rows are all but the last axis
    f = lambda v, ww: v.reshape(-1, 5) @ ww.T  # noqa: E731
    r = rnd(6, 4)
    close(go.fully_connected_grad_input(r, w, x.shape), fd_grad(lambda v: f(v, w), x, r))
    full = fd_grad(lambda v: f(x, v), w, r)
    close(go.fully_connected_grad_weight(r, x, w.shape), full)
    close(go.fully_connected_grad_weight(r, x, w.shape, k=3), full[:, :3])


@pytest.mark.parametrize("act,lo,hi", [("relu", 0, None), ("relu6", 0, 6), ("relu_n1_to_1", -1, 1)])
def test_activation_masks(act, lo, hi):
    x = rnd(2, 40) * 4
    x[0, :3] = [lo, hi if hi is not None else 7.0, 1e-3]  # exactly on the clamp: no gradient (PyTorch too)
    f = lambda v: np.clip(v, lo, hi)  # noqa: E731
    r = rnd(*x.shape)
    want = fd_grad(f, x, r, eps=1e-7)
    want[0, 0] = 0.0  # FD straddles the kink there
    if hi is not None:
        want[0, 1] = 0.0
    close(go.act_grad(r, f(x), act), want)


def test_softmax_grad():
    for beta in (1.0, 0.5):
        x = rnd(3, 6)

        def f(v):
            e = np.exp(beta * (v - v.max(-1, keepdims=True)))
            return e / e.sum(-1, keepdims=True)
        r = rnd(*x.shape)
        close(go.softmax_grad(r, f(x), beta), fd_grad(f, x, r))


def test_add_broadcast():
    a, b = rnd(2, 3, 4), rnd(1, 1, 4)
    r = rnd(2, 3, 4)
    close(go.unbroadcast(r, a.shape), fd_grad(lambda v: v + b, a, r))
    close(go.unbroadcast(r, b.shape), fd_grad(lambda v: a + v, b, r))
    close(go.unbroadcast(r, (4,)), r.sum(axis=(0, 1)))


POOL_CASES = [
    dict(filter_h=2, filter_w=2, stride_h=2, stride_w=2, padding="valid"),
    dict(filter_h=3, filter_w=3, stride_h=2, stride_w=2, padding="same"),
    dict(filter_h=3, filter_w=2, stride_h=1, stride_w=1, padding="same"),
]


@pytest.mark.parametrize("a", POOL_CASES)
def test_average_pool_grad(a):
    x = rnd(2, 5, 6, 3)
    y = f_avg(x, a)
    np.testing.assert_allclose(executor_forward("average_pool2d", x, dict(a, act="none"), None, y.shape), y,
                               rtol=1e-5, atol=1e-5)
    r = rnd(*y.shape)
    close(go.average_pool2d_grad(r, x.shape, a), fd_grad(lambda v: f_avg(v, a), x, r))


@pytest.mark.parametrize("a", POOL_CASES)
def test_max_pool_grad(a):
    x = rnd(2, 5, 6, 3)
    y = f_max(x, a)
    np.testing.assert_allclose(executor_forward("max_pool2d", x, dict(a, act="none"), None, y.shape), y,
                               rtol=1e-6)
    r = rnd(*y.shape)
    close(go.max_pool2d_grad(r, x, a), fd_grad(lambda v: f_max(v, a), x, r))


def test_max_pool_ties_go_to_first():
    x = np.zeros((1, 2, 2, 1))
    g = go.max_pool2d_grad(np.ones((1, 1, 1, 1)), x, POOL_CASES[0])
    assert g.reshape(-1).tolist() == [1, 0, 0, 0]


def test_mean_reshape_pad_concat():
    x = rnd(2, 3, 4, 5)
    r = rnd(2, 5)
    close(go.mean_grad(r, x.shape, np.array([1, 2])), fd_grad(lambda v: v.mean(axis=(1, 2)), x, r))
    r = rnd(2, 1, 4, 5)
    close(go.mean_grad(r, x.shape, np.array(-3)), fd_grad(lambda v: v.mean(axis=1, keepdims=True), x, r))
    r = rnd(2, 60)
    close(go.reshape_grad(r, x.shape), fd_grad(lambda v: v.reshape(2, 60), x, r))
    p = np.array([[0, 0], [1, 2], [2, 1], [0, 0]])
    r = rnd(2, 6, 7, 5)
    close(go.pad_grad(r, p), fd_grad(lambda v: np.pad(v, p), x, r))
    a, b = rnd(2, 3, 2), rnd(2, 3, 4)
    r = rnd(2, 3, 6)
    ga, gb = go.concatenation_grad(r, [2, 4], axis=2)
    close(ga, fd_grad(lambda v: np.concatenate([v, b], 2), a, r))
    close(gb, fd_grad(lambda v: np.concatenate([a, v], 2), b, r))
    close(go.grad_sum([r, 2 * r, r]), 4 * r)


def test_softmax_ce_loss():
    z = rnd(3, 7) * 3
    lab = np.array([0, 6, 2])

    def f(v):
        m = v.max(-1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(v - m).sum(-1))
        return np.array(lse - v[np.arange(3), lab]).sum()
    loss, d = go.softmax_ce_loss(z, lab)
    np.testing.assert_allclose(float(loss), f(z), rtol=1e-6)
    close(d, fd_grad(f, z, np.ones(())))
    # Stable far from 0 (a naive exp would overflow float32).
    loss, d = go.softmax_ce_loss(np.array([[1000.0, 0.0]]), np.array([1]))
    assert np.isfinite(loss) and abs(float(loss) - 1000.0) < 1e-3 and np.isfinite(d).all()


def test_mse_loss():
    y, t = rnd(2, 3, 4), rnd(2, 3, 4)
    f = lambda v: ((v - t) ** 2).reshape(2, -1).mean(axis=1).sum()  # noqa: E731
    loss, d = go.mse_loss(y, t)
    np.testing.assert_allclose(float(loss), f(y), rtol=1e-6)
    close(d, fd_grad(f, y, np.ones(())))


def test_updates_on_slice():
    w = np.ones((2, 4), np.float32)
    go.sgd_update(w, np.ones((2, 2), np.float32), lr=0.5, scale=0.5, n=2)
    assert w.tolist() == [[0.75, 0.75, 1, 1]] * 2


# ---- element-wise ops, activations and slices ------------------------------------------------------------------

def _away_from(x, kinks, gap=1e-2):
    """Move values within `gap` of a kink out of it: central differences straddling a kink measure neither side."""
    x = x.copy()
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, gap, -gap)
    return x


@pytest.mark.parametrize("b_shape", [(2, 3, 4), (4,), (1, 1, 4), (3, 1)])
def test_mul_sub_grads_with_broadcasting(b_shape):
    a, b = rnd(2, 3, 4), rnd(*b_shape)
    r = rnd(2, 3, 4)
    if len(b_shape) < 3:  # a constant operand as the executor runs it (the IR's BatchNorm-style scale)
        np.testing.assert_allclose(executor_forward("mul", a, {"act": "none"}, b, a.shape), a * b, rtol=1e-6)
        np.testing.assert_allclose(executor_forward("sub", a, {"act": "none"}, b, a.shape), a - b, rtol=1e-6,
                                   atol=1e-6)
    close(go.mul_grad(r, b, a.shape), fd_grad(lambda v: v * b, a, r))
    close(go.mul_grad(r, a, b.shape), fd_grad(lambda v: a * v, b, r))
    close(go.sub_grad(r, a.shape, 1.0), fd_grad(lambda v: v - b, a, r))
    close(go.sub_grad(r, b.shape, -1.0), fd_grad(lambda v: a - v, b, r))
    # mul(x, x): the two shares sum to 2·x·dy.
    close(go.grad_sum([go.mul_grad(r, a, a.shape)] * 2), fd_grad(lambda v: v * v, a, r))


def test_logistic_tanh_grads_from_output():
    x = rnd(3, 50) * 4
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    np.testing.assert_allclose(executor_forward("logistic", x, {}, None, x.shape), sig(x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(executor_forward("tanh", x, {}, None, x.shape), np.tanh(x), rtol=1e-6, atol=1e-7)
    r = rnd(*x.shape)
    close(go.logistic_grad(r, sig(x)), fd_grad(sig, x, r))
    close(go.tanh_grad(r, np.tanh(x)), fd_grad(np.tanh, x, r))
    close(go.act_grad(r, np.tanh(x), "tanh"), fd_grad(np.tanh, x, r))  # a fused tanh activation


def test_hard_swish_grad():
    x = _away_from(rnd(3, 60) * 3, (-3.0, 3.0))
    f = lambda v: v * np.clip(v + 3, 0, 6) / 6  # noqa: E731
    np.testing.assert_allclose(executor_forward("hard_swish", x, {}, None, x.shape), f(x), rtol=1e-6, atol=1e-7)
    assert (x < -3).any() and (x > 3).any()
    r = rnd(*x.shape)
    close(go.hard_swish_grad(r, x), fd_grad(f, x, r))


def test_hard_swish_grad_kinks_are_pytorchs():
    """PyTorch 2.x hardswish_backward: x <= -3 -> 0, x >= 3 -> dy, dy·(x/3 + 0.5) strictly between."""
    x = np.array([-3.5, -3.0, np.nextafter(np.float32(-3), np.float32(0)), 0.0, np.nextafter(np.float32(3),
                  np.float32(0)), 3.0, 3.5], np.float32)
    dy = np.full(x.shape, 2.0, np.float32)
    got = go.hard_swish_grad(dy, x)
    lin = lambda v: 2 * (v / np.float32(3) + np.float32(0.5))  # noqa: E731
    want = np.array([0, 0, lin(x[2]), 1, lin(x[4]), 2, 2], np.float32)
    np.testing.assert_array_equal(got, want)
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.hardswish(xt).backward(torch.tensor(dy))
    np.testing.assert_array_equal(got, xt.grad.numpy())  # bit-equal, kinks included


def test_leaky_relu_and_prelu_grads():
    x = _away_from(rnd(2, 3, 4, 5), (0.0,))
    alpha = 0.2
    f = lambda v: np.where(v > 0, v, alpha * v)  # noqa: E731
    np.testing.assert_allclose(executor_forward("leaky_relu", x, {"alpha": alpha}, None, x.shape), f(x),
                               rtol=1e-6, atol=1e-7)
    r = rnd(*x.shape)
    close(go.leaky_relu_grad(r, x, alpha), fd_grad(f, x, r))
    # The kink x = 0 takes the slope alpha (PyTorch's leaky_relu and prelu backward).
    assert go.leaky_relu_grad(np.ones(1), np.zeros(1), alpha)[0] == np.float32(alpha)
    for a_shape in [(1, 1, 5), (3, 4, 5), (5,)]:  # per channel (shared over H, W), per position, flat
        al = rng.uniform(-0.5, 0.8, a_shape)
        fp = lambda v, al=al: np.where(v >= 0, v, v * al)  # noqa: E731
        np.testing.assert_allclose(executor_forward("prelu", x, {}, al, x.shape), fp(x), rtol=1e-6, atol=1e-7)
        close(go.prelu_grad(r, x, al), fd_grad(fp, x, r))
    assert go.prelu_grad(np.ones(1), np.zeros(1), np.array([0.3]))[0] == np.float32(0.3)


SLICE_CASES = [
    # (numpy index of the forward, starts, stops, strides) as the reader resolves x[:, 1:7:2, ::-1, 2:8] etc.
    ((slice(None), slice(1, 7, 2), slice(None, None, -1), slice(2, 8)), [0, 1, 7, 2], [2, 7, -1, 8], [1, 2, -1, 1]),
    ((slice(None), slice(None), 1, slice(None)), [0, 0, 1, 0], [2, 8, 2, 8], [1, 1, 1, 1]),  # shrink_axis_mask
    ((slice(None), slice(6, 0, -3), slice(0, 8, 3), slice(5, 6)), [0, 6, 0, 5], [2, 0, 8, 6], [1, -3, 3, 1]),
]


@pytest.mark.parametrize("index,starts,stops,strides", SLICE_CASES)
def test_strided_slice_grad(index, starts, stops, strides):
    x = rnd(2, 8, 8, 8)
    f = lambda v: v[index]  # noqa: E731
    y = f(x)
    a = {"starts": starts, "stops": stops, "strides": strides}
    np.testing.assert_array_equal(executor_forward("strided_slice", x, a, None, y.shape), y.astype(np.float32))
    r = rnd(*y.shape)
    close(go.strided_slice_grad(r, x.shape, starts, stops, strides), fd_grad(f, x, r))
