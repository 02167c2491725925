"""Exact numpy semantics of every IR operator and cast (ir.md, "Semantics").

Every function here takes and returns *lane values*: a numpy scalar (a value
that is the same on every lane) or a numpy array broadcastable to the current
lane set. Integer values are ``uint32``/``int32``, F32 values ``float32`` and
BOOL values numpy ``bool``. Callers run under ``np.errstate(all="ignore")``:
wrap-around, division by zero and NaN creation are defined results here, not
errors.

The functions are chosen once per IR node at compile time (`binary_op`,
`unary_op`, `cast_op`), so evaluating a node is one Python call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from vyre_async.abc import public_dir as _public_dir
from vyre_async.ir.ops import BinOp, UnOp
from vyre_async.ir.types import DType

__all__ = [
    "NUMPY_DTYPE",
    "BinaryFn",
    "Scalar",
    "UnaryFn",
    "Value",
    "binary_op",
    "cast_op",
    "const_value",
    "fix",
    "fma_f32",
    "in_place_ufunc",
    "truth",
    "unary_op",
]
__dir__ = _public_dir(__name__)

#: A lane value held as a numpy scalar (uniform) or array (per lane).
Value = npt.NDArray[Any] | np.generic
Scalar = np.generic
BinaryFn = Callable[[Value, Value], Value]
UnaryFn = Callable[[Value], Value]

#: numpy type that holds each IR dtype while a program runs (BOOL as numpy bool).
NUMPY_DTYPE: dict[DType, type[np.generic]] = {
    DType.U32: np.uint32,
    DType.I32: np.int32,
    DType.F32: np.float32,
    DType.BOOL: np.bool_,
}

_U32 = np.uint32
_I32 = np.int32
_F32 = np.float32
_U32_MAX = np.uint32(0xFFFF_FFFF)
_ZERO_U32 = np.uint32(0)
_ONE_U32 = np.uint32(1)
_MASK5_U32 = np.uint32(31)
_MASK5_I32 = np.int32(31)


def fix(value: Any) -> Value:
    """Return ``value`` with 0-d arrays turned into numpy scalars (uniform values stay scalars)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    return value  # type: ignore[no-any-return]


def const_value(dtype: DType, bits: int) -> Scalar:
    """Return the numpy scalar for a constant with 32-bit pattern ``bits``."""
    word = np.uint32(bits & 0xFFFF_FFFF)
    if dtype is DType.U32:
        return word
    if dtype is DType.I32:
        return word.view(np.int32)
    if dtype is DType.F32:
        return word.view(np.float32)
    return np.bool_(bits != 0)


def truth(value: Value) -> Value:
    """Return the BOOL truth of a condition value (BOOL as is; U32 non-zero = true)."""
    if value.dtype == np.bool_:
        return value
    return fix(np.not_equal(value, 0))


# ---------------------------------------------------------------------------------
# bit-pattern helpers


def _as_u32(value: Value) -> Value:
    """Reinterpret a 32-bit value's bits as uint32 (no copy)."""
    if value.dtype == _U32:
        return value
    return value.view(_U32)


def _as_i32(value: Value) -> Value:
    """Reinterpret a 32-bit value's bits as int32 (no copy)."""
    if value.dtype == _I32:
        return value
    return value.view(_I32)


def _asarray(value: Value, dtype: type[np.generic]) -> npt.NDArray[Any]:
    return np.asarray(value, dtype=dtype)


# ---------------------------------------------------------------------------------
# integer arithmetic


def _i32_wrap(op: Callable[[Value, Value], Value]) -> BinaryFn:
    """Return ``op`` computed on the uint32 bit patterns and reinterpreted as int32."""

    def run(a: Value, b: Value) -> Value:
        return _as_i32(fix(op(_as_u32(a), _as_u32(b))))

    return run


def _div_u32(a: Value, b: Value) -> Value:
    if isinstance(b, np.generic) and b:
        k = int(b)
        if k & (k - 1) == 0:
            return fix(np.right_shift(a, np.uint32(k.bit_length() - 1)))
        return fix(np.floor_divide(a, b))
    zero = np.equal(b, 0)
    q = np.floor_divide(a, np.where(zero, _ONE_U32, b))
    return fix(np.where(zero, _U32_MAX, q).astype(_U32, copy=False))


