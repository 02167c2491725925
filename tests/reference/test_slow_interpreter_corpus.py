"""The shipped conformance corpus on the slow interpreter, the oracle of the reference tests.

The differential tests compare the reference engine with the slow interpreter
(``slow_interpreter.run_slow``) on generated programs; this holds the
interpreter itself to the corpus's independently computed expected outputs,
case by case, so a corner the corpus gains (a rounding tie, a NaN operand, a
loop with no trip) is checked on both sides of those comparisons.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async.testing.corpus import Case, cases

CASES = [case for case in cases() if case.error is None]


def _ordered(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Binary32 values as ordered integers: adjacent floats differ by 1."""
    signed = values.astype(np.float32).view(np.uint32).astype(np.int64)
    return np.where(signed >= 2**31, 2**31 - signed, signed)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_slow_interpreter_gives_every_expected_output(case: Case) -> None:
    got = run_slow(
        case.program,
        [array.copy() for array in case.inputs],
        grid_override=case.grid,
        fixpoint_iterations=case.fixpoint_iterations,
    )
    assert len(got) == len(case.expected)
    for index, (out, want) in enumerate(zip(got, case.expected, strict=True)):
        out = np.asarray(out)
        assert out.dtype == want.dtype and out.shape == want.shape, index
        if case.ulp_budget and want.dtype == np.float32:
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(out), nan), index
            far = ~nan & (np.abs(_ordered(out) - _ordered(want)) > case.ulp_budget)
            assert not far.any(), (index, out[far].tolist(), want[far].tolist())
        else:
            assert out.view(np.uint32).tolist() == want.view(np.uint32).tolist(), index
