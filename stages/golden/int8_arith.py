"""Fixed-point arithmetic of TFLite's reference kernels, bit for bit, on numpy arrays.

Everything here mirrors `tensorflow/lite/kernels/internal/common.h`, `quantization_util.cc` and gemmlowp's
`fixedpoint/fixedpoint.h` as built by default (no TFLITE_SINGLE_ROUNDING: the "double rounding" path that
TFLite Micro also runs). Values are carried as int64 numpy arrays holding int32 quantities; wherever the C code
would wrap or saturate an int32 we do the same explicitly, so results match even on the edges.

The parameter helpers (`quantize_multiplier`, `activation_range`, ...) work on Python scalars with the exact
float/double mix of the C++ code, since the integer parameters they produce decide every output bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1


# ---- scalar parameter helpers (quantization_util.cc) -------------------------------------------

def round_half_away(x: float) -> int:
    """TfLiteRound / std::round on a double: ties away from zero (not Python's banker's rounding)."""
    t = math.trunc(x)
    frac = x - t  # exact: x and trunc(x) share the exponent range
    if frac >= 0.5:
        return t + 1
    if frac <= -0.5:
        return t - 1
    return t


def quantize_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier: real = q * 2^(shift - 31) with q a Q0.31 int32 mantissa in [2^30, 2^31).

    frexp, then round-half-away of m * 2^31; a mantissa that rounds up to 2^31 is halved (shift + 1); a shift
    below -31 would shift every bit out, so the reference flushes it to (0, 0)."""
    if real == 0.0:
        return 0, 0
    m, shift = math.frexp(real)
    q = round_half_away(m * float(1 << 31))
    if q == (1 << 31):
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if q > INT32_MAX:
        raise ValueError(f"multiplier {real!r} does not fit a Q0.31 mantissa")
    return int(q), int(shift)


def quantize_multiplier_smaller_than_one_exp(real: float) -> tuple[int, int]:
    """QuantizeMultiplierSmallerThanOneExp: as quantize_multiplier, and the reference checks shift <= 0."""
    q, shift = quantize_multiplier(real)
    if shift > 0:
        raise ValueError(f"multiplier {real!r} is not smaller than one")
    return q, shift


def quantize_multiplier_greater_than_one(real: float) -> tuple[int, int]:
    q, shift = quantize_multiplier(real)
    if shift < 0:
        raise ValueError(f"multiplier {real!r} is not greater than one")
    return q, shift


def f32(x: float) -> float:
    """Round a Python float to float32 (the C++ code keeps tensor scales as float)."""
    return float(np.float32(x))


