"""The generated CUDA kernels of the whole conformance corpus, run on the CPU emulator.

Every case must come out byte-identical to its independent expectation (NaN
by position; the transcendental case within its ULP budget) and to the numpy
reference engine. The operator table runs every operator, unary op, cast and
Fma on the cross product of edge values against the reference.
"""

from __future__ import annotations

import pytest

from tests.conformance.corpus import cases
from tests.cupy.conftest import Toolchain
from tests.cupy.emulator import request_for
from vyre_async._shadow import compare_outputs
from vyre_async.errors import InvalidProgram
from vyre_reference import execute


def test_every_corpus_case_is_byte_identical(toolchain: Toolchain) -> None:
    emulator = toolchain.corpus_build.wait()
    requests = [
        request_for(i, c.program, c.inputs, grid=c.grid, iterations=c.fixpoint_iterations)
        for i, c in enumerate(toolchain.corpus)
    ]
    results = emulator.run(requests)
    assert len(results) == len(toolchain.corpus) >= 40
    for case, result in zip(toolchain.corpus, results, strict=True):
        expected = compare_outputs(
            case.name,
            case.program,
            case.inputs,
            result.outputs,
            list(case.expected),
            ulp_budget=case.ulp_budget,
        )
        assert expected is None, str(expected)
        reference = execute(
            case.program,
            list(case.inputs),
            grid_override=case.grid,
            fixpoint_iterations=case.fixpoint_iterations,
        )
        agreed = compare_outputs(
            case.name, case.program, case.inputs, result.outputs, reference, ulp_budget=2
        )
        assert agreed is None, str(agreed)
        for got, want in zip(result.outputs, case.expected, strict=True):
            assert got.dtype == want.dtype


def test_error_cases_fail_at_planning_as_the_backend_would() -> None:
    errors = [c for c in cases() if c.error is not None]
    assert errors
    for case in errors:
        with pytest.raises(case.error) as info:  # type: ignore[arg-type]
            request_for(0, case.program, case.inputs, grid=case.grid)
        assert isinstance(info.value, InvalidProgram)
        assert "Fix:" in str(info.value)


def test_every_operator_on_edge_values_matches_the_reference(toolchain: Toolchain) -> None:
    emulator = toolchain.ops_build.wait()
    results = emulator.run(
        [request_for(i, o.program, o.inputs) for i, o in enumerate(toolchain.ops)]
    )
    lanes = 0
    for op, result in zip(toolchain.ops, results, strict=True):
        want = execute(op.program, list(op.inputs))
        divergence = compare_outputs(op.name, op.program, op.inputs, result.outputs, want)
        assert divergence is None, str(divergence)
        lanes += op.inputs[0].size if op.inputs else 0
    assert len(toolchain.ops) >= 90 and lanes > 30_000
