"""The ``wgpu`` backend against the reference, byte for byte, by method.

The reference backend (`vyre_reference`) is the oracle: it implements ir.md's
"Semantics" exactly. Every check here runs one program on both backends and
compares the outputs with `compare_outputs` (bit for bit; NaN compared by
position; programs that use ``exp log sin cos tanh rsqrt`` within the IR's
2-ULP budget). The inputs are chosen where WGSL, Vulkan and a shader compiler
are most likely to go their own way:

- **operator sweeps**: one program per (operator, dtype) the typing tables of
  `vyre_async.ir.ops` accept, per cast pair, ``Select`` and ``Fma``, run on every
  pair of the dtype's boundary values (zeros, ±1, INT_MIN/INT_MAX, shift counts
  of 31/32/33, ±0, ±inf, NaN, subnormals, the extremes, halfway cases, integers
  near 2^23, 2^24, 2^31 and 2^32) plus seeded random pairs; the transcendentals
  over their whole domains (``sin``/``cos`` up to 1e38, ``exp`` into the
  subnormal results);
- **constant-folding guards**: expressions a finite-math compiler folds
  (``x * 0``, ``x - x``, ``(x + c) - c``, ``0 - x``, ``x / x`` ...) and every
  binary operator with a literal operand, on NaN, ±inf, ±0 and huge inputs;
- **constant out-of-range indices** into workgroup memory (a fixed-size WGSL
  array, which naga bounds-checks at shader creation);
- **generated programs**: random valid programs of `tests.strategies` on one
  lane (so no two lanes race and atomics have one order), byte for byte.

A wgpu error the reference does not raise is a divergence too, and so is a
dispatch that does not return: every dispatch runs on a daemon thread given
`LIMIT_S` seconds, so a shader compile that never ends (lavapipe, see
`test_fmod_of_two_literals`) fails its test instead of hanging the session.
Two tests guard bugs this file found (both fixed in the backend):
`test_constant_out_of_range_workgroup_indices` and `test_fmod_of_two_literals`.

The operands of one (operator, dtype) are batched into one dispatch: each new
program is a shader compile (tens of milliseconds on lavapipe). Without wgpu-py
or an adapter every test is skipped (``tests/wgpu/conftest.py``).
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import programs, small_inputs_for
from vyre_async import DispatchConfig, PendingDispatch, VyreBackend
from vyre_async._shadow import Divergence, compare_outputs
from vyre_async.ir import (
    Access,
    Atomic,
    AtomicOp,
    Bin,
    BinOp,
    BufferDecl,
    BufLen,
    Cast,
    Const,
    DType,
    Expr,
    Fma,
    If,
    Let,
    Load,
    Program,
    Select,
    Store,
    Un,
    UnOp,
    Var,
    gid,
)
from vyre_async.ir.ops import (
    TRANSCENDENTAL,
    bin_operand_types,
    bin_result,
    un_operand_types,
    un_result,
)
from vyre_reference import reference_backend

pytestmark = pytest.mark.anyio

U32, I32, F32, BOOL = DType.U32, DType.I32, DType.F32, DType.BOOL
Array = np.ndarray[Any, Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the bytes do not depend on the event loop; trio would compile twice


@pytest.fixture
async def reference() -> AsyncIterator[VyreBackend]:
    backend = reference_backend()
    try:
        yield backend
    finally:
        await backend.aclose()


# ---------------------------------------------------------------------------------
# Values


def _bits(words: Sequence[int]) -> Array:
    """F32 values from their bit patterns (keeps -0.0 and NaN payloads exact)."""
    return np.array(words, dtype=np.uint32).view(np.float32)


_F32_EDGE_BITS = (
    0x0000_0000,  # +0
    0x8000_0000,  # -0
    0x7F80_0000,  # +inf
    0xFF80_0000,  # -inf
    0x7FC0_0000,  # quiet NaN
    0xFFC0_0000,  # negative quiet NaN
    0x7FA0_0000,  # signalling NaN
    0x0000_0001,  # smallest subnormal
    0x8000_0001,
    0x0000_0003,
    0x0040_0000,  # a middle subnormal
    0x007F_FFFF,  # largest subnormal
    0x807F_FFFF,
    0x0080_0000,  # smallest normal
    0x8080_0000,
    0x0080_0001,
    0x7F7F_FFFF,  # largest finite
    0xFF7F_FFFF,
    0x7F00_0000,  # 2^127
)
_F32_EDGE_VALUES = (
    1.0,
    -1.0,
    0.5,
    -0.5,
    1.5,
    -1.5,
    2.5,
    -2.5,
    3.0,
    0.1,
    -0.7,
    100.25,
    8388607.5,  # 2^23 - 0.5
    8388608.0,  # 2^23
    8388609.0,
    16777215.0,
    16777216.0,  # 2^24
    16777218.0,
    -16777216.0,
    2147483520.0,  # the largest float below 2^31
    2147483648.0,  # 2^31
    -2147483648.0,
    -2147483904.0,  # the next float below -2^31
    4294967040.0,  # the largest float below 2^32
    4294967296.0,  # 2^32
    -4294967296.0,
    1e38,
    -3e38,
    1e-38,
)
_U32_EDGES = (
    0,
    1,
    2,
    3,
    7,
    31,
    32,
    33,
    63,
    64,
    0xFFFF,
    0x1_0000,
    0x100_0001,  # 2^24 + 1: rounds (to even) as f32
    0x100_0003,
    0x5555_5555,
    0x7FFF_FFBF,
    0x7FFF_FFC0,  # halfway between two floats near 2^31
    0x7FFF_FFFF,
    0x8000_0000,
    0x8000_0001,
    0xAAAA_AAAA,
    0xFFFF_0000,
    0xFFFF_FF7F,
    0xFFFF_FF80,  # halfway between 2^32 - 256 and 2^32
    0xFFFF_FFFE,
    0xFFFF_FFFF,
)
_I32_EDGES = (
    0,
    1,
    -1,
    2,
    -2,
    3,
    7,
    -7,
    31,
    32,
    33,
    -31,
    -32,
    -33,
    46341,  # its square overflows
    0x1_0000,
    -0x1_0000,
    0x100_0001,
    -0x100_0001,
    0x4000_0000,
    0x7FFF_FFC0,
    2**31 - 2,
    2**31 - 1,
    -(2**31) + 1,
    -(2**31),
)
#: BOOL words: 0 and 1, the only words a BOOL holds (ir.md).
_BOOL_EDGES = (0, 1)


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(list(name.encode()))


@functools.cache
def edges(dtype: DType) -> Array:
    """The boundary values of ``dtype``, as an array of its numpy dtype."""
    if dtype is F32:
        return np.concatenate([_bits(_F32_EDGE_BITS), np.array(_F32_EDGE_VALUES, np.float32)])
    table = {U32: _U32_EDGES, I32: _I32_EDGES, BOOL: _BOOL_EDGES}[dtype]
    return np.array(table, dtype=np.int64).astype(dtype.numpy)


def random_values(dtype: DType, n: int, seed: str) -> Array:
    """``n`` seeded random values: any bit pattern, and (F32) moderate magnitudes too."""
    rng = _rng(f"{dtype.value}.{seed}")
    if dtype is BOOL:
        return rng.integers(0, 2, n).astype(np.uint32)
    words = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    if dtype is not F32:
        return words.view(dtype.numpy)
    half = n // 2
    moderate = rng.uniform(-4.0, 4.0, n - half) * np.exp2(rng.integers(-12, 24, n - half))
    return np.concatenate([words[:half].view(np.float32), moderate.astype(np.float32)])


@functools.cache
def singles(dtype: DType) -> Array:
    """Operands of unary operators and casts: the boundary values, then random ones."""
    return np.concatenate([edges(dtype), random_values(dtype, 0 if dtype is BOOL else 96, "one")])


@functools.cache
def pairs(dtype: DType) -> tuple[Array, Array]:
    """Every pair of boundary values, then random pairs and boundary x random pairs."""
    e = edges(dtype)
    left = [np.repeat(e, e.size)]
    right = [np.tile(e, e.size)]
    if dtype is not BOOL:
        n = 384
        left.append(random_values(dtype, n, "left"))
        right.append(random_values(dtype, n, "right"))
        mixed = random_values(dtype, e.size * 4, "mixed")
        left += [np.tile(e, 4), mixed]
        right += [mixed, np.tile(e, 4)]
    return np.concatenate(left), np.concatenate(right)


# ---------------------------------------------------------------------------------
# Cases and their comparison


@dataclass(frozen=True)
class Case:
    """One program and its inputs; ``labels`` names the output elements each lane stores."""

    name: str
    program: Program
    inputs: tuple[Array, ...]
    labels: tuple[str, ...] = ("",)
    config: DispatchConfig | None = None


def lane_program(
    name: str,
    operands: Sequence[DType],
    results: Sequence[tuple[str, DType, Callable[[list[Expr]], Expr]]],
    rows: int,
) -> tuple[Program, tuple[str, ...]]:
    """``out[i * k + j] = build_j(in0[i], in1[i], ...)`` for each of the ``k`` results.

    Every result must have one dtype (that of ``out``).
    """
    dtypes = {dtype for _, dtype, _ in results}
    assert len(dtypes) == 1, dtypes
    decls = [BufferDecl(f"in{k}", k, Access.READ, dt) for k, dt in enumerate(operands)]
    k = len(results)
    decls.append(BufferDecl("out", len(operands), Access.WRITE, dtypes.pop(), rows * k))
    i = Var("i")
    loads: list[Expr] = [Load(f"in{n}", i) for n in range(len(operands))]
    stores = [
        Store("out", Bin(BinOp.ADD, Bin(BinOp.MUL, i, Const(U32, k)), Const(U32, j)), build(loads))
        for j, (_, _, build) in enumerate(results)
    ]
    body = [Let("i", gid()), If(Bin(BinOp.LT, i, BufLen("in0")), stores)]
    return Program(decls, 64, body, op_id=f"wgpu.diff.{name}"), tuple(n for n, _, _ in results)


def elementwise(
    name: str,
    operands: Sequence[DType],
    result: DType,
    build: Callable[[list[Expr]], Expr],
    inputs: Sequence[Array],
) -> Case:
    """``out[i] = build(in0[i], in1[i], ...)`` on ``inputs``."""
    program, labels = lane_program(name, operands, [("", result, build)], inputs[0].size)
    return Case(name, program, tuple(inputs), labels)


def _show(value: Any) -> str:
    word = int(np.asarray(value).reshape(1).view(np.uint32)[0])
    return f"{value!r} (0x{word:08x})"


def _differing(case: Case, d: Divergence, got: list[Array], want: list[Array]) -> list[int]:
    """Up to 4 elements of the divergent output that `compare_outputs` rejects."""
    index = d.output_index
    g, w = got[index].reshape(-1), want[index].reshape(-1)
    if g.size != w.size:
        return []
    found = []
    for e in np.flatnonzero(g.view(np.uint32) != w.view(np.uint32)):
        one_g = [x[:0] for x in got]
        one_w = [x[:0] for x in want]
        one_g[index], one_w[index] = g[e : e + 1], w[e : e + 1]
        if compare_outputs(case.name, case.program, case.inputs, one_g, one_w) is not None:
            found.append(int(e))
            if len(found) == 4:
                break
    return found


def describe(case: Case, d: Divergence, got: list[Array], want: list[Array]) -> str:
    """The divergence, with the operands and both results of a few differing elements."""
    lines = [f"{case.name}: {d}"]
    k = len(case.labels)
    for e in _differing(case, d, got, want):
        row, label = divmod(e, k)
        operands = ", ".join(_show(x[row]) for x in case.inputs if row < x.size)
        what = f" {case.labels[label]}" if case.labels[label] else ""
        lines.append(
            f"    [{e}]{what} on ({operands}): wgpu {_show(got[d.output_index].reshape(-1)[e])}, "
            f"reference {_show(want[d.output_index].reshape(-1)[e])}"
        )
    return "\n".join(lines)


#: Seconds one dispatch may take to compile and launch, and then to finish. A normal
#: compile takes well under a second on lavapipe; a driver whose compile hangs must fail
#: the test, not hang the session.
LIMIT_S = 30.0


class Hung(AssertionError):
    """The wgpu backend did not return within `LIMIT_S`."""


def _on_daemon_thread(call: Callable[[], Any]) -> tuple[threading.Event, list[Any]]:
    """Run ``call`` on a daemon thread; its result (or exception) lands in the list."""
    box: list[Any] = []
    done = threading.Event()

    def work() -> None:
        try:
            box.append(call())
        except BaseException as exc:  # handed to the test
            box.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="vyre-test-dispatch", daemon=True).start()
    return done, box


def _hung(case: Case, limit: float) -> Hung:
    return Hung(
        f"{case.name}: the wgpu backend did not return within {limit:.0f} s (the driver's "
        f"shader compile hangs)\n{case.program!r}"
    )


def _settled(box: list[Any]) -> Any:
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


async def start(backend: VyreBackend, case: Case, limit: float = LIMIT_S) -> PendingDispatch:
    """``backend.dispatch`` for ``case``, on a daemon thread, given at most ``limit`` seconds.

    The pipeline is compiled inside ``dispatch``, by the driver: if that never returns
    (lavapipe compiles some shaders for minutes), the thread is abandoned (a daemon
    thread, so the process can still exit) and `Hung` is raised, naming the program.
    """
    done, box = _on_daemon_thread(
        lambda: backend.dispatch(case.program, list(case.inputs), case.config)
    )
    if not await anyio.to_thread.run_sync(done.wait, limit):
        raise _hung(case, limit)
    pending: PendingDispatch = _settled(box)
    return pending


def outputs_sync(backend: VyreBackend, case: Case) -> list[Array]:
    """``backend.dispatch_sync`` for ``case`` (outside event loops), given at most `LIMIT_S`."""
    done, box = _on_daemon_thread(
        lambda: backend.dispatch_sync(case.program, list(case.inputs), case.config)
    )
    if not done.wait(LIMIT_S):
        raise _hung(case, LIMIT_S)
    return list(_settled(box))


async def divergences(
    wgpu: VyreBackend, reference: VyreBackend, cases: Sequence[Case], *, limit: float = LIMIT_S
) -> list[str]:
    """Run every case on both backends; describe each one whose outputs differ, or that the
    wgpu backend refuses (an error the reference does not raise) or hangs on."""
    found: list[str] = []
    pending: list[PendingDispatch | None] = []
    for case in cases:  # all launched first: the device runs while the next one compiles
        try:
            pending.append(await start(wgpu, case, limit))
        except Hung as exc:
            found.append(str(exc))
            pending.append(None)
        except Exception as exc:
            found.append(await _refused(reference, case, exc))
            pending.append(None)
    for case, dispatch in zip(cases, pending, strict=True):
        if dispatch is None:
            continue
        try:
            with anyio.fail_after(limit):
                got = list(await dispatch)
        except Exception as exc:
            found.append(await _refused(reference, case, exc))
            continue
        want = list(await reference.dispatch(case.program, list(case.inputs), case.config))
        d = compare_outputs(case.name, case.program, case.inputs, got, want)
        if d is not None:
            found.append(describe(case, d, got, want))
    return found


async def _refused(reference: VyreBackend, case: Case, exc: Exception) -> str:
    """Describe a wgpu error on ``case`` next to what the reference does with it."""
    try:
        want = list(await reference.dispatch(case.program, list(case.inputs), case.config))
    except Exception as ref_exc:
        return (
            f"{case.name}: wgpu raised {type(exc).__name__}, the reference "
            f"{type(ref_exc).__name__}: {ref_exc}\n{case.program!r}"
        )
    first = str(exc).strip().splitlines()[:16]
    return (
        f"{case.name}: wgpu raised {type(exc).__name__} where the reference returned "
        f"{[w.tolist()[:8] for w in want]}\n{case.program!r}\n    " + "\n    ".join(first)
    )


def _fail(found: list[str], total: int) -> str:
    return f"{len(found)} of {total} programs diverge from the reference:\n" + "\n".join(found)


# ---------------------------------------------------------------------------------
# 1. Operator sweeps


def binary_cases() -> list[Case]:
    out = []
    for op in BinOp:
        for dt in sorted(bin_operand_types(op), key=list(DType).index):
            result = bin_result(op, dt)
            assert result is not None
            out.append(
                elementwise(
                    f"{op.value}.{dt.value}",
                    [dt, dt],
                    result,
                    lambda x, op=op: Bin(op, x[0], x[1]),
                    pairs(dt),
                )
            )
    return out


def unary_cases() -> list[Case]:
    out = []
    for op in UnOp:
        for dt in sorted(un_operand_types(op), key=list(DType).index):
            result = un_result(op, dt)
            assert result is not None
            out.append(
                elementwise(
                    f"{op.value}.{dt.value}",
                    [dt],
                    result,
                    lambda x, op=op: Un(op, x[0]),
                    [singles(dt)],
                )
            )
    return out


def cast_cases() -> list[Case]:
    out = []
    for source, target in itertools.product(DType, DType):
        out.append(
            elementwise(
                f"cast.{source.value}.{target.value}",
                [source],
                target,
                lambda x, target=target: Cast(target, x[0]),
                [singles(source)],
            )
        )
    return out


def select_cases() -> list[Case]:
    out = []
    conditions = {BOOL: np.array([0, 1], np.uint32), U32: edges(U32)}
    for cond_dt, value_dt in itertools.product((BOOL, U32), (U32, I32, F32, BOOL)):
        a, b = pairs(value_dt)
        c = np.resize(conditions[cond_dt], a.size)
        _rng(f"select.{cond_dt.value}.{value_dt.value}").shuffle(c)
        out.append(
            elementwise(
                f"select.{cond_dt.value}.{value_dt.value}",
                [cond_dt, value_dt, value_dt],
                value_dt,
                lambda x: Select(x[0], x[1], x[2]),
                [c, a, b],
            )
        )
    return out


def fma_inputs() -> tuple[Array, Array, Array]:
    """Fma triples: boundary pairs with c = -(a*b) rounded, +-1 ULP, a boundary and a random
    c; random moderate triples that nearly cancel; products in the subnormal range."""
    a, b = pairs(F32)
    with np.errstate(all="ignore"):
        product = a * b
        cancel = -product
        above = np.nextafter(cancel, np.float32(np.inf))
        below = np.nextafter(cancel, np.float32(-np.inf))
    boundary = np.resize(edges(F32), a.size)
    _rng("fma.c").shuffle(boundary)
    rng = _rng("fma.random")
    n = 2048
    ra = (rng.uniform(-2, 2, n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    rb = (rng.uniform(-2, 2, n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    rc = -(ra.astype(np.float64) * rb * (1 + rng.uniform(-1e-6, 1e-6, n))).astype(np.float32)
    ta = (rng.uniform(1, 2, n) * np.exp2(rng.integers(-80, -60, n))).astype(np.float32)
    tb = (rng.uniform(-2, 2, n) * np.exp2(rng.integers(-80, -60, n))).astype(np.float32)
    tc = np.where(rng.integers(0, 2, n) == 1, _bits([0x0000_0005] * n), np.float32(0.0))
    tc = (tc * np.sign(rng.uniform(-1, 1, n))).astype(np.float32)
    # Ties decided by bits shifted out of the window (vy_fma's sticky bit): a*b is
    # 2^-24 * (1 + 2^-46) (8392705 * 16769026 = 2^47 + 2), half an ULP of c = +-1 and of
    # c = +-2^k scaled alike, so a*b + c is just past the tie and rounds away from c.
    ma, mb = np.float32(8392705 * 2.0**-23), np.float32(16769026 * 2.0**-48)
    scales = np.exp2(np.arange(-20, 21, 5)).astype(np.float32)
    sa = np.concatenate([ma * scales, -ma * scales, ma * scales, -ma * scales])
    sb = np.full(sa.size, mb, np.float32)
    sc = np.concatenate([scales, -scales, -scales, scales]).astype(np.float32)
    return (
        np.concatenate([a, a, a, a, a, ra, ta, sa]),
        np.concatenate([b, b, b, b, b, rb, tb, sb]),
        np.concatenate(
            [cancel, above, below, boundary, random_values(F32, a.size, "c"), rc, tc, sc]
        ),
    )


def fma_case() -> Case:
    return elementwise("fma.f32", [F32] * 3, F32, lambda x: Fma(x[0], x[1], x[2]), fma_inputs())


async def test_binary_operators_on_boundary_pairs(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    """Every BinOp on every dtype it accepts, over every pair of boundary values and random
    pairs: guards the prelude's integer division/remainder/shift/wrap helpers, mulhi, the
    bit-pattern float comparisons, min/max (NaN ignored, -0 < +0), fmod, and the native
    ``+ - * /`` (subnormals kept, round to nearest even)."""
    cases = binary_cases()
    found = await divergences(wgpu_backend, reference, cases)
    assert not found, _fail(found, len(cases))


async def test_unary_operators_casts_and_select_on_boundary_values(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    """Every UnOp on every dtype it accepts, every cast pair (truncation and saturation of
    float to int, NaN to 0, int to float ties to even, BOOL from and to every dtype), and
    Select with BOOL and U32 conditions on every value dtype: guards the prelude's rounding
    functions, bit counts, conversions and the codegen's truth and select mapping."""
    cases = unary_cases() + cast_cases() + select_cases()
    found = await divergences(wgpu_backend, reference, cases)
    assert not found, _fail(found, len(cases))


