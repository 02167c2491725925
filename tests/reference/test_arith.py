"""Every operator and cast of the engine, on arrays and uniform scalars, against scalar oracles."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
import pytest

from tests.reference import slow_interpreter as oracle
from vyre_async.ir import BinOp, DType, UnOp
from vyre_async.ir.ops import TRANSCENDENTAL, bin_result, un_result
from vyre_reference import arith

_SPECIAL_U32 = [
    0,
    1,
    2,
    3,
    31,
    32,
    33,
    255,
    256,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFE,
    0xFFFF_FFFF,
]
_SPECIAL_F32_BITS = [
    0x0000_0000,
    0x8000_0000,
    0x3F80_0000,
    0xBF80_0000,
    0x3F00_0000,
    0xBF00_0000,
    0x3FC0_0000,
    0x4020_0000,
    0x7FC0_0000,
    0x7F80_0000,
    0xFF80_0000,
    0x0000_0001,
    0x8000_0001,
    0x007F_FFFF,
    0x0080_0000,
    0x7F7F_FFFF,
    0xFF7F_FFFF,
    0x4B80_0001,
    0x4F80_0000,
    0xCF00_0000,
]


def _values(dtype: DType, rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
    if dtype is DType.BOOL:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtype is DType.F32:
        words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        small = rng.standard_normal(n).astype(np.float32).view(np.uint32)
        words = np.where(rng.integers(0, 2, n) == 0, words, small)
        words[: len(_SPECIAL_F32_BITS)] = _SPECIAL_F32_BITS
        return words.view(np.float32)
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    words[rng.integers(0, 2, n) == 0] %= 40
    words[: len(_SPECIAL_U32)] = _SPECIAL_U32
    return words if dtype is DType.U32 else words.view(np.int32)


def _py(value: Any, dtype: DType) -> Any:
    if dtype is DType.F32:
        return float(value)
    if dtype is DType.BOOL:
        return bool(value)
    return int(value)


def _words(values: list[Any], dtype: DType) -> list[int]:
    if dtype is DType.F32:
        return [int(struct.unpack("<I", struct.pack("<f", v))[0]) for v in values]
    return [int(v) & 0xFFFF_FFFF for v in values]


def _check(got: Any, want: list[Any], dtype: DType, ulp: int = 0) -> None:
    got_list = np.asarray(got).reshape(-1)
    assert got_list.dtype == arith.NUMPY_DTYPE[dtype]
    if dtype is DType.F32:
        g = got_list.astype(np.float32)
        w = np.array(want, dtype=np.float64).astype(np.float32)
        assert np.array_equal(np.isnan(g), np.isnan(w))
        keep = ~np.isnan(w)
        gk = g[keep].view(np.uint32).astype(np.int64)
        wk = w[keep].view(np.uint32).astype(np.int64)
        gk = np.where(gk >= 2**31, 2**31 - gk, gk)
        wk = np.where(wk >= 2**31, 2**31 - wk, wk)
        assert np.abs(gk - wk).max(initial=0) <= ulp
    else:
        assert _words(got_list.tolist(), dtype) == _words(want, dtype)


def _rng(op: BinOp | UnOp, dtype: DType) -> np.random.Generator:
    """The same values for a case in every run (``hash`` of a str differs per process)."""
    return np.random.default_rng(zlib.crc32(f"{op.value}/{dtype.value}".encode()))


BIN_CASES = [(op, dt) for op in BinOp for dt in DType if bin_result(op, dt) is not None]
UN_CASES = [(op, dt) for op in UnOp for dt in DType if un_result(op, dt) is not None]


@pytest.mark.parametrize(("op", "dtype"), BIN_CASES, ids=lambda x: str(x))
def test_binary_ops(op: BinOp, dtype: DType) -> None:
    rng = _rng(op, dtype)
    a = _values(dtype, rng, 400)
    b = _values(dtype, rng, 400)
    result = bin_result(op, dtype)
    assert result is not None
    fn = arith.binary_op(op, dtype)
    with np.errstate(all="ignore"):
        got = fn(a, b)
        want = [
            oracle.binary(op, dtype, _py(x, dtype), _py(y, dtype))
            for x, y in zip(a, b, strict=True)
        ]
        _check(got, want, result)
        for k in (0, 1, 5, 12):  # a uniform right operand takes the scalar paths
            scalar = b[k : k + 1].reshape(()).item()
            got = fn(a, b.dtype.type(scalar))
            want = [oracle.binary(op, dtype, _py(x, dtype), _py(b[k], dtype)) for x in a]
            _check(got, want, result)


@pytest.mark.parametrize(("op", "dtype"), UN_CASES, ids=lambda x: str(x))
def test_unary_ops(op: UnOp, dtype: DType) -> None:
    rng = _rng(op, dtype)
    a = _values(dtype, rng, 400)
    with np.errstate(all="ignore"):
        got = arith.unary_op(op, dtype)(a)
    want = [oracle.unary(op, dtype, _py(x, dtype)) for x in a]
    result = un_result(op, dtype)
    assert result is not None
    # The budget is for other backends; the reference computes in float64 and
    # rounds once, as the oracle does: rsqrt (two correctly rounded float64
    # operations) must match it exactly. exp, log and the trigonometric ones come
    # from numpy's and C's libm, which may differ in the last float64 bit.
    exact = op not in TRANSCENDENTAL or op is UnOp.RSQRT
    _check(got, want, result, ulp=0 if exact else 2)


@pytest.mark.parametrize(
    ("op", "inputs"),
    [
        # numpy's float32 exp and log are 2 and 3 ULP from the float64 result rounded once
        # on these (found over 2 million random inputs each)
        (UnOp.EXP, [62.09893035888672, 61.5, -0.25]),
        (UnOp.LOG, [0.7804264426231384, 3.0, 1e-30]),
    ],
)
def test_exp_and_log_are_rounded_once_from_float64(op: UnOp, inputs: list[float]) -> None:
    # The reference is the oracle other backends are judged against with a 2 ULP budget:
    # if it were 2 or 3 ULP off itself, a backend within budget of the truth could fail.
    a = np.array(inputs, np.float32)
    got = arith.unary_op(op, DType.F32)(a)
    _check(got, [oracle.unary(op, DType.F32, float(x)) for x in a], DType.F32, ulp=1)


@pytest.mark.parametrize("source", list(DType), ids=str)
@pytest.mark.parametrize("target", list(DType), ids=str)
def test_casts(source: DType, target: DType) -> None:
    rng = np.random.default_rng(3)
    a = _values(source, rng, 400)
    with np.errstate(all="ignore"):
        got = arith.cast_op(source, target)(a)
    _check(got, [oracle.cast(source, target, _py(x, source)) for x in a], target)


def test_fma_is_exactly_rounded_on_hard_cases() -> None:
    rng = np.random.default_rng(11)
    n = 20_000
    # a*b lands next to a binary32 midpoint, then c tips (or not) the rounding.
    a = (1 + rng.integers(0, 2**12, n) * 2.0**-12).astype(np.float32)
    b = (1 + rng.integers(0, 2**12, n) * 2.0**-12).astype(np.float32)
    # c a power of two, or with a full significand (its low bits land in the binary64
    # rounding of the sum, where the round-to-odd step must test the last bit)
    whole = 1 + rng.integers(0, 2**23, n) * 2.0**-23
    significand = np.where(rng.integers(0, 2, n) == 0, 1.0, whole)
    c = rng.choice([-1.0, 1.0], n) * significand * 2.0 ** rng.integers(-70, -20, n)
    c = c.astype(np.float32)
    c[::7] = -(a[::7].astype(np.float64) * b[::7]).astype(np.float32)  # cancellation
    special = np.array(_SPECIAL_F32_BITS, np.uint32).view(np.float32)
    a = np.concatenate([a, np.repeat(special, len(special))])
    b = np.concatenate([b, np.tile(special, len(special))])
    c = np.concatenate([c, np.tile(special[::-1], len(special))])
    with np.errstate(all="ignore"):
        got = arith.fma_f32(a, b, c)
    want = [oracle.fma(float(x), float(y), float(z)) for x, y, z in zip(a, b, c, strict=True)]
    _check(got, want, DType.F32)
    # The hard cases are hard: binary64 then binary32 (two roundings) gets some wrong.
    naive = (a[:n].astype(np.float64) * b[:n] + c[:n]).astype(np.float32)
    assert not np.array_equal(naive.view(np.uint32), np.asarray(got)[:n].view(np.uint32))


@pytest.mark.parametrize(
    ("a", "b", "c"),
    [
        # |c| far above |a*b|: the sum lands on a binary32 midpoint in binary64, and only
        # TwoSum's exact error (here -2**-60) says which neighbour is nearer
        (0x3980_0020, 0x397F_FFC0, 0x3F80_0001),
        (0x3980_0020, 0x397F_FFC0, 0x3F80_0002),
        (0xB980_0020, 0x397F_FFC0, 0x3F80_0001),
        (0x3980_0020, 0x397F_FFC0, 0xBF80_0001),
    ],
)
def test_fma_rounds_once_when_the_addend_dwarfs_the_product(a: int, b: int, c: int) -> None:
    x, y, z = (np.array([w], np.uint32).view(np.float32) for w in (a, b, c))
    got = arith.fma_f32(x, y, z)
    want = oracle.fma(float(x[0]), float(y[0]), float(z[0]))
    _check(got, [want], DType.F32)
