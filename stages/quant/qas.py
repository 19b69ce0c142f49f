"""Real-int8 parameter updates with Quantization-Aware Scaling (DESIGN §6; TTE, Lin et al. 2022 §2.1).

The golden definition of the `qas_*_update` ops of the training IR (stages/autodiff.py) and of the PRNG behind
stochastic rounding. Everything here is float32 or exact integer arithmetic, in an order the C runtime repeats
(compiled with -ffp-contract=off), so that host, QEMU and this reference agree bit for bit.

An int8 weight W̄ has the per-output-channel scale s_W (W = s_W·W̄, zero point 0); an int32 bias B̄ has the scale
s_B = s_x·s_W (the accumulator's: input activation scale times the channel's weight scale). The backward pass
gives the fp32 gradient G of the *real* parameter. One update of the trained slice P̄ = p[..., :n] with scale s
(the scale of each element's output channel, a float32 constant tensor in the IR):

  1. gg = G · f32(1/B)                                  (B = batch size; G is the sum over the batch)
     QAS on:   if wd: gg = gg + wd · (s · P)            (the real weight; P = P̄ as float, or the master copy)
     QAS off:  gg = gg · s;  if wd: gg = gg + wd · P    (G_W̄ = s·G_W: the gradient of the integer parameter)
  2. d = the optimizer's fp32 step from gg, with the float optimizers' own formulas and fp32 state
     (grad_ops.sgd_step / momentum_step / adam_step / rmsprop_step):
       sgd       d = lr·gg
       momentum  buf = μ·buf; buf = buf + gg; d = lr·buf
       adam      m = m + (gg − m)·(1−β1); v = β2·v; v = v + (1−β2)·gg·gg;
                 d = f32(lr/bc1) · m / (sqrt(v) / f32(sqrt(bc2)) + eps)      bc_i = 1 − β_i^step (double, then f32)
       rmsprop   sq = α·sq; sq = sq + (1−α)·gg·gg; d = lr·gg / (sqrt(sq) + eps)
     With QAS on the state is in real units (identical to fp32 training's); with QAS off, in integer units.
  3. Δ = −d / s (QAS on: ΔW̄ = −lr·G_W/s_W, ΔB̄ = −lr·G_b/(s_x·s_W) for SGD)   or   Δ = −d (QAS off: the naive
     update of the integer tensor as if it were the float one, ΔW̄ = −lr·s_W·G_W).
  4. Without a master copy: r = round(Δ), P̄ = clamp(P̄ + r, lo, hi) in integer arithmetic (the update is rounded,
     not the sum, so a bias above 2^24 keeps every bit). Bounds: [−127, 127] for int8 weights (the TFLite
     int8 weight range), [INT32_MIN, INT32_MAX] for int32 biases. Before the float → integer conversion Δ is
     clamped to ±2^40 (no C undefined behaviour on huge steps; NaN is not guarded).
       nearest     r = round half away from zero (C roundf)
       stochastic  r = floor(Δ + u) (float32 add, then floorf), u uniform in [0, 1) from the PRNG, one draw per
                   element of the trained slice in its row-major order
     With a master copy M (fp32, integer units, initialised to P̄ of the model): M = M + Δ;
     P̄ = clamp(roundf(M), lo, hi) (round half away from zero; no PRNG). Master copies exist for int8 weights
     only: an int32 bias already resolves steps far below one real LSB of the weights, and float32 would hold a
     bias above 2^24 less precisely than the int32 does.

PRNG (xorshift32, Marsaglia 2003, shifts 13/17/5), one stream per trained tensor that rounds stochastically,
so results do not depend on the order in which a schedule runs the updates:
  state: uint32 (an int32 tensor holding the bits; the IR has no uint32 dtype)
  seed:  x0 = (seed + stream · 0x6D2B79F5) mod 2^32, and 0x9E3779B9 when that is 0
         (seed = runtime value train.seed; stream = the update op's `stream` attr, 0, 1, 2, ... in op order)
  draw:  x ^= x << 13; x ^= x >> 17; x ^= x << 5 (all mod 2^32); u = (x >> 8) · 2^-24 (exact in float32)
"""

from __future__ import annotations

import numpy as np

from tinytrain.stages.golden import grad_ops as go

F32 = np.float32
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
WEIGHT_RANGE = (-127, 127)
BIAS_RANGE = (INT32_MIN, INT32_MAX)
PRNG_ZERO_SEED_STATE = 0x9E3779B9
PRNG_STREAM_INCREMENT = 0x6D2B79F5
_DELTA_LIMIT = F32(2.0 ** 40)
ROUNDINGS = ("nearest", "stochastic")
# Optimizer state tensors per trained tensor (opt/<p>/<name>, fp32 on the gradient's shape), float and QAS alike.
STATE_NAMES = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v"), "rmsprop": ("square_avg",)}
STATE_COUNT = {k: len(v) for k, v in STATE_NAMES.items()}


# ---- PRNG ----------------------------------------------------------------------------------------------------

def seed_state(seed: int, stream: int = 0) -> int:
    x = (int(seed) + int(stream) * PRNG_STREAM_INCREMENT) & 0xFFFFFFFF
    return x or PRNG_ZERO_SEED_STATE  # xorshift's all-zero state is a fixed point


def xorshift32_next(x: int) -> int:
    """One step, scalar: the reference the C runtime transcribes."""
    x &= 0xFFFFFFFF
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    return x


