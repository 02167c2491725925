"""The conformance corpus: programs, inputs and the outputs every backend must produce.

Each `Case` is plain data: a program, its inputs, launch settings and the
expected outputs, computed here by independent Python/numpy code written for
the case (exact integer arithmetic with Python ints; binary32 results by
rounding binary64 or exact rationals with `struct`), never by an engine. Any
backend's test can iterate `cases()` and compare byte for byte: 32-bit words
exactly, except that NaN is compared by position only and cases with
``ulp_budget > 0`` (transcendental ops) allow that many ULP.

`SEMANTIC_RULES` names every rule of the IR specification's semantics
(``ir.md``: "Semantics — every backend implements exactly this", the buffer
rules and "Launch geometry"); every rule is named by at least one case.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import reduce
from typing import Any

import numpy as np

from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    BufferDecl,
    BufLen,
    Cast,
    DType,
    Expr,
    Fma,
    GridBarrier,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Stmt,
    Store,
    Un,
    Var,
    f32,
    gid,
    lid,
    nwg,
    u32,
    wgid,
)
from vyre_async.programs import standard_workloads

__all__ = ["SEMANTIC_RULES", "Case", "cases"]
__dir__ = _public_dir(__name__)

#: Rule id → the sentence of the IR specification it stands for.
SEMANTIC_RULES: dict[str, str] = {
    "int.wrap": "`add sub mul neg` wrap modulo 2^32.",
    "u32.div0": "U32: `x / 0 = 0xFFFFFFFF`, `x % 0 = 0`.",
    "i32.trunc": "I32: C truncating division and remainder (remainder has the dividend's sign)",
    "i32.div0": "I32: `x / 0 = 0`, `x % 0 = 0`",
    "i32.min_neg1": "I32: `INT_MIN / -1 = INT_MIN`, `INT_MIN % -1 = 0`.",
    "shift.mask": "Shift counts use the low 5 bits (`b & 31`)",
    "shift.kind": "`shr` is logical on U32 and arithmetic on I32.",
    "mulhi": "`mulhi` is the high 32 bits of the 64-bit U32 product.",
    "bits.count": "`popcount`, `clz` and `ctz` work on the 32-bit pattern and return the "
    "operand's dtype (`clz(0)` = `ctz(0)` = 32).",
    "int.compare": "Typing is strict: operands of a binary op have the same dtype "
    "(U32 compares unsigned, I32 signed).",
    "bool.load": "Loading a BOOL word yields `word != 0`.",
    "cond.nonzero": "A `Select` condition, like an `If` condition, is BOOL or U32 "
    "(non-zero = true).",
    "f32.rne": "IEEE binary32, round-to-nearest-even",
    "f32.no_contraction": "no implicit FMA contraction (only `Fma` fuses)",
    "f32.fma": "`Fma(a, b, c)`: fused multiply-add ``a * b + c`` on F32 with a single rounding.",
    "f32.subnormals": "subnormals preserved",
    "f32.nan_payload": "NaN payloads unspecified (compare NaN positions only).",
    "f32.minmax_nan": "`min`/`max` return the non-NaN operand (NaN only if both are NaN)",
    "f32.minmax_zero": "and order `-0.0` below `+0.0` (IEEE 754-2019 minimumNumber/"
    "maximumNumber), so `min(+0, -0) = -0`",
    "f32.round": "`round` is roundToIntegralTiesToEven with the sign kept (`round(-0.5) = -0.0`)",
    "f32.mod": "`mod` is C `fmodf` (sign of the dividend)",
    "f32.div0": "division by zero ... follow[s] IEEE",
    "f32.nan_compare": "comparisons with NaN follow IEEE (`ne` is the only comparison true "
    "for NaN).",
    "f32.div_sqrt": "`div` and `sqrt` correctly rounded.",
    "f32.transcendental": "Transcendentals (`exp log sin cos tanh rsqrt`) may differ between "
    "backends by at most `ulp_budget` ULP (default budget for them: 2 ULP)",
    "f32.exact": "everything else is bit-exact.",
    "cast.f2i": "F32 → U32/I32 truncates toward zero and saturates, NaN → 0",
    "cast.i2f": "integer → F32 rounds to nearest even",
    "cast.reinterpret": "U32 ↔ I32 reinterprets bits",
    "cast.to_bool": "anything → BOOL is `!= 0`",
    "cast.from_bool": "BOOL → number is 0 or 1.",
    "mem.oob_load": "an out-of-bounds load returns 0",
    "mem.oob_store": "an out-of-bounds store or atomic does nothing (the atomic returns 0).",
    "mem.oob_workgroup": "This holds for workgroup buffers too.",
    "mem.write_zeroed": "`WRITE` buffers start zero-filled",
    "mem.read_write_init": "`READ_WRITE` start from their input",
    "mem.workgroup": "`WORKGROUP` buffers are per-workgroup shared memory, zero-filled.",
    "uniformity": "literals, `BufLen`, `wgid`, `nwg` and loads from `UNIFORM` buffers are "
    "uniform (a barrier under control flow that depends only on them is legal)",
    "ctl.all_lanes": 'every launched lane runs (no implicit "tail" exit)',
    "ctl.return": "`Return` removes the lane; returned lanes do not count at barriers.",
    "ctl.barrier": "`Barrier()` (workgroup execution + memory barrier); legal only in uniform "
    "control flow.",
    "ctl.select_both": "`Select` evaluates both arms (safe: every op is total).",
    "ctl.if": "`If(cond, then, orelse)`: each lane runs the branch its condition picks.",
    "ctl.loop": "`Loop(var, start, end, body)` (half-open `[start, end)`, bounds evaluated "
    "once, the loop variable is a read-only U32)",
    "atomic.old": "Atomics are relaxed and device-scoped and return the old value.",
    "atomic.final": "Final memory of commutative atomics is order-independent",
    "atomic.order": "which lane sees which old value is unspecified, so tests compare only "
    "order-independent facts.",
    "atomic.cas": "``expected`` is required for ``cas`` (store ``value`` only if the old word "
    "equals ``expected``)",
    "launch.override": "the grid (number of workgroups) comes from "
    "`DispatchConfig.grid_override` when given",
    "launch.infer": "for a 1-D workgroup, `n` = the largest element count among output "
    "buffers (or among all non-workgroup buffers when the program uses workgroup memory or "
    "atomics) and `grid_x = ceil(n / workgroup_size[0])`",
    "launch.multi_dim": "A multi-dimensional workgroup without `grid_override` is an "
    "`InvalidProgram` error with a Fix.",
    "launch.zero": "A launch with zero lanes runs nothing and returns the outputs as initialised.",
    "launch.fixpoint": "`DispatchConfig.fixpoint_iterations = N` repeats the launch N times "
    "back to back; buffer contents carry over between passes (WRITE buffers are zeroed only "
    "before the first).",
    "launch.builtins": "`gid` (global invocation id), `lid` (local id in the workgroup), "
    "`wgid` (workgroup id), `nwg` (number of workgroups), per axis.",
    "grid.barrier": "`GridBarrier()`: every lane of the grid finishes the statements before "
    "it before any lane runs one after it, and every storage write before it is visible "
    "after it.",
    "grid.workgroup_reset": "workgroup memory is zero again after a grid barrier.",
    "fusion.members": "a fused program (`vyre_async.ir.fusion.fuse_programs`) gives every "
    "member exactly the outputs it has launched alone.",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One conformance case.

    Attributes:
        name: Unique, stable name.
        rules: Ids of `SEMANTIC_RULES` the case checks.
        program: The program.
        inputs: One array per input buffer, in binding order.
        expected: One array per output buffer, in binding order (empty when
            ``error`` is set).
        grid: ``grid_override`` for the dispatch (None: inferred).
        ulp_budget: ULP allowed on F32 outputs (non-zero only for transcendental ops).
        fixpoint_iterations: Launches back to back.
        error: The exception type the dispatch must raise instead of returning.
    """

    name: str
    rules: tuple[str, ...]
    program: Program
    inputs: tuple[np.ndarray[Any, Any], ...]
    expected: tuple[np.ndarray[Any, Any], ...]
    grid: tuple[int, int, int] | None = None
    ulp_budget: int = 0
    fixpoint_iterations: int = 1
    error: type[Exception] | None = field(default=None)

    def config(self) -> DispatchConfig:
        """The dispatch config the case runs with (grid, ULP budget, iterations; its name)."""
        return DispatchConfig(
            grid_override=self.grid,
            ulp_budget=self.ulp_budget or None,
            fixpoint_iterations=self.fixpoint_iterations,
            label=self.name,
        )


