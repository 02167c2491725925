"""Compiled statements on paths the corpus did not reach (found by mutation testing).

Each program runs on the engine and on the slow interpreter (the oracle), with
a grid of several workgroups so that divergent branches take the engine's
lane-subset paths:

- an ``Assign`` whose variable is never read still runs the atomics of its
  expression (the compiler drops other unread assignments);
- a ``Return`` in a frame that already lost lanes to a nested ``Return``
  keeps both sets of lanes returned when the frames merge;
- a variable assigned in an ``If`` nested in another sparse ``If`` (a lane
  subset of a lane subset) is written back to the right lanes;
- a comparison of a lane-affine value (``gid``, ``lid``, ``wgid`` and what
  ``+ - *`` make of them) with a constant, which the engine decides from the
  value's bounds or builds as a prefix/suffix mask of the lanes: every operator,
  both operand orders, constants at the first and last lane and past them,
  values the same on every lane, values that wrap past 2**32, and lane subsets
  of every kind (a run or list of lanes, of workgroups, of local lanes);
- a ``cas`` whose expected value is a variable;
- products and comparisons of two lane-affine values, neither of them a
  constant (the engine must not scale by, or compare with, the other's
  constant term);
- a lane-affine value (the lane id, and one whose lane terms cancel, the
  same on every lane) added to, subtracted from, multiplied by and compared
  with loaded words in both operand orders: the engine's shortcuts must leave
  a per-lane operand to the general path.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    AtomicOp,
    Bin,
    BinOp,
    Block,
    BufferDecl,
    Cast,
    DType,
    Expr,
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
    UnOp,
    Var,
    gid,
    lid,
    u32,
    wgid,
)
from vyre_reference import execute

U32 = DType.U32
N = 256  # lanes: 4 workgroups of 64


def _run_both(
    program: Program, inputs: list[np.ndarray], grid: tuple[int, int, int] | None = None
) -> list[list[int]]:
    got = execute(program, [a.copy() for a in inputs], grid_override=grid)
    want = run_slow(program, [a.copy() for a in inputs], grid_override=grid)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    return [g.tolist() for g in got]


def test_an_unread_assignment_still_runs_its_atomic() -> None:
    program = Program(
        [
            BufferDecl("acc", 0, Access.READ_WRITE, U32),
            BufferDecl("out", 1, Access.WRITE, U32, N),
        ],
        (64, 1, 1),
        [
            Let("old", u32(0)),
            Assign("old", Atomic(AtomicOp.ADD, "acc", u32(0), u32(1))),  # "old" is never read
            Store("out", gid(0), u32(5)),
        ],
    )
    acc, out = _run_both(program, [np.array([10], dtype=np.uint32)])
    assert acc == [10 + N]
    assert out == [5] * N


@pytest.mark.parametrize("inner", [2, 3, 7])
def test_a_return_after_a_nested_return_keeps_both_sets_of_lanes_returned(inner: int) -> None:
    lane = gid(0)
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, N)],
        (64, 1, 1),
        [
            Store("out", lane, u32(1)),
            If(
                (lane % u32(4)).eq(u32(0)),  # a quarter of the lanes
                [
                    If((lane % u32(inner)).eq(u32(0)), [Return()]),  # some of them return here
                    Store("out", lane, u32(2)),
                    Return(),  # the rest of the quarter returns here
                ],
            ),
            Store("out", lane, u32(3)),  # only lanes outside the quarter get here
        ],
    )
    (out,) = _run_both(program, [])
    for i, word in enumerate(out):
        if i % 4:
            assert word == 3, i
        else:
            assert word == (1 if i % inner == 0 else 2), i


Condition = Callable[[Expr], Expr]
Truth = Callable[[int], bool]

_CONDITIONS: dict[str, tuple[Condition, Condition, Truth, Truth]] = {
    # (outer, inner) conditions on the lane id, as expressions and as Python
    "every 7th, then every 14th": (
        lambda x: (x % u32(7)).eq(u32(0)),
        lambda x: (x % u32(14)).eq(u32(0)),
        lambda i: i % 7 == 0,
        lambda i: i % 14 == 0,
    ),
    # a long run (a flat subset), then a shorter run inside it (a flat subset of it)
    "lanes below 200, then 50 to 89": (
        lambda x: x.lt(u32(200)),
        lambda x: x.ge(u32(50)).land(x.lt(u32(90))),
        lambda i: i < 200,
        lambda i: 50 <= i < 90,
    ),
    # a long run, then every 9th lane of it (a sparse subset of a flat one)
    "lanes from 20, then every 9th": (
        lambda x: x.ge(u32(20)),
        lambda x: (x % u32(9)).eq(u32(0)),
        lambda i: i >= 20,
        lambda i: i % 9 == 0,
    ),
}


@pytest.mark.parametrize("conditions", list(_CONDITIONS))
def test_an_assignment_in_a_subset_of_a_subset_reaches_its_lanes(conditions: str) -> None:
    outer, inner, outer_at, inner_at = _CONDITIONS[conditions]
    lane = gid(0)
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, N)],
        (64, 1, 1),
        [
            Let("x", lane),
            If(
                outer(lane),
                [
                    Assign("x", Var("x") + u32(1000)),
                    If(inner(lane), [Assign("x", Var("x") + u32(100_000))]),
                ],
            ),
            Store("out", lane, Var("x")),
        ],
    )
    (out,) = _run_both(program, [])
    want = [
        i + (1000 if outer_at(i) else 0) + (100_000 if outer_at(i) and inner_at(i) else 0)
        for i in range(N)
    ]
    assert out == want


@pytest.mark.parametrize("skipped", [0, 1, 3])
def test_an_assignment_in_some_whole_workgroups_reaches_their_lanes(skipped: int) -> None:
    # A condition uniform per workgroup, true in 3 of 4: the branch runs on those
    # workgroups' rows (a grid subset), and a per-lane value goes back to them.
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, N)],
        (64, 1, 1),
        [
            Let("x", u32(7)),
            If(wgid(0).ne(u32(skipped)), [Assign("x", gid(0))]),
            Store("out", gid(0), Var("x")),
        ],
    )
    (out,) = _run_both(program, [])
    assert out == [7 if i // 64 == skipped else i for i in range(N)]


# -- comparisons of lane-affine values with constants ---------------------------------

_PY_OPS: dict[BinOp, Callable[[int, int], bool]] = {
    BinOp.LT: operator.lt,
    BinOp.LE: operator.le,
    BinOp.GT: operator.gt,
    BinOp.GE: operator.ge,
    BinOp.EQ: operator.eq,
    BinOp.NE: operator.ne,
}
_OPS = list(_PY_OPS)
Value = Callable[[int], int]  # a lane's linear id -> the value's u32 word there


def _check_comparisons(
    op: BinOp,
    x: Expr,
    x_at: Value,
    ks: Sequence[int],
    *,
    guards: Sequence[tuple[Expr, Truth]] = (),
    lane: Expr | None = None,
    workgroup: int | tuple[int, int, int] = 64,
    grid: tuple[int, int, int] = (4, 1, 1),
) -> None:
    """Run ``x op k`` and ``k op x`` for each ``k`` inside the nested ``guards``.

    The grid has ``N`` lanes (the output, one slot of ``N`` words per comparison,
    would make it larger). Slot ``s`` holds, at lane ``i``, 2 where comparison
    ``s`` is true, 1 where it is false and 0 where a guard keeps the lane out.
    """
    lane = gid(0) if lane is None else lane
    pairs = [(k, flipped) for k in ks for flipped in (False, True)]
    body: list[Stmt] = [
        Store(
            "out",
            lane + u32(N * slot),
            Select(Bin(op, u32(k), x) if flipped else Bin(op, x, u32(k)), u32(2), u32(1)),
        )
        for slot, (k, flipped) in enumerate(pairs)
    ]
    for guard, _ in reversed(guards):
        body = [If(guard, body)]
    program = Program([BufferDecl("out", 0, Access.WRITE, U32, N * len(pairs))], workgroup, body)
    (out,) = _run_both(program, [], grid)
    compare = _PY_OPS[op]
    want = []
    for k, flipped in pairs:
        for i in range(N):
            if not all(at(i) for _, at in guards):
                want.append(0)
                continue
            v = x_at(i) % (1 << 32)
            want.append(2 if (compare(k, v) if flipped else compare(v, k)) else 1)
    assert out == want


_EDGES = [0, 1, 63, 64, 128, 254, 255, 256, 0xFFFFFFFF]


@pytest.mark.parametrize("op", _OPS, ids=str)
def test_the_lane_id_compared_with_constants_at_the_edges_of_the_grid(op: BinOp) -> None:
    _check_comparisons(op, gid(0), lambda i: i, _EDGES)


@pytest.mark.parametrize("op", _OPS, ids=str)
def test_a_lane_value_the_same_on_every_lane_compared_with_constants(op: BinOp) -> None:
    # lid(1) is 0 in a 64 x 1 x 1 workgroup: the value is 5 on every lane, but
    # symbolic (it has a lane term), so bounds with low == high decide it.
    _check_comparisons(op, lid(1) + u32(5), lambda i: 5, [4, 5, 6])


_WRAPPING: dict[str, tuple[Expr, Value]] = {
    # the highest lanes wrap past 2**32 to small values
    "lanes 10 and up wrap": (gid(0) + u32(2**32 - 10), lambda i: i + 2**32 - 10),
    # only the last lane wraps, to 0: the unwrapped high bound is exactly 2**32
    "only the last lane wraps": (gid(0) + u32(2**32 - (N - 1)), lambda i: i + 2**32 - (N - 1)),
    # below zero on every lane but the first few
    "5 - gid goes below zero": (u32(5) - gid(0), lambda i: 5 - i),
}


@pytest.mark.parametrize("value", list(_WRAPPING))
@pytest.mark.parametrize("op", _OPS, ids=str)
def test_a_lane_value_that_wraps_compared_with_constants(op: BinOp, value: str) -> None:
    x, x_at = _WRAPPING[value]
    _check_comparisons(op, x, x_at, [0, 3, 5, 100, 2**32 - 5])


_SUBSETS: dict[str, list[tuple[Expr, Truth]]] = {
    # gid >= 20: a run of lanes starting inside workgroup 0 (a flat lane range)
    "lanes from 20": [(gid(0).ge(u32(20)), lambda i: i >= 20)],
    # every 9th lane of that run (a list of lanes cut from a flat range)
    "every 9th lane from 20": [
        (gid(0).ge(u32(20)), lambda i: i >= 20),
        ((gid(0) % u32(9)).eq(u32(0)), lambda i: i % 9 == 0),
    ],
    "workgroups 2 and 3": [(wgid(0).ge(u32(2)), lambda i: i // 64 >= 2)],
    "workgroups 0 and 2": [((wgid(0) % u32(2)).eq(u32(0)), lambda i: (i // 64) % 2 == 0)],
    "local lanes below 32": [(lid(0).lt(u32(32)), lambda i: i % 64 < 32)],
    "even local lanes": [((lid(0) % u32(2)).eq(u32(0)), lambda i: i % 2 == 0)],
}


@pytest.mark.parametrize("subset", list(_SUBSETS))
@pytest.mark.parametrize("op", _OPS, ids=str)
def test_the_lane_id_compared_with_constants_on_a_subset_of_lanes(op: BinOp, subset: str) -> None:
    ks = [0, 15, 20, 21, 100, 150, 255, 256]
    _check_comparisons(op, gid(0), lambda i: i, ks, guards=_SUBSETS[subset])


@pytest.mark.parametrize("op", _OPS, ids=str)
def test_a_comparison_in_a_workgroup_along_y_on_a_run_of_lanes(op: BinOp) -> None:
    # Workgroups of 1 x 64 x 1 lanes on a 1 x 4 x 1 grid, then the run of lanes
    # from 20: wgid(1) + lid(1) is not the lane's position there (it restarts
    # near 0 in each workgroup), so it cannot be cut as a run of positions.
    _check_comparisons(
        op,
        wgid(1) + lid(1),
        lambda i: i // 64 + i % 64,
        [0, 20, 21, 40, 64, 66, 100],
        guards=[(gid(1).ge(u32(20)), lambda i: i >= 20)],
        lane=gid(1),
        workgroup=(1, 64, 1),
        grid=(1, 4, 1),
    )


def test_a_comparison_result_in_every_use_of_a_bool() -> None:
    # gid < 100 on the lanes from 20 is a mask built by slicing; it is stored,
    # cast, negated, compared and selected on.
    lane = gid(0)
    cond = lane.lt(u32(100))
    program = Program(
        [
            BufferDecl("flags", 0, Access.WRITE, DType.BOOL, N),
            BufferDecl("out", 1, Access.WRITE, U32, 4 * N),
            BufferDecl("fl", 2, Access.WRITE, DType.F32, N),
        ],
        (64, 1, 1),
        [
            If(
                lane.ge(u32(20)),
                [
                    Let("c", cond),
                    Store("flags", lane, Var("c")),
                    Store("out", lane, Cast(U32, Var("c"))),
                    Store("out", lane + u32(N), Cast(U32, Cast(DType.I32, Var("c")))),
                    Store("out", lane + u32(2 * N), Cast(U32, Un(UnOp.LNOT, Var("c")))),
                    Store("out", lane + u32(3 * N), Cast(U32, Var("c").eq(lane.lt(u32(50))))),
                    Store("fl", lane, Cast(DType.F32, Var("c"))),
                ],
            )
        ],
    )
    flags, out, fl = _run_both(program, [], (4, 1, 1))
    assert flags == [int(20 <= i < 100) for i in range(N)]
    assert out[:N] == flags
    assert out[N : 2 * N] == flags
    assert out[2 * N : 3 * N] == [int(i >= 100) for i in range(N)]
    assert out[3 * N :] == [0 if i < 20 else int((i < 100) == (i < 50)) for i in range(N)]
    assert fl == [float(f) for f in flags]


def test_a_cas_whose_expected_value_is_a_variable() -> None:
    program = Program(
        [
            BufferDecl("words", 0, Access.READ_WRITE, U32),
            BufferDecl("old", 1, Access.WRITE, U32, N),
        ],
        (64, 1, 1),
        [
            Let("expected", gid(0) % u32(8)),
            Store("old", gid(0), Atomic(AtomicOp.CAS, "words", gid(0), u32(99), Var("expected"))),
        ],
    )
    words = np.array([i % 8 if i % 3 else 1000 for i in range(N)], dtype=np.uint32)
    got_words, old = _run_both(program, [words])
    assert old == words.tolist()
    assert got_words == [99 if i % 3 else 1000 for i in range(N)]


# -- lane-affine values combined with other lane values --------------------------------

Words = Callable[[int, int], int]  # (lane's linear id, the word loaded there) -> u32 word


def _check_slots(slots: Sequence[tuple[Expr, Words]], words: np.ndarray) -> None:
    """Store each expression in its own slot of ``N`` words and compare with Python.

    ``Load("words", gid)`` reads ``words`` (``N`` of them) in the expressions.
    """
    lane = gid(0)
    program = Program(
        [
            BufferDecl("words", 0, Access.READ, U32, N),
            BufferDecl("out", 1, Access.WRITE, U32, N * len(slots)),
        ],
        (64, 1, 1),
        [Store("out", lane + u32(N * slot), expr) for slot, (expr, _) in enumerate(slots)],
    )
    (out,) = _run_both(program, [words], (4, 1, 1))
    want = [at(i, int(words[i])) % (1 << 32) for _, at in slots for i in range(N)]
    assert out == want


def _flag(cond: Expr) -> Expr:
    return Select(cond, u32(2), u32(1))


def test_products_and_comparisons_of_two_lane_values() -> None:
    # Both operands depend on the lane: the product is not a scaling by the
    # other's constant term, and the comparison is not with that constant.
    lane = gid(0)
    slots: list[tuple[Expr, Words]] = [
        (lane * lane, lambda i, w: i * i),
        (lane * lid(0), lambda i, w: i * (i % 64)),
        ((lane + u32(3)) * (lane + u32(1)), lambda i, w: (i + 3) * (i + 1)),
        (_flag(lane.lt(lane + u32(1))), lambda i, w: 2),
        (_flag(lane.ge(lane + u32(5))), lambda i, w: 1),
        (_flag((lane * u32(2)).gt(lane + u32(100))), lambda i, w: 2 if 2 * i > i + 100 else 1),
    ]
    _check_slots(slots, np.zeros(N, dtype=np.uint32))


_WORDS = np.array([(i * 37) % 16 if i % 5 else 0xFFFFFFFF - i for i in range(N)], dtype=np.uint32)


def _both_orders(fn: Callable[[int, int], int], x_at: Value) -> tuple[Words, Words]:
    """Return ``fn(x, word)`` and ``fn(word, x)`` as functions of (lane, word)."""

    def x_first(i: int, v: int) -> int:
        return fn(x_at(i), v)

    def word_first(i: int, v: int) -> int:
        return fn(v, x_at(i))

    return x_first, word_first


def _as_flag(compare: Callable[[int, int], bool]) -> Callable[[int, int], int]:
    def flag(p: int, q: int) -> int:
        return 2 if compare(p, q) else 1

    return flag


_LANE_VALUES: dict[str, tuple[Expr, Value]] = {
    "gid": (gid(0), lambda i: i),
    # 7 on every lane but still a lane value (its lane terms cancelled): a
    # constant for the engine's shortcuts, which must still leave a loaded
    # (per-lane) operand to the general path
    "gid - gid + 7": (gid(0) - gid(0) + u32(7), lambda i: 7),
}


@pytest.mark.parametrize("value", list(_LANE_VALUES))
def test_a_lane_value_combined_with_loaded_words(value: str) -> None:
    x, x_at = _LANE_VALUES[value]
    w = Load("words", gid(0))
    arith_ops: dict[BinOp, Callable[[int, int], int]] = {
        BinOp.ADD: operator.add,
        BinOp.SUB: operator.sub,
        BinOp.MUL: operator.mul,
    }
    slots: list[tuple[Expr, Words]] = []
    for op, fn in arith_ops.items():
        x_first, word_first = _both_orders(fn, x_at)
        slots += [(Bin(op, x, w), x_first), (Bin(op, w, x), word_first)]
    for op, compare in _PY_OPS.items():
        x_first, word_first = _both_orders(_as_flag(compare), x_at)
        slots += [(_flag(Bin(op, x, w)), x_first), (_flag(Bin(op, w, x)), word_first)]
    _check_slots(slots, _WORDS)


def test_a_loop_starting_at_a_variable_counts_from_its_value() -> None:
    """The loop's bounds see the enclosing scope's variables (start and end alike)."""
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 8)],
        (8, 1, 1),
        [
            Let("s", gid() % u32(3)),
            Let("e", u32(4)),
            Loop("i", Var("s"), Var("e"), [Store("out", gid(), Load("out", gid()) + Var("i"))]),
        ],
    )
    got = execute(program, [])[0].tolist()
    assert got == run_slow(program, [])[0].tolist()
    assert got == [sum(range(g % 3, 4)) for g in range(8)]


def _outer_program(nested: Stmt) -> Program:
    """Lanes 0-7 of 16 run ``x = 1`` then ``nested`` (which sets ``y`` on some of them)."""
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 16)],
        (16, 1, 1),
        [
            Let("x", u32(0)),
            Let("y", u32(0)),
            If(gid().lt(u32(8)), [Assign("x", u32(1)), nested]),
            Store("out", gid(), Var("x") * u32(10) + Var("y")),
        ],
    )


@pytest.mark.parametrize(
    "nested",
    [
        If(gid().lt(u32(4)), [Assign("y", u32(2))]),
        Loop("t", u32(0), gid() % u32(2), [Assign("y", u32(2))]),
        Block([Assign("y", u32(2))]),
    ],
    ids=["if", "loop", "block"],
)
def test_assignments_in_a_branch_before_and_inside_a_nested_statement_all_reach_the_lanes(
    nested: Stmt,
) -> None:
    """Every outer variable a branch assigns is merged back, whichever statement assigned it:
    the branch's own ``x = 1`` and ``y = 2`` from an If, a loop or a block nested in it."""
    program = _outer_program(nested)
    got = execute(program, [])[0].tolist()
    assert got == run_slow(program, [])[0].tolist()
    sets_y = {"If": lambda g: g < 4, "Loop": lambda g: g % 2 == 1, "Block": lambda g: True}[
        type(nested).__name__
    ]
    assert got == [10 + 2 * sets_y(g) if g < 8 else 0 for g in range(16)]