async def test_fma_rounds_once(wgpu_backend: VyreBackend, reference: VyreBackend) -> None:
    """Fma on f32 triples: boundary pairs with c the negated rounded product (the exact
    residue of a*b must survive), one ULP off it, boundary and random c, near-cancelling
    random triples and subnormal results: guards vy_fma's single rounding (WGSL's and
    lavapipe's fma may round twice) and its NaN/inf/zero-sign rules."""
    case = fma_case()
    found = await divergences(wgpu_backend, reference, [case])
    assert not found, _fail(found, 1)


def transcendental_inputs() -> Array:
    """One input array for every transcendental: the whole f32 range, and where each is hard."""
    rng = _rng("transcendental")
    positive = rng.integers(1, 0x7F80_0000, 4096, dtype=np.uint64).astype(np.uint32)
    signs = rng.integers(0, 2, 4096).astype(np.uint32) << np.uint32(31)
    everywhere = (positive | signs).view(np.float32)  # every exponent, up to 3.4e38
    # exp: overflow and underflow thresholds, and the subnormal results of x in [-104, -87].
    exp_edges = _bits([0x42B1_7217, 0x42B1_7218, 0x42B1_7219, 0xC2CF_F1B4, 0xC2CF_F1B5,
                       0xC2CF_F1B6, 0xC2AE_AC4F, 0xC2AE_AC50, 0x3EB1_7218, 0x3F85_1592,
                       0x3900_0000, 0x3900_0001])  # fmt: skip
    subnormal_exp = np.linspace(-104.0, -87.0, 1500).astype(np.float32)
    exp_range = rng.uniform(-110.0, 90.0, 1500).astype(np.float32)
    # log: near 1 (+-k ULP), subnormals, powers of two.
    one = np.float32(1.0).view(np.uint32)
    near_one = (one + np.arange(-64, 65, dtype=np.int64)).astype(np.uint32).view(np.float32)
    subnormals = rng.integers(1, 0x0080_0000, 256, dtype=np.uint64).astype(np.uint32)
    powers = np.exp2(np.arange(-149, 128)).astype(np.float32)
    # sin/cos: near multiples of pi/2 at every magnitude, the switch to Payne-Hanek, up to 1e38.
    k = np.concatenate([np.arange(1, 64), np.round(np.exp2(rng.uniform(6, 120, 512)))])
    multiples = (k * (math.pi / 2)).astype(np.float32)
    multiples = np.concatenate([multiples, np.nextafter(multiples, np.float32(np.inf)),
                                np.nextafter(multiples, np.float32(0))])  # fmt: skip
    big = np.exp2(rng.uniform(0, 126, 1024)).astype(np.float32)
    reduce_edges = _bits([0x47CE_477F, 0x47CE_4780, 0x47CE_4781, 0x3980_0000, 0x397F_FFFF,
                          0x7E00_0000, 0x7F7F_FFFF, 0x4B80_0000, 0x5EFF_FFFF])  # fmt: skip
    # tanh: [-20, 20], the polynomial and saturation thresholds.
    tanh_range = rng.uniform(-20.0, 20.0, 1024).astype(np.float32)
    tanh_edges = _bits([0x3F0C_9F54, 0x3F0C_9F55, 0x4120_0000, 0x411F_FFFF, 0x3280_0000])
    parts = [edges(F32), everywhere, exp_edges, subnormal_exp, exp_range, near_one,
             subnormals.view(np.float32), powers, multiples, big, -big, reduce_edges,
             tanh_range, tanh_edges]  # fmt: skip
    return np.concatenate(parts).astype(np.float32)


