"""The column fast path for atomics, on indexes it must not take (found by mutation testing).

An ``add`` whose result is unused and whose index depends only on the local id
runs as one column sum per lane position (`vyre_reference.atomics._column_add`).
An index that depends only on the workgroup id has the transposed shape (one
value per workgroup row); where there are as many workgroups as lanes in one,
a looser shape test would read it as per-lane columns. These programs have
exactly that grid, into storage and into workgroup memory, and every lane adds
a different value, so a wrong column shows in the words. The slow interpreter
is the oracle.
"""

from __future__ import annotations

import numpy as np
import pytest

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
