"""Programs built to reach each fast path of the reference engine, for differential tests.

Three families, each a *builder* (parameters → `Case`), a systematic
*enumerator* (the combinations that matter most in full, the other parameters
chosen by a fixed-seed generator, then every pair of parameter values: one
deterministic list) and a Hypothesis *strategy* drawing the same parameters
(the data comes from a drawn seed, so that Hypothesis explores parameters
instead of mutating arrays):

- `alias_case`: a value read from a writable buffer (READ_WRITE or WRITE
  storage, or WORKGROUP memory) through an index the engine may answer with a
  *view* (``x[gid]``, ``x[2·gid+1]``, ``x[lid]``, ``sh[lid]``, ``sh[c]``,
  ``sh[lid % big]`` ...), carried through one expression kind (the load itself,
  casts to the same dtype, U32↔I32 bit casts, conversions, selects with uniform
  and per-lane conditions, arithmetic, comparisons, unary operators, Fma), kept
  (`Let`, `Assign`, inside a branch or merged back from one, a loop start, or in
  the same statement as an atomic on the buffer), then the buffer is stored to at
  the same element (a constant, a fresh value, an atomic), then the value is used.
  The used value must be the one read before the store.
- `index_case`: one load or store into a storage buffer (READ, UNIFORM,
  READ_WRITE, WRITE) or a workgroup buffer through one index pattern (stride 1,
  strided, reversed, transposed, modulo, wrapping past 2**32, negative, out of
  range, the last element, data-dependent, a variable, a loop counter), of every
  dtype, buffer sizes odd, smaller, equal and larger than the workgroup or the
  grid, workgroup sizes that do not divide them, 1-, 2- and 3-axis shapes, under
  one control context (none, a prefix ``gid < n``, a local-id cut from either
  side, a workgroup cut, sparse lanes cut out or compacted, half the lanes,
  per-lane loop trips).
- `atomic_case`: 1, 16, 17 or 64 lanes on one address (one workgroup, spread
  over workgroups, every other lane, every fifth lane, two interleaved
  addresses, columns ``lid`` across workgroups, some lanes out of range), every
  atomic operator, storage or workgroup memory, the old values stored to an
  output, kept in a variable, or unused.

Every case says whether it is race-free by construction (`Case.race_free`):
a real device must then produce the reference's bytes. Atomic cases carry an
`AtomicCheck`: ir.md leaves the order of one node's atomics open (the
reference takes lane order, docs/reference-engine.md), so across backends the
old values and the final words must only be those of *some* sequential order
(`sequential_witness`), while the final words of commutative operators are exact.
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tests.reference.slow_interpreter import atomic as atomic_step
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    AtomicOp,
    Barrier,
    BufferDecl,
    Cast,
    Const,
    DType,
    Expr,
    Fma,
    If,
    Let,
    Load,
    Loop,
    Program,
    Select,
    Stmt,
    Store,
    Un,
    UnOp,
    Var,
    f32,
    gid,
    i32,
    lid,
    nwg,
    u32,
    wgid,
)

__all__ = [
    "ALIAS_AXES",
    "ATOMIC_AXES",
    "INDEX_AXES",
    "AtomicCheck",
    "AtomicSite",
    "Case",
    "Geometry",
    "alias_case",
    "alias_cases",
    "atomic_case",
    "atomic_cases",
    "enumerate_alias",
    "enumerate_atomic",
    "enumerate_index",
    "index_case",
    "index_cases",
    "covering",
    "pairwise",
    "sequential_witness",
]

U32, I32, F32, BOOL = DType.U32, DType.I32, DType.F32, DType.BOOL
_M32 = 0xFFFF_FFFF


# ---------------------------------------------------------------------------------
# cases and geometry


@dataclass(frozen=True)
class Geometry:
    """A launch shape: lanes per workgroup axis and workgroups per grid axis."""

    workgroup: tuple[int, int, int]
    grid: tuple[int, int, int]

    @property
    def nl(self) -> int:
        return math.prod(self.workgroup)

    @property
    def ng(self) -> int:
        return math.prod(self.grid)

    @property
    def lanes(self) -> int:
        return self.nl * self.ng

    @property
    def flat(self) -> bool:
        return self.workgroup[1] * self.workgroup[2] == 1 and self.grid[1] * self.grid[2] == 1

    def local(self) -> Expr:
        """The linear local id (``lid()`` on a 1-D workgroup)."""
        return _linear(lid, self.workgroup)

    def group(self) -> Expr:
        """The linear workgroup id (``wgid()`` on a 1-D grid)."""
        return _linear(wgid, self.grid)

    def lane(self) -> Expr:
        """The linear lane id (``gid()`` on 1-D shapes)."""
        if self.flat:
            return gid()
        return self.group() * u32(self.nl) + self.local()

    def group_of(self, lane: int) -> int:
        return lane // self.nl

    def __str__(self) -> str:
        wg = "x".join(str(v) for v in self.workgroup if v > 1) or "1"
        grid = "x".join(str(v) for v in self.grid if v > 1) or "1"
        return f"wg{wg}/grid{grid}"


def _linear(builtin: Callable[[int], Expr], extent: tuple[int, int, int]) -> Expr:
    out: Expr = builtin(0)
    stride = extent[0]
    for axis in (1, 2):
        if extent[axis] > 1:
            out = out + builtin(axis) * u32(stride)
        stride *= extent[axis]
    return out


@dataclass(frozen=True)
class AtomicSite:
    """One address of an atomic case: its initial word, where its final word is, its lanes.

    Attributes:
        final: Output buffer holding the address's final word.
        final_index: Element of ``final`` holding it.
        init: The word before the atomics.
        lanes: ``(lane, value, expected)`` of every lane that hits the address, in
            lane order (``expected`` is None except for ``cas``).
    """

    final: str
    final_index: int
    init: int
    lanes: tuple[tuple[int, int, int | None], ...]


@dataclass(frozen=True)
class AtomicCheck:
    """What any backend's outputs of an atomic case must satisfy.

    Attributes:
        op: The atomic operator.
        olds: Output holding lane ``L``'s old word at element ``L`` (None when unused).
        sites: Every address the atomics hit.
    """

    op: AtomicOp
    olds: str | None
    sites: tuple[AtomicSite, ...]

    @property
    def commutative(self) -> bool:
        return self.op not in (AtomicOp.EXCHANGE, AtomicOp.CAS)


@dataclass(frozen=True, eq=False)
class Case:
    """One program, its inputs and its launch.

    Attributes:
        name: The parameters that built it (unique within a family).
        family: ``"alias"``, ``"index"`` or ``"atomic"``.
        program: The program.
        inputs: One array per input buffer, in binding order.
        grid: Workgroups per axis (always given: the launch never infers it).
        race_free: No two lanes touch one word, one writing, without a barrier
            between them: every backend must produce the reference's bytes.
        atomic: For atomic cases, the order-independent check across backends.
    """

    name: str
    family: str
    program: Program
    inputs: tuple[np.ndarray[Any, Any], ...]
    grid: tuple[int, int, int]
    race_free: bool
    atomic: AtomicCheck | None = field(default=None)


def _const(dtype: DType, value: float) -> Const:
    if dtype is U32:
        return u32(int(value) & _M32)
    if dtype is I32:
        return i32(int(value))
    if dtype is F32:
        return f32(float(value))
    return Const(BOOL, bool(value))


#: Seeds of the data of drawn cases (data from a seed keeps Hypothesis exploring the
#: parameters instead of mutating arrays).
_SEEDS = st.integers(0, 2**32 - 1)

_EDGES: dict[DType, tuple[float, ...]] = {
    U32: (0, 1, 2, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFE, 0xFFFF_FFFF),
    I32: (0, 1, -1, 2**31 - 1, -(2**31), -(2**31) + 1),
    F32: (0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, 1e-45, -1e-45, 1e-38, 3.4e38, -3.4e38, 16777217.0),
}


def _rng(name: str, seed: int | None) -> np.random.Generator:
    """The case's generator: from the drawn seed, or from its name (enumerated cases)."""
    return np.random.default_rng(zlib.crc32(name.encode()) if seed is None else seed)


