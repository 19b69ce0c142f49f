"""The contribution analysis' frozen-prefix cache (stages/planning/frozen_prefix.py) and its noise-aware estimate scaling.

A unit trained on the suffix after a cached cut must be the unit trained on the whole graph: the same losses and
parameters (the prefix is the same ops on the same values, only batched), and the same held-out accuracy."""

import numpy as np
import pytest

from tinytrain.stages.planning import contribution as C
from tinytrain.stages.golden import fast_float
from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph
from tinytrain.stages.golden.forward import run_graph
from tinytrain.stages.planning.frozen_prefix import FrozenPrefix, single_tensor_cuts
from tinytrain.stages.golden.train_step import train
from tinytrain.stages.planning.train_plan import LayerPlan, TrainPlan

from test_sparse_plan import graph_of


def _data(g, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *g.tensors[g.inputs[0]].shape[1:])).astype(np.float32)
    k = int(g.tensors[g.outputs[0]].shape[-1])
    return x, rng.integers(0, k, n)


def test_cuts_are_single_tensor_and_skip_residual_spans():
    g = C.dequantize_graph(graph_of("residual_int8"))
    cuts = single_tensor_cuts(g)
    assert cuts[0] == (0, g.inputs[0])
    prod = g.producers()
    for c, t in cuts:
        # Every non-constant value read at or after c (or a graph output) is t or produced at or after c.
        const = {x.name for x in g.constants()}
        crossing = {x for op in g.ops[c:] for x in op.inputs if x and x not in const and prod.get(x, -1) < c}
        crossing |= {x for x in g.outputs if prod.get(x, -1) < c}
        assert crossing == {t}
    # A residual ADD reads two values: positions between the skip's source and the ADD are never cuts.
    add = next(i for i, op in enumerate(g.ops) if op.type == "add")
    skip_src = min(prod.get(x, -1) for x in g.ops[add].inputs)
    assert not any(skip_src + 1 < c <= add for c, _ in cuts)


@pytest.mark.parametrize("fixture", ["digits_cnn_int8", "residual_int8"])
def test_suffix_training_equals_whole_graph_training(fixture):
    g = graph_of(fixture)
    fg = C.dequantize_graph(g)
    ops = TrainPlan.trainable_ops(fg)
    last = ops[-1]
    plan = TrainPlan([LayerPlan(fg.ops[last].inputs[1], bias=True, weight_ratio=0.5)])
    x, y = _data(fg, 24)
    xe, ye = _data(fg, 16, seed=1)
    opt = OptimizerSpec(kind="sgd", learning_rate=0.05)

    whole = build_training_graph(fg, plan, "cross_entropy", opt, 1)
    losses_w, state_w = train(whole, x, y, steps=24, seed=3)

    pre = FrozenPrefix(fg, {"tune": x, "eval": xe})
    cut = pre.cut_before(pre.first_trained_op([fg.ops[last].inputs[1]]))
    assert 0 < cut[0] <= last                               # something is skipped, nothing trained is
    sg = pre.suffix(cut)
    part = build_training_graph(sg, plan, "cross_entropy", opt, 1)
    losses_s, state_s = train(part, pre.activations(cut, "tune"), y, steps=24, seed=3)
    np.testing.assert_allclose(losses_s, losses_w, rtol=1e-5, atol=1e-6)
    for name in whole.meta["train"]["trained"]:
        np.testing.assert_allclose(state_s[name], state_w[name], rtol=1e-5, atol=1e-6)
    # Held-out scoring from the cut = scoring the whole graph.
    params = {n: state_w[n] for n in whole.meta["train"]["trained"]}
    acc_whole = C.evaluate(fg, params, xe, ye)
    assert C.evaluate(sg, params, pre.activations(cut, "eval"), ye) == acc_whole
    # The cached cut activations are the whole graph's intermediate values.
    ref = run_graph(fg, {fg.inputs[0]: xe}, keep_intermediates=True)[cut[1]]
    np.testing.assert_allclose(pre.activations(cut, "eval"), ref, rtol=1e-5, atol=1e-6)


