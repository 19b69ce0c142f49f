"""Fixed-point arithmetic of TFLite's reference kernels, bit for bit, on numpy arrays.

Everything here mirrors `tensorflow/lite/kernels/internal/common.h`, `quantization_util.cc` and gemmlowp's
`fixedpoint/fixedpoint.h` as built by default (no TFLITE_SINGLE_ROUNDING: the "double rounding" path that
TFLite Micro also runs). Values are carried as int64 numpy arrays holding int32 quantities; wherever the C code
would wrap or saturate an int32 we do the same explicitly, so results match even on the edges.

The parameter helpers (`quantize_multiplier`, `activation_range`, ...) work on Python scalars with the exact
float/double mix of the C++ code, since the integer parameters they produce decide every output bit.
"""

from __future__ import annotations

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


# ---- op-level integer kernels shared by the executor --------------------------------------------

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
