"""Programs the fake-device tests dispatch besides the corpus and the contract's own."""

from __future__ import annotations

from vyre_async.ir import (
    Access,
    BufferDecl,
    DType,
    If,
    Load,
    Loop,
    Program,
    Return,
    Store,
    Var,
    gid,
    u32,
)

__all__ = ["accumulate", "extra_programs", "gate", "graph_programs", "grid_programs"]


def accumulate() -> Program:
    """``acc[i] += x[i] * 3`` with ``acc`` READ_WRITE and ``x`` READ (resident-buffer tests)."""
    return Program(
        [
            BufferDecl("x", 0, Access.READ, DType.U32),
            BufferDecl("acc", 1, Access.READ_WRITE, DType.U32),
        ],
        64,
        [Store("acc", gid(), Load("acc", gid()) + Load("x", gid()) * 3)],
        op_id="test.accumulate",
    )


def gate() -> Program:
    """Spin until ``flag[0]`` becomes non-zero, then ``out[0] = 1``: a kernel the test ends.

    On the fake device, memory is host memory, so a test can open the gate by
    writing the flag while kernels wait on it (stream order then holds them in flight).
    """
    return Program(
        [
            BufferDecl("flag", 0, Access.READ, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 1),
        ],
        1,
        [
            Loop(
                "i",
                u32(0),
                u32(0xFFFF_FFFF),
                [
                    If(
                        Load("flag", u32(0)).ne(u32(0)),
                        [Store("out", u32(0), Var("i") * 0 + 1), Return()],
                    )
                ],
            )
        ],
        op_id="test.gate",
    )


def graph_programs() -> list[Program]:
    """The arm-graph test's kernels, as the graph dispatches them (resident variants)."""
    from tests.policies.kernels import binop
    from vyre_async._graph.schedule import _resident_variant

    return [_resident_variant(binop("xor", 64)), _resident_variant(binop("add", 64))]


def grid_programs() -> list[Program]:
    """Exclusive scans on each side of the fake device's co-residency limit (``test_cupy_grid``).

    32-lane workgroups, 4 SMs of 32 blocks: 128 workgroups fit at once, 129 do not.
    """
    from vyre_async.programs import exclusive_scan

    return [exclusive_scan(32 * blocks, workgroup=32) for blocks in (128, 129)]


def extra_programs() -> list[Program]:
    """Return every extra program (one kernel each in the fake device's library).

    Programs with grid barriers also get one kernel per segment (``conftest.py``).
    """
    return [accumulate(), gate(), *graph_programs(), *grid_programs()]
