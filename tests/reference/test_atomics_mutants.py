"""The reference engine's atomics where mutation testing found them unchecked.

The column fast path: an ``add`` whose result is unused and whose index
depends only on the local id runs as one column sum per lane position
(`vyre_reference.atomics._column_add`). An index that depends only on the
workgroup id has the transposed shape (one value per workgroup row); where
there are as many workgroups as lanes in one, a looser shape test would read it
as per-lane columns. These programs have exactly that grid, into storage and
into workgroup memory, and every lane adds a different value, so a wrong column
shows in the words. Under an ``If`` that masks lanes off (without cutting the
grid) the fast path adds only the lanes that take it.

Workgroup atomics on int64 addresses (a workgroup array of 2**32 words or more),
and every operator with 1, 16, 17 and 64 lanes on one word: old values in lane
order and the final word. The slow interpreter is the oracle throughout.
"""

from __future__ import annotations

import numpy as np
import pytest

import vyre_reference.atomics as atomics_module
from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import (
    Access,
    Atomic,
    AtomicOp,
    Barrier,
    BufferDecl,
    DType,
    Expr,
    If,
    Let,
    Load,
    Loop,
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


def _program(n: int, space: str, index: Expr) -> Program:
    add: Stmt = Let("unused_old", Atomic(AtomicOp.ADD, "acc", index, lid(0) * u32(3) + u32(1)))
    perm = BufferDecl("perm", 0, Access.READ, U32)  # what the read[wgid] index reads
    if space == "storage":
        return Program([perm, BufferDecl("acc", 1, Access.READ_WRITE, U32)], (n, 1, 1), [add])
    return Program(
        [
            perm,
            BufferDecl("init", 1, Access.READ, U32),
            BufferDecl("acc", 2, Access.WORKGROUP, U32, n),
            BufferDecl("out", 3, Access.WRITE, U32, n * n),
        ],
        (n, 1, 1),
        [
            If(
                lid(0).eq(u32(0)),
                [Loop("j", u32(0), u32(n), [Store("acc", Var("j"), Load("init", Var("j")))])],
            ),
            Barrier(),
            add,
            Barrier(),
            Store("out", wgid(0) * u32(n) + lid(0), Load("acc", lid(0))),
        ],
    )


@pytest.mark.parametrize("n", [2, 4, 5])
@pytest.mark.parametrize("space", ["storage", "workgroup"])
@pytest.mark.parametrize(
    "index",
    # wgid is affine (an `Affine` index, tested by kind); wgid * wgid and a word read at
    # wgid are arrays of one value per workgroup; lid is the fast path's own case
    ["wgid", "wgid+1", "wgid*wgid", "read[wgid]", "lid"],
)
def test_a_workgroup_indexed_add_is_not_taken_for_a_column_add(
    n: int, space: str, index: str
) -> None:
    expr = {
        "wgid": wgid(0),
        "wgid+1": wgid(0) + u32(1),
        "wgid*wgid": wgid(0) * wgid(0),
        "read[wgid]": Load("perm", wgid(0)),
        "lid": lid(0),
    }[index]
    program = _program(n, space, expr)
    perm = np.roll(np.arange(n, dtype=np.uint32), 1)  # workgroup g adds to word g - 1
    init = (np.arange(n, dtype=np.uint32) * np.uint32(1000)) + np.uint32(7)
    got = execute(program, [perm, init.copy()], grid_override=n)
    want = run_slow(program, [perm, init.copy()], grid_override=n)
    assert len(got) == len(want) == 1
    assert got[0].tolist() == want[0].tolist()
    if index == "wgid" and space == "storage":
        # every workgroup's lanes add 1, 4, 7, ... to the word of its own id
        lane_sum = sum(3 * j + 1 for j in range(n))
        assert got[0].tolist() == [int(w) + lane_sum for w in init]


# An unused-result add under an If whose lanes are neither a prefix nor whole rows or
# columns: the branch keeps every lane and masks the others off (`frame.Frame.mask`),
# and the column fast path must add only the masked-in lanes' values.
def _masked_column_add(space: str, lanes: int, workgroups: int) -> Program:
    add: Stmt = Let("unused_old", Atomic(AtomicOp.ADD, "acc", lid(0), gid(0) + u32(1)))
    masked = If((gid(0) % u32(3)).ne(u32(0)), [add])
    if space == "storage":
        return Program([BufferDecl("acc", 0, Access.READ_WRITE, U32)], (lanes, 1, 1), [masked])
    return Program(
        [
            BufferDecl("init", 0, Access.READ, U32),
            BufferDecl("acc", 1, Access.WORKGROUP, U32, lanes),
            BufferDecl("out", 2, Access.WRITE, U32, lanes * workgroups),
        ],
        (lanes, 1, 1),
        [
            Store("acc", lid(0), Load("init", lid(0))),
            Barrier(),
            masked,
            Barrier(),
            Store("out", wgid(0) * u32(lanes) + lid(0), Load("acc", lid(0))),
        ],
    )


@pytest.mark.parametrize("space", ["storage", "workgroup"])
def test_an_unused_add_under_a_masking_if_adds_only_the_lanes_that_take_it(space: str) -> None:
    lanes, workgroups = 8, 4
    program = _masked_column_add(space, lanes, workgroups)
    init = np.arange(lanes, dtype=np.uint32) * np.uint32(100)
    got = execute(program, [init.copy()], grid_override=workgroups)
    want = run_slow(program, [init.copy()], grid_override=workgroups)
    assert got[0].tolist() == want[0].tolist()
    # word l gets gid + 1 from every lane gid = 8 w + l that is not a multiple of 3
    if space == "storage":
        adds = [
            sum(g + 1 for g in range(col, lanes * workgroups, lanes) if g % 3)
            for col in range(lanes)
        ]
        assert got[0].tolist() == [100 * col + a for col, a in enumerate(adds)]
    else:
        words = [
            100 * col + (w * lanes + col + 1 if (w * lanes + col) % 3 else 0)
            for w in range(workgroups)
            for col in range(lanes)
        ]
        assert got[0].tolist() == words


# Workgroup memory is one (workgroups, words) array; its lane addresses are
# ``workgroup * words + index``, in uint32 below 2**32 words and in int64 from there (a
# 16 GiB array: 349 526 workgroups of 48 KiB). The threshold is lowered to 1 here, so
# these small programs take the int64 addresses.
WG_OPS = [AtomicOp.ADD, AtomicOp.MIN, AtomicOp.XOR, AtomicOp.EXCHANGE, AtomicOp.CAS]


def _workgroup_atomics(op: AtomicOp, *, want_old: bool) -> Program:
    lanes, words, workgroups = 8, 4, 3
    index = (lid(0) * u32(5) + wgid(0)) % u32(words)  # every workgroup hits its words differently
    expected = Load("init", wgid(0) * u32(words) + index) if op is AtomicOp.CAS else None
    atomic = Atomic(op, "acc", index, gid(0) * u32(7) + u32(3), expected)
    use: Stmt = Store("old", gid(0), atomic) if want_old else Let("unused_old", atomic)
    first = lid(0).lt(u32(words))
    return Program(
        [
            BufferDecl("init", 0, Access.READ, U32, words * workgroups),
            BufferDecl("acc", 1, Access.WORKGROUP, U32, words),
            BufferDecl("old", 2, Access.WRITE, U32, lanes * workgroups),
            BufferDecl("out", 3, Access.WRITE, U32, words * workgroups),
        ],
        (lanes, 1, 1),
        [
            If(first, [Store("acc", lid(0), Load("init", wgid(0) * u32(words) + lid(0)))]),
            Barrier(),
            use,
            Barrier(),
            If(first, [Store("out", wgid(0) * u32(words) + lid(0), Load("acc", lid(0)))]),
        ],
    )


@pytest.mark.parametrize("want_old", [True, False], ids=["old-used", "old-unused"])
@pytest.mark.parametrize("op", WG_OPS, ids=[op.value for op in WG_OPS])
def test_workgroup_atomics_on_int64_addresses_match_the_slow_interpreter(
    monkeypatch: pytest.MonkeyPatch, op: AtomicOp, want_old: bool
) -> None:
    program = _workgroup_atomics(op, want_old=want_old)
    init = np.array([5, 900, 17, 3000, 40, 2, 77, 6000, 1, 33, 500, 8], dtype=np.uint32)
    want = run_slow(program, [init.copy()], grid_override=3)
    monkeypatch.setattr(atomics_module, "_U32_KEYS", 1)
    got = execute(program, [init.copy()], grid_override=3)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert got[1].tolist() != init.tolist()  # every op changed some word


# Every operator with 1, 16, 17 and 64 lanes on one word (one and several doubling
# steps of the scans, a run that is not a power of two): the engine applies them in
# lane order, as the slow interpreter does, so old values and final words are exact.
ALL_OPS = list(AtomicOp)
K, C = 0x0101_0101, 0xF000_0000  # lane g's operand: K * g + C (wraps past 2**32 under add)
START = (C - K) % (1 << 32)  # the word's first value: lane 0's operand "before lane 0"


@pytest.mark.parametrize("lanes", [1, 16, 17, 64])
@pytest.mark.parametrize("op", ALL_OPS, ids=[op.value for op in ALL_OPS])
def test_lanes_on_one_word_see_the_old_values_of_lane_order(op: AtomicOp, lanes: int) -> None:
    # cas: lane g expects lane g - 1's operand (plus 1 at g = 4, 9, ...): lanes 0 to 3
    # swap, lane 4 fails, and every later one expects a word that is not there
    expected = None
    if op is AtomicOp.CAS:
        expected = (gid(0) - u32(1)) * u32(K) + u32(C) + (gid(0) % u32(5)) / u32(4)
    program = Program(
        [
            BufferDecl("acc", 0, Access.READ_WRITE, U32, 2),
            BufferDecl("old", 1, Access.WRITE, U32, lanes),
        ],
        (lanes, 1, 1),
        [Store("old", gid(0), Atomic(op, "acc", u32(1), gid(0) * u32(K) + u32(C), expected))],
    )
    init = np.array([11, START], dtype=np.uint32)
    got = execute(program, [init.copy()], grid_override=1)
    want = run_slow(program, [init.copy()], grid_override=1)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert got[0][0] == 11  # the other word is untouched
    operands = [(K * g + C) % (1 << 32) for g in range(lanes)]
    if op is AtomicOp.ADD:
        assert got[1].tolist() == [(START + sum(operands[:g])) % (1 << 32) for g in range(lanes)]
        assert got[0][1] == (START + sum(operands)) % (1 << 32)
    elif op is AtomicOp.EXCHANGE:
        assert got[1].tolist() == [START, *operands[:-1]]
        assert got[0][1] == operands[-1]
    elif op is AtomicOp.CAS:
        swapped = min(lanes, 4)
        assert got[1].tolist()[:swapped] == [START, *operands[: swapped - 1]]
        assert got[0][1] == operands[swapped - 1]


def _run_with_an_atomic_after_a_load(stmt: Stmt) -> list[list[int]]:
    """Run ``stmt`` on 16 lanes over ``b`` (READ_WRITE, ``5 * i``) and ``out``; check it
    against the slow interpreter and that each lane's atomic added 1 to its own word."""
    program = Program(
        [
            BufferDecl("b", 0, Access.READ_WRITE, DType.U32, 16),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 16),
        ],
        (16, 1, 1),
        [stmt],
    )
    b = np.arange(16, dtype=np.uint32) * np.uint32(5)
    got = [g.tolist() for g in execute(program, [b.copy()])]
    assert got == [w.tolist() for w in run_slow(program, [b.copy()])]
    assert got[0] == (b + 1).tolist()
    return got


def test_a_load_in_a_branch_condition_with_an_atomic_reads_the_word_before_it() -> None:
    """``b[i] == atomicAdd(b[i], 1)`` holds on every lane: the load is read before the
    atomic changes the word, even where the load would be a view of the buffer."""
    taken = If(
        Load("b", gid(0)).eq(Atomic(AtomicOp.ADD, "b", gid(0), u32(1))),
        [Store("out", gid(0), u32(1))],
    )
    assert _run_with_an_atomic_after_a_load(taken)[1] == [1] * 16


def test_a_load_in_a_loop_bound_with_an_atomic_reads_the_word_before_it() -> None:
    """The end ``b[i] - atomicAdd(b[i], 1)`` is 0 on every lane (the load comes first), so
    the body never runs, even where the load would be a view of the buffer."""
    loop = Loop(
        "t",
        u32(0),
        Load("b", gid(0)) - Atomic(AtomicOp.ADD, "b", gid(0), u32(1)),
        [Store("out", gid(0), Load("out", gid(0)) + u32(1))],
    )
    assert _run_with_an_atomic_after_a_load(loop)[1] == [0] * 16
