"""The reference memory layer on paths the corpus did not reach (found by mutation testing).

Each program runs on the engine and on the slow interpreter (the oracle):

- a cancelled launch says so in words (the ``Cancelled`` message a user reads);
- a WORKGROUP load whose index is out of bounds on some or all lanes reads
  U32 zeros, which stay U32 words in later bit operations (a float zero would
  break ``^``), on a whole grid and on a compacted run of lanes;
- a WORKGROUP index that is lane-affine but the same on every lane
  (``lid - lid + k``) is one slot for the whole workgroup;
- a per-lane WORKGROUP store whose last lanes fall past the buffer writes only
  the lanes in bounds.
"""

from __future__ import annotations

import threading

import pytest

from tests.reference.oracle_check import run_both
from vyre_async.ir import (
    Access,
    Barrier,
    BufferDecl,
    DType,
    If,
    Load,
    Program,
    Store,
    gid,
    lid,
    u32,
    wgid,
)
from vyre_reference import Cancelled, execute

U32 = DType.U32
MASK = 0xFFFF_FFFF


def test_a_cancelled_launch_says_the_dispatch_was_cancelled() -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, U32, 8)], (8, 1, 1), [Store("out", gid(), u32(1))]
    )
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled) as info:
        execute(program, [], cancel=cancel)
    assert str(info.value) == "the dispatch was cancelled; the reference engine stopped"


@pytest.mark.parametrize("shift", [1, 3, 7])
def test_a_shifted_workgroup_load_reads_u32_zeros_past_the_end(shift: int) -> None:
    # sh[lid + shift] is in bounds on the first 8 - shift lanes of each workgroup only.
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 32),
            BufferDecl("sh", 1, Access.WORKGROUP, U32, 8),
        ],
        (8, 1, 1),
        [
            Store("sh", lid(), gid() * u32(3) + u32(1)),
            Barrier(),
            Store("out", gid(), Load("sh", lid() + u32(shift)) ^ u32(MASK)),
        ],
    )
    (out,) = run_both(program, [])
    for i, word in enumerate(out):
        local = i % 8 + shift
        read = (i - i % 8 + local) * 3 + 1 if local < 8 else 0
        assert word == read ^ MASK, i


def test_a_uniform_workgroup_load_past_the_end_reads_a_u32_zero() -> None:
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 32),
            BufferDecl("sh", 1, Access.WORKGROUP, U32, 8),
        ],
        (8, 1, 1),
        [
            Store("sh", lid(), u32(5)),
            Barrier(),
            Store("out", gid(), Load("sh", u32(100)) ^ gid()),
        ],
    )
    (out,) = run_both(program, [])
    assert out == list(range(32))


def test_a_uniform_workgroup_load_past_the_end_on_a_run_of_lanes_reads_a_u32_zero() -> None:
    # gid >= 4 holds on one contiguous run of lanes across workgroups: the branch
    # runs on that run compacted to a flat lane list.
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 32),
            BufferDecl("sh", 1, Access.WORKGROUP, U32, 8),
        ],
        (8, 1, 1),
        [
            Store("sh", lid(), u32(5)),
            Barrier(),
            If(gid().ge(u32(4)), [Store("out", gid(), Load("sh", u32(100)) ^ gid())]),
        ],
    )
    (out,) = run_both(program, [])
    assert out == [0, 0, 0, 0, *range(4, 32)]


@pytest.mark.parametrize("slot", [0, 5])
def test_a_lane_affine_index_equal_on_every_lane_is_one_workgroup_slot(slot: int) -> None:
    same = lid() - lid() + u32(slot)  # affine in lid, but with coefficient 0
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 32),
            BufferDecl("sh", 1, Access.WORKGROUP, U32, 8),
        ],
        (8, 1, 1),
        [
            If(lid().eq(u32(2)), [Store("sh", same, wgid() + u32(10))]),
            Barrier(),
            Store("out", gid(), Load("sh", same)),
        ],
    )
    (out,) = run_both(program, [])
    assert out == [i // 8 + 10 for i in range(32)]


def test_a_workgroup_store_past_the_end_writes_only_the_lanes_in_bounds() -> None:
    # Two lanes per workgroup, one slot: lane 1's store falls past the end.
    program = Program(
        [
            BufferDecl("out", 0, Access.WRITE, U32, 8),
            BufferDecl("sh", 1, Access.WORKGROUP, U32, 1),
        ],
        (2, 1, 1),
        [
            Store("sh", lid(), gid() + u32(1)),
            Store("out", gid(), Load("sh", lid())),
        ],
    )
    (out,) = run_both(program, [])
    assert out == [1, 0, 3, 0, 5, 0, 7, 0]
