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
  enclosing code, per lane, per local lane and per workgroup;
- comparisons of one workgroup or local coordinate with a constant on 2-D grids
  and workgroups, which the engine decides from the coordinate's range on the
  branch's lanes when it can (so that range must be right);
- assignments, returns and a whole launch returning inside branches on cut lane
  sets, which the engine brings back to the enclosing code.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.reference.oracle_check import run_both
from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    DType,
    Expr,
    If,
    Let,
    Loop,
    Program,
    Return,
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
    (out,) = run_both(program, [], grid)
    return out


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


def _lane_2d(grid_x: int, workgroup_x: int) -> Expr:
    """The linear lane id on a grid ``(grid_x, *, 1)`` of workgroups ``(workgroup_x, 2, 1)``."""
    nl = workgroup_x * 2
    return (wgid(0) + wgid(1) * u32(grid_x)) * u32(nl) + lid(0) + lid(1) * u32(workgroup_x)


def test_a_workgroup_coordinate_compared_inside_a_branch_on_the_other_one_is_exact() -> None:
    # 4 x 2 workgroups of 2 lanes: wgid(1) == 1 keeps workgroups 4..7 (linear ids),
    # whose wgid(0) is 0..3, not their linear ids 4..7 and not local ids 0..1
    lane = (wgid(0) + wgid(1) * u32(4)) * u32(2) + lid(0)
    out = _run_both(
        (2, 1, 1),
        (4, 2, 1),
        [
            Store("out", lane, u32(1)),
            If(
                wgid(1).eq(u32(1)),
                [
                    If(wgid(0).lt(u32(2)), [Store("out", lane, u32(2))]),
                    If(wgid(0).ge(u32(3)), [Store("out", lane, u32(3))]),
                ],
            ),
        ],
    )
    want = []
    for w in range(8):
        x, y = w % 4, w // 4
        want += [(2 if x < 2 else 3 if x >= 3 else 1) if y == 1 else 1] * 2
    assert out == want


def test_coordinates_of_a_2d_workgroup_and_a_1d_grid_compare_over_their_own_extents() -> None:
    # 4 workgroups of 2 x 2 lanes: wgid(0) runs over 0..3 (not the workgroup's 0..1)
    # and lid(1) over 0..1 (not the grid's single row 0)
    lane = _lane_2d(4, 2)
    out = _run_both(
        (2, 2, 1),
        (4, 1, 1),
        [
            Store("out", lane, u32(0)),
            If(wgid(0).lt(u32(2)), [Store("out", lane, u32(10))]),
            If(lid(1).lt(u32(1)), [Store("out", lane, lane + u32(100))]),
        ],
    )
    want = []
    for i in range(16):
        w, local = i // 4, i % 4
        want.append(i + 100 if local // 2 < 1 else 10 if w < 2 else 0)
    assert out == want


def test_assignments_in_a_branch_on_some_workgroups_all_reach_the_enclosing_code() -> None:
    # eight outer variables and eight variables of the branch's own, all assigned
    # there: every outer one must come back, whatever order the names are kept in
    body: list[Stmt] = []
    inner: list[Stmt] = []
    for i in range(8):
        body.append(Let(f"x{i}", u32(0)))
        inner += [
            Let(f"t{i}", gid() * u32(0)),
            Assign(f"t{i}", Var(f"t{i}") + u32(1 << i)),
            Assign(f"x{i}", Var(f"t{i}")),
        ]
    total: Expr = Var("x0")
    for i in range(1, 8):
        total = total + Var(f"x{i}")
    out = _run_both(
        (8, 1, 1),
        (4, 1, 1),
        [*body, If(wgid().eq(u32(2)), inner), Store("out", gid(), total + u32(1000))],
    )
    assert out == [1255 if i // 8 == 2 else 1000 for i in range(32)]


def test_an_assignment_two_branches_deep_reaches_the_enclosing_code() -> None:
    # workgroup 1, then its local lanes below 3: both cut the lane set
    out = _run_both(
        (8, 1, 1),
        (4, 1, 1),
        [
            Let("x", u32(1)),
            If(wgid().eq(u32(1)), [If(lid().lt(u32(3)), [Assign("x", gid() + u32(50))])]),
            Store("out", gid(), Var("x")),
        ],
    )
    assert out == [i + 50 if i // 8 == 1 and i % 8 < 3 else 1 for i in range(32)]


def test_lanes_returned_in_two_sibling_branches_both_stay_returned() -> None:
    # in workgroup 1, local lane 0 returns in one branch and local lane 1 in the
    # next: neither may run the store after the enclosing branch
    out = _run_both(
        (4, 1, 1),
        (4, 1, 1),
        [
            If(
                wgid().eq(u32(1)),
                [If(lid().eq(u32(0)), [Return()]), If(lid().eq(u32(1)), [Return()])],
            ),
            Store("out", gid(), gid() + u32(1)),
        ],
    )
    assert out == [0 if i in (4, 5) else i + 1 for i in range(16)]


class _Watchdog(threading.Event):
    """A cancel event that a user's watchdog sets once the launch has run a while.

    The engine polls it before every statement and loop iteration; it reads as
    set from the ``after``-th poll on.
    """

    def __init__(self, after: int) -> None:
        super().__init__()
        self.polls = 0
        self.after = after

    def is_set(self) -> bool:
        self.polls += 1
        return self.polls >= self.after or super().is_set()


def test_a_launch_whose_lanes_all_returned_in_branches_runs_nothing_after_them() -> None:
    # the local lanes below 2 return in the then branch, the others in the else
    # branch: the long loop after it must not run (it would take minutes, and the
    # watchdog would cancel the launch)
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, 16)],
        (4, 1, 1),
        [
            Store("out", gid(), u32(9)),
            If(lid().lt(u32(2)), [Return()], [Return()]),
            Loop("i", u32(0), u32(1 << 30), [Store("out", gid(), Var("i"))]),
        ],
    )
    watchdog = _Watchdog(after=1000)
    (got,) = execute(program, [], grid_override=(4, 1, 1), cancel=watchdog)
    (want,) = run_slow(program, [], grid_override=(4, 1, 1))
    assert got.tolist() == want.tolist() == [9] * 16
    assert watchdog.polls < 1000