def _words(
    dtype: DType, n: int, rng: np.random.Generator, *, small: int = 50
) -> np.ndarray[Any, Any]:
    """``n`` input elements: mostly small, some edge values, some anything; never NaN."""
    if dtype is BOOL:
        return rng.integers(0, 2, n).astype(np.uint32)
    kind = rng.integers(0, 4, n)
    edges = np.array(_EDGES[dtype], dtype=np.float64 if dtype is F32 else np.int64)
    edge = edges[rng.integers(0, len(edges), n)]
    if dtype is F32:
        tiny = rng.integers(-4 * small, 4 * small, n) * 0.25
        wide = rng.standard_normal(n) * 1e4
        out = np.where(kind < 2, tiny, np.where(kind == 2, edge, wide))
        return out.astype(np.float32)
    lo = -20 if dtype is I32 else 0
    tiny = rng.integers(lo, small, n)
    wide = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.int64)
    out = np.where(kind < 2, tiny, np.where(kind == 2, edge, wide))
    return (
        (out & _M32).astype(np.uint32).view(dtype.numpy)
        if dtype is I32
        else (out & _M32).astype(np.uint32)
    )


# ---------------------------------------------------------------------------------
# pairwise covering


def pairwise(axes: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Return rows (one value per axis) that together hold every pair of values of every
    two axes; greedy and deterministic."""
    uncovered: set[tuple[int, int, int, int]] = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(axes)), 2)
        for a in range(len(axes[i]))
        for b in range(len(axes[j]))
    }
    rows: list[tuple[Any, ...]] = []
    while uncovered:
        i, a, j, b = min(uncovered)
        choice: dict[int, int] = {i: a, j: b}
        for k in range(len(axes)):
            if k in choice:
                continue
            best, gain = 0, -1
            for v in range(len(axes[k])):
                g = sum(
                    1
                    for m, w in choice.items()
                    if ((m, w, k, v) if m < k else (k, v, m, w)) in uncovered
                )
                if g > gain:
                    best, gain = v, g
            choice[k] = best
        for m, n in itertools.combinations(range(len(axes)), 2):
            uncovered.discard((m, choice[m], n, choice[n]))
        rows.append(tuple(axes[k][choice[k]] for k in range(len(axes))))
    return rows


def covering(axes: Sequence[Sequence[Any]], times: int, seed: str) -> list[tuple[Any, ...]]:
    """Return rows in which every value of every axis occurs at least ``times`` times: each
    row takes, on every axis, a value seen least so far (ties: a fixed-seed choice)."""
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    seen = [dict.fromkeys(range(len(axis)), 0) for axis in axes]
    rows: list[tuple[Any, ...]] = []
    while any(min(counts.values()) < times for counts in seen):
        row = []
        for axis, counts in zip(axes, seen, strict=True):
            low = min(counts.values())
            choices = [v for v, c in counts.items() if c == low]
            v = choices[int(rng.integers(len(choices)))]
            counts[v] += 1
            row.append(axis[v])
        rows.append(tuple(row))
    return rows


# ---------------------------------------------------------------------------------
# (a) aliasing: a value read, the buffer stored to, the value used

ALIAS_SPACES = ("rw", "wo", "sh")
ALIAS_DTYPES = (U32, I32, F32)
#: How the lane reads the buffer, and what the engine answers it with.
ALIAS_INDEXES = (
    "own",  # gid (storage: a slice view; shared: lid, a full window view)
    "group_major",  # wgid·nl + lid (storage: a slice view; shared: a gather)
    "strided",  # 2·gid + 1 (a strided slice or window view)
    "lid",  # lid (storage: one view broadcast over workgroups; shared: a window view)
    "lid_off",  # lid + 1 (views)
    "wgid",  # wgid (storage: a per-workgroup view; shared: a gather)
    "uniform",  # a constant (storage: a scalar; shared: a column view)
    "mod",  # gid % big (storage: a gather; shared: a progression slice view)
)
ALIAS_VIAS = (
    "load",
    "cast_same",
    "bitcast",
    "bitcast_back",
    "convert",
    "select_true",
    "select_false",
    "select_lane",
    "select_nested",
    "arith",
    "compare",
    "unary",
    "fma",
)
ALIAS_KEEPS = (
    "let",
    "assign",
    "assign_branch",
    "assign_merge",
    "let_flat",
    "let_cut",
    "loop_start",
    "same_statement",
)
ALIAS_OVERWRITES = ("store", "store_fresh", "atomic")
ALIAS_GEOMETRIES = (
    Geometry((4, 1, 1), (1, 1, 1)),
    Geometry((5, 1, 1), (2, 1, 1)),
    Geometry((8, 1, 1), (3, 1, 1)),
    Geometry((3, 1, 1), (1, 1, 1)),
    Geometry((4, 2, 1), (2, 1, 1)),
)
ALIAS_AXES: tuple[tuple[Any, ...], ...] = (
    ALIAS_SPACES,
    ALIAS_DTYPES,
    ALIAS_INDEXES,
    ALIAS_VIAS,
    ALIAS_KEEPS,
    ALIAS_OVERWRITES,
    ALIAS_GEOMETRIES,
)


def _alias_index(space: str, form: str, g: Geometry) -> tuple[Expr, int, bool]:
    """Return (index, buffer count, race-free) of one read pattern."""
    lane, local, group, L, nl, ng = g.lane(), g.local(), g.group(), g.lanes, g.nl, g.ng
    if space == "sh":
        table: dict[str, tuple[Expr, int, bool]] = {
            "own": (local, nl, True),
            "group_major": (group * u32(nl) + local, L, True),
            "strided": (local * u32(2) + u32(1), 2 * nl + 1, True),
            "lid": (local, nl + 2, True),
            "lid_off": (local + u32(1), nl + 1, True),
            "wgid": (group, ng, nl == 1),
            "uniform": (u32(1), 3, nl == 1),
            "mod": (local % u32(1000), nl, True),
        }
    else:
        table = {
            "own": (lane, L, True),
            "group_major": (group * u32(nl) + local, L + 1, True),
            "strided": (lane * u32(2) + u32(1), 2 * L + 1, True),
            "lid": (local, nl, ng == 1),
            "lid_off": (local + u32(1), nl + 2, ng == 1),
            "wgid": (group, ng, nl == 1),
            "uniform": (u32(1), 3, L == 1),
            "mod": (lane % u32(1000), L, True),
        }
    return table[form]


def _other_int(dtype: DType) -> DType:
    return I32 if dtype is U32 else U32


def _alias_via(via: str, dtype: DType, x: Expr, lane: Expr) -> tuple[Expr, DType]:
    """Return the kept value built from the load ``x`` and its dtype."""
    k = _const(dtype, 3)
    always, never = nwg().ge(u32(1)), nwg().lt(u32(1))
    if via == "load":
        return x, dtype
    if via == "cast_same":
        return Cast(dtype, x), dtype
    if via == "bitcast":  # U32 ↔ I32 reinterpret the bits; F32 → I32 converts
        target = I32 if dtype is F32 else _other_int(dtype)
        return Cast(target, x), target
    if via == "bitcast_back":
        middle = F32 if dtype is F32 else _other_int(dtype)
        return Cast(dtype, Cast(middle, x)), dtype
    if via == "convert":
        target = U32 if dtype is F32 else F32
        return Cast(target, x), target
    if via == "select_true":
        return Select(always, x, k), dtype
    if via == "select_false":
        return Select(never, k, x), dtype
    if via == "select_lane":
        return Select((lane & u32(1)).eq(u32(0)), x, k), dtype
    if via == "select_nested":
        inner = Select(always, Cast(dtype, x), k)
        return Select(never, k, Cast(dtype, inner)), dtype
    if via == "arith":
        return x + k, dtype
    if via == "compare":
        return x.gt(k), BOOL
    if via == "unary":
        return Un(UnOp.NEG if dtype is F32 else UnOp.NOT, x), dtype
    if via == "fma":
        if dtype is F32:
            return Fma(x, f32(2.0), f32(0.5)), F32
        return Fma(Cast(F32, x), f32(2.0), f32(0.5)), F32
    raise ValueError(via)


def _zero(dtype: DType) -> Const:
    return _const(dtype, 0)


def alias_case(
    space: str,
    dtype: DType,
    index: str,
    via: str,
    keep: str,
    overwrite: str,
    geometry: Geometry,
    seed: int | None = None,
) -> Case:
    """Build one aliasing case (see the module docstring); ``seed`` draws READ_WRITE contents."""
    g = geometry
    if keep == "same_statement":  # the load, then an atomic on its buffer, in one statement
        dtype, overwrite = U32, "atomic"  # (atomics take U32 READ_WRITE or WORKGROUP words)
        space = "rw" if space == "wo" else space
    elif overwrite == "atomic" and (dtype is not U32 or space == "wo"):
        overwrite = "store"
    name = f"alias/{space}/{dtype.value}/{index}/{via}/{keep}/{overwrite}/{g}"
    lane, local = g.lane(), g.local()
    idx, count, race_free = _alias_index(space, index, g)
    value, vdtype = _alias_via(via, dtype, Load("buf", idx), lane)
    if keep == "loop_start" and vdtype is not U32:
        value, vdtype = Cast(U32, value), U32
    access = {"rw": Access.READ_WRITE, "wo": Access.WRITE, "sh": Access.WORKGROUP}[space]
    buffers = [
        BufferDecl("buf", 0, access, dtype, 0 if space == "rw" else count),
        BufferDecl("out", 1, Access.WRITE, vdtype, g.lanes),
        BufferDecl("after", 2, Access.WRITE, dtype, g.lanes),
    ]
    over: list[Stmt]
    if overwrite == "store":
        over = [Store("buf", idx, _const(dtype, 77))]
    elif overwrite == "store_fresh":
        if dtype is F32:
            fresh: Expr = Cast(F32, lane) + f32(0.5)
        elif dtype is I32:
            fresh = Cast(I32, lane) ^ i32(0x55)
        else:
            fresh = lane ^ u32(0x55)
        over = [Store("buf", idx, fresh)]
    else:
        over = [Let("unused_atomic", Atomic(AtomicOp.ADD, "buf", idx, u32(1000)))]
    use = Store("out", lane, Var("x"))
    body: list[Stmt] = []
    if space != "rw":
        body.append(Store("buf", idx, Cast(dtype, lane * u32(2) + u32(7))))
        if space == "sh":
            body.append(Barrier())
    if keep == "let":
        body += [Let("x", value), *over, use]
    elif keep == "assign":
        body += [Let("x", _zero(vdtype)), Assign("x", value), *over, use]
    elif keep == "assign_branch":  # a column cut: the child lanes' own variables
        body += [Let("x", _zero(vdtype)), If(local.ge(u32(1)), [Assign("x", value), *over, use])]
    elif keep == "assign_merge":  # assigned on a run of lanes, merged back, used after
        body += [
            Let("x", _zero(vdtype)),
            If(lane.lt(u32(g.lanes - 1)), [Assign("x", value)]),
            *over,
            use,
        ]
    elif keep == "let_flat":  # a contiguous run of lanes (the last one left out)
        body += [If(lane.lt(u32(g.lanes - 1)), [Let("x", value), *over, use])]
    elif keep == "let_cut":
        body += [If(local.ge(u32(1)), [Let("x", value), *over, use])]
    elif keep == "loop_start":
        body += [Loop("x", value, value + u32(2), [*over, use])]
    elif keep == "same_statement":  # Select computes both arms: the load, then the atomic
        k = _const(vdtype, 3)
        bump = Atomic(AtomicOp.ADD, "buf", idx, u32(1000))
        both = Select(nwg().ge(u32(1)), value, Select(bump.eq(u32(0xDEAD_BEEF)), k, k))
        body += [Store("out", lane, both)]
    else:
        raise ValueError(keep)
    body.append(Store("after", lane, Load("buf", idx)))
    program = Program(buffers, g.workgroup, body, op_id="test.differential.alias")
    inputs: tuple[np.ndarray[Any, Any], ...] = ()
    if space == "rw":
        inputs = (_words(dtype, count, _rng(name, seed)),)
    return Case(name, "alias", program, inputs, g.grid, race_free)


def enumerate_alias() -> list[Case]:
    """Every (index, via, keep) triple, the other axes drawn by a fixed-seed generator; then
    every pair of values of all axes."""
    pick = _picker("alias")
    rows = [
        (
            pick(ALIAS_SPACES),
            pick(ALIAS_DTYPES),
            index,
            via,
            keep,
            pick(ALIAS_OVERWRITES),
            pick(ALIAS_GEOMETRIES),
        )
        for index, via, keep in itertools.product(ALIAS_INDEXES, ALIAS_VIAS, ALIAS_KEEPS)
    ]
    rows += pairwise(ALIAS_AXES)
    return _unique(alias_case(*row) for row in rows)


@st.composite
def alias_cases(draw: st.DrawFn) -> Case:
    """Draw an aliasing case: any parameters, READ_WRITE contents from a drawn seed."""
    row = [draw(st.sampled_from(axis)) for axis in ALIAS_AXES]
    return alias_case(*row, seed=draw(_SEEDS))


# ---------------------------------------------------------------------------------
# (b) index patterns into storage and workgroup buffers

INDEX_SPACES = ("read", "uniform", "rw_load", "rw_store", "wo_store", "sh_load", "sh_store")
_LOADS = ("read", "uniform", "rw_load", "sh_load")
_SHARED = ("sh_load", "sh_store")

#: Index patterns: name → (the index expression, the index a lane computes). ``n`` is
#: the buffer's element count (per workgroup for workgroup memory).
_Form = tuple[Callable[[Geometry, int], Expr], Callable[[Geometry, int, int], int]]
_FORMS: dict[str, _Form] = {
    "gid": (lambda g, n: g.lane(), lambda g, n, x: x),
    "gid+1": (lambda g, n: g.lane() + u32(1), lambda g, n, x: x + 1),
    "gid+3": (lambda g, n: g.lane() + u32(3), lambda g, n, x: x + 3),
    "2gid": (lambda g, n: g.lane() * u32(2), lambda g, n, x: 2 * x),
    "2gid+1": (lambda g, n: g.lane() * u32(2) + u32(1), lambda g, n, x: 2 * x + 1),
    "3gid+2": (lambda g, n: g.lane() * u32(3) + u32(2), lambda g, n, x: 3 * x + 2),
    "lid": (lambda g, n: g.local(), lambda g, n, x: x % g.nl),
    "lid+1": (lambda g, n: g.local() + u32(1), lambda g, n, x: x % g.nl + 1),
    "lid+2": (lambda g, n: g.local() + u32(2), lambda g, n, x: x % g.nl + 2),
    "lid-1": (lambda g, n: g.local() - u32(1), lambda g, n, x: x % g.nl - 1),
    "2lid": (lambda g, n: g.local() * u32(2), lambda g, n, x: 2 * (x % g.nl)),
    "2lid+1": (lambda g, n: g.local() * u32(2) + u32(1), lambda g, n, x: 2 * (x % g.nl) + 1),
    "3lid+2": (lambda g, n: g.local() * u32(3) + u32(2), lambda g, n, x: 3 * (x % g.nl) + 2),
    "wgid": (lambda g, n: g.group(), lambda g, n, x: x // g.nl),
    "wgid*5+lid*2": (
        lambda g, n: g.group() * u32(5) + g.local() * u32(2),
        lambda g, n, x: 5 * (x // g.nl) + 2 * (x % g.nl),
    ),
    "transposed": (
        lambda g, n: g.local() * u32(g.ng) + g.group(),
        lambda g, n, x: (x % g.nl) * g.ng + x // g.nl,
    ),
    "last": (lambda g, n: u32(n - 1), lambda g, n, x: n - 1),
    "past": (lambda g, n: u32(n), lambda g, n, x: n),
    "huge": (lambda g, n: u32(_M32), lambda g, n, x: _M32),
    "gid-1": (lambda g, n: g.lane() - u32(1), lambda g, n, x: x - 1),
    "rev_lid": (lambda g, n: u32(g.nl - 1) - g.local(), lambda g, n, x: g.nl - 1 - x % g.nl),
    "rev_gid": (lambda g, n: u32(n - 1) - g.lane(), lambda g, n, x: n - 1 - x),
    "mod": (
        lambda g, n: g.lane() % u32(max(1, n // 2) | 1),
        lambda g, n, x: x % (max(1, n // 2) | 1),
    ),
    "mod_wrap": (lambda g, n: (g.lane() + u32(n - 1)) % u32(n), lambda g, n, x: (x + n - 1) % n),
    "lid%3": (lambda g, n: g.local() % u32(3), lambda g, n, x: x % g.nl % 3),
    "lid%big": (lambda g, n: g.local() % u32(1000), lambda g, n, x: x % g.nl),
    "2lid%big": (lambda g, n: (g.local() * u32(2)) % u32(1000), lambda g, n, x: 2 * (x % g.nl)),
    "gid+2^32": (
        lambda g, n: g.lane() + u32(0x8000_0000) + u32(0x8000_0000),
        lambda g, n, x: x,
    ),
    "gid*2^32+gid": (
        lambda g, n: g.lane() * u32(0x10000) * u32(0x10000) + g.lane(),
        lambda g, n, x: x,
    ),
    "lid+2^32": (
        lambda g, n: g.local() + u32(0x8000_0000) + u32(0x8000_0000),
        lambda g, n, x: x % g.nl,
    ),
    "lid-1-0xFFFFFFFF": (
        lambda g, n: g.local() - u32(1) - u32(_M32),
        lambda g, n, x: x % g.nl,
    ),
}
#: Patterns that need more than an expression: a data-dependent index, a variable, a loop.
_SPECIAL_FORMS = ("data", "var", "loop")
STORAGE_FORMS = (
    "gid",
    "gid+1",
    "gid+3",
    "2gid",
    "2gid+1",
    "3gid+2",
    "lid",
    "lid+2",
    "wgid",
    "wgid*5+lid*2",
    "transposed",
    "last",
    "past",
    "huge",
    "gid-1",
    "rev_lid",
    "rev_gid",
    "mod",
    "mod_wrap",
    "gid+2^32",
    "gid*2^32+gid",
    *_SPECIAL_FORMS,
)
SHARED_FORMS = (
    "lid",
    "lid+1",
    "lid+2",
    "lid-1",
    "2lid",
    "2lid+1",
    "3lid+2",
    "rev_lid",
    "lid%3",
    "lid%big",
    "2lid%big",
    "last",
    "past",
    "huge",
    "wgid",
    "gid",
    "lid+2^32",
    "lid-1-0xFFFFFFFF",
    *_SPECIAL_FORMS,
)
INDEX_CONTEXTS = (
    "top",
    "prefix",
    "lid_lo",
    "lid_hi",
    "wg_hi",
    "sparse",
    "sparse_run",
    "half",
    "lane_loop",
)
STORAGE_COUNTS = ("one", "odd", "nl", "lanes-1", "lanes", "lanes+1", "2lanes+1")
SHARED_COUNTS = ("one", "odd", "nl-1", "nl", "nl+1", "2nl", "2nl+1")
INDEX_DTYPES = (U32, F32, I32, BOOL)
INDEX_GEOMETRIES = (
    Geometry((1, 1, 1), (3, 1, 1)),
    Geometry((3, 1, 1), (1, 1, 1)),
    Geometry((4, 1, 1), (2, 1, 1)),
    Geometry((5, 1, 1), (3, 1, 1)),
    Geometry((7, 1, 1), (2, 1, 1)),
    Geometry((8, 1, 1), (1, 1, 1)),
    Geometry((16, 1, 1), (2, 1, 1)),
    Geometry((4, 2, 1), (2, 1, 1)),
    Geometry((2, 2, 2), (1, 1, 1)),
    Geometry((3, 1, 1), (2, 2, 1)),
)
STORAGE_AXES: tuple[tuple[Any, ...], ...] = (
    INDEX_SPACES[:5],
    STORAGE_FORMS,
    INDEX_CONTEXTS,
    STORAGE_COUNTS,
    INDEX_DTYPES,
    INDEX_GEOMETRIES,
)
SHARED_AXES: tuple[tuple[Any, ...], ...] = (
    _SHARED,
    SHARED_FORMS,
    INDEX_CONTEXTS,
    SHARED_COUNTS,
    INDEX_DTYPES,
    INDEX_GEOMETRIES,
)
INDEX_AXES = (STORAGE_AXES, SHARED_AXES)


def _as(dtype: DType, word: Expr) -> Expr:
    """A U32 lane value as ``dtype`` (BOOL: its low bit, so both values occur)."""
    return Cast(dtype, word & u32(1) if dtype is BOOL else word)


def _count(kind: str, g: Geometry) -> int:
    table = {
        "one": 1,
        "odd": 7,
        "nl-1": g.nl - 1,
        "nl": g.nl,
        "nl+1": g.nl + 1,
        "2nl": 2 * g.nl,
        "2nl+1": 2 * g.nl + 1,
        "lanes-1": g.lanes - 1,
        "lanes": g.lanes,
        "lanes+1": g.lanes + 1,
        "2lanes+1": 2 * g.lanes + 1,
    }
    return max(1, table[kind])


def _index_expr(
    form: str, shared: bool, g: Geometry, n: int
) -> tuple[Expr, list[Stmt], Callable[[list[Stmt]], list[Stmt]]]:
    """Return (index, statements before, wrapper) of one index pattern into ``n`` elements."""
    base = g.local() if shared else g.lane()

    def same(stmts: list[Stmt]) -> list[Stmt]:
        return stmts

    if form == "data":
        return Load("idx", g.lane()), [], same
    if form == "var":  # an affine value kept in a variable
        return Var("iv"), [Let("iv", base * u32(2) + u32(1))], same
    if form == "loop":  # a uniform loop's counter in the index

        def wrap(stmts: list[Stmt]) -> list[Stmt]:
            return [Loop("t", u32(0), u32(2), stmts)]

        return base * u32(2) + Var("t"), [], wrap
    return _FORMS[form][0](g, n), [], same


def _context(kind: str, g: Geometry, stmts: list[Stmt]) -> list[Stmt]:
    lane, local, group = g.lane(), g.local(), g.group()
    if kind == "top":
        return stmts
    if kind == "prefix":  # a contiguous run of lanes: the partial last workgroup
        return [If(lane.lt(u32(max(1, g.lanes - 2))), stmts)]
    if kind == "lid_lo":
        return [If(local.lt(u32(max(1, g.nl - 1))), stmts)]
    if kind == "lid_hi":  # a column cut that does not start at 0
        return [If(local.ge(u32(1)), stmts)]
    if kind == "wg_hi":
        return [If(group.ge(u32(1)), stmts)]
    if kind == "sparse":  # the workgroups and local lanes with no active lane cut away
        return [If((lane % u32(7)).eq(u32(3)), stmts)]
    if kind == "sparse_run":  # a few lanes of a contiguous run: compacted to a lane list
        return [If(lane.lt(u32(g.lanes - 1)), [If((lane % u32(7)).eq(u32(3)), stmts)])]
    if kind == "half":  # masked on the same lanes
        return [If((lane & u32(1)).eq(u32(0)), stmts)]
    if kind == "lane_loop":  # per-lane trip counts
        return [Loop("tt", u32(0), local % u32(2) + u32(1), stmts)]
    raise ValueError(kind)


def _shared_fill(g: Geometry, count: int, dtype: DType) -> list[Stmt]:
    """Every lane fills its share of the workgroup buffer ``sh``: ``sh[j] = wg·1000 + j + 1``."""
    local, group = g.local(), g.group()
    j = local + Var("k") * u32(g.nl)
    word = group * u32(1000) + Var("j") + u32(1)
    return [
        Loop(
            "k",
            u32(0),
            u32(-(-count // g.nl)),
            [Let("j", j), If(Var("j").lt(u32(count)), [Store("sh", Var("j"), _as(dtype, word))])],
        ),
        Barrier(),
    ]


def _shared_dump(g: Geometry, count: int) -> list[Stmt]:
    """After a barrier, every workgroup copies ``sh`` to ``dump[wg·count ..]``."""
    local, group = g.local(), g.group()
    return [
        Barrier(),
        Loop(
            "k2",
            u32(0),
            u32(-(-count // g.nl)),
            [
                Let("j2", local + Var("k2") * u32(g.nl)),
                If(
                    Var("j2").lt(u32(count)),
                    [Store("dump", group * u32(count) + Var("j2"), Load("sh", Var("j2")))],
                ),
            ],
        ),
    ]


def _injective(
    form: str, g: Geometry, n: int, indices: np.ndarray[Any, Any] | None, *, per_group: bool
) -> bool:
    """True when no two lanes (of one workgroup, ``per_group``) reach one element below ``n``."""
    owner: dict[tuple[int, int], int] = {}
    for lane in range(g.lanes):
        for i in _touched(form, per_group, g, n, lane, indices):
            if i >= n:
                continue
            key = (g.group_of(lane) if per_group else 0, i)
            if owner.setdefault(key, lane) != lane:
                return False
    return True


def _touched(
    form: str, shared: bool, g: Geometry, n: int, lane: int, indices: np.ndarray[Any, Any] | None
) -> list[int]:
    """The indices one lane computes (every loop iteration's), reduced modulo 2**32."""
    base = lane % g.nl if shared else lane
    if form == "data":
        assert indices is not None
        return [int(indices[lane])]
    if form == "var":
        return [2 * base + 1]
    if form == "loop":
        return [2 * base, 2 * base + 1]
    return [_FORMS[form][1](g, n, lane) & _M32]


def index_case(
    space: str,
    form: str,
    context: str,
    count_kind: str,
    dtype: DType,
    geometry: Geometry,
    seed: int | None = None,
) -> Case:
    """Build one index-pattern case (see the module docstring); ``seed`` draws the data."""
    g = geometry
    shared = space in _SHARED
    name = f"index/{space}/{form}/{context}/{count_kind}/{dtype.value}/{g}"
    rng = _rng(name, seed)
    n = _count(count_kind, g)
    lane = g.lane()
    index, pre, wrap = _index_expr(form, shared, g, n)
    buffers: list[BufferDecl] = []
    inputs: list[np.ndarray[Any, Any]] = []
    body: list[Stmt] = [*pre]
    indices = None
    if form == "data":  # in range, just past it, and far past it
        buffers.append(BufferDecl("idx", 0, Access.READ, U32))
        indices = np.where(
            rng.random(g.lanes) < 0.9,
            rng.integers(0, n + 2, g.lanes),
            rng.integers(0, 1 << 32, g.lanes, dtype=np.uint64),
        ).astype(np.uint32)
        inputs.append(indices)
    if space in ("read", "uniform", "rw_load", "rw_store"):
        access = {"read": Access.READ, "uniform": Access.UNIFORM}.get(space, Access.READ_WRITE)
        buffers.append(BufferDecl("buf", 1, access, dtype))
        inputs.append(_words(dtype, n, rng))
    elif space == "wo_store":
        buffers.append(BufferDecl("buf", 1, Access.WRITE, dtype, n))
    else:
        buffers.append(BufferDecl("sh", 1, Access.WORKGROUP, dtype, n))
    target = "sh" if shared else "buf"
    if space in _LOADS:
        buffers.append(BufferDecl("out", 2, Access.WRITE, dtype, g.lanes))
        op: Stmt = Store("out", lane, Load(target, index))
    else:
        if dtype is not U32:
            value: Expr = _as(dtype, lane + u32(1))
        else:  # a fresh array: a store over the whole buffer in order adopts it
            value = (lane + u32(1)) ^ u32(0x300)
        op = Store(target, index, value)
    if shared:
        body += _shared_fill(g, n, dtype)
    body += _context(context, g, wrap([op]))
    if space == "sh_store":
        buffers.append(BufferDecl("dump", 3, Access.WRITE, dtype, g.ng * n))
        body += _shared_dump(g, n)
    program = Program(buffers, g.workgroup, body, op_id="test.differential.index")
    # Loads of inputs, or of workgroup memory filled before a barrier, never race; a store
    # races when two lanes (of one workgroup, for workgroup memory) reach one element.
    race_free = space in _LOADS or _injective(form, g, n, indices, per_group=shared)
    return Case(name, "index", program, tuple(inputs), g.grid, race_free)


def enumerate_index() -> list[Case]:
    """Every (space, form, context) and every (space, form, count) triple, the other axes
    drawn by a fixed-seed generator; then every pair of values of all axes; for storage
    and for workgroup memory (each has its own forms and counts)."""
    pick = _picker("index")
    rows: list[tuple[Any, ...]] = []
    for spaces, forms, contexts, counts, dtypes, geometries in INDEX_AXES:
        rows += [
            (space, form, context, pick(counts), pick(dtypes), pick(geometries))
            for space, form, context in itertools.product(spaces, forms, contexts)
        ]
        rows += [
            (space, form, pick(contexts), count, pick(dtypes), pick(geometries))
            for space, form, count in itertools.product(spaces, forms, counts)
        ]
    rows += pairwise(STORAGE_AXES) + pairwise(SHARED_AXES)
    return _unique(index_case(*row) for row in rows)


@st.composite
def index_cases(draw: st.DrawFn, *, shared: bool) -> Case:
    """Draw an index-pattern case into workgroup memory (``shared``) or storage: any
    parameters, data from a drawn seed."""
    axes = SHARED_AXES if shared else STORAGE_AXES
    row = [draw(st.sampled_from(axis)) for axis in axes]
    return index_case(*row, seed=draw(_SEEDS))


# ---------------------------------------------------------------------------------
# (c) atomics: many lanes on one address, the old values kept

ATOMIC_OPS = tuple(AtomicOp)
ATOMIC_LANES = (1, 16, 17, 64)
ATOMIC_ARRANGEMENTS = ("group", "spread", "half", "sparse", "pairs", "columns", "mixed")
ATOMIC_SPACES = ("rw", "sh")
ATOMIC_VALUES = ("const", "lane", "data")
ATOMIC_EXPECTED = ("init", "lane", "data")
ATOMIC_CAPTURES = ("store", "let", "unused")
ATOMIC_AXES: tuple[tuple[Any, ...], ...] = (
    ATOMIC_OPS,
    ATOMIC_LANES,
    ATOMIC_ARRANGEMENTS,
    ATOMIC_SPACES,
    ATOMIC_VALUES,
    ATOMIC_EXPECTED,
    ATOMIC_CAPTURES,
)
_SLOTS = 3  # words of the atomic target


def _arrangement(
    kind: str, n: int
) -> tuple[
    Geometry, Callable[[int], bool], Callable[[Geometry], Expr], Callable[[int, Geometry], int]
]:
    """Return (geometry, which lanes run the atomic, its index, the index per lane)."""
    if kind == "group":
        return (
            Geometry((n, 1, 1), (1, 1, 1)),
            lambda lane: True,
            lambda g: u32(1),
            lambda lane, g: 1,
        )
    if kind == "spread":
        g = Geometry((8, 1, 1), (-(-(n + 3) // 8), 1, 1))
        return g, lambda lane: lane < n, lambda g: u32(1), lambda lane, g: 1
    if kind == "half":
        return (
            Geometry((2 * n, 1, 1), (1, 1, 1)),
            lambda lane: lane % 2 == 0,
            lambda g: u32(1),
            lambda lane, g: 1,
        )
    if kind == "sparse":
        return (
            Geometry((5 * n, 1, 1), (1, 1, 1)),
            lambda lane: lane % 5 == 0,
            lambda g: u32(2),
            lambda lane, g: 2,
        )
    if kind == "pairs":
        return (
            Geometry((2 * n, 1, 1), (1, 1, 1)),
            lambda lane: True,
            lambda g: g.lane() % u32(2),
            lambda lane, g: lane % 2,
        )
    if kind == "columns":
        return (
            Geometry((4, 1, 1), (n, 1, 1)),
            lambda lane: True,
            lambda g: g.local(),
            lambda lane, g: lane % 4,
        )
    if kind == "mixed":  # lanes past the last word do nothing and read 0
        return (
            Geometry((n + 2, 1, 1), (1, 1, 1)),
            lambda lane: True,
            lambda g: g.lane() % u32(_SLOTS + 1),
            lambda lane, g: lane % (_SLOTS + 1),
        )
    raise ValueError(kind)


def atomic_case(
    op: AtomicOp,
    n: int,
    arrangement: str,
    space: str,
    value_kind: str,
    expected_kind: str,
    capture: str,
    seed: int | None = None,
) -> Case:
    """Build one atomic case (see the module docstring); ``seed`` draws the words."""
    if op is not AtomicOp.CAS:
        expected_kind = "-"
    name = f"atomic/{op.value}/{n}/{arrangement}/{space}/{value_kind}/{expected_kind}/{capture}"
    rng = _rng(name, seed)
    g, active, index_of, index_at = _arrangement(arrangement, n)
    L = g.lanes
    lane = g.lane()
    init = _words(U32, _SLOTS, rng)
    if op in (AtomicOp.ADD, AtomicOp.MIN, AtomicOp.MAX, AtomicOp.EXCHANGE, AtomicOp.CAS):
        values = _words(U32, L, rng, small=40)  # chains of distinct words, some wrapping
    else:
        values = rng.integers(0, 1 << 32, L, dtype=np.uint64).astype(np.uint32)
    expected = np.where(rng.random(L) < 0.5, init[rng.integers(0, _SLOTS, L)], values)
    const_value = int(values[0])

    def value_at(lane_id: int) -> int:
        if value_kind == "const":
            return const_value
        if value_kind == "lane":
            return (lane_id * 7 + 1) & _M32
        return int(values[lane_id])

    if value_kind == "const":
        value: Expr = u32(const_value)
    elif value_kind == "lane":
        value = lane * u32(7) + u32(1)
    else:
        value = Load("vals", lane)
    target = "sh" if space == "sh" else "acc"
    index = index_of(g)
    exp_expr: Expr | None = None
    if op is AtomicOp.CAS:
        if expected_kind == "init":
            exp_expr = Load("inits", index)
        elif expected_kind == "lane":
            exp_expr = lane
        else:
            exp_expr = Load("exps", lane)

    def expected_at(lane_id: int) -> int | None:
        if op is not AtomicOp.CAS:
            return None
        if expected_kind == "init":
            i = index_at(lane_id, g)
            return int(init[i]) if i < _SLOTS else 0
        if expected_kind == "lane":
            return lane_id
        return int(expected[lane_id])

    node = Atomic(op, target, index, value, exp_expr)
    if capture == "store":
        stmts: list[Stmt] = [Store("olds", lane, node)]
    elif capture == "let":
        stmts = [Let("old", node), Store("olds", lane, Var("old"))]
    else:
        stmts = [Let("unused_old", node)]
    if arrangement == "spread":
        stmts = [If(lane.lt(u32(n)), stmts)]
    elif arrangement == "half":
        stmts = [If((lane & u32(1)).eq(u32(0)), stmts)]
    elif arrangement == "sparse":  # within a contiguous run: compacted to a lane list
        stmts = [If(lane.lt(u32(L - 1)), [If((lane % u32(5)).eq(u32(0)), stmts)])]
    buffers = [
        BufferDecl("inits", 0, Access.READ, U32),
        BufferDecl("vals", 1, Access.READ, U32),
        BufferDecl("exps", 2, Access.READ, U32),
        BufferDecl("olds", 3, Access.WRITE, U32, L),
    ]
    inputs: list[np.ndarray[Any, Any]] = [init, values, expected]
    body: list[Stmt] = []
    if space == "rw":
        buffers.append(BufferDecl("acc", 4, Access.READ_WRITE, U32))
        inputs.append(init.copy())
        body += stmts
        final = "acc"
    else:
        local, group = g.local(), g.group()
        buffers.append(BufferDecl("sh", 4, Access.WORKGROUP, U32, _SLOTS))
        buffers.append(BufferDecl("final", 5, Access.WRITE, U32, g.ng * _SLOTS))
        body += [
            If(
                local.eq(u32(0)),
                [Loop("j", u32(0), u32(_SLOTS), [Store("sh", Var("j"), Load("inits", Var("j")))])],
            ),
            Barrier(),
            *stmts,
            Barrier(),
            If(
                local.eq(u32(0)),
                [
                    Loop(
                        "j",
                        u32(0),
                        u32(_SLOTS),
                        [Store("final", group * u32(_SLOTS) + Var("j"), Load("sh", Var("j")))],
                    )
                ],
            ),
        ]
        final = "final"
    program = Program(buffers, g.workgroup, body, op_id="test.differential.atomic")
    sites: dict[tuple[int, int], list[tuple[int, int, int | None]]] = {}
    for lane_id in range(L):
        if not active(lane_id):
            continue
        i = index_at(lane_id, g)
        if i >= _SLOTS:
            continue
        key = (g.group_of(lane_id) if space == "sh" else 0, i)
        sites.setdefault(key, []).append((lane_id, value_at(lane_id), expected_at(lane_id)))
    check = AtomicCheck(
        op,
        None if capture == "unused" else "olds",
        tuple(
            AtomicSite(final, w * _SLOTS + i if space == "sh" else i, int(init[i]), tuple(hits))
            for (w, i), hits in sorted(sites.items())
        ),
    )
    return Case(name, "atomic", program, tuple(inputs), g.grid, False, check)


def enumerate_atomic() -> list[Case]:
    """Every (op, lanes, arrangement) and every (op, arrangement, space, capture)
    combination, the other axes drawn by a fixed-seed generator; then every pair."""
    pick = _picker("atomic")
    values, expected, spaces, captures = (
        ATOMIC_VALUES,
        ATOMIC_EXPECTED,
        ATOMIC_SPACES,
        ATOMIC_CAPTURES,
    )
    rows: list[tuple[Any, ...]] = [
        (op, n, arrangement, pick(spaces), pick(values), pick(expected), pick(captures))
        for op, n, arrangement in itertools.product(ATOMIC_OPS, ATOMIC_LANES, ATOMIC_ARRANGEMENTS)
    ]
    rows += [
        (op, pick(ATOMIC_LANES), arrangement, space, pick(values), pick(expected), capture)
        for op, arrangement, space, capture in itertools.product(
            ATOMIC_OPS, ATOMIC_ARRANGEMENTS, ATOMIC_SPACES, ATOMIC_CAPTURES
        )
    ]
    rows += pairwise(ATOMIC_AXES)
    return _unique(atomic_case(*row) for row in rows)


@st.composite
def atomic_cases(draw: st.DrawFn) -> Case:
    """Draw an atomic case: any parameters, initial words, operands and comparands from a
    drawn seed."""
    row = [draw(st.sampled_from(axis)) for axis in ATOMIC_AXES]
    return atomic_case(*row, seed=draw(_SEEDS))


# ---------------------------------------------------------------------------------
# the order-independent check of atomics


def sequential_witness(
    op: AtomicOp,
    init: int,
    lanes: Sequence[tuple[int, int | None, int | None]],
    final: int,
    *,
    budget: int = 200_000,
) -> bool:
    """Return True when some order of the atomics ``lanes`` turns ``init`` into ``final``
    with each lane reading its old word.

    Args:
        op: The operator.
        init: The word before the atomics.
        lanes: ``(value, expected, old)`` per lane; ``old`` None when not observed.
        final: The word after them.
        budget: Most search steps (an AssertionError past it: the check must decide).
    """
    if any(old is None for _, _, old in lanes):
        if op not in (AtomicOp.EXCHANGE, AtomicOp.CAS):
            word = init
            for value, expected, _ in lanes:
                word = atomic_step(op, word, value, expected)
            return word == final  # the same in every order
        return final == init or any(final == value for value, _, _ in lanes)
    steps = 0
    seen: set[tuple[int, frozenset[int]]] = set()

    def search(word: int, left: frozenset[int]) -> bool:
        nonlocal steps
        steps += 1
        assert steps <= budget, "sequential_witness: search budget exhausted"
        if not left:
            return word == final
        if (word, left) in seen:
            return False
        seen.add((word, left))
        ready = [k for k in left if lanes[k][2] == word]
        for k in ready:  # a lane that leaves the word as it is can always go now
            value, expected, _ = lanes[k]
            if atomic_step(op, word, value, expected) == word:
                return search(word, left - {k})
        tried: set[tuple[int, int | None]] = set()
        for k in ready:
            value, expected, _ = lanes[k]
            if (value, expected) in tried:
                continue
            tried.add((value, expected))
            if search(atomic_step(op, word, value, expected), left - {k}):
                return True
        return False

    return search(init, frozenset(range(len(lanes))))


# ---------------------------------------------------------------------------------
# helpers


def _picker(seed: str) -> Callable[[Sequence[Any]], Any]:
    """Return a deterministic chooser (the same sequence of choices on every run)."""
    rng = np.random.default_rng(zlib.crc32(seed.encode()))
    return lambda axis: axis[int(rng.integers(len(axis)))]


def _unique(cases: Iterator[Case] | Any) -> list[Case]:
    out: dict[str, Case] = {}
    for case in cases:
        out.setdefault(case.name, case)
    return list(out.values())