def activation_range(act: str, scale: float, zero_point: int, qmin: int = -128, qmax: int = 127) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: the clamp bounds of a fused activation in the output's int space.

    `f / scale` is a float32 division and the result is rounded half away from zero (TfLiteRound on float)."""
    def quantize(f: float) -> int:
        return zero_point + round_half_away(f32(f32(f) / f32(scale)))

    if act == "none":
        return qmin, qmax
    if act == "relu":
        return max(qmin, quantize(0.0)), qmax
    if act == "relu6":
        return max(qmin, quantize(0.0)), min(qmax, quantize(6.0))
    if act == "relu_n1_to_1":
        return max(qmin, quantize(-1.0)), min(qmax, quantize(1.0))
    raise NotImplementedError(f"int8 fused activation {act!r}")


def relu_op_range(lo: float, hi: float | None, scale: float, zero_point: int) -> tuple[int, int]:
    """activations.cc QuantizedReluX: bounds of the standalone RELU/RELU6 ops, `roundf(act / scale)` in float32.
    hi=None is the unbounded RELU (upper bound = 127)."""
    qlo = max(-128, zero_point + round_half_away(f32(f32(lo) / f32(scale))))
    qhi = 127 if hi is None else min(127, zero_point + round_half_away(f32(f32(hi) / f32(scale))))
    return qlo, qhi


def softmax_params(beta: float, input_scale: float, scaled_diff_integer_bits: int = 5) -> tuple[int, int, int]:
    """PreprocessSoftmaxScaling + CalculateInputRadius, as activations.cc SoftmaxPrepare does for kReference.

    Returns (input_multiplier, input_left_shift, diff_min)."""
    max_real = float((1 << 31) - 1)  # double-rounding build; single rounding caps at 2^30 - 1
    real = min(float(beta) * float(input_scale) * float(1 << (31 - scaled_diff_integer_bits)), max_real)
    mult, left_shift = quantize_multiplier_greater_than_one(real)
    radius = calculate_input_radius(scaled_diff_integer_bits, left_shift)
    # `-1.0 * radius` assigned to an int: exact for these magnitudes.
    return mult, left_shift, -radius


def calculate_input_radius(input_integer_bits: int, input_left_shift: int, total_signed_bits: int = 31) -> int:
    max_input_rescaled = (1.0 * ((1 << input_integer_bits) - 1) * float(1 << (total_signed_bits - input_integer_bits))
                          / float(1 << input_left_shift))
    return int(math.floor(max_input_rescaled))


# ---- vectorised int32 primitives (gemmlowp fixedpoint.h, common.h) -----------------------------

def _i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def wrap32(x) -> np.ndarray:
    """Two's-complement wrap of int64 values to int32 range (what an overflowing int32 op gives in practice)."""
    x = _i64(x)
    return ((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def saturate32(x) -> np.ndarray:
    return np.clip(_i64(x), INT32_MIN, INT32_MAX)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul: round(a*b / 2^31), nudged +-2^30 and then truncated towards
    zero (C++ integer division), with INT32_MIN * INT32_MIN saturated to INT32_MAX."""
    a, b = _i64(a), _i64(b)
    overflow = (a == b) & (a == INT32_MIN)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    s = ab + nudge
    # Division by 2^31 truncating towards zero (not an arithmetic shift, which floors).
    q = np.where(s >= 0, s >> 31, -((-s) >> 31))
    return np.where(overflow, INT32_MAX, q)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: arithmetic shift right with round-to-nearest, ties away from zero
    (the threshold is one larger for negative x). `exponent` may be an array (per-channel shifts), 0..31."""
    x, e = _i64(x), _i64(exponent)
    if np.any(e < 0) or np.any(e > 31):
        raise ValueError("RoundingDivideByPOT exponent must be in 0..31")
    mask = (np.int64(1) << e) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0).astype(np.int64)
    return (x >> e) + (remainder > threshold).astype(np.int64)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """MultiplyByQuantizedMultiplier (double rounding): a left shift for shift > 0 (int32 multiply, wraps),
    SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT for shift < 0. The rounding happens twice,
    which is what the reference kernels and TFLite Micro do by default."""
    x, m, s = _i64(x), _i64(multiplier), _i64(shift)
    left = np.maximum(s, 0)
    right = np.maximum(-s, 0)
    shifted = wrap32(x * (np.int64(1) << left))
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, m), right)


def multiply_by_quantized_multiplier_smaller_than_one_exp(x, multiplier, left_shift) -> np.ndarray:
    """Used by ADD: RoundingDivideByPOT(SRDHM(x, m), -left_shift) with left_shift <= 0."""
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x, multiplier), -_i64(left_shift))


def multiply_by_quantized_multiplier_greater_than_one(x, multiplier, left_shift) -> np.ndarray:
    """Used by SOFTMAX: SRDHM(x * 2^left_shift, m) with the int32 multiply wrapping like C."""
    return saturating_rounding_doubling_high_mul(wrap32(_i64(x) * (np.int64(1) << _i64(left_shift))), multiplier)


def saturating_rounding_multiply_by_pot(x, exponent: int) -> np.ndarray:
    """gemmlowp SaturatingRoundingMultiplyByPOT<exponent>: a rounding right shift for exponent < 0, a left shift
    that saturates to INT32_MIN/MAX for exponent > 0."""
    x = _i64(x)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    out = wrap32(x << exponent)
    out = np.where(x > threshold, INT32_MAX, out)
    return np.where(x < -threshold, INT32_MIN, out)


