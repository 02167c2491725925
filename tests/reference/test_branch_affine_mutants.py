"""Affine loads and stores as strided views (found by mutation testing).

A load or store whose index is ``c + a·wgid + b·lid`` on a whole grid runs as
one strided view of the buffer instead of a gather or scatter. Each program
runs on the engine and on the slow interpreter (the oracle), which stores lane
by lane in lane order, so colliding stores keep the last lane's value:

- lanes of different workgroups whose elements overlap (``wgid + 2·lid``)
  keep the last lane's value, not the order in which a strided view is walked;
- the lanes of one workgroup writing one element (``wgid``) keep the last
  lane's value;
- a load of ``wgid + 2·lid`` reads the words at those indices (its rows do not
  follow each other, so it is no plain slice of the buffer).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.oracle_check import run_both
from vyre_async.ir import Access, BufferDecl, DType, If, Load, Program, Store, gid, lid, u32, wgid

U32 = DType.U32


@pytest.mark.parametrize(("groups", "size"), [(4, 4), (3, 4), (4, 2)])
def test_overlapping_affine_stores_keep_the_last_lanes_value(groups: int, size: int) -> None:
    # Lane (W, L) writes element W + 2L: several lanes of different workgroups
    # share an element, and the highest lane (gid = W·size + L) must win.
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, 32)],
        (size, 1, 1),
        [Store("out", wgid() + lid() * u32(2), gid() + u32(100))],
    )
    (out,) = run_both(program, [], groups)
    want = [0] * 32
    for w in range(groups):
        for j in range(size):
            want[w + 2 * j] = w * size + j + 100
    assert out == want


def test_a_store_indexed_by_workgroup_keeps_the_last_lane_of_each_workgroup() -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, 8)],
        (2, 1, 1),
        [Store("out", wgid(), lid() + u32(7))],
    )
    (out,) = run_both(program, [], 4)
    assert out == [8, 8, 8, 8, 0, 0, 0, 0]


def test_a_load_with_interleaved_rows_reads_each_lanes_word() -> None:
    # wgid + 2·lid on workgroups of 2: a = 1 and b = 2, so rows overlap and are
    # no plain slice of the input.
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 8),
            BufferDecl("inp", 1, Access.READ, U32, 8),
        ],
        (2, 1, 1),
        [Store("out", gid(), Load("inp", wgid() + lid() * u32(2)))],
    )
    inp = np.arange(10, 18, dtype=np.uint32)
    (out,) = run_both(program, [inp], 4)
    assert out == [10, 12, 11, 13, 12, 14, 13, 15]


@pytest.mark.parametrize(
    ("workgroup", "axis", "stride"),
    [((1, 1, 2), 2, 2), ((1, 2, 1), 1, 2), ((1, 2, 1), 1, 1)],
    ids=["z-stride-2", "y-stride-2", "y-stride-1"],
)
def test_a_load_in_a_branch_on_a_workgroup_along_y_or_z_reads_each_lanes_word(
    workgroup: tuple[int, int, int], axis: int, stride: int
) -> None:
    # Lanes 0 to 10 of 16 take the branch: a contiguous run of lanes (no mask), on
    # which the load of wgid + stride·lid is one strided slice only when its workgroup
    # term is the local term times the lanes per workgroup (all three axes counted).
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 16),
            BufferDecl("inp", 1, Access.READ, U32, 32),
        ],
        workgroup,
        [
            If(
                (wgid(0) * u32(2) + lid(axis)).lt(u32(11)),
                [
                    Store(
                        "out",
                        wgid(0) * u32(2) + lid(axis),
                        Load("inp", wgid(0) + lid(axis) * u32(stride)),
                    )
                ],
            )
        ],
    )
    inp = np.arange(100, 132, dtype=np.uint32)
    (out,) = run_both(program, [inp], 8)
    want = [0] * 16
    for w in range(8):
        for j in range(2):
            if 2 * w + j < 11:
                want[2 * w + j] = 100 + w + stride * j
    assert out == want
