"""Split a program at its grid-wide barriers into segments run as launches in sequence."""

from __future__ import annotations

from vyre_async._exports import public_dir as _public_dir
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import GridBarrier, Stmt

__all__ = ["split_at_grid_barriers"]
__dir__ = _public_dir(__name__)


def split_at_grid_barriers(program: Program) -> tuple[Program, ...]:
    """Return the segment programs that run ``program`` as launches in sequence.

    Each segment has ``program``'s buffers, workgroup shape and op id, and the
    statements between two top-level `GridBarrier`\\ s as its body. Run one
    after the other on the same buffers (one queue or stream: the launch
    boundary is the grid-wide fence, and each launch starts with zeroed
    workgroup memory), they compute exactly what ``program`` computes. Empty
    segments (a barrier first, last or twice in a row) are left out; a program
    without grid barriers is its own only segment, and one with nothing else
    is one segment with an empty body. Pure and memoised on the program.

    Raises:
        InvalidProgram: ``program`` does not validate (a grid barrier under an
            ``If``, a variable used across one: `vyre_async.ir.validate`).
    """
    from vyre_async.ir.validate import validate_or_raise

    cached = program.memo.get("ir.segments")
    if cached is not None:
        return tuple(cached)
    validate_or_raise(program)
    parts: list[list[Stmt]] = [[]]
    for stmt in program.body:
        if isinstance(stmt, GridBarrier):
            parts.append([])
        else:
            parts[-1].append(stmt)
    if len(parts) == 1:
        segments: tuple[Program, ...] = (program,)
    else:
        kept = [part for part in parts if part] or [[]]
        segments = tuple(
            Program(program.buffers, program.workgroup_size, part, program.op_id) for part in kept
        )
    program.memo["ir.segments"] = segments
    return segments