def _mod_u32(a: Value, b: Value) -> Value:
    if isinstance(b, np.generic) and b:
        k = int(b)
        if k & (k - 1) == 0:
            return fix(np.bitwise_and(a, np.uint32(k - 1)))
        return fix(np.remainder(a, b))
    zero = np.equal(b, 0)
    r = np.remainder(a, np.where(zero, _ONE_U32, b))
    return fix(np.where(zero, _ZERO_U32, r).astype(_U32, copy=False))


def _trunc_divmod_i32(
    a: Value, b: Value
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    a64 = _asarray(a, np.int64)
    b64 = _asarray(b, np.int64)
    zero = b64 == 0
    safe = np.where(zero, 1, b64)
    q = np.abs(a64) // np.abs(safe)
    q = np.where((a64 < 0) != (safe < 0), -q, q)
    r = a64 - q * safe
    return q, r, zero


def _to_i32(values: npt.NDArray[np.int64]) -> Value:
    """Wrap int64 values to int32 (two's complement)."""
    return fix((values & 0xFFFF_FFFF).astype(_U32).view(_I32))


def _div_i32(a: Value, b: Value) -> Value:
    q, _, zero = _trunc_divmod_i32(a, b)
    return _to_i32(np.where(zero, 0, q))


def _mod_i32(a: Value, b: Value) -> Value:
    _, r, zero = _trunc_divmod_i32(a, b)
    return _to_i32(np.where(zero, 0, r))


def _shl_u32(a: Value, b: Value) -> Value:
    return fix(np.left_shift(a, np.bitwise_and(b, _MASK5_U32)))


def _shr_u32(a: Value, b: Value) -> Value:
    return fix(np.right_shift(a, np.bitwise_and(b, _MASK5_U32)))


def _shl_i32(a: Value, b: Value) -> Value:
    count = _as_u32(fix(np.bitwise_and(b, _MASK5_I32)))
    return _as_i32(fix(np.left_shift(_as_u32(a), count)))


def _shr_i32(a: Value, b: Value) -> Value:
    return fix(np.right_shift(a, np.bitwise_and(b, _MASK5_I32)))


def _mulhi_u32(a: Value, b: Value) -> Value:
    wide = np.multiply(_asarray(a, np.uint64), _asarray(b, np.uint64))
    return fix(np.right_shift(wide, np.uint64(32)).astype(_U32))


# ---------------------------------------------------------------------------------
# f32 min/max: IEEE 754-2019 minimumNumber / maximumNumber


def _fmin_f32(a: Value, b: Value) -> Value:
    result = np.fmin(a, b)
    zeros = np.logical_and(np.equal(a, 0), np.equal(b, 0))
    if not np.any(zeros):
        return fix(result)
    signed = np.bitwise_or(_as_u32(a), _as_u32(b)).view(_F32)  # -0 if either is -0
    return fix(np.where(zeros, signed, result))


def _fmax_f32(a: Value, b: Value) -> Value:
    result = np.fmax(a, b)
    zeros = np.logical_and(np.equal(a, 0), np.equal(b, 0))
    if not np.any(zeros):
        return fix(result)
    signed = np.bitwise_and(_as_u32(a), _as_u32(b)).view(_F32)  # +0 unless both are -0
    return fix(np.where(zeros, signed, result))


def _ufunc2(fn: np.ufunc) -> BinaryFn:
    def run(a: Value, b: Value) -> Value:
        return fix(fn(a, b))

    return run


_BIN_INT_COMMON: dict[BinOp, BinaryFn] = {
    BinOp.MIN: _ufunc2(np.minimum),
    BinOp.MAX: _ufunc2(np.maximum),
    BinOp.AND: _ufunc2(np.bitwise_and),
    BinOp.OR: _ufunc2(np.bitwise_or),
    BinOp.XOR: _ufunc2(np.bitwise_xor),
}
_COMPARE: dict[BinOp, BinaryFn] = {
    BinOp.EQ: _ufunc2(np.equal),
    BinOp.NE: _ufunc2(np.not_equal),
    BinOp.LT: _ufunc2(np.less),
    BinOp.LE: _ufunc2(np.less_equal),
    BinOp.GT: _ufunc2(np.greater),
    BinOp.GE: _ufunc2(np.greater_equal),
}

_BIN: dict[DType, dict[BinOp, BinaryFn]] = {
    DType.U32: {
        BinOp.ADD: _ufunc2(np.add),
        BinOp.SUB: _ufunc2(np.subtract),
        BinOp.MUL: _ufunc2(np.multiply),
        BinOp.DIV: _div_u32,
        BinOp.MOD: _mod_u32,
        BinOp.SHL: _shl_u32,
        BinOp.SHR: _shr_u32,
        BinOp.MULHI: _mulhi_u32,
        **_BIN_INT_COMMON,
        **_COMPARE,
    },
    DType.I32: {
        BinOp.ADD: _i32_wrap(np.add),
        BinOp.SUB: _i32_wrap(np.subtract),
        BinOp.MUL: _i32_wrap(np.multiply),
        BinOp.DIV: _div_i32,
        BinOp.MOD: _mod_i32,
        BinOp.SHL: _shl_i32,
        BinOp.SHR: _shr_i32,
        **_BIN_INT_COMMON,
        **_COMPARE,
    },
    DType.F32: {
        BinOp.ADD: _ufunc2(np.add),
        BinOp.SUB: _ufunc2(np.subtract),
        BinOp.MUL: _ufunc2(np.multiply),
        BinOp.DIV: _ufunc2(np.divide),
        BinOp.MOD: _ufunc2(np.fmod),
        BinOp.MIN: _fmin_f32,
        BinOp.MAX: _fmax_f32,
        **_COMPARE,
    },
    DType.BOOL: {
        BinOp.EQ: _ufunc2(np.equal),
        BinOp.NE: _ufunc2(np.not_equal),
        BinOp.LAND: _ufunc2(np.logical_and),
        BinOp.LOR: _ufunc2(np.logical_or),
    },
}


_IN_PLACE: dict[tuple[BinOp, DType], np.ufunc] = {
    (BinOp.ADD, DType.F32): np.add,
    (BinOp.SUB, DType.F32): np.subtract,
    (BinOp.MUL, DType.F32): np.multiply,
    (BinOp.DIV, DType.F32): np.divide,
    (BinOp.ADD, DType.U32): np.add,
    (BinOp.SUB, DType.U32): np.subtract,
    (BinOp.MUL, DType.U32): np.multiply,
    (BinOp.AND, DType.U32): np.bitwise_and,
    (BinOp.OR, DType.U32): np.bitwise_or,
    (BinOp.XOR, DType.U32): np.bitwise_xor,
}


def in_place_ufunc(op: BinOp, dtype: DType) -> np.ufunc | None:
    """Return the ufunc of ``op`` on ``dtype`` when it may write into an operand (``out=``)."""
    return _IN_PLACE.get((op, dtype))


def binary_op(op: BinOp, dtype: DType) -> BinaryFn:
    """Return the function computing ``op`` on two operands of ``dtype``.

    Raises:
        KeyError: ``op`` is not defined on ``dtype`` (the validator rejects such programs).
    """
    return _BIN[dtype][op]


# ---------------------------------------------------------------------------------
# unary operators


def _bit_length_u32(bits: Value) -> Value:
    """Return the number of significant bits of uint32 values (0 for 0)."""
    _, exponent = np.frexp(np.asarray(bits, dtype=np.float64))  # exact: 32 bits fit a double
    return fix(exponent)


def _popcount(a: Value) -> Value:
    return fix(np.bitwise_count(_as_u32(a)).astype(a.dtype))


def _clz(a: Value) -> Value:
    return fix((32 - np.asarray(_bit_length_u32(_as_u32(a)))).astype(a.dtype))


def _ctz(a: Value) -> Value:
    bits = _as_u32(a)
    lowest = np.bitwise_and(bits, np.negative(bits))  # isolates the lowest set bit
    length = np.asarray(_bit_length_u32(lowest))
    return fix(np.where(length == 0, 32, length - 1).astype(a.dtype))


def _via_f64(fn: np.ufunc) -> UnaryFn:
    """Return ``fn`` evaluated in float64 and rounded once to float32."""

    def run(a: Value) -> Value:
        return fix(fn(np.asarray(a, dtype=np.float64)).astype(_F32))

    return run


def _rsqrt(a: Value) -> Value:
    return fix((1.0 / np.sqrt(np.asarray(a, dtype=np.float64))).astype(_F32))


def _neg_i32(a: Value) -> Value:
    return _as_i32(fix(np.negative(_as_u32(a))))


def _ufunc1(fn: np.ufunc) -> UnaryFn:
    def run(a: Value) -> Value:
        return fix(fn(a))

    return run


_UN_INT: dict[UnOp, UnaryFn] = {
    UnOp.NOT: _ufunc1(np.invert),
    UnOp.POPCOUNT: _popcount,
    UnOp.CLZ: _clz,
    UnOp.CTZ: _ctz,
}

_UN: dict[DType, dict[UnOp, UnaryFn]] = {
    DType.U32: {UnOp.NEG: _ufunc1(np.negative), **_UN_INT},
    DType.I32: {UnOp.NEG: _neg_i32, **_UN_INT},
    DType.F32: {
        UnOp.NEG: _ufunc1(np.negative),
        UnOp.ABS: _ufunc1(np.abs),
        UnOp.SQRT: _ufunc1(np.sqrt),
        UnOp.RSQRT: _rsqrt,
        UnOp.EXP: _via_f64(np.exp),
        UnOp.LOG: _via_f64(np.log),
        UnOp.SIN: _via_f64(np.sin),
        UnOp.COS: _via_f64(np.cos),
        UnOp.TANH: _via_f64(np.tanh),
        UnOp.FLOOR: _ufunc1(np.floor),
        UnOp.CEIL: _ufunc1(np.ceil),
        UnOp.ROUND: _ufunc1(np.rint),
        UnOp.TRUNC: _ufunc1(np.trunc),
    },
    DType.BOOL: {UnOp.LNOT: _ufunc1(np.logical_not)},
}


def unary_op(op: UnOp, dtype: DType) -> UnaryFn:
    """Return the function computing ``op`` on an operand of ``dtype``.

    Raises:
        KeyError: ``op`` is not defined on ``dtype`` (the validator rejects such programs).
    """
    return _UN[dtype][op]


# ---------------------------------------------------------------------------------
# casts


def _f32_to_int(lo: float, hi: float, target: type[np.generic]) -> UnaryFn:
    """Truncate toward zero, saturate to ``[lo, hi]``, NaN → 0."""

    def run(a: Value) -> Value:
        wide = np.trunc(np.asarray(a, dtype=np.float64))
        wide = np.where(np.isnan(wide), 0.0, np.clip(wide, lo, hi))
        return fix(wide.astype(target))

    return run


def _int_to_f32(a: Value) -> Value:
    # int → float64 is exact, so the only rounding is float64 → float32 (nearest even).
    return fix(np.asarray(a, dtype=np.float64).astype(_F32))


def _astype(target: type[np.generic]) -> UnaryFn:
    def run(a: Value) -> Value:
        return fix(np.asarray(a).astype(target))

    return run


def _nonzero(a: Value) -> Value:
    return fix(np.not_equal(a, 0))


def _identity(a: Value) -> Value:
    return a


_CAST: dict[tuple[DType, DType], UnaryFn] = {
    (DType.U32, DType.I32): _as_i32,
    (DType.I32, DType.U32): _as_u32,
    (DType.U32, DType.F32): _int_to_f32,
    (DType.I32, DType.F32): _int_to_f32,
    (DType.F32, DType.U32): _f32_to_int(0.0, 4294967295.0, np.uint32),
    (DType.F32, DType.I32): _f32_to_int(-2147483648.0, 2147483647.0, np.int32),
    (DType.BOOL, DType.U32): _astype(np.uint32),
    (DType.BOOL, DType.I32): _astype(np.int32),
    (DType.BOOL, DType.F32): _astype(np.float32),
    (DType.U32, DType.BOOL): _nonzero,
    (DType.I32, DType.BOOL): _nonzero,
    (DType.F32, DType.BOOL): _nonzero,
}


def cast_op(source: DType, target: DType) -> UnaryFn:
    """Return the function converting a ``source`` value to ``target`` (ir.md cast rules)."""
    if source is target:
        return _identity
    return _CAST[(source, target)]


# ---------------------------------------------------------------------------------
# fused multiply-add


def fma_f32(a: Value, b: Value, c: Value) -> Value:
    """Return ``a * b + c`` on float32 values rounded once (IEEE fusedMultiplyAdd).

    The product of two binary32 values is exact in binary64. The sum is made
    exact with TwoSum (``s + e``), then rounded to binary64 *to odd* (when
    ``e != 0`` and ``s`` has an even significand, step one ulp toward ``e``);
    round-to-odd with 29 spare bits makes the final binary64 → binary32
    rounding equal to a single round-to-nearest-even of the exact value.
    """
    p = np.multiply(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    c64 = np.asarray(c, dtype=np.float64)
    s = p + c64
    p_part = s - c64
    err = (p - p_part) + (c64 - (s - p_part))
    inexact = np.isfinite(err) & (err != 0)
    if np.any(inexact):
        even = (np.asarray(s).view(np.uint64) & np.uint64(1)) == 0
        step = inexact & even
        s = np.where(step, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return fix(np.asarray(s).astype(_F32))