def rounding_half_sum(a, b) -> np.ndarray:
    """gemmlowp RoundingHalfSum<int32>: (a + b +- 1) / 2 in int64, truncating towards zero."""
    s = _i64(a) + _i64(b)
    t = s + np.where(s >= 0, 1, -1)
    return np.where(t >= 0, t // 2, -((-t) // 2))


def count_leading_zeros32(x) -> np.ndarray:
    """CountLeadingZeros on uint32 (x is taken modulo 2^32); 32 for x == 0."""
    u = _i64(x) & 0xFFFFFFFF
    _, e = np.frexp(u.astype(np.float64))  # exact: u < 2^53, and frexp's exponent is the bit length
    return np.where(u == 0, 32, 32 - e.astype(np.int64))


# ---- gemmlowp transcendental helpers (FixedPoint<int32, k> carried as raw int64) -----------------

def _fx_mul(a, b) -> np.ndarray:
    """FixedPoint * FixedPoint: SRDHM of the raw values (integer bits add up)."""
    return saturating_rounding_doubling_high_mul(a, b)


def _fx_add(a, b) -> np.ndarray:
    return wrap32(_i64(a) + _i64(b))


def _fx_sub(a, b) -> np.ndarray:
    return wrap32(_i64(a) - _i64(b))


def _rescale(x, src_int_bits: int, dst_int_bits: int) -> np.ndarray:
    """gemmlowp Rescale<dst>(FixedPoint<.., src>)."""
    return saturating_rounding_multiply_by_pot(x, src_int_bits - dst_int_bits)


def exp_on_interval_between_negative_one_quarter_and_0_excl(a) -> np.ndarray:
    """exp(a) for a in [-1/4, 0) in Q0.31: Taylor expansion around -1/8 (gemmlowp constants)."""
    constant_term = 1895147668            # exp(-1/8) in Q0.31
    constant_1_over_3 = 715827883          # 1/3 in Q0.31
    x = _fx_add(a, 1 << 28)                # a + 1/8
    x2 = _fx_mul(x, x)
    x3 = _fx_mul(x2, x)
    x4 = _fx_mul(x2, x2)
    x4_over_4 = saturating_rounding_multiply_by_pot(x4, -2)
    inner = _fx_add(_fx_mul(_fx_add(x4_over_4, x3), constant_1_over_3), x2)
    x4_over_24_plus_x3_over_6_plus_x2_over_2 = saturating_rounding_multiply_by_pot(inner, -1)
    return _fx_add(constant_term, _fx_mul(constant_term, _fx_add(x, x4_over_24_plus_x3_over_6_plus_x2_over_2)))


# exp(-2^k) in Q0.31 for k = -2..4, the barrel shifter of gemmlowp's exp_on_negative_values.
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535),
               (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int) -> np.ndarray:
    """gemmlowp exp_on_negative_values for FixedPoint<int32, integer_bits> input a <= 0; result in Q0.31."""
    a = _i64(a)
    frac_bits = 31 - integer_bits
    one_quarter = 1 << (frac_bits - 2)
    mask = one_quarter - 1
    a_mod_quarter_minus_one_quarter = _fx_sub(a & mask, one_quarter)
    result = exp_on_interval_between_negative_one_quarter_and_0_excl(
        _rescale(a_mod_quarter_minus_one_quarter, integer_bits, 0))
    remainder = _fx_sub(a_mod_quarter_minus_one_quarter, a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (frac_bits + exponent)
            result = np.where((remainder & bit) != 0, _fx_mul(result, multiplier), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))  # -32.0
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, INT32_MAX, result)  # One() of Q0.31


def one_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    """gemmlowp one_over_one_plus_x_for_x_in_0_1: three Newton-Raphson steps in Q2.29, result in Q0.31."""
    half_denominator = rounding_half_sum(a, INT32_MAX)       # Q0.31
    constant_48_over_17 = 1515870810                         # Q2.29
    constant_neg_32_over_17 = -1010580540                    # Q2.29
    x = _fx_add(constant_48_over_17, _fx_mul(half_denominator, constant_neg_32_over_17))
    one_q2 = 1 << 29
    for _ in range(3):
        half_denominator_times_x = _fx_mul(half_denominator, x)           # Q2.29
        one_minus = _fx_sub(one_q2, half_denominator_times_x)             # Q2.29
        x = _fx_add(x, _rescale(_fx_mul(x, one_minus), 4, 2))             # Q4.27 -> Q2.29
    # ExactMulByPot<-1>: same raw value read as Q1.30; then Rescale<0>.
    return _rescale(x, 1, 0)


