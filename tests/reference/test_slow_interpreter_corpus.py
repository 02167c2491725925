"""The shipped conformance corpus on the slow interpreter, the oracle of the reference tests.

The differential tests compare the reference engine with the slow interpreter
(``slow_interpreter.run_slow``) on generated programs; this holds the
interpreter itself to the corpus's independently computed expected outputs,
case by case, so a corner the corpus gains (a rounding tie, a NaN operand, a
loop with no trip) is checked on both sides of those comparisons. Outputs are
compared as the contract suite compares a backend's (`vyre_async._shadow.compare_outputs`:
bit for bit, transcendentals within the case's ULP budget).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference.slow_interpreter import run_slow
from vyre_async._shadow import compare_outputs
from vyre_async.testing.corpus import Case, cases

CASES = [case for case in cases() if case.error is None]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_slow_interpreter_gives_every_expected_output(case: Case) -> None:
    got = run_slow(
        case.program,
        [array.copy() for array in case.inputs],
        grid_override=case.grid,
        fixpoint_iterations=case.fixpoint_iterations,
    )
    for out, want in zip(got, case.expected, strict=True):
        assert np.asarray(out).dtype == want.dtype and np.shape(out) == want.shape
    divergence = compare_outputs(
        case.name, case.program, case.inputs, got, case.expected, ulp_budget=case.ulp_budget
    )
    assert divergence is None, str(divergence)
