"""Compiled statements on paths the corpus did not reach (found by mutation testing).

Each program runs on the engine and on the slow interpreter (the oracle), with
a grid of several workgroups so that divergent branches take the engine's
lane-subset paths:

- an ``Assign`` whose variable is never read still runs the atomics of its
  expression (the compiler drops other unread assignments);
- a ``Return`` in a frame that already lost lanes to a nested ``Return``
  keeps both sets of lanes returned when the frames merge;
- a variable assigned in an ``If`` nested in another sparse ``If`` (a lane
  subset of a lane subset) is written back to the right lanes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    AtomicOp,
    BufferDecl,
    DType,
    Expr,
    If,
    Let,
    Program,
    Return,
    Store,
    Var,
    gid,
    u32,
    wgid,
)
from vyre_reference import execute

U32 = DType.U32
N = 256  # lanes: 4 workgroups of 64


def _run_both(program: Program, inputs: list[np.ndarray]) -> list[list[int]]:
    got = execute(program, [a.copy() for a in inputs])
    want = run_slow(program, [a.copy() for a in inputs])
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
