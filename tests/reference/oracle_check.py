"""One program on the reference engine and on the slow interpreter (the oracle), compared.

Shared by the triage test files that pin the engine's fast paths against the
oracle word for word.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.reference.slow_interpreter import run_slow
from vyre_async.ir import Program
from vyre_reference import execute


def run_both(
    program: Program,
    inputs: Sequence[np.ndarray] = (),
    grid_override: int | Sequence[int] | None = None,
) -> list[list[int]]:
    """Run ``program`` on both (each on its own copy of ``inputs``); assert the outputs'
    dtypes and words are equal; return the outputs as lists."""
    got = execute(program, [a.copy() for a in inputs], grid_override=grid_override)
    want = run_slow(program, [a.copy() for a in inputs], grid_override=grid_override)
    assert [g.dtype for g in got] == [w.dtype for w in want]
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    return [g.tolist() for g in got]