# ---------------------------------------------------------------------------------
# independent scalar arithmetic (the oracle side)

M32 = 0xFFFF_FFFF
U32_MAX = M32
I32_MIN = -(2**31)
I32_MAX = 2**31 - 1
NAN = math.nan
INF = math.inf


def _bits_f32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


MIN_SUB = _bits_f32(0x0000_0001)  # 2**-149
MAX_SUB = _bits_f32(0x007F_FFFF)
MIN_NORMAL = _bits_f32(0x0080_0000)  # 2**-126
MAX_F32 = _bits_f32(0x7F7F_FFFF)


def r32(x: float) -> float:
    """Round a binary64 value to binary32 (nearest even; overflow to ±inf)."""
    if math.isnan(x):
        return NAN
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(INF, x)


def exact_r32(q: Fraction) -> float:
    """Round an exact non-zero rational to binary32 (nearest even)."""
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    scaled = q / quantum
    n, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest > scaled.denominator or (2 * rest == scaled.denominator and n % 2):
        n += 1
    value = n * quantum
    return sign * INF if value >= 2**128 else sign * float(value)


def wrap_i32(x: int) -> int:
    """Two's complement wrap of an integer to 32 bits."""
    return ((x + 2**31) & M32) - 2**31


def c_div(a: int, b: int) -> int:
    """C division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# ---------------------------------------------------------------------------------
# builders

_NP = {DType.U32: np.uint32, DType.I32: np.int32, DType.F32: np.float32, DType.BOOL: np.uint32}


def _array(dtype: DType, values: Sequence[Any]) -> np.ndarray[Any, Any]:
    if dtype is DType.BOOL:
        return np.array([int(v) for v in values], dtype=np.uint32)
    if dtype is DType.F32:
        return np.array(values, dtype=np.float64).astype(np.float32)
    if dtype is DType.I32:
        return np.array(values, dtype=np.int64).astype(np.int32)
    return np.array(values, dtype=np.uint64).astype(np.uint32)


Lanes = Callable[[list[Expr]], Expr]


def _elementwise(
    name: str,
    rules: tuple[str, ...],
    inputs: Sequence[tuple[DType, Sequence[Any]]],
    outputs: Sequence[tuple[DType, Lanes, Callable[..., Any]]],
    *,
    ulp_budget: int = 0,
) -> Case:
    """Return a case computing ``out_k[i] = f_k(in_0[i], in_1[i], ...)`` lane by lane.

    ``outputs`` holds (dtype, IR builder over the loaded inputs, Python oracle
    over the input values).
    """
    n = len(inputs[0][1])
    decls = [BufferDecl(f"in{k}", k, Access.READ, dt) for k, (dt, _) in enumerate(inputs)]
    base = len(inputs)
    decls += [
        BufferDecl(f"out{k}", base + k, Access.WRITE, dt, n) for k, (dt, _, _) in enumerate(outputs)
    ]
    i = Var("i")
    loads: list[Expr] = [Load(f"in{k}", i) for k in range(len(inputs))]
    stores: list[Stmt] = [
        Store(f"out{k}", i, build(loads)) for k, (_, build, _) in enumerate(outputs)
    ]
    program = Program(decls, 4, [Let("i", gid()), If(i.lt(BufLen("out0")), stores)], op_id=name)
    arrays = tuple(_array(dt, values) for dt, values in inputs)
    columns = [a.tolist() for a in arrays]  # the oracle sees exactly the binary32 inputs
    expected = tuple(
        _array(dt, [oracle(*row) for row in zip(*columns, strict=True)])
        for dt, _, oracle in outputs
    )
    return Case(
        name=name,
        rules=rules,
        program=program,
        inputs=arrays,
        expected=expected,
        ulp_budget=ulp_budget,
    )


def _bin(op: str) -> Lanes:
    from vyre_async.ir import Bin

    return lambda xs: Bin(op, xs[0], xs[1])


def _un(op: str) -> Lanes:
    return lambda xs: Un(op, xs[0])


# ---------------------------------------------------------------------------------
# integer cases


def _integer_cases() -> list[Case]:
    ua = [0, 1, U32_MAX, U32_MAX, 0x8000_0000, 12345, 0xDEAD_BEEF]
    ub = [0, U32_MAX, 1, U32_MAX, 0x8000_0000, 67890, 0x1234_5678]
    ia = [0, I32_MAX, I32_MIN, -1, 65536, -7, I32_MIN]
    ib = [0, 1, 1, I32_MIN, 65536, 123456789, -1]
    out = [
        _elementwise(
            "u32_wrap",
            ("int.wrap",),
            [(DType.U32, ua), (DType.U32, ub)],
            [
                (DType.U32, _bin("add"), lambda a, b: (a + b) & M32),
                (DType.U32, _bin("sub"), lambda a, b: (a - b) & M32),
                (DType.U32, _bin("mul"), lambda a, b: (a * b) & M32),
                (DType.U32, _un("neg"), lambda a, b: (-a) & M32),
            ],
        ),
        _elementwise(
            "i32_wrap",
            ("int.wrap",),
            [(DType.I32, ia), (DType.I32, ib)],
            [
                (DType.I32, _bin("add"), lambda a, b: wrap_i32(a + b)),
                (DType.I32, _bin("sub"), lambda a, b: wrap_i32(a - b)),
                (DType.I32, _bin("mul"), lambda a, b: wrap_i32(a * b)),
                (DType.I32, _un("neg"), lambda a, b: wrap_i32(-a)),
            ],
        ),
        _elementwise(
            "u32_div_mod",
            ("u32.div0",),
            [
                (DType.U32, [7, 0, U32_MAX, 100, 5, U32_MAX, 9]),
                (DType.U32, [0, 0, 2, 7, 10, U32_MAX, 3]),
            ],
            [
                (DType.U32, _bin("div"), lambda a, b: U32_MAX if b == 0 else a // b),
                (DType.U32, _bin("mod"), lambda a, b: 0 if b == 0 else a % b),
            ],
        ),
    ]
    da = [7, -7, 7, -7, 0, 5, -5, 0, I32_MIN, I32_MIN, I32_MIN, I32_MAX, -1, 13]
    db = [2, 2, -2, -2, 3, 0, 0, 0, -1, 1, 2, -1, I32_MIN, 13]
    out.append(
        _elementwise(
            "i32_div_mod",
            ("i32.trunc", "i32.div0", "i32.min_neg1"),
            [(DType.I32, da), (DType.I32, db)],
            [
                (DType.I32, _bin("div"), lambda a, b: 0 if b == 0 else wrap_i32(c_div(a, b))),
                (DType.I32, _bin("mod"), lambda a, b: 0 if b == 0 else a - c_div(a, b) * b),
            ],
        )
    )
    out.append(
        _elementwise(
            "u32_shifts",
            ("shift.mask", "shift.kind"),
            [
                (DType.U32, [1, 0x8000_0000, U32_MAX, 5, 0xF0F0_F0F0]),
                (DType.U32, [31, 32, 33, U32_MAX, 4]),
            ],
            [
                (DType.U32, _bin("shl"), lambda a, b: (a << (b & 31)) & M32),
                (DType.U32, _bin("shr"), lambda a, b: a >> (b & 31)),
            ],
        )
    )
    out.append(
        _elementwise(
            "i32_shifts",
            ("shift.mask", "shift.kind"),
            [(DType.I32, [-8, -8, 1, I32_MIN, -1, 1000]), (DType.I32, [1, 33, 31, 31, -1, -30])],
            [
                (DType.I32, _bin("shl"), lambda a, b: wrap_i32((a & M32) << (b & 31))),
                (DType.I32, _bin("shr"), lambda a, b: a >> (b & 31)),
            ],
        )
    )
    out.append(
        _elementwise(
            "u32_mulhi",
            ("mulhi",),
            [
                (DType.U32, [U32_MAX, 0x10000, 3, 0x8000_0000, 0xDEAD_BEEF]),
                (DType.U32, [U32_MAX, 0x10000, 5, 2, 0xCAFE_BABE]),
            ],
            [(DType.U32, _bin("mulhi"), lambda a, b: (a * b) >> 32)],
        )
    )
    bits_u = [0, 1, 0x8000_0000, U32_MAX, 0x00F0, 0x0001_0000]
    bits_i = [0, -1, I32_MIN, 1, 96, I32_MAX]

    def clz(x: int) -> int:
        return 32 - (x & M32).bit_length()

    def ctz(x: int) -> int:
        x &= M32
        return 32 if x == 0 else (x & -x).bit_length() - 1

    out += [
        _elementwise(
            "u32_bit_counts",
            ("bits.count",),
            [(DType.U32, bits_u)],
            [
                (DType.U32, _un("popcount"), lambda a: bin(a).count("1")),
                (DType.U32, _un("clz"), clz),
                (DType.U32, _un("ctz"), ctz),
                (DType.U32, _un("not"), lambda a: ~a & M32),
            ],
        ),
        _elementwise(
            "i32_bit_counts",
            ("bits.count",),
            [(DType.I32, bits_i)],
            [
                (DType.I32, _un("popcount"), lambda a: bin(a & M32).count("1")),
                (DType.I32, _un("clz"), clz),
                (DType.I32, _un("ctz"), ctz),
                (DType.I32, _un("not"), lambda a: ~a),
            ],
        ),
        _elementwise(
            "int_min_max_compare",
            ("int.compare",),
            [(DType.U32, [U32_MAX, 0, 7, 5]), (DType.U32, [1, 0, 9, 5])],
            [
                (DType.U32, _bin("min"), min),
                (DType.U32, _bin("max"), max),
                (DType.BOOL, _bin("lt"), lambda a, b: a < b),
                (DType.BOOL, _bin("ge"), lambda a, b: a >= b),
                (
                    DType.I32,
                    lambda xs: Cast(DType.I32, xs[0]).min(Cast(DType.I32, xs[1])),
                    lambda a, b: min(wrap_i32(a), wrap_i32(b)),
                ),
                (
                    DType.BOOL,
                    lambda xs: Cast(DType.I32, xs[0]).lt(Cast(DType.I32, xs[1])),
                    lambda a, b: wrap_i32(a) < wrap_i32(b),
                ),
            ],
        ),
    ]
    return out


# ---------------------------------------------------------------------------------
# f32 cases


def _f_add(a: float, b: float) -> float:
    return r32(a + b)


def _f_mul(a: float, b: float) -> float:
    return r32(a * b)


def _f_div(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return NAN
    if b == 0:
        if a == 0:
            return NAN
        negative = (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
        return -INF if negative else INF
    return r32(a / b)


def _fma_oracle(a: float, b: float, c: float) -> float:
    if not all(math.isfinite(v) for v in (a, b, c)):
        return a * b + c
    q = Fraction(a) * Fraction(b) + Fraction(c)
    if q != 0:
        return exact_r32(q)
    product_zero_negative = a * b == 0 and (math.copysign(1, a) < 0) != (math.copysign(1, b) < 0)
    if a * b == 0 and c == 0:
        return -0.0 if product_zero_negative and math.copysign(1, c) < 0 else 0.0
    return 0.0


def _fmin(a: float, b: float) -> float:
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == b == 0:
        return -0.0 if math.copysign(1, a) < 0 or math.copysign(1, b) < 0 else 0.0
    return min(a, b)


def _fmax(a: float, b: float) -> float:
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == b == 0:
        return -0.0 if math.copysign(1, a) < 0 and math.copysign(1, b) < 0 else 0.0
    return max(a, b)


def _keep_sign(fn: Callable[[float], float]) -> Callable[[float], float]:
    def run(x: float) -> float:
        return x if not math.isfinite(x) else math.copysign(float(fn(x)), x)

    return run


def _fmod(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return NAN
    return a if math.isinf(b) else math.fmod(a, b)


def _f32_cases() -> list[Case]:
    h = 2.0**-24
    a = [1.0, 1.0, 16777216.0, 0.1, 3.0e38, -3.0e38, 1.0e-30, 1.5, 2.0**-12 + 1]
    b = [h, 3 * h, 1.0, 0.2, 3.0e38, -3.0e38, 1.0e-30, -1.5, 2.0**-12 + 1]
    a = [r32(x) for x in a]
    b = [r32(x) for x in b]
    out = [
        _elementwise(
            "f32_round_to_nearest_even",
            ("f32.rne", "f32.exact"),
            [(DType.F32, a), (DType.F32, b)],
            [
                (DType.F32, _bin("add"), _f_add),
                (DType.F32, _bin("sub"), lambda x, y: r32(x - y)),
                (DType.F32, _bin("mul"), _f_mul),
            ],
        )
    ]
    # a*b+c where a fused multiply-add would give 2**-24 but two roundings give 0.
    p = r32(1 + 2.0**-12)
    # Then: a subnormal result that is not a tie (0.625 * 2**-149 rounds up to
    # 2**-149), two that round past MAX_F32 (a sum of two, and MAX_F32 plus half
    # its last place: a tie that rounds to even, up, to infinity), and an
    # infinite operand beside finite ones.
    fa = [
        p,
        p,
        MAX_F32,
        1.0,
        1.5,
        0.0,
        -0.0,
        INF,
        1.0,
        MIN_SUB,
        MIN_SUB,
        MAX_F32,
        MAX_F32,
        INF,
        1.0,
    ]
    fb = [p, p, 2.0, -1.0, 1.5, 5.0, 1.0, 0.0, 1.0, 0.5, 0.625, 1.0, 1.0, 1.0, 1.0]
    fc = [r32(-(1 + 2.0**-11)), 2.0**-60, -MAX_F32, 1.0, -2.25, -0.0, -0.0, 1.0, MIN_SUB, 0.0]
    fc += [0.0, MAX_F32, 2.0**103, 1.0, -INF]
    out.append(
        _elementwise(
            "f32_fma_single_rounding",
            ("f32.fma", "f32.no_contraction", "f32.subnormals"),
            [(DType.F32, fa), (DType.F32, fb), (DType.F32, fc)],
            [
                (DType.F32, lambda xs: Fma(xs[0], xs[1], xs[2]), _fma_oracle),
                (
                    DType.F32,
                    lambda xs: xs[0] * xs[1] + xs[2],
                    lambda x, y, z: _f_add(_f_mul(x, y), z),
                ),
            ],
        )
    )
    sa = [MIN_SUB, MIN_SUB, MIN_NORMAL, MAX_SUB, MIN_SUB, -MIN_SUB, MIN_NORMAL]
    sb = [0.5, 1.5, 0.5, MIN_SUB, 0.0, 2.0, -MAX_SUB]
    out.append(
        _elementwise(
            "f32_subnormals",
            ("f32.subnormals", "f32.rne"),
            [(DType.F32, sa), (DType.F32, sb)],
            [
                (DType.F32, _bin("mul"), _f_mul),
                (DType.F32, _bin("add"), _f_add),
                (DType.F32, _bin("div"), _f_div),
            ],
        )
    )
    ma = [NAN, 1.0, NAN, 0.0, -0.0, -INF, 3.0, -0.0, NAN, 0.0]
    mb = [1.0, NAN, NAN, -0.0, 0.0, INF, -2.0, -0.0, -0.0, 0.0]
    out.append(
        _elementwise(
            "f32_min_max",
            ("f32.minmax_nan", "f32.minmax_zero", "f32.nan_payload"),
            [(DType.F32, ma), (DType.F32, mb)],
            [(DType.F32, _bin("min"), _fmin), (DType.F32, _bin("max"), _fmax)],
        )
    )
    ra = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, r32(0.49999997), -0.0, INF, NAN, 8388609.0, -0.7, 1e30]
    out.append(
        _elementwise(
            "f32_rounding_ops",
            ("f32.round", "f32.exact"),
            [(DType.F32, ra)],
            [
                (DType.F32, _un("round"), _keep_sign(round)),
                (DType.F32, _un("floor"), _keep_sign(math.floor)),
                (DType.F32, _un("ceil"), _keep_sign(math.ceil)),
                (DType.F32, _un("trunc"), _keep_sign(math.trunc)),
                (DType.F32, _un("abs"), math.fabs),
                (DType.F32, _un("neg"), lambda x: -x),
            ],
        )
    )
    out.append(
        _elementwise(
            "f32_mod_div_by_zero",
            ("f32.mod", "f32.div0"),
            [
                # (the last four: NaN operands, a NaN over a zero is NaN, not an infinity;
                # written apart, hence the concatenations)
                (
                    DType.F32,
                    [5.5, -5.5, 5.5, 1.0, INF, 1.0, -0.0, 1.0, -1.0, 0.0, INF, NAN, 2.0]  # noqa: RUF005
                    + [NAN, NAN],
                ),
                (
                    DType.F32,
                    [2.0, 2.0, -2.0, 0.0, 1.0, INF, 1.0, 0.0, 0.0, 0.0, INF, 2.0, NAN]  # noqa: RUF005
                    + [0.0, -0.0],
                ),
            ],
            [(DType.F32, _bin("mod"), _fmod), (DType.F32, _bin("div"), _f_div)],
        )
    )
    out.append(
        _elementwise(
            "f32_div_by_negative_zero",
            ("f32.div0",),
            [(DType.F32, [1.0, -1.0, 0.0]), (DType.F32, [-0.0, -0.0, -0.0])],
            [(DType.F32, _bin("div"), _f_div)],
        )
    )
    na = [NAN, 1.0, NAN, INF, -0.0]
    nb = [1.0, NAN, NAN, INF, 0.0]
    out.append(
        _elementwise(
            "f32_nan_comparisons",
            ("f32.nan_compare",),
            [(DType.F32, na), (DType.F32, nb)],
            [
                (DType.BOOL, _bin(op), fn)
                for op, fn in (
                    ("eq", lambda x, y: x == y),
                    ("ne", lambda x, y: x != y),
                    ("lt", lambda x, y: x < y),
                    ("le", lambda x, y: x <= y),
                    ("gt", lambda x, y: x > y),
                    ("ge", lambda x, y: x >= y),
                )
            ],
        )
    )
    rng = np.random.default_rng(7)
    da = [float(v) for v in rng.standard_normal(64).astype(np.float32)] + [
        2.0,
        0.0,
        -0.0,
        -1.0,
        INF,
    ]
    db = [float(v) for v in (rng.standard_normal(64) * 3).astype(np.float32)] + [
        3.0,
        1.0,
        1.0,
        1.0,
        1.0,
    ]

    def f_sqrt(x: float, _: float) -> float:
        return NAN if math.isnan(x) or x < 0 else r32(math.sqrt(x))

    out.append(
        _elementwise(
            "f32_div_sqrt_correctly_rounded",
            ("f32.div_sqrt",),
            [(DType.F32, da), (DType.F32, db)],
            [(DType.F32, _bin("div"), _f_div), (DType.F32, _un("sqrt"), f_sqrt)],
        )
    )
    ta = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        10.0,
        88.0,
        89.0,
        -104.0,
        1e-30,
        3.0,
        100.0,
        MIN_SUB,
        INF,
        -INF,
        NAN,
    ]
    ta += [float(v) for v in rng.uniform(-20, 20, 32).astype(np.float32)]

    def guard(fn: Callable[[float], float]) -> Callable[[float], float]:
        def run(x: float) -> float:
            try:
                return r32(fn(x))
            except OverflowError:
                return INF
            except ValueError:
                return -INF if x == 0 else NAN

        return run

    def rsqrt(x: float) -> float:
        if math.isnan(x) or x < 0:
            return NAN
        return math.copysign(INF, x) if x == 0 else r32(1.0 / math.sqrt(x))

    def periodic(fn: Callable[[float], float]) -> Callable[[float], float]:
        return lambda x: NAN if not math.isfinite(x) else r32(fn(x))

    out.append(
        _elementwise(
            "f32_transcendentals",
            ("f32.transcendental",),
            [(DType.F32, ta)],
            [
                (DType.F32, _un("exp"), guard(math.exp)),
                (
                    DType.F32,
                    _un("log"),
                    lambda x: NAN if x < 0 or math.isnan(x) else guard(math.log)(x),
                ),
                (DType.F32, _un("sin"), periodic(math.sin)),
                (DType.F32, _un("cos"), periodic(math.cos)),
                (DType.F32, _un("tanh"), lambda x: r32(math.tanh(x))),
                (DType.F32, _un("rsqrt"), rsqrt),
            ],
            ulp_budget=2,
        )
    )
    return out


# ---------------------------------------------------------------------------------
# casts


def _f2i(lo: int, hi: int) -> Callable[[float], int]:
    def run(x: float) -> int:
        if math.isnan(x):
            return 0
        if math.isinf(x):
            return hi if x > 0 else lo
        return min(max(math.trunc(x), lo), hi)

    return run


def _cast_cases() -> list[Case]:
    fv = [1.9, -1.9, -0.5, 3e9, -3e9, 5e9, NAN, INF, -INF, 2147483520.0, 4294967040.0, -0.0, 2.5e9]
    # The last lane: just below a halfway point (0x8000_017F rounds down to
    # 0x8000_0100; rounding to 25 bits first would give 0x8000_0200).
    uv = [16777217, 16777219, U32_MAX, 0x8000_0080, 0x8000_0181, 0, 33554435, 0x8000_017F]
    iv = [-16777217, I32_MIN, I32_MAX, -1, 16777219, 0, -33554435, 0x4000_00BF]
    return [
        _elementwise(
            "cast_f32_to_int",
            ("cast.f2i",),
            [(DType.F32, fv)],
            [
                (DType.U32, lambda xs: Cast(DType.U32, xs[0]), _f2i(0, U32_MAX)),
                (DType.I32, lambda xs: Cast(DType.I32, xs[0]), _f2i(I32_MIN, I32_MAX)),
            ],
        ),
        _elementwise(
            "cast_int_to_f32",
            ("cast.i2f", "cast.reinterpret"),
            [(DType.U32, uv), (DType.I32, iv)],
            [
                (
                    DType.F32,
                    lambda xs: Cast(DType.F32, xs[0]),
                    lambda u, i: exact_r32(Fraction(u)) if u else 0.0,
                ),
                (
                    DType.F32,
                    lambda xs: Cast(DType.F32, xs[1]),
                    lambda u, i: exact_r32(Fraction(i)) if i else 0.0,
                ),
                (DType.I32, lambda xs: Cast(DType.I32, xs[0]), lambda u, i: wrap_i32(u)),
                (DType.U32, lambda xs: Cast(DType.U32, xs[1]), lambda u, i: i & M32),
            ],
        ),
        _elementwise(
            "cast_bool",
            ("cast.to_bool", "cast.from_bool"),
            [
                (DType.F32, [0.0, -0.0, NAN, MIN_SUB, -INF]),
                (DType.U32, [0, 7, 1, U32_MAX, 0]),
                (DType.I32, [-1, 0, 0, I32_MIN, 5]),
            ],
            [
                (DType.BOOL, lambda xs: Cast(DType.BOOL, xs[0]), lambda f, u, i: f != 0),
                (DType.BOOL, lambda xs: Cast(DType.BOOL, xs[1]), lambda f, u, i: u != 0),
                (DType.BOOL, lambda xs: Cast(DType.BOOL, xs[2]), lambda f, u, i: i != 0),
                (
                    DType.U32,
                    lambda xs: Cast(DType.U32, Cast(DType.BOOL, xs[0])),
                    lambda f, u, i: int(f != 0),
                ),
                (
                    DType.F32,
                    lambda xs: Cast(DType.F32, Cast(DType.BOOL, xs[1])),
                    lambda f, u, i: float(u != 0),
                ),
                (
                    DType.I32,
                    lambda xs: Cast(DType.I32, Cast(DType.BOOL, xs[2])),
                    lambda f, u, i: int(i != 0),
                ),
            ],
        ),
        _elementwise(
            "bool_load_and_conditions",
            ("bool.load", "cond.nonzero"),
            [(DType.BOOL, [0, 1, 2, U32_MAX, 0x8000_0000]), (DType.U32, [0, 3, 0, 1, 0x100])],
            [
                (DType.BOOL, lambda xs: xs[0], lambda b, u: b != 0),
                (
                    DType.U32,
                    lambda xs: Select(xs[0], u32(10), u32(20)),
                    lambda b, u: 10 if b else 20,
                ),
                (DType.U32, lambda xs: Select(xs[1], u32(1), u32(2)), lambda b, u: 1 if u else 2),
                (
                    DType.BOOL,
                    lambda xs: xs[0].eq(Cast(DType.BOOL, xs[1])),
                    lambda b, u: (b != 0) == (u != 0),
                ),
            ],
        ),
    ]


# ---------------------------------------------------------------------------------
# memory, control, atomics and launch geometry


def _u32s(*values: int) -> np.ndarray[Any, Any]:
    return np.array(values, dtype=np.uint64).astype(np.uint32)


def _memory_cases() -> list[Case]:
    cases: list[Case] = []
    # Out-of-bounds loads: 8 lanes read a 4-element buffer, and index 0xFFFFFFFF.
    g = gid()
    prog = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("f", 1, Access.READ, DType.F32),
            BufferDecl("out", 2, Access.WRITE, DType.U32, 8),
            BufferDecl("fout", 3, Access.WRITE, DType.F32, 8),
            BufferDecl("far", 4, Access.WRITE, DType.U32, 1),
        ],
        4,
        [
            Store("out", g, Load("a", g)),
            Store("fout", g, Load("f", g)),
            Store("far", u32(0), Load("a", u32(U32_MAX)) + u32(5)),
        ],
        op_id="case.oob_load",
    )
    a = _u32s(11, 12, 13, 14)
    fv = np.array([1.5, -2.5, 3.5, 4.5], np.float32)
    cases.append(
        Case(
            name="oob_load_returns_zero",
            rules=("mem.oob_load", "ctl.all_lanes"),
            program=prog,
            inputs=(a, fv),
            expected=(
                _u32s(11, 12, 13, 14, 0, 0, 0, 0),
                np.array([1.5, -2.5, 3.5, 4.5, 0, 0, 0, 0], np.float32),
                _u32s(5),
            ),
        )
    )
    # Out-of-bounds stores and atomics: dropped; the atomic returns 0.
    prog = Program(
        [
            BufferDecl("acc", 0, Access.READ_WRITE, DType.U32, 2),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
            BufferDecl("old", 2, Access.WRITE, DType.U32, 8),
        ],
        8,
        [
            Store("out", g + u32(2), g + u32(1)),
            Store("out", u32(U32_MAX), u32(99)),
            Store("old", g, Atomic("add", "acc", g, u32(1)) + u32(100)),
        ],
        op_id="case.oob_store",
    )
    cases.append(
        Case(
            name="oob_store_and_atomic_do_nothing",
            rules=("mem.oob_store", "mem.write_zeroed", "mem.read_write_init", "atomic.old"),
            program=prog,
            inputs=(_u32s(40, 50),),
            expected=(
                _u32s(41, 51),
                _u32s(0, 0, 1, 2),
                _u32s(140, 150, 100, 100, 100, 100, 100, 100),
            ),
            grid=(1, 1, 1),
        )
    )
    # Workgroup buffers: per-workgroup, zero-filled, and out-of-bounds stays inside nothing.
    lane = lid()
    prog = Program(
        [
            BufferDecl("out", 0, Access.WRITE, DType.U32, 8),
            BufferDecl("atom", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("sh", 2, Access.WORKGROUP, DType.U32, 3),
        ],
        4,
        [
            Store("sh", lane, lane + wgid() * u32(10) + u32(1)),
            Barrier(),
            Let("o", Atomic("add", "sh", lane + u32(1), u32(100))),
            Barrier(),
            Store("out", gid(), Load("sh", lane) + Load("sh", u32(7))),
            Store("atom", gid(), Var("o")),
        ],
        op_id="case.workgroup_oob",
    )
    cases.append(
        Case(
            name="workgroup_memory_private_and_bounded",
            rules=("mem.oob_workgroup", "mem.workgroup", "ctl.barrier", "mem.oob_store"),
            program=prog,
            inputs=(),
            expected=(
                _u32s(1, 102, 103, 0, 11, 112, 113, 0),
                _u32s(2, 3, 0, 0, 12, 13, 0, 0),
            ),
            grid=(2, 1, 1),
        )
    )
    # WORKGROUP memory starts at zero in every workgroup and every launch; WRITE once.
    prog = Program(
        [
            BufferDecl("rw", 0, Access.READ_WRITE, DType.U32, 4),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
            BufferDecl("seen", 2, Access.WRITE, DType.U32, 4),
            BufferDecl("sh", 3, Access.WORKGROUP, DType.U32, 1),
        ],
        2,
        [
            If(lane.eq(u32(0)), [Store("sh", u32(0), Load("sh", u32(0)) + wgid() + u32(1))]),
            Barrier(),
            Store("seen", gid(), Load("sh", u32(0))),
            Store("rw", gid(), Load("rw", gid()) * u32(2)),
            Store("out", gid(), Load("out", gid()) + u32(1)),
        ],
        op_id="case.fixpoint",
    )
    cases.append(
        Case(
            name="fixpoint_carries_buffers",
            rules=("launch.fixpoint", "mem.workgroup", "mem.write_zeroed", "mem.read_write_init"),
            program=prog,
            inputs=(_u32s(1, 2, 3, 4),),
            expected=(_u32s(8, 16, 24, 32), _u32s(3, 3, 3, 3), _u32s(1, 1, 2, 2)),
            fixpoint_iterations=3,
        )
    )
    return cases


def _control_cases() -> list[Case]:
    cases: list[Case] = []
    g, x, acc = gid(), Var("x"), Var("acc")
    # The loop below starts at lane % 3 and ends at the lane's value: lane 8 (1)
    # starts above its end, lanes 5 (2) and 7 (1) at a non-zero end: no trip for any.
    # (The If below needs 5 and 7: odd values each side of its x > 5.)
    data = [3, 8, 5, 0, 12, 2, 7, 1, 1, 4]
    # Divergent If/else, nested, assigning an outer variable under masks.
    prog = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 10),
        ],
        4,
        [
            Let("x", Load("a", g)),
            Let("acc", u32(1000)),
            If(
                (x & u32(1)).eq(u32(1)),
                [Assign("acc", x * u32(3)), If(x.gt(u32(5)), [Assign("acc", acc + u32(100))])],
                [Assign("acc", x / u32(2)), If(x.eq(u32(0)), [Assign("acc", u32(77))])],
            ),
            If(g.lt(BufLen("out")), [Store("out", g, acc)]),
        ],
        op_id="case.if",
    )

    def branchy(v: int) -> int:
        if v & 1:
            return v * 3 + (100 if v > 5 else 0)
        return 77 if v == 0 else v // 2

    cases.append(
        Case(
            name="divergent_if_else_masks",
            rules=("ctl.if",),
            program=prog,
            inputs=(_u32s(*data),),
            expected=(_u32s(*[branchy(v) for v in data]),),
        )
    )
    # Per-lane trip counts; bounds are evaluated once even if the body changes them.
    prog = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 10),
        ],
        4,
        [
            Let("n", Load("a", g)),
            Let("acc", u32(0)),
            Loop("j", g % u32(3), Var("n"), [Assign("acc", acc + Var("j")), Assign("n", u32(0))]),
            If(g.lt(BufLen("out")), [Store("out", g, acc * u32(16) + Var("n"))]),
        ],
        op_id="case.loop",
    )

    def trips(i: int, n: int) -> int:
        total = sum(range(i % 3, n))
        return total * 16 + (0 if i % 3 < n else n)

    cases.append(
        Case(
            name="loop_per_lane_trip_counts",
            rules=("ctl.loop",),
            program=prog,
            inputs=(_u32s(*data),),
            expected=(_u32s(*[trips(i, v) for i, v in enumerate(data)]),),
        )
    )
    # Bounds are evaluated once even when they were loaded from memory the body
    # changes: the start is a value, not a view of the buffer (the reference engine
    # once kept a view, so each atomic moved the counter of the next iteration;
    # the trip count stayed right, only the counter's value went wrong).
    for wg, suffix in ((4, ""), (1, "_single_lane_workgroups")):
        prog = Program(
            [
                BufferDecl("data", 0, Access.READ_WRITE, DType.U32),
                BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
            ],
            wg,
            [
                Let("acc", u32(0)),
                Loop(
                    "t",
                    Load("data", g),
                    u32(4),
                    [
                        Assign("acc", acc + Var("t")),
                        Let("old", Atomic("add", "data", g, u32(10))),
                        Store("out", g, acc),
                    ],
                ),
            ],
            op_id="case.loop_memory_bounds",
        )
        start = [0, 1, 2, 3]
        cases.append(
            Case(
                name="loop_start_loaded_from_memory_the_body_writes" + suffix,
                rules=("ctl.loop",),
                program=prog,
                inputs=(_u32s(*start),),
                expected=(
                    _u32s(*[s + 10 * (4 - s) for s in start]),
                    _u32s(*[sum(range(s, 4)) for s in start]),
                ),
            )
        )
    # Return removes lanes; a uniformly returned workgroup does not block a barrier.
    lane = lid()
    prog = Program(
        [
            BufferDecl("out", 0, Access.WRITE, DType.U32, 12),
            BufferDecl("sh", 1, Access.WORKGROUP, DType.U32, 4),
        ],
        4,
        [
            If(wgid().eq(u32(1)), [Return()]),
            Store("sh", lane, g + u32(1)),
            Barrier(),
            If(
                (g % u32(3)).eq(u32(0)),
                [Store("out", g, u32(500)), Return(), Store("out", g, u32(600))],
            ),
            Store("out", g, Load("sh", (lane + u32(1)) % u32(4)) * u32(10)),
        ],
        op_id="case.return",
    )
    expected = []
    for i in range(12):
        w, l_ = divmod(i, 4)
        if w == 1:
            expected.append(0)
        elif i % 3 == 0:
            expected.append(500)
        else:
            expected.append((w * 4 + (l_ + 1) % 4 + 1) * 10)
    cases.append(
        Case(
            name="return_before_barrier",
            rules=("ctl.return", "ctl.barrier", "uniformity"),
            program=prog,
            inputs=(),
            expected=(_u32s(*expected),),
        )
    )
    # Select evaluates both arms: both atomics run on every lane.
    prog = Program(
        [BufferDecl("acc", 0, Access.READ_WRITE, DType.U32, 2)],
        4,
        [
            Let(
                "s",
                Select(
                    (g & u32(1)).eq(u32(0)), Atomic("add", "acc", 0, 1), Atomic("add", "acc", 1, 2)
                ),
            ),
            If(Var("s").gt(u32(1_000_000)), [Store("acc", u32(0), u32(0))]),
        ],
        op_id="case.select",
    )
    cases.append(
        Case(
            name="select_evaluates_both_arms",
            rules=("ctl.select_both", "atomic.final"),
            program=prog,
            inputs=(_u32s(5, 6),),
            expected=(_u32s(5 + 8, 6 + 16),),
            grid=(2, 1, 1),
        )
    )
    # Barrier under uniform control flow: wgid-dependent If, UNIFORM-bounded loop.
    prog = Program(
        [
            BufferDecl("rounds", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("sh", 2, Access.WORKGROUP, DType.U32, 4),
        ],
        4,
        [
            Store("sh", lane, lane + u32(1)),
            Barrier(),
            If(
                wgid().eq(u32(0)),
                [
                    Loop(
                        "r",
                        u32(0),
                        Load("rounds", u32(0)),
                        [
                            Let("v", Load("sh", (lane + u32(1)) % u32(4))),
                            Barrier(),
                            Store("sh", lane, Var("v")),
                            Barrier(),
                        ],
                    )
                ],
            ),
            Store("out", g, Load("sh", lane) + nwg() * u32(100)),
        ],
        op_id="case.uniform",
    )
    rot = [[(l_ + 3) % 4 + 1 for l_ in range(4)], [l_ + 1 for l_ in range(4)]]
    cases.append(
        Case(
            name="barriers_in_uniform_control",
            rules=("uniformity", "ctl.barrier"),
            program=prog,
            inputs=(_u32s(3),),
            expected=(_u32s(*[v + 200 for row in rot for v in row]),),
        )
    )
    return cases


def _atomic_cases() -> list[Case]:
    g, lane = gid(), lid()
    n = 24
    cases: list[Case] = []
    ops = ("add", "or", "and", "xor", "min", "max")
    init = [5, 0x100, U32_MAX, 0xAAAA, 1000, 3]
    values = [(i * 2654435761) & M32 for i in range(n)]
    body: list[Stmt] = [Let("v", Load("vals", g))]
    for k, op in enumerate(ops):
        body.append(Let(f"u{k}", Atomic(op, "acc", u32(k), Var("v"))))
    prog = Program(
        [
            BufferDecl("vals", 0, Access.READ, DType.U32),
            BufferDecl("acc", 1, Access.READ_WRITE, DType.U32, len(ops)),
        ],
        8,
        body,
        op_id="case.atomic_final",
    )
    combine: dict[str, Callable[[int, int], int]] = {
        "add": lambda p, q: (p + q) & M32,
        "or": lambda p, q: p | q,
        "and": lambda p, q: p & q,
        "xor": lambda p, q: p ^ q,
        "min": min,
        "max": max,
    }
    final = [reduce(combine[op], values, init[k]) for k, op in enumerate(ops)]
    cases.append(
        Case(
            name="colliding_atomics_final_memory",
            rules=("atomic.final",),
            program=prog,
            inputs=(_u32s(*values), _u32s(*init)),
            expected=(_u32s(*final),),
        )
    )
    # Old values: a slot counter hands out 0..n-1 exactly once (an order-independent fact).
    slot = Var("slot")
    prog = Program(
        [
            BufferDecl("counter", 0, Access.READ_WRITE, DType.U32, 1),
            BufferDecl("marks", 1, Access.READ_WRITE, DType.U32, n),
            BufferDecl("wmarks", 2, Access.WRITE, DType.U32, n),
            BufferDecl("wcount", 3, Access.WORKGROUP, DType.U32, 1),
        ],
        8,
        [
            Let("slot", Atomic("add", "counter", u32(0), u32(1))),
            Let("mark", Atomic("add", "marks", slot, u32(1))),
            Let("wslot", Atomic("add", "wcount", u32(0), u32(1))),
            Store("wmarks", wgid() * u32(8) + Var("wslot"), Var("wslot") + u32(1)),
        ],
        op_id="case.atomic_old",
    )
    cases.append(
        Case(
            name="atomic_old_values_are_a_permutation",
            rules=("atomic.old", "atomic.order", "mem.workgroup"),
            program=prog,
            inputs=(_u32s(0), _u32s(*[0] * n)),
            expected=(_u32s(n), _u32s(*[1] * n), _u32s(*[1 + i % 8 for i in range(n)])),
            grid=(3, 1, 1),
        )
    )
    # Exchange: old values plus the final value are exactly {init} + {values}.
    prog = Program(
        [
            BufferDecl("cell", 0, Access.READ_WRITE, DType.U32, 1),
            BufferDecl("seen", 1, Access.READ_WRITE, DType.U32, n + 1),
        ],
        n,
        [
            Let("old", Atomic("exchange", "cell", u32(0), g + u32(1))),
            Let("m1", Atomic("add", "seen", Var("old"), u32(1))),
            Barrier(),
            If(lane.eq(u32(0)), [Let("m2", Atomic("add", "seen", Load("cell", u32(0)), u32(1)))]),
            Barrier(),
            Store("cell", u32(0), u32(0)),
        ],
        op_id="case.exchange",
    )
    cases.append(
        Case(
            name="atomic_exchange_chain",
            rules=("atomic.old", "atomic.order"),
            program=prog,
            inputs=(_u32s(0), _u32s(*[0] * (n + 1))),
            expected=(_u32s(0), _u32s(*[1] * (n + 1))),
            grid=(1, 1, 1),
        )
    )
    # Compare-and-swap: stores only on a match; exactly one lane wins an empty cell.
    prog = Program(
        [
            BufferDecl("cell", 0, Access.READ_WRITE, DType.U32, 4),
            BufferDecl("old", 1, Access.WRITE, DType.U32, 8),
        ],
        8,
        [
            Let("o", Atomic("cas", "cell", u32(0), u32(7), expected=u32(0))),
            If(Var("o").eq(u32(0)), [Let("w", Atomic("add", "cell", u32(1), u32(1)))]),
            Store("old", g, Atomic("cas", "cell", u32(2), u32(5), expected=u32(99))),
            Let("m", Atomic("cas", "cell", u32(9), u32(5), expected=u32(0))),
        ],
        op_id="case.cas",
    )
    cases.append(
        Case(
            name="atomic_cas_stores_only_on_match",
            rules=("atomic.cas", "atomic.order", "mem.oob_store"),
            program=prog,
            inputs=(_u32s(0, 0, 3, 4),),
            expected=(_u32s(7, 1, 3, 4), _u32s(*[3] * 8)),
            grid=(1, 1, 1),
        )
    )
    # Workgroup atomics count per workgroup; lane 0 publishes them.
    prog = Program(
        [
            BufferDecl("out", 0, Access.WRITE, DType.U32, 6),
            BufferDecl("bins", 1, Access.WORKGROUP, DType.U32, 2),
        ],
        5,
        [
            Let("k", Atomic("add", "bins", lane % u32(2), lane + u32(1))),
            Barrier(),
            If(lane.lt(u32(2)), [Store("out", wgid() * u32(2) + lane, Load("bins", lane))]),
        ],
        op_id="case.wg_atomics",
    )
    per_wg = [1 + 3 + 5, 2 + 4]
    cases.append(
        Case(
            name="workgroup_atomics_per_workgroup",
            rules=("atomic.final", "mem.workgroup"),
            program=prog,
            inputs=(),
            expected=(_u32s(*per_wg * 3),),
            grid=(3, 1, 1),
        )
    )
    return cases


def _launch_cases() -> list[Case]:
    g = gid()
    cases: list[Case] = []
    # Inferred grid: n = largest output count (10) → ceil(10 / 4) = 3 workgroups.
    prog = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 10),
        ],
        4,
        [Store("out", g, nwg() * u32(1000) + g)],
        op_id="case.infer",
    )
    x20 = _u32s(*range(20))
    cases.append(
        Case(
            name="grid_inferred_from_outputs",
            rules=("launch.infer", "ctl.all_lanes"),
            program=prog,
            inputs=(x20,),
            expected=(_u32s(*[3000 + i for i in range(10)]),),
        )
    )
    # With atomics every non-workgroup buffer counts: n = 20 → 5 workgroups, 20 lanes run.
    prog = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 10),
            BufferDecl("lanes", 2, Access.READ_WRITE, DType.U32, 1),
        ],
        4,
        [Store("out", g, nwg() * u32(1000) + g), Let("c", Atomic("add", "lanes", u32(0), u32(1)))],
        op_id="case.infer_atomics",
    )
    cases.append(
        Case(
            name="grid_inferred_with_atomics",
            rules=("launch.infer", "ctl.all_lanes", "atomic.final"),
            program=prog,
            inputs=(x20, _u32s(0)),
            expected=(_u32s(*[5000 + i for i in range(10)]), _u32s(20)),
        )
    )
    # grid_override wins; multi-dimensional builtins and lane order.
    wg_shape, grid = (2, 3, 1), (2, 1, 2)
    total = 2 * 3 * 1 * 2 * 1 * 2
    code = (
        gid(0) * u32(1)
        + gid(1) * u32(10)
        + gid(2) * u32(100)
        + lid(0) * u32(1000)
        + lid(1) * u32(10000)
        + wgid(0) * u32(100000)
        + wgid(2) * u32(1000000)
        + (nwg(0) + nwg(1) * u32(2) + nwg(2) * u32(4)) * u32(10000000)
    )
    prog = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, total)],
        wg_shape,
        [
            Let(
                "linear",
                (wgid(2) * nwg(1) * nwg(0) + wgid(1) * nwg(0) + wgid(0)) * u32(6)
                + lid(1) * u32(2)
                + lid(0),
            ),
            Store("out", Var("linear"), code),
        ],
        op_id="case.builtins",
    )
    expected = []
    for w in range(4):
        wx, wz = w % 2, w // 2
        for loc in range(6):
            lx, ly = loc % 2, loc // 2
            gx, gy, gz = wx * 2 + lx, ly, wz
            expected.append(
                gx
                + gy * 10
                + gz * 100
                + lx * 1000
                + ly * 10000
                + wx * 100000
                + wz * 1000000
                + (2 + 1 * 2 + 2 * 4) * 10000000
            )
    cases.append(
        Case(
            name="grid_override_multi_dim_builtins",
            rules=("launch.override", "launch.builtins"),
            program=prog,
            inputs=(),
            expected=(_u32s(*expected),),
            grid=grid,
        )
    )
    cases.append(
        Case(
            name="multi_dim_without_grid_is_invalid",
            rules=("launch.multi_dim",),
            program=prog,
            inputs=(),
            expected=(),
            error=InvalidProgram,
        )
    )
    # Zero lanes: outputs come back as initialised.
    prog = Program(
        [
            BufferDecl("rw", 0, Access.READ_WRITE, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.F32, 3),
        ],
        4,
        [Store("rw", g, u32(9)), Store("out", g, f32(1.0))],
        op_id="case.zero",
    )
    cases.append(
        Case(
            name="zero_lane_launch",
            rules=("launch.zero", "mem.write_zeroed", "mem.read_write_init"),
            program=prog,
            inputs=(_u32s(4, 5),),
            expected=(_u32s(4, 5), np.zeros(3, np.float32)),
            grid=(0, 1, 1),
        )
    )
    return cases


def _grid_cases() -> list[Case]:
    """Grid-wide barriers: placement, many phases, workgroup memory, cross-workgroup reads."""
    cases: list[Case] = []
    g, i = gid(), Var("i")
    # A barrier first and last (empty phases) around one phase.
    prog = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 10),
        ],
        4,
        [
            GridBarrier(),
            Let("i", g),
            If(i.lt(BufLen("out")), [Store("out", i, Load("a", i) * u32(3) + u32(1))]),
            GridBarrier(),
        ],
        op_id="case.grid_first_last",
    )
    data = [5, 0, 7, 1, 9, 2, 8, 3, 6, 4]
    cases.append(
        Case(
            name="grid_barrier_first_and_last",
            rules=("grid.barrier",),
            program=prog,
            inputs=(_u32s(*data),),
            expected=(_u32s(*[3 * v + 1 for v in data]),),
        )
    )
    # Seven phases ping-ponging between two buffers; each lane reads a neighbour that
    # another workgroup wrote in the phase before (12 lanes, 3 workgroups of 4).
    n, phases = 12, 7
    body: list[Stmt] = []
    buffers = ("a", "b")
    for k in range(phases):
        src, dst = buffers[k % 2], buffers[(k + 1) % 2]
        if k:
            body.append(GridBarrier())
        body += [
            Let("i", g),
            Store(dst, i, Load(src, i) * u32(2) + Load(src, (i + u32(k + 1)) % u32(n))),
        ]
    prog = Program(
        [
            BufferDecl("a", 0, Access.READ_WRITE, DType.U32),
            BufferDecl("b", 1, Access.WRITE, DType.U32, n),
        ],
        4,
        body,
        op_id="case.grid_phases",
    )
    start = [(7 * v + 3) % 50 for v in range(n)]
    state = {"a": list(start), "b": [0] * n}
    for k in range(phases):
        old, new = state[buffers[k % 2]], state[buffers[(k + 1) % 2]]
        new[:] = [(old[v] * 2 + old[(v + k + 1) % n]) & M32 for v in range(n)]
    cases.append(
        Case(
            name="grid_barrier_many_phases",
            rules=("grid.barrier", "mem.read_write_init", "mem.write_zeroed"),
            program=prog,
            inputs=(_u32s(*start),),
            expected=(_u32s(*state["a"]), _u32s(*state["b"])),
        )
    )
    # Workgroup memory written before a grid barrier reads zero after it; written
    # again after it, it is shared as usual.
    wg = 4
    lane = lid()
    prog = Program(
        [
            BufferDecl("first", 0, Access.WRITE, DType.U32, 8),
            BufferDecl("second", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("s", 2, Access.WORKGROUP, DType.U32, wg),
        ],
        wg,
        [
            Store("s", lane, g + u32(1)),
            Barrier(),
            Let("i", g),
            Store("first", i, Load("s", (lane + u32(1)) % u32(wg))),
            GridBarrier(),
            Let("old", Load("s", lane)),
            Barrier(),
            Store("s", lane, u32(100) + g),
            Barrier(),
            Store("second", g, Var("old") * u32(1000) + Load("s", u32(wg - 1) - lane)),
        ],
        op_id="case.grid_workgroup_memory",
    )
    first = [(v // wg) * wg + (v % wg + 1) % wg + 1 for v in range(8)]
    second = [100 + (v // wg) * wg + (wg - 1 - v % wg) for v in range(8)]
    cases.append(
        Case(
            name="grid_barrier_workgroup_memory_is_zero_after",
            rules=("grid.barrier", "grid.workgroup_reset", "mem.workgroup", "ctl.barrier"),
            program=prog,
            inputs=(),
            expected=(_u32s(*first), _u32s(*second)),
            grid=(2, 1, 1),
        )
    )
    # A cross-workgroup reduction: per-workgroup partial sums, then one lane adds
    # them, then every lane reads the total and a partial of another workgroup.
    values = [(37 * v + 11) % 1000 for v in range(24)]
    prog = Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("parts", 1, Access.WRITE, DType.U32, 6),
            BufferDecl("out", 2, Access.WRITE, DType.U32, 24),
        ],
        4,
        [
            If(
                lid().eq(u32(0)),
                [
                    Let("acc", u32(0)),
                    Loop(
                        "t",
                        u32(0),
                        u32(4),
                        [Assign("acc", Var("acc") + Load("x", wgid() * u32(4) + Var("t")))],
                    ),
                    Store("parts", wgid(), Var("acc")),
                ],
            ),
            GridBarrier(),
            If(
                g.eq(u32(0)),
                [
                    Let("sum", u32(0)),
                    Loop("t", u32(0), nwg(), [Assign("sum", Var("sum") + Load("parts", Var("t")))]),
                    Store("x_total", u32(0), Var("sum")),
                ],
            ),
            GridBarrier(),
            Store(
                "out",
                g,
                Load("x_total", u32(0)) * u32(10) + Load("parts", u32(5) - wgid()),
            ),
        ],
        op_id="case.grid_reduce",
    )
    prog = Program(
        (*prog.buffers, BufferDecl("x_total", 3, Access.WRITE, DType.U32, 1)),
        prog.workgroup_size,
        prog.body,
        prog.op_id,
    )
    parts = [sum(values[4 * w : 4 * w + 4]) for w in range(6)]
    total = sum(parts)
    cases.append(
        Case(
            name="grid_barrier_cross_workgroup_reduction",
            rules=("grid.barrier", "launch.infer"),
            program=prog,
            inputs=(_u32s(*values),),
            expected=(
                _u32s(*parts),
                _u32s(*[total * 10 + parts[5 - v // 4] for v in range(24)]),
                _u32s(total),
            ),
        )
    )
    return cases


def _fusion_cases() -> list[Case]:
    """Fused programs: members of different sizes, barriers, returns and builtins."""
    g, lane = gid(), lid()
    # Member 0: an xor over 10 lanes (3 workgroups of 4, the last one partly idle).
    xor = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("b", 1, Access.READ, DType.U32),
            BufferDecl("out", 2, Access.WRITE, DType.U32, 10),
        ],
        4,
        [If(g.lt(BufLen("out")), [Store("out", g, Load("a", g) ^ Load("b", g))])],
        op_id="case.fuse_xor",
    )
    # Member 1: each workgroup reverses its lanes through workgroup memory (a Barrier),
    # and records its workgroup id and the number of workgroups.
    rev = Program(
        [
            BufferDecl("x", 0, Access.READ_WRITE, DType.U32),
            BufferDecl("ids", 1, Access.WRITE, DType.U32, 2),
            BufferDecl("s", 2, Access.WORKGROUP, DType.U32, 4),
        ],
        4,
        [
            Store("s", lane, Load("x", g)),
            Barrier(),
            Store("x", g, Load("s", u32(3) - lane)),
            If(lane.eq(u32(0)), [Store("ids", wgid(), wgid() * u32(100) + nwg())]),
        ],
        op_id="case.fuse_reverse",
    )
    # Member 2: lanes at or past 5 return; the others store their gid squared.
    ret = Program(
        [BufferDecl("sq", 0, Access.WRITE, DType.U32, 8)],
        4,
        [If(g.ge(u32(5)), [Return()]), Store("sq", g, g * g)],
        op_id="case.fuse_return",
    )
    from vyre_async.ir.fusion import fuse_programs  # (the corpus is built once)

    fused = fuse_programs([xor, rev, ret])
    grids = [(3, 1, 1), (2, 1, 1), (2, 1, 1)]
    a = [(13 * v + 5) % 97 for v in range(10)]
    b = [(7 * v + 3) % 89 for v in range(10)]
    x = [10 + v for v in range(8)]
    inputs = fused.fused_inputs([[_u32s(*a), _u32s(*b)], [_u32s(*x)], []], grids)
    reversed_x = [x[(v // 4) * 4 + 3 - v % 4] for v in range(8)]
    return [
        Case(
            name="fusion_members_keep_their_own_outputs",
            rules=("fusion.members", "ctl.barrier", "ctl.return", "launch.builtins"),
            program=fused.program,
            inputs=tuple(inputs),
            expected=(
                _u32s(*[p ^ q for p, q in zip(a, b, strict=True)]),
                _u32s(*reversed_x),
                _u32s(0 * 100 + 2, 1 * 100 + 2),
                _u32s(*[v * v if v < 5 else 0 for v in range(8)]),
            ),
            grid=fused.grid(grids),
        )
    ]


def _standard_cases() -> list[Case]:
    rules = {
        "xor": ("ctl.all_lanes", "launch.infer"),
        "saxpy": ("f32.rne", "f32.no_contraction", "launch.infer"),
        "sum": ("ctl.barrier", "mem.workgroup", "f32.rne"),
        "histogram": ("atomic.final", "mem.read_write_init", "mem.workgroup"),
        "scan": ("ctl.barrier", "int.wrap", "cond.nonzero"),
        "matmul": ("ctl.barrier", "f32.no_contraction", "launch.override", "uniformity"),
        "array_sum": ("grid.barrier", "ctl.barrier", "f32.rne", "mem.workgroup"),
        "exclusive_scan": ("grid.barrier", "grid.workgroup_reset", "int.wrap", "uniformity"),
    }
    out = []
    for workload in standard_workloads():
        inputs = workload.inputs(seed=1)
        out.append(
            Case(
                name=f"standard_{workload.name}",
                rules=rules[workload.name],
                program=workload.program,
                inputs=tuple(inputs),
                expected=tuple(workload.expected(inputs)),
                grid=workload.grid,
            )
        )
    return out


def cases() -> list[Case]:
    """Return every conformance case (a fresh list; names are unique)."""
    out = (
        _standard_cases()
        + _integer_cases()
        + _f32_cases()
        + _cast_cases()
        + _memory_cases()
        + _control_cases()
        + _atomic_cases()
        + _launch_cases()
        + _grid_cases()
        + _fusion_cases()
    )
    names = [c.name for c in out]
    assert len(names) == len(set(names)), "case names must be unique"
    return out
