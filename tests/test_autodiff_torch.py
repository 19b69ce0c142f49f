"""Training IR (autodiff + numpy training executor) vs PyTorch, step for step (issue 4, "Done when").

Each case trains a float fixture model for 50 steps in both, from the same weights on the same batches, and
compares the loss of every step within 1e-4 relative. PyTorch runs its own optimizers (torch.optim.SGD with and
without momentum, Adam, RMSprop; foreach=False) and losses (F.cross_entropy / F.mse_loss, mean reduction) on a
twin of the IR built from the IR's weights (tests/torch_mirror.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from tinytrain.stages.autodiff import OptimizerSpec, build_training_graph  # noqa: E402
from tinytrain.stages.train.runtime_config import OPTIMIZER_DEFAULTS  # noqa: E402
from tinytrain.stages.model.tflite_reader import read_model  # noqa: E402
from tinytrain.stages.golden.train_step import init_state, train, train_step  # noqa: E402
from tinytrain.stages.planning.train_plan import LayerPlan, PlanError, TrainPlan  # noqa: E402

from torch_mirror import TorchMirror  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
STEPS = 50
RTOL = 1e-4
LR = {"sgd": 0.05, "momentum": 0.02, "adam": 0.003, "rmsprop": 0.002}

torch.set_num_threads(1)


def _graph(model: str):
    return read_model(FIX / f"{model}_float.tflite")


def _torch_opt(kind: str, params, lr: float):
    # With tinytrain's default hyper-parameters (OptimizerSpec(kind) takes them), which are not PyTorch's.
    d = OPTIMIZER_DEFAULTS
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=d.momentum, foreach=False)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(d.beta1, d.beta2), eps=d.eps, foreach=False)
    return torch.optim.RMSprop(params, lr=lr, alpha=d.alpha, eps=d.eps, foreach=False)


def partial_plan(graph) -> TrainPlan:
    """The last layer in full and the biases of all the others."""
    ops = TrainPlan.trainable_ops(graph)
    return TrainPlan([LayerPlan(i, bias=True, weight_ratio=1.0 if i == ops[-1] else 0.0) for i in ops])


def _data(tg, loss: str, batch: int, seed: int = 0):
    """STEPS batches: inputs N(0,1), labels uniform, MSE targets N(0, 0.5)."""
    rng = np.random.default_rng(seed)
    x_t = tg.tensors[tg.inputs[0]]
    pred = tg.tensors[tg.meta["train"]["prediction"]]
    n = 16  # a small set that the steps cycle through, so the loss falls (but not to the float32 noise floor)
    x = rng.standard_normal([n] + list(x_t.shape[1:])).astype(np.float32)
    if loss == "cross_entropy":
        y = rng.integers(0, pred.shape[-1], size=n).astype(np.int32)
    else:
        y = (0.5 * rng.standard_normal([n] + list(pred.shape[1:]))).astype(np.float32)
    return x, y


def run_both(model, kind, loss, batch, plan_fn=TrainPlan.full, mask_slices=False):
    g = _graph(model)
    plan = plan_fn(g)
    tg = build_training_graph(g, plan, loss, OptimizerSpec(kind), batch)
    x, y = _data(tg, loss, batch)
    lr = LR[kind]

    state = init_state(tg)
    ours = []
    for s in range(STEPS):
        idx = np.arange(s * batch, (s + 1) * batch) % len(x)
        ours.append(train_step(tg, state, x[idx], y[idx], {"learning_rate": lr}))

    net = TorchMirror(g)
    trained = tg.meta["train"]["trained"]
    for name in net.names:
        p = net.param(name)
        p.requires_grad_(name in trained)
        n = trained.get(name, {}).get("n")
        if mask_slices and n is not None:
            # Zeroed gradients leave SGD/momentum/Adam/RMSprop's state and update exactly 0 there.
            keep = torch.zeros(p.shape)
            keep[..., :_slice_len(tg, name)] = 1
            p.register_hook(lambda grad, keep=keep: grad * keep)
    opt = _torch_opt(kind, [net.param(n) for n in net.names if n in trained], lr)
    pred = tg.meta["train"]["prediction"]
    theirs = []
    for s in range(STEPS):
        idx = np.arange(s * batch, (s + 1) * batch) % len(x)
        opt.zero_grad()
        out = net(torch.tensor(x[idx]), upto=pred)
        if loss == "cross_entropy":
            lv = F.cross_entropy(out.reshape(batch, -1), torch.tensor(y[idx]).long())
        else:
            lv = F.mse_loss(out, torch.tensor(y[idx]))
        lv.backward()
        opt.step()
        theirs.append(lv.item())
    return np.array(ours), np.array(theirs), tg, state, net


def _slice_len(tg, name):
    return tg.tensors[tg.meta["train"]["trained"][name]["gradient"]].shape[-1]


def check(ours, theirs, batch):
    # atol: a cross-entropy near 0 is log(Σe) − z_label with Σe ≈ 1, so both sides carry an absolute error of a
    # float32 ulp of 1 (1.2e-7) whatever the relative tolerance says.
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=1e-6)
    # The steps cycle through the 16 samples: compare the last full cycle with the first.
    period = 16 // batch
    assert ours[-period:].mean() < ours[:period].mean(), "training should lower the loss on a small repeated set"


OPTS = ["sgd", "momentum", "adam", "rmsprop"]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("kind", OPTS)
def test_residual_full(kind, loss, batch):
    """Fan-out (one tensor read by a conv and the add), residual ADD, shared bias constant, MEAN, RELU op."""
    check(*run_both("residual", kind, loss, batch)[:2], batch)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("kind", OPTS)
def test_mlp(kind, batch):
    check(*run_both("mlp", kind, "cross_entropy", batch)[:2], batch)


@pytest.mark.parametrize("kind,loss,batch", [("sgd", "cross_entropy", 8), ("adam", "mse", 1),
                                             ("momentum", "cross_entropy", 1), ("rmsprop", "mse", 8)])
def test_convnet(kind, loss, batch):
    """conv SAME/VALID, relu6/relu fused, max and average pool, reshape; MSE goes through the softmax."""
    check(*run_both("convnet", kind, loss, batch)[:2], batch)


@pytest.mark.parametrize("kind,batch", [("adam", 8), ("sgd", 1)])
def test_dwsep_and_mbv2(kind, batch):
    """Depthwise (stride 2, multiplier 2, dilation), PAD, CONCATENATION, RELU6 op, MEAN keep_dims; an ADD with the
    graph input (no gradient below it)."""
    check(*run_both("dwsep", kind, "mse", batch)[:2], batch)
    check(*run_both("mbv2_block", kind, "mse", batch)[:2], batch)


@pytest.mark.parametrize("kind", OPTS)
@pytest.mark.parametrize("model", ["residual", "convnet"])
def test_partial_plan(model, kind):
    ours, theirs, tg, state, net = run_both(model, kind, "cross_entropy", 8, partial_plan)
    check(ours, theirs, 8)
    # Frozen weights got no gradient op and did not move.
    g = _graph(model)
    ops = TrainPlan.trainable_ops(g)
    frozen = [g.ops[i].inputs[1] for i in ops[:-1]]
    assert not any(op.type.endswith("_grad_weight") and op.outputs[0].startswith(tuple(f"grad/{w}#" for w in frozen))
                   for op in tg.ops)
    for w in frozen:
        assert w not in state


def test_sliced_weights_match_masked_torch():
    """Ratio 1/2 on every conv/FC weight: only input channels [0, ceil(C/2)) train, in both."""
    def half(g):
        return TrainPlan([LayerPlan(i, bias=True, weight_ratio=0.5) for i in TrainPlan.trainable_ops(g)])
    ours, theirs, tg, state, net = run_both("convnet", "adam", "cross_entropy", 8, half, mask_slices=True)
    check(ours, theirs, 8)
    g = _graph("convnet")
    for i in TrainPlan.trainable_ops(g):
        w = g.ops[i].inputs[1]
        c = g.tensors[w].shape[-1]
        k = -(-c // 2)
        assert tg.tensors[tg.meta["train"]["trained"][w]["gradient"]].shape[-1] == k
        np.testing.assert_array_equal(state[w][..., k:], g.tensors[w].data[..., k:])
        assert not np.array_equal(state[w][..., :k], g.tensors[w].data[..., :k])


def test_pruning_below_earliest_trained_layer():
    g = _graph("convnet")
    tg = build_training_graph(g, TrainPlan.last_k(g, 1), "cross_entropy", OptimizerSpec("sgd"), 1)
    types = [op.type for op in tg.ops]
    assert "conv2d_grad_input" not in types and "conv2d_grad_weight" not in types
    assert "fully_connected_grad_input" not in types and "max_pool2d_grad" not in types
    assert types.count("fully_connected_grad_weight") == 1 and types.count("sgd_update") == 2
    tg = build_training_graph(g, TrainPlan.bias_only(g), "cross_entropy", OptimizerSpec("sgd"), 1)
    types = [op.type for op in tg.ops]
    assert not any(t.endswith("_grad_weight") for t in types)
    assert types.count("conv2d_grad_input") == 1  # the second conv's; nothing below the first


def test_runtime_lr_needs_no_rebuild_and_roles():
    g = _graph("mlp")
    tg = build_training_graph(g, TrainPlan.full(g), "cross_entropy", OptimizerSpec("adam"), 8)
    x, y = _data(tg, "cross_entropy", 8)
    l1, _ = train(tg, x, y, {"learning_rate": 0.01}, steps=5, shuffle=False)
    l2, _ = train(tg, x, y, {"learning_rate": 0.0}, steps=5, shuffle=False)
    assert l1[0] == l2[0] and l1[-1] < l2[-1] and len(set(l2)) <= 2  # lr 0: the weights stay put
    ups = [op for op in tg.ops if op.type == "adam_update"]
    assert ups and all(op.attrs["learning_rate_ref"] == "runtime.learning_rate" for op in ups)
    roles = {t.role for t in tg.tensors.values()}
    assert {"gradient", "optimizer_state"} <= roles
    text = tg.to_text()
    assert "softmax_ce_loss" in text and "batch_accumulate" in text


def test_plan_json_and_errors():
    g = _graph("convnet")
    p = TrainPlan([LayerPlan(0, bias=True, weight_ratio=0.125), LayerPlan(g.ops[5].inputs[1], True, 1.0)])
    assert TrainPlan.loads(p.dumps()) == p
    assert TrainPlan.from_json({"layers": [{"layer": 0, "weight_ratio": "1/8"}]}).layers[0].weight_ratio == 0.125
    with pytest.raises(PlanError, match="not a trainable layer"):
        TrainPlan([LayerPlan(1, True, 1.0)]).resolve(g)  # op 1 is the max pool
    with pytest.raises(PlanError, match="not one of"):
        TrainPlan([LayerPlan(0, True, 0.3)]).resolve(g)


def test_stage_run_writes_train_graph(tmp_path):
    from tinytrain.pipeline.contract import StageContext
    from tinytrain.stages.autodiff import run
    from tinytrain.stages.model.ir import Graph

    src = tmp_path / "load"
    src.mkdir()
    g = _graph("residual")
    gpath, _ = g.save(src)
    out = tmp_path / "out"
    out.mkdir()
    res = run(StageContext(config={"train.loss": "mse", "train.optimizer": "momentum", "train.batch_size": 4},
                           inputs={"load/graph.json": gpath}, out_dir=out))
    assert res.metrics["backward_ops"] > 0
    # 3 weights, the FC bias and the one bias constant both convs share.
    assert (out / "train_graph.txt").read_text().count("momentum_update") == 5
    back = Graph.load(out, stem="train_")
    assert back.meta["train"]["batch_size"] == 4 and back.to_text() == (out / "train_graph.txt").read_text()
    x, y = _data(back, "mse", 4)
    losses, _ = train(back, x, y, {"learning_rate": 0.01}, steps=8, shuffle=False)
    assert np.isfinite(losses).all()


# ---- element-wise ops, activations and slices (MUL, SUB, LOGISTIC, TANH, HARD_SWISH, LEAKY_RELU, PRELU,
# STRIDED_SLICE): converter-made fixtures of tests/fixtures/ops/ (README there) --------------------------------

# act_arith: conv -> logistic and tanh of it (fan-out of 3) -> mul (fused relu) -> sub (conv − mul) -> hard_swish
#            -> leaky_relu -> mul by a constant [8] -> sub of a constant [1,1,8] (fused relu6).
# prelu_slice: conv -> prelu (alpha [1,1,8]) -> strided_slice x[:, 1:7:2, ::-1, 2:8] -> conv 1x1 -> prelu (alpha
#            [3,8,6]) -> strided_slice x[:, :, 1, :] (shrink). Their outputs are feature maps: MSE only.
OP_MODELS = ["ops/act_arith", "ops/prelu_slice"]


@pytest.mark.parametrize("kind,batch", [("sgd", 1), ("sgd", 8), ("adam", 1), ("adam", 8)])
@pytest.mark.parametrize("model", OP_MODELS)
def test_elementwise_and_slice_ops(model, kind, batch):
    ours, theirs, tg, _, _ = run_both(model, kind, "mse", batch)
    check(ours, theirs, batch)
    types = {op.type for op in tg.ops}
    want = {"ops/act_arith": {"mul_grad", "sub_grad", "logistic_grad", "tanh_grad", "hard_swish_grad",
                              "leaky_relu_grad", "act_grad"},
            "ops/prelu_slice": {"prelu_grad", "strided_slice_grad"}}[model]
    assert want <= types


@pytest.mark.parametrize("model", OP_MODELS)
def test_elementwise_ops_first_gradient_matches_torch(model):
    """One sample's parameter gradients (before any update) against torch autograd: the whole chain of new
    backward ops, not only the loss it leads to."""
    from tinytrain.stages.golden.train_step import run_sample

    g = _graph(model)
    tg = build_training_graph(g, TrainPlan.full(g), "mse", OptimizerSpec("sgd"), 1)
    x, y = _data(tg, "mse", 1)
    vals = run_sample(tg, init_state(tg), x[:1], y[:1])
    net = TorchMirror(g)
    F.mse_loss(net(torch.tensor(x[:1]), upto=tg.meta["train"]["prediction"]), torch.tensor(y[:1])).backward()
    for p, d in tg.meta["train"]["trained"].items():
        want = net.param(p).grad.numpy()
        np.testing.assert_allclose(vals[d["gradient"]], want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


def test_constant_operands_get_no_gradient():
    """act_arith's MUL by a constant [8] and SUB of a constant [1,1,8] (BatchNorm-like): the activation operand
    gets its gradient, the constant none (not a trained parameter); the mul of logistic and tanh gets both."""
    g = _graph("ops/act_arith")
    tg = build_training_graph(g, TrainPlan.full(g), "mse", OptimizerSpec("sgd"), 1)
    consts = {t.name for t in g.constants()}
    muls = [op for op in tg.ops if op.type == "mul_grad"]
    assert len(muls) == 3  # two for logistic·tanh, one for leaky_relu·const
    assert not any(o.split("#")[0][len("grad/"):] in consts for op in tg.ops for o in op.outputs
                   if o.startswith("grad/") and op.type in ("mul_grad", "sub_grad"))
    subs = [op for op in tg.ops if op.type == "sub_grad"]
    assert sorted(op.attrs["which"] for op in subs) == [[0], [0, 1]]
