"""The engine's affine fast paths against the slow interpreter, at the edges that broke them.

Each program here once gave a wrong result (a cold review, 2026-11-25): a lane
set's cached value taken over as a buffer and then changed by a later store,
a lane-independent constant outside 0..2**32-1 used unwrapped as a comparison
bound, and workgroup-memory indices that wrap judged out of bounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import (
    Access,
    Atomic,
    Barrier,
    BufferDecl,
    DType,
    If,
    Let,
    Load,
    Program,
    Select,
    Store,
    Var,
    gid,
    lid,
    u32,
    wgid,
)
from vyre_reference import execute


def _out(name: str, binding: int, count: int) -> BufferDecl:
    return BufferDecl(name, binding, Access.WRITE, DType.U32, count)


def _shared() -> BufferDecl:
    return BufferDecl("sh", 1, Access.WORKGROUP, DType.U32, 8)


_FILL_SHARED = [Store("sh", lid(), lid() + u32(10)), Barrier()]

CASES: dict[str, tuple[Program, list[Any]]] = {
    # A cached gid-based value must not become a buffer a later store changes.
    "cached value, then an atomic on its buffer": (
        Program(
            [BufferDecl("rw", 0, Access.READ_WRITE, DType.U32), _out("out2", 1, 8)],
            4,
            [
                Store("rw", gid(), u32(7) - gid()),
                Let("old", Atomic("add", "rw", u32(0), u32(100))),
                Store("out2", gid(), u32(7) - gid()),
            ],
        ),
        [np.zeros(8, np.uint32)],
    ),
    "cached value, then a store over its buffer (one workgroup)": (
        Program(
            [_out("out", 0, 4), _out("out2", 1, 4)],
            4,
            [
                Store("out", gid(), gid() + u32(1)),
                Store("out", gid(), u32(7)),
                Store("out2", gid(), gid() + u32(1)),
            ],
        ),
        [],
    ),
    "cached value, then a store over its buffer (two workgroups)": (
        Program(
            [_out("out", 0, 8), _out("out2", 1, 8)],
            4,
            [
                Store("out", gid(), wgid() + lid()),
                Store("out", gid(), u32(7)),
                Store("out2", gid(), wgid() + lid()),
            ],
        ),
        [],
    ),
    "cached value as a later load index": (
        Program(
            [
                BufferDecl("inp", 0, Access.READ, DType.U32),
                _out("tmp", 1, 4),
                _out("o", 2, 4),
            ],
            4,
            [
                Store("tmp", gid(), gid() * u32(2)),
                Store("tmp", gid(), u32(0)),
                Store("o", gid(), Load("inp", gid() * u32(2))),
            ],
        ),
        [np.arange(10, dtype=np.uint32) + 50],
    ),
    # A constant reached by wrapping (0 - 1 = 0xFFFFFFFF; 0xFFFFFFFF + 2 = 1).
    "select on gid < (gid - gid - 1)": (
        Program(
            [_out("out", 0, 8)],
            8,
            [Store("out", gid(), Select(gid().lt((gid() - gid()) - u32(1)), u32(1), u32(2)))],
        ),
        [],
    ),
    "if gid < (gid * 0 - 1)": (
        Program(
            [_out("out", 0, 8)],
            8,
            [If(gid().lt(gid() * u32(0) - u32(1)), [Store("out", gid(), u32(1))])],
        ),
        [],
    ),
    "if gid < k, k = 0xFFFFFFFF + 2 = 1": (
        Program(
            [_out("out", 0, 8)],
            8,
            [
                Let("k", (lid() - lid()) + u32(0xFFFFFFFF) + u32(2)),
                If(gid().lt(Var("k")), [Store("out", gid(), u32(1))]),
            ],
        ),
        [],
    ),
    # Workgroup-memory indices that wrap back into bounds.
    "shared load at lid + 2**31 + 2**31": (
        Program(
            [_out("out", 0, 8), _shared()],
            8,
            [
                *_FILL_SHARED,
                Store("out", gid(), Load("sh", lid() + u32(0x80000000) + u32(0x80000000))),
            ],
        ),
        [],
    ),
    "shared store at lid + 2**31 + 2**31": (
        Program(
            [_out("out", 0, 8), _shared()],
            8,
            [
                Store("sh", lid() + u32(0x80000000) + u32(0x80000000), lid() + u32(10)),
                Barrier(),
                Store("out", gid(), Load("sh", lid())),
            ],
        ),
        [],
    ),
    "shared load at lid - 1 - 0xFFFFFFFF": (
        Program(
            [_out("out", 0, 8), _shared()],
            8,
            [*_FILL_SHARED, Store("out", gid(), Load("sh", lid() - u32(1) - u32(0xFFFFFFFF)))],
        ),
        [],
    ),
    "shared load at lid * 2**32 + lid": (
        Program(
            [_out("out", 0, 8), _shared()],
            8,
            [
                *_FILL_SHARED,
                Store("out", gid(), Load("sh", lid() * u32(0x10000) * u32(0x10000) + lid())),
            ],
        ),
        [],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_paths_match_the_slow_interpreter(name: str) -> None:
    program, inputs = CASES[name]
    want = run_slow(program, [a.copy() for a in inputs])
    got = execute(program, [a.copy() for a in inputs])
    assert [g.tolist() for g in got] == [w.tolist() for w in want]


def test_outputs_stay_writable_arrays_of_their_own() -> None:
    """A stored lane value is copied, never handed out read-only or shared."""
    program, inputs = CASES["cached value, then a store over its buffer (one workgroup)"]
    outputs = execute(program, inputs)
    for output in outputs:
        assert output.flags.writeable and output.base is None
