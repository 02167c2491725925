"""`execute`'s ``workgroup_override``, found unchecked by mutation testing (issue 28).

``workgroup_override`` replaces the program's workgroup shape for one call: the
launch must run workgroups of the given shape, so ``lid`` and ``wgid`` (and how
many lanes a grid of workgroups has) follow it, exactly as the same program
written with that workgroup shape does on the slow interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import Access, BufferDecl, DType, Program, Store, gid, lid, u32, wgid
from vyre_reference import execute


def _program(workgroup: tuple[int, int, int]) -> Program:
    """Write ``wgid·100 + lid`` at ``gid`` on 32 words."""
    return Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 32)],
        workgroup,
        [Store("out", gid(), wgid() * u32(100) + lid())],
    )


@pytest.mark.parametrize(("override", "size"), [(8, 8), ((8, 1, 1), 8), ([2], 2)])
def test_execute_runs_workgroups_of_the_overriding_shape(
    override: int | Sequence[int], size: int
) -> None:
    grid = 32 // size
    program = _program((4, 1, 1))
    got = execute(program, [], grid_override=grid, workgroup_override=override)[0].tolist()
    assert got == run_slow(_program((size, 1, 1)), [], grid_override=grid)[0].tolist()
    assert got == [(i // size) * 100 + i % size for i in range(32)]


def test_execute_infers_the_grid_from_the_overriding_workgroup() -> None:
    # no grid_override: 32 words in workgroups of 16 lanes is a grid of 2, not 8
    got = execute(_program((4, 1, 1)), [], workgroup_override=16)[0].tolist()
    assert got == [(i // 16) * 100 + i % 16 for i in range(32)]