# xorshift32 is linear over GF(2): the k-th state is M^k · x0. Row k of _BASIS holds M^(k+1)·e_j for the 32 unit
# vectors e_j, so n draws are an XOR of the columns picked by x0's set bits: numpy-fast, and the same numbers as
# the scalar loop (a test checks).
_BASIS = np.zeros((0, 32), np.uint32)


def _basis(n: int) -> np.ndarray:
    global _BASIS
    if len(_BASIS) < n:
        rows = [_BASIS] if len(_BASIS) else []
        x = _BASIS[-1].copy() if len(_BASIS) else (np.uint32(1) << np.arange(32, dtype=np.uint32))
        new = np.empty((max(n, 2 * len(_BASIS)) - len(_BASIS), 32), np.uint32)
        for k in range(len(new)):
            x = x ^ (x << np.uint32(13))
            x = x ^ (x >> np.uint32(17))
            x = x ^ (x << np.uint32(5))
            new[k] = x
        _BASIS = np.concatenate(rows + [new])
    return _BASIS[:n]


def xorshift32_draws(state: int, n: int) -> tuple[np.ndarray, int]:
    """The next n states (uint32) after `state`, and the new state (= the last of them)."""
    if n == 0:
        return np.zeros(0, np.uint32), int(state)
    b = _basis(n)
    bits = [j for j in range(32) if (int(state) >> j) & 1]
    vals = np.bitwise_xor.reduce(b[:, bits], axis=1) if bits else np.zeros(n, np.uint32)
    return vals.astype(np.uint32), int(vals[-1])


def uniforms(draws: np.ndarray) -> np.ndarray:
    """u = (x >> 8) · 2^-24: 24 bits, exactly representable, in [0, 1)."""
    return (draws >> np.uint32(8)).astype(F32) * F32(2.0 ** -24)


# ---- rounding ------------------------------------------------------------------------------------------------

def round_nearest(v: np.ndarray) -> np.ndarray:
    """C roundf: half away from zero (np.round would round half to even)."""
    v = np.clip(np.asarray(v, F32), -_DELTA_LIMIT, _DELTA_LIMIT)
    t = np.trunc(v)
    frac = v - t  # exact in float32
    return t.astype(np.int64) + (frac >= F32(0.5)) - (frac <= F32(-0.5))


def round_stochastic(v: np.ndarray, u: np.ndarray) -> np.ndarray:
    """floorf(v + u) with the float32 sum: rounds up with probability frac(v), unbiased in expectation."""
    v = np.clip(np.asarray(v, F32), -_DELTA_LIMIT, _DELTA_LIMIT)
    return np.floor((v + np.asarray(u, F32)).astype(F32)).astype(np.int64)


# ---- the update --------------------------------------------------------------------------------------------

def broadcast_scale(scale: np.ndarray, shape, axis: int, n: int | None) -> np.ndarray:
    """The float32 scale of every element of the trained slice p[..., :n] (scale indexed by `axis`)."""
    scale = np.asarray(scale, F32).reshape(-1)
    shape = list(shape)
    b = [1] * len(shape)
    b[axis] = -1
    full = np.broadcast_to(scale.reshape(b) if len(scale) > 1 else scale.reshape([1] * len(shape)), shape)
    return full[go._slice(n)]


def qas_update(kind: str, p: np.ndarray, g: np.ndarray, scale: np.ndarray, *, axis: int, n: int | None,
               state: list[np.ndarray], hp: dict[str, float], step: int = 0, batch_size: int = 1,
               qas: bool = True, rounding: str = "nearest", bounds: tuple[int, int] = WEIGHT_RANGE,
               master: np.ndarray | None = None, prng: np.ndarray | None = None) -> None:
    """One int8/int32 parameter update in place (p, state, master, prng all change in place); see the module
    docstring for the formulas. `hp`: learning_rate, weight_decay and the optimizer's own values."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}")
    sl = go._slice(n)
    s = broadcast_scale(scale, p.shape, axis, n)
    cur = master if master is not None else p[sl].astype(F32)
    wd = float(hp.get("weight_decay", 0.0))
    gg = go.prepare_grad(g, 1.0 / float(batch_size))
    if qas:
        if wd:
            gg = gg + F32(wd) * (s * cur)
    else:
        gg = gg * s
        if wd:
            gg = gg + F32(wd) * cur
    gg = gg.astype(F32)
    lr = hp["learning_rate"]
    if kind == "sgd":
        d = go.sgd_step(gg, lr)
    elif kind == "momentum":
        d = go.momentum_step(gg, state[0], lr, hp["momentum"])
    elif kind == "adam":
        d = go.adam_step(gg, state[0], state[1], int(step), lr, hp["beta1"], hp["beta2"], hp["eps"])
    elif kind == "rmsprop":
        d = go.rmsprop_step(gg, state[0], lr, hp["alpha"], hp["eps"])
    else:
        raise ValueError(f"unknown optimizer {kind!r}")
    d = np.asarray(d, F32)
    delta = (-d / s).astype(F32) if qas else (-d).astype(F32)
    lo, hi = bounds
    if master is not None:
        master += delta
        p[sl] = np.clip(round_nearest(master), lo, hi).astype(p.dtype)
        return
    if rounding == "stochastic":
        if prng is None:
            raise ValueError("stochastic rounding needs a PRNG state")
        draws, new = xorshift32_draws(int(np.asarray(prng).view(np.uint32)), int(delta.size))
        prng[...] = np.array(new, np.uint32).view(np.int32)
        r = round_stochastic(delta, uniforms(draws).reshape(delta.shape))
    else:
        r = round_nearest(delta)
    p[sl] = np.clip(p[sl].astype(np.int64) + r, lo, hi).astype(p.dtype)
