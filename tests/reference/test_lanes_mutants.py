"""Lane subsets the engine cuts for divergent branches, on paths mutation testing found unchecked.

Each program runs on the engine and on the slow interpreter (the oracle), and
the outputs are also compared with values worked out by hand. The branches are
chosen so that the engine runs their bodies on a particular kind of lane set:

- lanes on the grid's diagonal (``lid == wgid``): few lanes, but some in every
  workgroup and at every local id, so the engine compacts them into a list cut
  from the whole grid; the body reads variables that vary per lane, per local
  lane only and per workgroup only;
- a contiguous run of lanes inside a branch that already dropped local lane 0
  of every workgroup (a run of a column subset, not of the whole grid);
- a branch on the workgroup or on the local id inside a branch that runs masked
  (``gid % 3 != 0``: too many lanes to compact, not a run): the masked-out lanes
  must stay out;
- a branch on some workgroups or some local lanes that reads variables of the
  enclosing code, per lane, per local lane and per workgroup.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import (
    Access,
    BufferDecl,
    DType,
    Expr,
    If,
    Let,
    Program,
    Stmt,
    Store,
    Var,
    gid,
    lid,
    u32,
    wgid,
)
from vyre_reference import execute

U32 = DType.U32


def _run_both(
    workgroup: tuple[int, int, int], grid: tuple[int, int, int], body: list[Stmt]
) -> list[int]:
    """Run ``body`` writing one ``out`` word per lane; return ``out`` (engine == oracle)."""
    lanes = int(np.prod(workgroup)) * int(np.prod(grid))
    program = Program([BufferDecl("out", 0, Access.WRITE, U32, lanes)], workgroup, body)
    got = execute(program, [], grid_override=grid)
    want = run_slow(program, [], grid_override=grid)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    (out,) = got
    return [int(v) for v in out.tolist()]


def _per_lane_variables() -> list[Stmt]:
    """Variables of the enclosing code: per local lane, per workgroup and per lane."""
    return [
        Let("per_lid", lid() * lid() + u32(1)),
        Let("per_wg", wgid() * wgid() + u32(2)),
        Let("per_lane", gid() * gid() + u32(3)),
    ]


def _mix() -> Expr:
    """One word from the three variables (each distinct per lane it varies over)."""
    return Var("per_lid") * u32(1_000_000) + Var("per_wg") * u32(1000) + Var("per_lane")


def _mix_at(wg: int, local: int, nl: int) -> int:
    lane = wg * nl + local
    return (local * local + 1) * 1_000_000 + (wg * wg + 2) * 1000 + lane * lane + 3


@pytest.mark.parametrize("size", [8, 12])
def test_a_branch_on_the_diagonal_of_the_grid_reads_the_variables_of_its_lanes(
    size: int,
) -> None:
    # size workgroups of size lanes: the diagonal is 1/size of the lanes, with one
    # in every workgroup and at every local id (no whole row or column to cut away)
    out = _run_both(
        (size, 1, 1),
        (size, 1, 1),
        [
            *_per_lane_variables(),
            Store("out", gid(), u32(7)),
            If(lid().eq(wgid()), [Store("out", gid(), _mix())]),
        ],
    )
    want = [_mix_at(w, x, size) if w == x else 7 for w in range(size) for x in range(size)]
    assert out == want


def test_a_run_of_lanes_inside_a_branch_that_dropped_local_lane_0_is_those_lanes() -> None:
    # 4 workgroups of 8; lid != 0 keeps local lanes 1..7 (a column subset), then
    # gid >= 12 is a contiguous run of that subset: lanes 12..15, 17..23, 25..31
    out = _run_both(
        (8, 1, 1),
        (4, 1, 1),
        [
            *_per_lane_variables(),
            Store("out", gid(), u32(7)),
            If(lid().ne(u32(0)), [If(gid().ge(u32(12)), [Store("out", gid(), _mix())])]),
        ],
    )
    want = [_mix_at(i // 8, i % 8, 8) if i % 8 and i >= 12 else 7 for i in range(32)]
    assert out == want


@pytest.mark.parametrize("inner", ["workgroup 1", "local lanes below 5"])
def test_a_branch_on_one_axis_inside_a_masked_branch_keeps_the_masked_lanes_out(
    inner: str,
) -> None:
    # gid % 3 != 0 is true on 21 of 32 lanes, neither a run nor few: that branch
    # runs masked on every lane; the inner condition depends on one axis only
    cond = wgid().eq(u32(1)) if inner == "workgroup 1" else lid().lt(u32(5))
    out = _run_both(
        (8, 1, 1),
        (4, 1, 1),
        [
            Store("out", gid(), u32(1)),
            If((gid() % u32(3)).ne(u32(0)), [If(cond, [Store("out", gid(), u32(2))])]),
        ],
    )
    taken = [i // 8 == 1 if inner == "workgroup 1" else i % 8 < 5 for i in range(32)]
    assert out == [2 if i % 3 and taken[i] else 1 for i in range(32)]


@pytest.mark.parametrize("skipped", [0, 2])
def test_a_branch_on_some_workgroups_reads_the_variables_of_its_lanes(skipped: int) -> None:
    out = _run_both(
        (8, 1, 1),
        (4, 1, 1),
        [
            *_per_lane_variables(),
            Store("out", gid(), u32(7)),
            If(wgid().ne(u32(skipped)), [Store("out", gid(), _mix())]),
        ],
    )
    assert out == [7 if i // 8 == skipped else _mix_at(i // 8, i % 8, 8) for i in range(32)]


@pytest.mark.parametrize("kept", [0, 1])
def test_a_branch_on_one_of_two_local_lanes_reads_the_variables_of_its_lanes(kept: int) -> None:
    # workgroups of 2 lanes: a per-lane value has 2 columns, a per-workgroup one 1
    out = _run_both(
        (2, 1, 1),
        (4, 1, 1),
        [
            *_per_lane_variables(),
            Store("out", gid(), u32(7)),
            If(lid().eq(u32(kept)), [Store("out", gid(), _mix())]),
        ],
    )
    assert out == [_mix_at(i // 2, i % 2, 2) if i % 2 == kept else 7 for i in range(8)]


_NESTED: dict[str, tuple[Expr, Expr, list[int]]] = {
    # a run from lane 12 (a lane list starting there), then every 9th lane of it
    "every 9th lane from lane 12": (
        gid().ge(u32(12)),
        (gid() % u32(9)).eq(u32(0)),
        [i for i in range(32) if i >= 12 and i % 9 == 0],
    ),
    # workgroups 1..3 (a run of rows starting at 1), then the odd ones among them
    "odd workgroups from workgroup 1": (
        wgid().ge(u32(1)),
        (wgid() % u32(2)).eq(u32(1)),
        [i for i in range(32) if i // 8 % 2 == 1],
    ),
}


@pytest.mark.parametrize("nested", list(_NESTED))
def test_a_sparse_branch_inside_a_run_that_does_not_start_at_lane_0_reaches_its_lanes(
    nested: str,
) -> None:
    outer, inner, taken = _NESTED[nested]
    out = _run_both(
        (8, 1, 1),
        (4, 1, 1),
        [
            *_per_lane_variables(),
            Store("out", gid(), u32(7)),
            If(outer, [If(inner, [Store("out", gid(), _mix())])]),
        ],
    )
    assert out == [_mix_at(i // 8, i % 8, 8) if i in taken else 7 for i in range(32)]


@pytest.mark.parametrize(
    ("value", "word"),
    [
        (gid() - gid() + u32(7), 7),
        (lid() * u32(0) + u32(0xFFFF_FFF0), 0xFFFF_FFF0),
        ((wgid() - wgid() + u32(3)) * u32(0x9E37_79B9) * u32(0x9E37_79B9), 3 * 0x9E37_79B9**2),
    ],
)
def test_a_lane_value_that_no_longer_depends_on_the_lane_is_stored_on_every_lane(
    value: Expr, word: int
) -> None:
    # the lane ids cancel (or are multiplied by 0): the same word on every lane,
    # modulo 2**32 when the constant grew past it
    out = _run_both((4, 1, 1), (2, 1, 1), [Store("out", gid(), value)])
    assert out == [word % (1 << 32)] * 8