def test_measure_uses_the_cut_and_matches_the_whole_graph():
    """make_measure (suffix after the cache) scores a unit as fine-tuning the whole graph (on the same fast float
    forward) does."""
    from types import SimpleNamespace

    g = graph_of("digits_cnn_int8")
    fg = C.dequantize_graph(g)
    x, y = _data(fg, 40)
    ds = SimpleNamespace(x_train=x, y_train=y, regression=False, x_test=x[:2], y_test=y[:2])
    settings = C.AnalysisSettings(samples=24, eval_samples=16)
    import tinytrain.stages.train.data as D
    orig = D.check_compatible
    D.check_compatible = lambda *a, **k: None
    try:
        measure = C.make_measure(g, ds, settings)
    finally:
        D.check_compatible = orig
    last = TrainPlan.trainable_ops(fg)[-1]
    plan = TrainPlan([LayerPlan(fg.ops[last].inputs[1], bias=True, weight_ratio=1.0)])
    got = measure(plan)
    x_tu, y_tu, x_ev, y_ev = C.holdout_split(ds, settings)
    tg = build_training_graph(fg, plan, "cross_entropy", OptimizerSpec(kind="sgd", learning_rate=0.01), 1)
    losses, state = train(tg, x_tu, y_tu, steps=len(x_tu), seed=0, forward_op=fast_float.run_op)
    want = C.evaluate(fg, {n: state[n] for n in tg.meta["train"]["trained"]}, x_ev, y_ev)
    assert got["accuracy"] == want
    assert got["train_loss"] == pytest.approx(float(np.mean(losses[-max(1, len(losses) // 10):])), rel=1e-5)


def _table(weight_deltas, bias_deltas, ref_acc=0.6):
    """A contribution table with measured and estimated options (first-order gains given)."""
    bias = [{"k": i + 1, "first_order": fo, "delta": d, **({"estimated": True} if d is None else {})}
            for i, (fo, d) in enumerate(bias_deltas)]
    weights = [{"op": i, "ratio": 1.0, "first_order": fo, "delta": d, **({"estimated": True} if d is None else {})}
               for i, (fo, d) in enumerate(weight_deltas)]
    for e in bias + weights:
        if e["delta"] is None:
            e["delta"] = 0.0
    return {"reference": {"accuracy": ref_acc}, "bias": bias, "weights": weights}


def test_noisy_negative_weights_do_not_zero_the_weights_scale():
    """Three weight options measured a little negative: on 20 held-out samples (±16 points of noise) that is no
    evidence, and the other weights keep the scale fitted on both kinds; on 4096 samples it is, and their scale
    drops to 0 while the biases keep their own."""
    bias = [(0.1, 0.05), (0.2, 0.10), (0.3, None)]
    weights = [(0.2, -0.01), (0.25, -0.02), (0.3, -0.01), (0.5, None)]
    noisy = _table(weights, bias)
    est = C._fill_estimates(noisy, held_out=20)
    assert est["scale"]["weights"] == est["scale"]["bias"] == est["pooled_scale"] > 0
    assert noisy["weights"][3]["delta"] > 0
    exact = _table(weights, bias)
    est2 = C._fill_estimates(exact, held_out=4096)
    assert est2["scale"]["weights"] == 0.0 and exact["weights"][3]["delta"] == 0.0
    assert est2["scale"]["bias"] == pytest.approx(0.5) and exact["bias"][2]["delta"] == pytest.approx(0.15)


def test_nothing_measured_keeps_the_first_order_ranking():
    t = _table([(0.5, None), (0.1, None)], [(0.2, None)])
    est = C._fill_estimates(t, held_out=256)
    assert est["scale"] == {"bias": 1.0, "weights": 1.0}
    assert [w["delta"] for w in t["weights"]] == [0.5, 0.1]


@pytest.mark.parametrize("kh,stride,padding,dil,act", [(1, 1, "same", 1, "none"), (3, 1, "same", 1, "relu6"),
                                                       (3, 2, "same", 1, "relu"), (3, 2, "valid", 1, "none"),
                                                       (5, 1, "valid", 2, "relu"), (1, 2, "valid", 1, "relu6")])
def test_fast_float_conv2d_matches_the_reference_executor(kh, stride, padding, dil, act):
    """fast_float's BLAS conv2d = the reference executor's float conv2d up to float32 rounding order."""
    from tinytrain.stages.golden.forward import run_op as ref_run_op
    from tinytrain.stages.model.ir import Graph, Op, Tensor

    rng = np.random.default_rng(kh * 10 + stride)
    x = rng.standard_normal((3, 11, 9, 5)).astype(np.float32)
    w = rng.standard_normal((7, kh, kh, 5)).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    attrs = {"stride_h": stride, "stride_w": stride, "padding": padding, "dilation_h": dil, "dilation_w": dil,
             "act": act}
    got = fast_float.conv2d(x, w, b, attrs)
    tensors = {"x": Tensor("x", [1, 11, 9, 5], "float32"), "w": Tensor("w", list(w.shape), "float32", data=w),
               "b": Tensor("b", [7], "float32", data=b), "y": Tensor("y", [1, *got.shape[1:]], "float32")}
    op = Op("conv2d", ["x", "w", "b"], ["y"], attrs)
    g = Graph(tensors=tensors, ops=[op], inputs=["x"], outputs=["y"])
    want = ref_run_op(g, op, {"x": x, "w": w, "b": b}, n=3)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fast_float.run_op(g, op, {"x": x, "w": w, "b": b}, n=3)[0].shape == want.shape


@pytest.mark.parametrize("kh,stride,padding,dil,act,mult", [(3, 1, "same", 1, "relu6", 1), (3, 2, "same", 1, "none", 1),
                                                            (3, 2, "valid", 1, "relu", 2), (5, 1, "same", 2, "none", 1),
                                                            (1, 1, "valid", 1, "relu6", 3)])
def test_fast_float_depthwise_matches_the_reference_executor(kh, stride, padding, dil, act, mult):
    """fast_float's depthwise (one multiply-add per tap, depth multiplier by repeating channels) = the reference
    executor's float depthwise up to float32 rounding order."""
    from tinytrain.stages.golden.forward import run_op as ref_run_op
    from tinytrain.stages.model.ir import Graph, Op, Tensor

    rng = np.random.default_rng(kh * 10 + stride + mult)
    x = rng.standard_normal((3, 11, 9, 4)).astype(np.float32)
    w = rng.standard_normal((1, kh, kh, 4 * mult)).astype(np.float32)
    b = rng.standard_normal(4 * mult).astype(np.float32)
    attrs = {"stride_h": stride, "stride_w": stride, "padding": padding, "dilation_h": dil, "dilation_w": dil,
             "act": act, "depth_multiplier": mult}
    got = fast_float.depthwise_conv2d(x, w, b, attrs)
    tensors = {"x": Tensor("x", [1, 11, 9, 4], "float32"), "w": Tensor("w", list(w.shape), "float32", data=w),
               "b": Tensor("b", [4 * mult], "float32", data=b), "y": Tensor("y", [1, *got.shape[1:]], "float32")}
    op = Op("depthwise_conv2d", ["x", "w", "b"], ["y"], attrs)
    g = Graph(tensors=tensors, ops=[op], inputs=["x"], outputs=["y"])
    want = ref_run_op(g, op, {"x": x, "w": w, "b": b}, n=3)[0]
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fast_float.run_op(g, op, {"x": x, "w": w, "b": b}, n=3)[0], got)


@pytest.mark.parametrize("k", [None, 3])
def test_fast_float_pointwise_backward_matches_grad_ops(k):
    from tinytrain.stages.golden import grad_ops as go
    from tinytrain.stages.model.ir import Op

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 6, 5, 8)).astype(np.float32)
    w = rng.standard_normal((12, 1, 1, 8)).astype(np.float32)
    dy = rng.standard_normal((1, 6, 5, 12)).astype(np.float32)
    attrs = {"stride_h": 1, "stride_w": 1, "padding": "same", "w_shape": [12, 1, 1, 8], "in_channels": k}
    gi = Op("conv2d_grad_input", ["dy", "w"], ["dx"], attrs)
    gw = Op("conv2d_grad_weight", ["dy", "x"], ["dw"], attrs)
    vals = {"dy": dy, "w": w, "x": x}
    got_i = fast_float.backward_op(gi, lambda j: vals[gi.inputs[j]])[0]
    got_w = fast_float.backward_op(gw, lambda j: vals[gw.inputs[j]])[0]
    np.testing.assert_allclose(got_i, go.conv2d_grad_input(dy, w, list(x.shape), attrs), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_w, go.conv2d_grad_weight(dy, x, [12, 1, 1, 8], attrs, k), rtol=1e-5, atol=1e-5)
    # Strided or 3x3: left to grad_ops.
    assert fast_float.backward_op(Op("conv2d_grad_input", ["dy", "w"], ["dx"], {**attrs, "stride_h": 2}),
                                  lambda j: vals[gi.inputs[j]]) is None


def test_fast_training_tracks_the_reference_training():
    """The analysis' fast ops train as the golden model does, up to float32 rounding (dwsep: 1x1 and depthwise)."""
    fg = C.dequantize_graph(graph_of("dwsep_int8"))
    x, y = _data(fg, 16)
    tg = build_training_graph(fg, TrainPlan.full(fg), "cross_entropy", OptimizerSpec(kind="sgd", learning_rate=0.05),
                              1)
    la, sa = train(tg, x, y, steps=16, seed=1)
    lb, sb = train(tg, x, y, steps=16, seed=1, forward_op=fast_float.run_op, backward_op=fast_float.backward_op)
    np.testing.assert_allclose(lb, la, rtol=1e-4, atol=1e-5)
    for name in tg.meta["train"]["trained"]:
        np.testing.assert_allclose(sb[name], sa[name], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,o,act,bias,keep", [((1, 1280), 10, "none", False, False), ((7, 33), 5, "relu6", True, False),
                                                  ((4, 1, 1, 24), 6, "relu", True, False),
                                                  ((2, 3, 16), 4, "none", True, True)])
def test_fast_float_fully_connected_is_the_reference_bit_for_bit(shape, o, act, bias, keep):
    """fast_float's fully_connected adds the products in the reference kernel's order (np.add.accumulate): the same
    bits, so the analysis' choices do not move; shapes as the reference's (keep_num_dims, a 4-D input)."""
    from tinytrain.stages.golden.forward import run_op as ref_run_op
    from tinytrain.stages.model.ir import Graph, Op, Tensor

    rng = np.random.default_rng(sum(shape) + o)
    depth = shape[-1] if len(shape) != 4 else int(np.prod(shape[1:]))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal((o, depth)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if bias else None
    y_shape = [1, *shape[1:-1], o] if keep else [1, o]
    tensors = {"x": Tensor("x", [1, *shape[1:]], "float32"), "w": Tensor("w", [o, depth], "float32", data=w),
               "y": Tensor("y", y_shape, "float32")}
    if bias:
        tensors["b"] = Tensor("b", [o], "float32", data=b)
    op = Op("fully_connected", ["x", "w", "b" if bias else None], ["y"], {"act": act, "keep_num_dims": keep})
    g = Graph(tensors=tensors, ops=[op], inputs=["x"], outputs=["y"])
    values = {"x": x, "w": w, **({"b": b} if bias else {})}
    want = ref_run_op(g, op, values, n=shape[0])[0]
    got = fast_float.run_op(g, op, values, n=shape[0])[0]
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32
    assert got.tobytes() == want.tobytes()


def test_parallel_measurements_equal_the_sequential_ones(monkeypatch):
    """Analysis.measure runs the units still to measure side by side in forked workers: each result (and so the
    table) is exactly what measuring them one by one in this process gives; a failing worker falls back to that."""
    from types import SimpleNamespace

    g = graph_of("residual_int8")
    fg = C.dequantize_graph(g)
    x, y = _data(fg, 48)
    ds = SimpleNamespace(x_train=x, y_train=y, regression=False, x_test=x[:2], y_test=y[:2])
    settings = C.AnalysisSettings(samples=24, eval_samples=16)
    import tinytrain.stages.train.data as D
    monkeypatch.setattr(D, "check_compatible", lambda *a, **k: None)

    def table(workers: int, measure=None) -> dict:
        monkeypatch.setattr(C, "worker_count", lambda: workers)
        m = measure or C.make_measure(g, ds, settings)
        an = C.Analysis(g, m, settings, graph_dig="g", data_dig="d")
        an.measure_all()
        return an.table()

    one = table(1)
    assert table(2) == one and one["measured"] == len({u["key"] for u in one["units"]})
    import os
    parent = os.getpid()
    real = C.make_measure(g, ds, settings)

    def failing(plan):     # fails in every worker (with an error that does not even pickle), works here
        if os.getpid() != parent:
            raise C.ContributionError("worker", hint="x")
        return real(plan)

    failing.warm = real.warm
    assert table(2, failing) == one