def get_reciprocal(x, x_integer_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """common.h GetReciprocal: 1/x for a positive fixed-point x with `x_integer_digits` integer bits.
    Returns (Q0.31 reciprocal of the normalised x, num_bits_over_unit)."""
    x = _i64(x)
    headroom_plus_one = count_leading_zeros32(x)
    num_bits_over_unit = x_integer_digits - headroom_plus_one
    shifted = ((x & 0xFFFFFFFF) << headroom_plus_one) & 0xFFFFFFFF
    shifted_sum_minus_one = wrap32(shifted - (1 << 31))
    return one_over_one_plus_x_for_x_in_0_1(shifted_sum_minus_one), num_bits_over_unit


# ---- op-level integer kernels shared by the op modules' forward kernels (stages/ops/) -------------

def channel_multipliers(s_in: float, w_scales, s_out: float, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """PopulateConvolutionQuantizationParams / FC per-channel Prepare: for each output channel,
    QuantizeMultiplier(double(s_in) * double(s_w[c]) / double(s_out)); a per-tensor filter scale is broadcast."""
    scales = tuple(float(s) for s in w_scales)
    if len(scales) == 1:
        scales = scales * channels
    if len(scales) != channels:
        raise ValueError(f"{len(scales)} weight scales for {channels} output channels")
    mult, shift = _channel_multipliers(float(s_in), scales, float(s_out))
    return mult.copy(), shift.copy()


@functools.lru_cache(maxsize=4096)
def _channel_multipliers(s_in: float, scales: tuple[float, ...], s_out: float) -> tuple[np.ndarray, np.ndarray]:
    # Memoised on the values: the golden model's training steps requantise every layer once per step with the same
    # scales (sparse-plan's probe: half a million QuantizeMultiplier calls on MobileNetV2, issue 14).
    pairs = [quantize_multiplier(s_in * s / s_out) for s in scales]
    return (np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64))


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer matmul through float64 BLAS: every product is below 2^16 and every partial sum below 2^53 for
    any layer a microcontroller runs (< 2^37 terms), so the float64 result is exact whatever the order."""
    if a.shape[-1] >= (1 << 36):
        raise ValueError("accumulation depth too large for exact float64 integer matmul")
    return np.rint(a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)


def round_half_away_array(q: np.ndarray) -> np.ndarray:
    """TfLiteRound on float32 values, C's round on float64 ones: ties away from zero (np.round would round ties
    to even), as int64."""
    t = np.trunc(q)
    frac = q - t  # exact in the values' own precision
    return (t + (frac >= 0.5) - (frac <= -0.5)).astype(np.int64)


def requantize(acc, multiplier, shift, out_zp: int, qmin: int, qmax: int) -> np.ndarray:
    """The tail of conv/depthwise/fully-connected: MultiplyByQuantizedMultiplier, + output offset, clamp."""
    out = multiply_by_quantized_multiplier(acc, multiplier, shift) + out_zp
    return np.clip(out, qmin, qmax)


def softmax_int8(x: np.ndarray, input_multiplier: int, input_left_shift: int, diff_min: int) -> np.ndarray:
    """reference_ops::Softmax<int8_t, int8_t> over the last axis (output scale 1/256, zero point -128)."""
    scaled_diff_integer_bits = 5
    accumulation_integer_bits = 12
    xi = _i64(x)
    max_in_row = xi.max(axis=-1, keepdims=True)
    diff = xi - max_in_row
    valid = diff >= diff_min
    rescaled = multiply_by_quantized_multiplier_greater_than_one(diff, input_multiplier, input_left_shift)
    exps = exp_on_negative_values(rescaled, scaled_diff_integer_bits)               # Q0.31
    contrib = np.where(valid, _rescale(exps, 0, accumulation_integer_bits), 0)      # Q12.19
    # Fixed-point + in the reference: int32 adds in row order; wrap as C would (the sum stays far below 2^31
    # for any realistic depth, since each term is at most 2^19).
    sum_of_exps = wrap32(np.cumsum(contrib, axis=-1)[..., -1:])
    shifted_scale, num_bits_over_unit = get_reciprocal(sum_of_exps, accumulation_integer_bits)
    exponent = num_bits_over_unit + 31 - 8
    if np.any(exponent < 0) or np.any(exponent > 31):
        raise ValueError("softmax reciprocal exponent out of range (the reference TFLITE_CHECKs this)")
    unsat = rounding_divide_by_pot(_fx_mul(shifted_scale, exps), exponent)
    out = np.clip(unsat - 128, -128, 127)
    return np.where(valid, out, -128).astype(np.int8)


# ---- LOGISTIC / TANH (reference_integer_ops, what TFLite Micro runs) and LiteRT's lookup tables -----------------

def logistic_tanh_params(input_scale: float, input_integer_bits: int = 4) -> tuple[int, int, int]:
    """TFLite Micro's CalculateArithmeticOpData for int8 LOGISTIC/TANH: frexp of double(s_in) * 2^(31 - 4), the
    mantissa rounded to Q0.31 (no renormalisation when it rounds up to 2^31: the C cast keeps the wrapped value,
    as below), and the input radius beyond which the output saturates. Returns (multiplier, left_shift, radius)."""
    real = float(np.float32(input_scale)) * float(1 << (31 - input_integer_bits))
    q, left_shift = math.frexp(real)
    mult = round_half_away(q * float(1 << 31))
    mult = int(wrap32(mult))
    radius = calculate_input_radius(input_integer_bits, left_shift, 31)
    return mult, int(left_shift), int(radius)


def _fx_neg(a) -> np.ndarray:
    return wrap32(-_i64(a))


def gemmlowp_logistic(a, integer_bits: int) -> np.ndarray:
    """gemmlowp::logistic(FixedPoint<int32, integer_bits>) -> Q0.31: 1 / (1 + exp(-|a|)) for the positive side,
    One() - that for the negative side, exactly 1/2 (2^30) at 0."""
    a = _i64(a)
    positive = a > 0
    abs_a = np.where(positive, a, _fx_neg(a))
    on_positive = one_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(_fx_neg(abs_a), integer_bits))
    on_negative = _fx_sub(INT32_MAX, on_positive)
    return np.where(a == 0, 1 << 30, np.where(positive, on_positive, on_negative))


def one_minus_x_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    """gemmlowp one_minus_x_over_one_plus_x_for_x_in_0_1: Newton-Raphson in Q2.29 as for 1/(1+x), then
    Rescale<0>(x - One) (a saturating left shift by 2)."""
    half_denominator = rounding_half_sum(a, INT32_MAX)
    x = _fx_add(1515870810, _fx_mul(half_denominator, -1010580540))
    one_q2 = 1 << 29
    for _ in range(3):
        half_denominator_times_x = _fx_mul(half_denominator, x)
        one_minus = _fx_sub(one_q2, half_denominator_times_x)
        x = _fx_add(x, _rescale(_fx_mul(x, one_minus), 4, 2))
    return _rescale(_fx_sub(x, one_q2), 2, 0)


def gemmlowp_tanh(a, integer_bits: int) -> np.ndarray:
    """gemmlowp::tanh(FixedPoint<int32, integer_bits>) -> Q0.31: with n = -|a|, t = (1 - e^{2n}) / (1 + e^{2n})
    (ExactMulByPot<1>: the same raw value read with one more integer bit); -t for negative a, 0 at 0."""
    a = _i64(a)
    negative = a < 0
    n = np.where(negative, a, _fx_neg(a))
    t = one_minus_x_over_one_plus_x_for_x_in_0_1(exp_on_negative_values(n, integer_bits + 1))
    return np.where(a == 0, 0, np.where(negative, _fx_neg(t), t))


def logistic_int8_fixed(x: np.ndarray, input_zero_point: int, multiplier: int, left_shift: int,
                        radius: int) -> np.ndarray:
    """reference_integer_ops::Logistic (int8, output (1/256, -128))."""
    v = _i64(x) - input_zero_point
    q4 = multiply_by_quantized_multiplier(v, multiplier, left_shift)
    out = rounding_divide_by_pot(gemmlowp_logistic(q4, 4), 31 - 8) - 128
    out = np.clip(out, -128, 127)
    out = np.where(v <= -radius, -128, np.where(v >= radius, 127, out))
    return out.astype(np.int8)


def tanh_int8_fixed(x: np.ndarray, input_zero_point: int, multiplier: int, left_shift: int,
                    radius: int) -> np.ndarray:
    """reference_integer_ops::Tanh (int8, output (1/128, 0))."""
    v = _i64(x) - input_zero_point
    q4 = multiply_by_quantized_multiplier(v, multiplier, left_shift)
    out = np.clip(rounding_divide_by_pot(gemmlowp_tanh(q4, 4), 31 - 7), -128, 127)
    out = np.where(v <= -radius, -128, np.where(v >= radius, 127, out))
    return out.astype(np.int8)


def _libm():
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fns = []
        for name in ("expf", "tanhf"):
            f = getattr(lib, name)
            f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
            fns.append(f)
        return tuple(fns)
    except (OSError, AttributeError):
        return None


_LIBM = _libm()


def expf(v: float) -> float:
    """C's expf (what std::exp(float) calls): libm itself where it can be loaded, so that a lookup-table entry
    near a rounding tie comes out as in LiteRT; numpy's float32 exp otherwise."""
    return float(_LIBM[0](v)) if _LIBM else float(np.exp(np.float32(v)))