async def test_transcendentals_over_their_domains(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    """exp log sin cos tanh rsqrt over the whole f32 range and where each is hardest (exp
    near overflow and into subnormal results, log near 1 and on subnormals, sin/cos near
    multiples of pi/2 up to 1e38 across the Payne-Hanek switch, tanh's thresholds): within
    the IR's 2-ULP budget of the correctly rounded reference, NaN where it has NaN."""
    x = transcendental_inputs()
    cases = [
        elementwise(f"{op.value}.f32.wide", [F32], F32, lambda v, op=op: Un(op, v[0]), [x])
        for op in sorted(TRANSCENDENTAL)
    ]
    found = await divergences(wgpu_backend, reference, cases)
    assert not found, _fail(found, len(cases))


# ---------------------------------------------------------------------------------
# 2. Constant-folding guards


def _c(value: float) -> Const:
    return Const(F32, value)


def _b(op: BinOp, a: Expr, b: Expr) -> Expr:
    return Bin(op, a, b)


ADD, SUB, MUL, DIV = BinOp.ADD, BinOp.SUB, BinOp.MUL, BinOp.DIV

#: name -> (result dtype, expression of x = in0[i] and y = in1[i]).
FOLD_GUARDS: dict[str, tuple[DType, Callable[[Expr, Expr], Expr]]] = {
    "x*0": (F32, lambda x, y: _b(MUL, x, _c(0.0))),
    "x*-0": (F32, lambda x, y: _b(MUL, x, _c(-0.0))),
    "0*x": (F32, lambda x, y: _b(MUL, _c(0.0), x)),
    "x-x": (F32, lambda x, y: _b(SUB, x, Load("in0", Var("i")))),
    "x+-0": (F32, lambda x, y: _b(ADD, x, _c(-0.0))),
    "x+0": (F32, lambda x, y: _b(ADD, x, _c(0.0))),
    "x-0": (F32, lambda x, y: _b(SUB, x, _c(0.0))),
    "(x+1)-1": (F32, lambda x, y: _b(SUB, _b(ADD, x, _c(1.0)), _c(1.0))),
    "(x+2^23)-2^23": (F32, lambda x, y: _b(SUB, _b(ADD, x, _c(2.0**23)), _c(2.0**23))),
    "(x+1e30)-1e30": (F32, lambda x, y: _b(SUB, _b(ADD, x, _c(1e30)), _c(1e30))),
    "(x*2)*0.5": (F32, lambda x, y: _b(MUL, _b(MUL, x, _c(2.0)), _c(0.5))),
    "(x*0.5)*2": (F32, lambda x, y: _b(MUL, _b(MUL, x, _c(0.5)), _c(2.0))),
    "0-x": (F32, lambda x, y: _b(SUB, _c(0.0), x)),
    "-0-x": (F32, lambda x, y: _b(SUB, _c(-0.0), x)),
    "x/x": (F32, lambda x, y: _b(DIV, x, Load("in0", Var("i")))),
    "x*3*0.1": (F32, lambda x, y: _b(MUL, _b(MUL, x, _c(3.0)), _c(0.1))),
    "x/3": (F32, lambda x, y: _b(DIV, x, _c(3.0))),
    "x/0.5": (F32, lambda x, y: _b(DIV, x, _c(0.5))),
    "x*1": (F32, lambda x, y: _b(MUL, x, _c(1.0))),
    "x*-1": (F32, lambda x, y: _b(MUL, x, _c(-1.0))),
    "(x+x)-x": (F32, lambda x, y: _b(SUB, _b(ADD, x, x), x)),
    "(x+y)-y": (F32, lambda x, y: _b(SUB, _b(ADD, x, y), y)),
    "(x*y)/y": (F32, lambda x, y: _b(DIV, _b(MUL, x, y), y)),
    "x-(x-y)": (F32, lambda x, y: _b(SUB, x, _b(SUB, x, y))),
    "sqrt(x*x)": (F32, lambda x, y: Un(UnOp.SQRT, _b(MUL, x, x))),
    "fma(x,0,0)": (F32, lambda x, y: Fma(x, _c(0.0), _c(0.0))),
    "fma(x,1,-x)": (F32, lambda x, y: Fma(x, _c(1.0), Un(UnOp.NEG, x))),
    "fma(x,y,-(x*y))": (F32, lambda x, y: Fma(x, y, Un(UnOp.NEG, _b(MUL, x, y)))),
    "(x*y+1)-1": (F32, lambda x, y: _b(SUB, _b(ADD, _b(MUL, x, y), _c(1.0)), _c(1.0))),
    "neg(neg(x))": (F32, lambda x, y: Un(UnOp.NEG, Un(UnOp.NEG, x))),
    "abs(x)-x": (F32, lambda x, y: _b(SUB, Un(UnOp.ABS, x), x)),
    "f32(i32(x))": (F32, lambda x, y: Cast(F32, Cast(I32, x))),
    "f32(u32(x))": (F32, lambda x, y: Cast(F32, Cast(U32, x))),
    "min(x,x)": (F32, lambda x, y: _b(BinOp.MIN, x, x)),
    "max(x,-x)": (F32, lambda x, y: _b(BinOp.MAX, x, Un(UnOp.NEG, x))),
    "x==x": (BOOL, lambda x, y: _b(BinOp.EQ, x, x)),
    "x!=x": (BOOL, lambda x, y: _b(BinOp.NE, x, x)),
    "x<=x": (BOOL, lambda x, y: _b(BinOp.LE, x, x)),
    "!(x<y)": (BOOL, lambda x, y: Un(UnOp.LNOT, _b(BinOp.LT, x, y))),
    "x*0==0": (BOOL, lambda x, y: _b(BinOp.EQ, _b(MUL, x, _c(0.0)), _c(0.0))),
    "x-x==0": (BOOL, lambda x, y: _b(BinOp.EQ, _b(SUB, x, x), _c(0.0))),
    "x+1>x": (BOOL, lambda x, y: _b(BinOp.GT, _b(ADD, x, _c(1.0)), x)),
    "select(x==x,x,0)": (F32, lambda x, y: Select(_b(BinOp.EQ, x, x), x, _c(0.0))),
    "u32(x*0)": (U32, lambda x, y: Cast(U32, _b(MUL, x, _c(0.0)))),
}

#: Expressions of literals only (no input): what a compiler evaluates at build time.
CONST_ONLY: dict[str, tuple[DType, Expr]] = {
    "inf*0": (F32, _b(MUL, _c(math.inf), _c(0.0))),
    "inf-inf": (F32, _b(SUB, _c(math.inf), _c(math.inf))),
    "0/0": (F32, _b(DIV, _c(0.0), _c(0.0))),
    "1/-0": (F32, _b(DIV, _c(1.0), _c(-0.0))),
    "nan+1": (F32, _b(ADD, _c(math.nan), _c(1.0))),
    "-0+-0": (F32, _b(ADD, _c(-0.0), _c(-0.0))),
    "0-0": (F32, _b(SUB, _c(0.0), _c(0.0))),
    "max*2": (F32, _b(MUL, _c(3.4028234663852886e38), _c(2.0))),
    "tiny*0.5": (F32, _b(MUL, _c(1e-45), _c(0.5))),
    "tiny*3/3": (F32, _b(DIV, _b(MUL, _c(1e-45), _c(3.0)), _c(3.0))),
    "sqrt(-1)": (F32, Un(UnOp.SQRT, _c(-1.0))),
    "sqrt(-0)": (F32, Un(UnOp.SQRT, _c(-0.0))),
    "floor(-0.5)": (F32, Un(UnOp.FLOOR, _c(-0.5))),
    "ceil(-0.5)": (F32, Un(UnOp.CEIL, _c(-0.5))),
    "round(2.5)": (F32, Un(UnOp.ROUND, _c(2.5))),
    "round(-0.5)": (F32, Un(UnOp.ROUND, _c(-0.5))),
    "trunc(-0.9)": (F32, Un(UnOp.TRUNC, _c(-0.9))),
    "min(nan,1)": (F32, _b(BinOp.MIN, _c(math.nan), _c(1.0))),
    "min(0,-0)": (F32, _b(BinOp.MIN, _c(0.0), _c(-0.0))),
    "max(-0,0)": (F32, _b(BinOp.MAX, _c(-0.0), _c(0.0))),
    "fma(big,big,-inf)": (F32, Fma(_c(1e30), _c(1e30), _c(-math.inf))),
    "fma(2^12+1,2^12-1,-2^24)": (F32, Fma(_c(4097.0), _c(4095.0), _c(-(2.0**24)))),
    "nan==nan": (BOOL, _b(BinOp.EQ, _c(math.nan), _c(math.nan))),
    "nan!=nan": (BOOL, _b(BinOp.NE, _c(math.nan), _c(math.nan))),
    "-0<0": (BOOL, _b(BinOp.LT, _c(-0.0), _c(0.0))),
    "u32(nan)": (U32, Cast(U32, _c(math.nan))),
    "u32(-1.5)": (U32, Cast(U32, _c(-1.5))),
    "u32(5e9)": (U32, Cast(U32, _c(5e9))),
    "i32(3e9)": (I32, Cast(I32, _c(3e9))),
    "i32(-inf)": (I32, Cast(I32, _c(-math.inf))),
    "f32(0xffffff80u)": (F32, Cast(F32, Const(U32, 0xFFFF_FF80))),
    "f32(16777217)": (F32, Cast(F32, Const(I32, 16_777_217))),
    "bool(-0.0)": (BOOL, Cast(BOOL, _c(-0.0))),
    "INT_MIN/-1": (I32, _b(DIV, Const(I32, -(2**31)), Const(I32, -1))),
    "INT_MIN%-1": (I32, _b(BinOp.MOD, Const(I32, -(2**31)), Const(I32, -1))),
    "7/0": (I32, _b(DIV, Const(I32, 7), Const(I32, 0))),
    "7u/0": (U32, _b(DIV, Const(U32, 7), Const(U32, 0))),
    "7u%0": (U32, _b(BinOp.MOD, Const(U32, 7), Const(U32, 0))),
    "1<<32": (U32, _b(BinOp.SHL, Const(U32, 1), Const(U32, 32))),
    "1<<33": (U32, _b(BinOp.SHL, Const(U32, 1), Const(U32, 33))),
    "-8>>33": (I32, _b(BinOp.SHR, Const(I32, -8), Const(I32, 33))),
    "i32 max+1": (I32, _b(ADD, Const(I32, 2**31 - 1), Const(I32, 1))),
    "-INT_MIN": (I32, Un(UnOp.NEG, Const(I32, -(2**31)))),
    "clz(0)": (U32, Un(UnOp.CLZ, Const(U32, 0))),
    "ctz(0i)": (I32, Un(UnOp.CTZ, Const(I32, 0))),
    "mulhi(max,max)": (U32, _b(BinOp.MULHI, Const(U32, 0xFFFF_FFFF), Const(U32, 0xFFFF_FFFF))),
    "u32 max+1": (U32, _b(ADD, Const(U32, 0xFFFF_FFFF), Const(U32, 1))),
    "0u-1u": (U32, _b(SUB, Const(U32, 0), Const(U32, 1))),
    "u32 max*2": (U32, _b(MUL, Const(U32, 0xFFFF_FFFF), Const(U32, 2))),
    "-1u": (U32, Un(UnOp.NEG, Const(U32, 1))),
    "~0u": (U32, Un(UnOp.NOT, Const(U32, 0))),
}

#: Literal operands of the f32 literal-operand programs (each literal is two stores per
#: lane: a few, as code size is what a lavapipe compile pays for).
_F32_LITERAL_BITS = (
    0x0000_0000,  # +0
    0x8000_0000,  # -0
    0x7F80_0000,  # +inf
    0xFF80_0000,  # -inf
    0x7FC0_0000,  # NaN
    0x0000_0001,  # smallest subnormal
    0x807F_FFFF,  # largest subnormal, negative
    0x0080_0000,  # smallest normal
    0x7F7F_FFFF,  # largest finite
    0x3F80_0000,  # 1
    0xBF80_0000,  # -1
    0x3F00_0000,  # 0.5
    0x4B00_0000,  # 2^23
    0x4F00_0000,  # 2^31
)
#: Literal right (and left) operands of the integer literal-operand programs.
_INT_LITERALS: dict[DType, tuple[int, ...]] = {
    U32: (0, 1, 2, 7, 31, 32, 33, 63, 64, 0x8000_0000, 0xFFFF_FFE0, 0xFFFF_FFFF),
    I32: (0, 1, -1, 7, -7, 31, 32, 33, -31, -32, -33, 2**31 - 1, -(2**31)),
}


def fold_guard_cases() -> list[Case]:
    x, y = pairs(F32)
    keep = np.concatenate(
        [np.arange(edges(F32).size ** 2, step=7), np.arange(edges(F32).size ** 2, x.size)]
    )
    x, y = x[keep], y[keep]  # every boundary x (and many y), and the random pairs
    out = []
    for name, (dtype, build) in FOLD_GUARDS.items():
        program, labels = lane_program(
            f"fold.{name}", [F32, F32], [(name, dtype, lambda v, b=build: b(v[0], v[1]))], x.size
        )
        out.append(Case(f"fold {name}", program, (x, y), labels))
    for dtype in (F32, U32, I32, BOOL):
        consts = [(n, dt, lambda v, e=e: e) for n, (dt, e) in CONST_ONLY.items() if dt is dtype]
        program, labels = lane_program(f"fold.const.{dtype.value}", [U32], consts, 1)
        out.append(Case(f"fold literals {dtype.value}", program, (np.zeros(1, np.uint32),), labels))
    return out


def literal_operand_cases() -> list[Case]:
    """``op(x, literal)`` and ``op(literal, x)`` for every binary operator and dtype."""
    out = []
    for op in BinOp:
        for dt in sorted(bin_operand_types(op), key=list(DType).index):
            result = bin_result(op, dt)
            assert result is not None
            if dt is F32:
                literals = [float(v) for v in _bits(_F32_LITERAL_BITS)]
            elif dt is BOOL:
                literals = [False, True]
            else:
                literals = list(_INT_LITERALS[dt])
            results = []
            for c in literals:
                const = Const(dt, c)
                text = repr(c)
                results.append(
                    (f"x {op.value} {text}", result, lambda v, k=const, o=op: Bin(o, v[0], k))
                )
                results.append(
                    (f"{text} {op.value} x", result, lambda v, k=const, o=op: Bin(o, k, v[0]))
                )
            x = (
                edges(dt)
                if dt is not F32
                else np.concatenate([edges(F32), random_values(F32, 16, "lit")])
            )
            program, labels = lane_program(f"literal.{op.value}.{dt.value}", [dt], results, x.size)
            out.append(Case(f"literal {op.value}.{dt.value}", program, (x,), labels))
    return out


async def test_folding_hazards_keep_ieee_semantics(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    """Expressions a finite-math compiler rewrites (x*0 -> 0, x-x -> 0, x+0 -> x, (x+c)-c ->
    x, (x*2)*0.5 -> x, 0-x -> -x, x/x -> 1, x*3*0.1 -> x*0.3, x==x -> true ...), one program
    each, on NaN, ±inf, ±0, subnormal and huge inputs, and expressions of literals only (inf*0,
    0/0, INT_MIN/-1, 1<<32, u32(nan) ...) that a compiler evaluates at build time: byte for
    byte as the reference (IEEE results, -0 kept, no reassociation)."""
    cases = fold_guard_cases()
    found = await divergences(wgpu_backend, reference, cases)
    assert not found, _fail(found, len(cases))


async def test_literal_operands(wgpu_backend: VyreBackend, reference: VyreBackend) -> None:
    """Every binary operator with a literal right and left operand (every f32 boundary value
    - NaN, ±inf, ±0, subnormals - and integer shift counts of 32 and more, divisors 0 and
    -1, INT_MIN): the literal is the case a compiler specialises (and WGSL rejects as a
    const-expression: a shift by 32, a NaN), against the boundary values."""
    cases = literal_operand_cases()
    found = await divergences(wgpu_backend, reference, cases)
    assert not found, _fail(found, len(cases))


def workgroup_index_cases() -> list[Case]:
    """Indices into a 1-element WORKGROUP buffer that are constant for the shader compiler
    but out of range (the IR: the load reads 0, the store and the atomic do nothing), and
    in-range controls."""
    acc_i32 = BufferDecl("acc", 1, Access.WORKGROUP, I32, 1)
    acc_u32 = BufferDecl("acc", 1, Access.WORKGROUP, U32, 1)
    out = BufferDecl("out", 0, Access.WRITE, U32, 2)
    past_end = BufLen("acc")  # 1: a literal in WGSL, the array's length
    zero = Const(U32, 0)

    def read(index: Expr) -> list[Any]:
        return [Store("out", zero, Cast(U32, Load("acc", index)))]

    bodies: dict[str, tuple[BufferDecl, list[Any]]] = {
        "load acc[0]": (acc_i32, read(zero)),
        "load acc[1]": (acc_i32, read(Const(U32, 1))),
        "load acc[len - 1]": (acc_i32, read(Bin(BinOp.SUB, past_end, Const(U32, 1)))),
        "load acc[len]": (acc_i32, read(past_end)),
        "load acc[1 + 0]": (acc_i32, read(Bin(ADD, Const(U32, 1), zero))),
        "load acc[0xffffffff + 2]": (
            acc_i32,
            read(Bin(ADD, Const(U32, 0xFFFF_FFFF), Const(U32, 2))),
        ),
        "store acc[len]": (
            acc_i32,
            [Store("acc", past_end, Const(I32, 5)), *read(zero)],
        ),
        "atomic acc[len]": (
            acc_u32,
            [Store("out", Const(U32, 1), Atomic(AtomicOp.ADD, "acc", past_end, Const(U32, 1)))],
        ),
    }
    return [
        Case(f"workgroup {name}", Program([out, acc], 1, body, op_id="wgpu.diff.wg"), ())
        for name, (acc, body) in bodies.items()
    ]


async def test_constant_out_of_range_workgroup_indices(
    wgpu_backend: VyreBackend, reference: VyreBackend
) -> None:
    """A WORKGROUP buffer is a fixed-size WGSL array, so an index the shader compiler can
    evaluate (``BufLen`` of that buffer, arithmetic on literals) and that is out of range is
    a shader-creation error for naga, where the IR defines it (reads 0, writes nothing):
    every such load, store and atomic must run and give the reference's bytes. Found by
    this file's property test (explore profile): all but the in-range controls and the
    bare literal ``acc[1]`` failed with KernelCompileFailed until the codegen passed every
    index that could be a const-expression through ``vy_idx``."""
    cases = workgroup_index_cases()
    found = await divergences(wgpu_backend, reference, cases)
    assert not found, _fail(found, len(cases))


# ---------------------------------------------------------------------------------
# 3. Generated programs


ONE_LANE = DispatchConfig(grid_override=(1, 1, 1), workgroup_override=(1, 1, 1))


@pytest.fixture(scope="module")
def backends(wgpu_adapter: dict[str, str]) -> Iterator[tuple[VyreBackend, VyreBackend]]:
    """A private wgpu backend and a reference backend for synchronous (Hypothesis) tests."""
    from vyre_wgpu import create_backend

    wgpu = create_backend(prefetch=False)
    reference = reference_backend()
    try:
        yield wgpu, reference
    finally:
        anyio.run(wgpu.aclose)
        anyio.run(reference.aclose)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_programs_on_one_lane_match_the_reference(
    backends: tuple[VyreBackend, VyreBackend], data: st.DataObject
) -> None:
    """Random valid programs (every node kind, atomics, barriers, loops, returns, special F32
    constants) with random inputs, on one lane: byte for byte as the reference. One lane, as
    tests/cupy/test_cupy_gpu.py does on a real GPU: no two lanes can race, so atomics and
    stores have one order and the reference's bytes are the only right answer. (A
    synchronous test: Hypothesis draws between dispatches, outside any event loop.)"""
    wgpu, reference = backends
    program = data.draw(programs(), label="program")
    inputs = data.draw(small_inputs_for(program), label="inputs")
    case = Case("random", program, tuple(inputs), config=ONE_LANE)
    got = outputs_sync(wgpu, case)
    want = list(reference.dispatch_sync(program, inputs, ONE_LANE))
    d = compare_outputs("random", program, inputs, got, want)
    assert d is None, f"{describe(case, d, got, want)}\n{program!r}\ninputs {inputs!r}"


# ---------------------------------------------------------------------------------
# Known failures (kept failing until fixed; last in the file: a hang leaves a thread busy)


def fmod_of_literals_case() -> Case:
    """``fmod`` of two literals: ``out[0] = -5.0 % 3.0``, ``out[1] = 1.0 % 0.0``."""
    results = [
        ("-5 % 3", F32, lambda v: Bin(BinOp.MOD, _c(-5.0), _c(3.0))),
        ("1 % 0", F32, lambda v: Bin(BinOp.MOD, _c(1.0), _c(0.0))),
    ]
    program, labels = lane_program("fold.fmod", [U32], results, 1)
    return Case("fold fmod of literals", program, (np.zeros(1, np.uint32),), labels)


async def test_fmod_of_two_literals(wgpu_backend: VyreBackend, reference: VyreBackend) -> None:
    """f32 ``mod`` whose two operands are literals (so, in WGSL, both uniform: every f32
    constant is XOR-ed with ``vy_info.grid.w``): -2.0 and NaN, as the reference. Found by
    this file: lavapipe's compile of such a shader (vy_fmod, then unrolled, on two uniform
    values) did not finish in minutes, so ``dispatch`` never returned; vy_fmod is a loop
    now."""
    # (compiles in well under a second; 10 s keeps a failure short)
    found = await divergences(wgpu_backend, reference, [fmod_of_literals_case()], limit=10.0)
    assert not found, _fail(found, 1)
