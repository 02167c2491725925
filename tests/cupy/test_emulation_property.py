"""Property test: random valid programs, compiled for sm_90 and run on the CPU emulator.

Each example draws a *batch* of random programs (`tests.strategies.programs`)
so one ``g++`` build and one ``nvcc`` build cover them all. Every program runs
twice in the emulator and on the numpy reference engine:

- on a single lane (workgroup and grid overridden to 1): no other lane can
  race, so the outputs must always agree;
- on its own workgroup shape over a small grid, with the emulator's race
  detector on: the lockstep reference and real threads agree exactly when no
  two lanes touch one word without a barrier between them, so race-free runs
  must agree and racy ones are counted, not compared.

Agreement is `compare_outputs`: bit for bit, NaN by position, 2 ULP on F32
outputs of programs with transcendental operations.
"""

from __future__ import annotations

import shutil
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.cupy.conftest import start_nvcc
from tests.cupy.emulator import NVCC, Request, build_emulator, request_for
from tests.strategies import programs, small_inputs_for
from vyre_async._shadow import compare_outputs
from vyre_async.errors import InvalidProgram
from vyre_async.ir import Program
from vyre_reference import execute

BATCH = 16
_SMALL_GRIDS = ((1, 1, 1), (2, 1, 1), (3, 1, 1), (2, 2, 1), (1, 2, 2))
_ONE = (1, 1, 1)


def _grid(data: st.DataObject, program: Program) -> tuple[int, int, int]:
    lanes = program.lanes_per_workgroup
    if lanes <= 16:
        return data.draw(st.sampled_from(_SMALL_GRIDS), label="grid")
    if lanes > 64:
        return _ONE
    return data.draw(st.sampled_from(_SMALL_GRIDS[:2]), label="grid")


def _reference(
    program: Program, inputs: list[Any], grid: tuple[int, int, int], workgroup: Any
) -> list[Any] | None:
    try:
        return execute(program, inputs, grid_override=grid, workgroup_override=workgroup)
    except InvalidProgram:
        return None


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_program_batches_match_the_reference(data: st.DataObject) -> None:
    batch = data.draw(st.lists(programs(), min_size=BATCH, max_size=BATCH), label="programs")
    build = build_emulator(batch)
    nvcc = start_nvcc(batch) if NVCC else None
    requests: list[Request] = []
    wanted: list[tuple[Program, list[Any], list[Any] | None, bool]] = []
    for k, program in enumerate(batch):
        inputs = data.draw(small_inputs_for(program), label=f"inputs{k}")
        grid = _grid(data, program)
        for workgroup, trace in ((_ONE, False), (None, True)):
            launch_grid = _ONE if workgroup else grid
            want = _reference(program, inputs, launch_grid, workgroup)
            if want is None:  # the reference refused the launch: planning must refuse too
                try:
                    request_for(k, program, inputs, grid=launch_grid, workgroup=workgroup)
                except InvalidProgram:
                    continue
                raise AssertionError("the launch plan accepted what the reference refused")
            requests.append(
                request_for(k, program, inputs, grid=launch_grid, workgroup=workgroup, trace=trace)
            )
            wanted.append((program, inputs, want, trace))
    try:
        results = build.wait().run(requests)
    finally:  # one-off batches: keep the temp-dir cache for the fixed kernel sets only
        build.discard()
    racy = 0
    for (program, inputs, want, traced), result in zip(wanted, results, strict=True):
        assert want is not None
        if result.racy:
            assert traced, "a single-lane launch cannot race"
            racy += 1
            continue
        divergence = compare_outputs("random", program, inputs, result.outputs, want)
        assert divergence is None, f"{divergence}\nprogram: {program!r}"
    event(f"racy multi-lane launches: {min(racy, 8) // 2 * 2}+ of {len(batch)}")
    if nvcc is not None:
        returncode, log = nvcc.wait()
        if returncode == 0:
            shutil.rmtree(nvcc.source.parent, ignore_errors=True)
        assert returncode == 0, f"nvcc rejected {nvcc.source}:\n{log[-8000:]}"