def tanhf(v: float) -> float:
    return float(_LIBM[1](v)) if _LIBM else float(np.tanh(np.float32(v)))


def lut_int8(input_scale: float, input_zero_point: int, output_scale: float, output_zero_point: int,
             transform) -> np.ndarray:
    """LiteRT's PopulateLookupTable / LUTPopulate<int8_t>: for each int8 input value, dequantize in float
    (float scale * float(val - zp)), apply `transform` in float, round(result * (1 / s_out)) (float), add the zero
    point, clamp. Indexed by uint8(val)."""
    table = np.zeros(256, np.int8)
    inv = np.float32(1.0) / np.float32(output_scale)
    for val in range(-128, 128):
        deq = np.float32(np.float32(input_scale) * np.float32(val - input_zero_point))
        t = np.float32(transform(float(deq)))
        rescaled = round_half_away(float(np.float32(t * inv)))
        table[val & 0xFF] = max(-128, min(127, rescaled + output_zero_point))
    return table


def logistic_f32(v: float) -> float:
    """The transform of LiteRT's int8 LOGISTIC table: 1.0f / (1.0f + std::exp(-value)) in float."""
    return float(np.float32(1.0) / np.float32(np.float32(1.0) + np.float32(expf(float(np.float32(-v))))))


def apply_lut(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return table[_i64(x) & 0xFF]


# ---- HARD_SWISH (reference_ops::HardSwish<int8_t>, 16-bit fixed point) ------------------------------------------

def _down_scale_to_int16(m: int) -> int:
    """DownScaleInt32ToInt16Multiplier."""
    if m >= INT32_MAX - (1 << 15):
        return (1 << 15) - 1
    return (m + (1 << 15)) >> 16


def hard_swish_params(input_scale: float, output_scale: float) -> tuple[int, int, int, int]:
    """HardSwishPrepare: every scale ratio in float, QuantizeMultiplier on the float promoted to double, the Q0.31
    mantissas scaled down to Q0.15. Returns (output_multiplier_int16, output_exponent, reluish_multiplier_int16,
    reluish_exponent)."""
    hires = f32(f32(1.0 / 128.0) * f32(input_scale))
    reluish_scale = f32(3.0 / 32768.0)
    om, oe = quantize_multiplier(f32(hires / f32(output_scale)))
    rm, re = quantize_multiplier(f32(hires / reluish_scale))
    if oe > 0:
        raise ValueError("hard_swish output multiplier exponent must be <= 0 (LiteRT checks it): the output "
                         "scale is too small for the input scale")
    return _down_scale_to_int16(om), oe, _down_scale_to_int16(rm), re


def _srdhm16(a, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul<int16_t>."""
    a, b = _i64(a), _i64(b)
    overflow = (a == b) & (a == -(1 << 15))
    ab = a * b
    s = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.where(s >= 0, s >> 15, -((-s) >> 15))
    return np.where(overflow, (1 << 15) - 1, _wrap16(q))


def _sdhm16(a, b) -> np.ndarray:
    """reference_ops::SaturatingDoublingHighMul (int16, truncating: SQDMULH)."""
    a, b = _i64(a), _i64(b)
    overflow = (a == b) & (a == -(1 << 15))
    ab = a * b
    q = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return np.where(overflow, (1 << 15) - 1, _wrap16(q))


def _wrap16(x) -> np.ndarray:
    x = _i64(x)
    return ((x + (1 << 15)) & 0xFFFF) - (1 << 15)


def _sat_left_shift16(x, amount: int) -> np.ndarray:
    return np.clip(_i64(x) * (1 << amount), -(1 << 15), (1 << 15) - 1)


def hard_swish_int8(x: np.ndarray, input_zero_point: int, output_zero_point: int,
                    params: tuple[int, int, int, int]) -> np.ndarray:
    om16, oe, rm16, re = params
    v = _wrap16(_i64(x) - input_zero_point)
    hires = _wrap16(v * (1 << 7))
    preshift_out = _srdhm16(hires, om16)
    reluish = hires
    if re > 0:
        reluish = _sat_left_shift16(reluish, re - 1)
    reluish = _srdhm16(reluish, rm16)
    if re > 0:
        reluish = _sat_left_shift16(reluish, 1)
    if re < 0:
        reluish = rounding_divide_by_pot(reluish, -re)
    reluish = _wrap16((reluish + (1 << 15)) >> 1)
    pre = _sdhm16(reluish, preshift_out)
    out = _wrap16(rounding_divide_by_pot(pre, -oe) + output_zero_point)
    return np.clip(out, -128, 127).astype(np.int8)
