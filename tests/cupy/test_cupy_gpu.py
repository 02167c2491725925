"""The ``cupy`` backend on a real CUDA device (marked ``gpu``; skipped, with the reason, without).

These are the checks no CPU run can make: the corpus, the operator table (its
``*.const-rhs`` cases too: shift counts of 32 and more as literals, where PTX
clamps instead of masking) and random programs byte for byte against the
reference on the GPU; subnormals surviving NVRTC (CuPy's own compile cache
would force ``-ftz=true``); device event timing; resident buffers; the disk
cache in a fresh process; one completion thread for thousands of dispatches in
flight; grid-barrier programs as one cooperative launch, and split into one launch
per segment when their grid cannot be co-resident. ``test_cupy_fake_device`` and
``test_cupy_grid`` run most of them on the fake device, so their own logic is
tested without a GPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.corpus import cases
from tests.cupy.op_table import op_cases
from tests.cupy.unit_programs import unit_cases
from tests.strategies import programs, small_inputs_for
from vyre_async import (
    CooperativeResidencyExceeded,
    DispatchConfig,
    DType,
    InvalidProgram,
    UnsupportedFeature,
    VyreBackend,
    split_at_grid_barriers,
)
from vyre_async._shadow import compare_outputs
from vyre_cupy import create_backend
from vyre_reference import execute


def _cuda_unavailable() -> str | None:
    """Return why no CUDA device is usable here, or None (the narrow probe)."""
    try:
        import cupy
    except Exception as exc:
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return f"no usable CUDA driver ({type(exc).__name__}: {exc})"
    return None if count > 0 else "no CUDA device is visible"


REASON = _cuda_unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=str(REASON))]


@pytest.fixture(scope="module")
def gpu() -> VyreBackend:
    return create_backend(disk_cache=None)


def test_corpus_byte_for_byte(gpu: VyreBackend) -> None:
    for case in cases():
        if case.error is not None:
            with pytest.raises(case.error):
                gpu.dispatch_sync(case.program, case.inputs, case.config())
            continue
        outputs = gpu.dispatch_sync(case.program, case.inputs, case.config())
        divergence = compare_outputs(
            case.name, case.program, case.inputs, outputs, case.expected, ulp_budget=case.ulp_budget
        )
        assert divergence is None, str(divergence)


def test_every_operator_on_edge_values(gpu: VyreBackend) -> None:
    for case in op_cases() + unit_cases():
        outputs = gpu.dispatch_sync(case.program, list(case.inputs))
        want = execute(case.program, list(case.inputs))
        divergence = compare_outputs(case.name, case.program, case.inputs, outputs, want)
        assert divergence is None, str(divergence)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_programs_on_one_lane_match_the_reference(
    gpu: VyreBackend, data: st.DataObject
) -> None:
    # One lane: no other lane can race, so GPU and lockstep reference must agree exactly.
    program = data.draw(programs(), label="program")
    inputs = data.draw(small_inputs_for(program), label="inputs")
    config = DispatchConfig(grid_override=(1, 1, 1), workgroup_override=(1, 1, 1))
    want = execute(program, inputs, grid_override=(1, 1, 1), workgroup_override=(1, 1, 1))
    got = gpu.dispatch_sync(program, inputs, config)
    divergence = compare_outputs("random", program, inputs, got, want)
    assert divergence is None, f"{divergence}\n{program!r}"


def test_subnormals_survive(gpu: VyreBackend) -> None:
    from vyre_async.programs import saxpy

    tiny = np.array([1e-45, 1e-40, -3e-39], np.float32)
    alpha = np.array([0.5], np.float32)
    out = gpu.dispatch_sync(saxpy(3), [tiny, np.zeros(3, np.float32), alpha])[0]
    assert out.tobytes() == (np.float32(0.5) * tiny).tobytes()
    assert (out != 0).any()


def test_device_timing_phases_and_one_completion_thread(
    gpu: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vyre_async._pending import DispatchCompleter
    from vyre_async.programs import elementwise_xor

    # Phases are taken for dispatches a span shows them on: as if one did.
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))

    program = elementwise_xor(4096)
    a = np.arange(4096, dtype=np.uint32)
    pendings = [gpu.dispatch(program, [a, np.full(4096, k, np.uint32)]) for k in range(2000)]
    names = [t.name for t in threading.enumerate()]
    assert names.count("vyre-cupy-completion") == 1
    for k, pending in enumerate(pendings):
        assert np.array_equal(pending.result()[0], a ^ k)
    timing = pendings[-1].timing
    assert timing is not None and timing.device_s is not None and timing.device_s > 0
    phases = [name for name, _, _ in pendings[-1].record.phases]
    assert phases[-3:] == ["vyre.upload", "vyre.launch", "vyre.readback"]


def test_resident_buffers(gpu: VyreBackend) -> None:
    from tests.cupy.device_programs import accumulate

    x = gpu.upload(np.arange(1 << 16, dtype=np.uint32))
    acc = gpu.alloc(DType.U32, 1 << 16)
    pendings = [gpu.dispatch(accumulate(), [x, acc]) for _ in range(10)]
    for pending in pendings:
        pending.result()
    assert gpu.download(acc).tolist() == [30 * i for i in range(1 << 16)]
    both = gpu.upload(np.arange(256, dtype=np.uint32))
    assert gpu.dispatch_sync(accumulate(), [both, both])[0].tolist() == [4 * i for i in range(256)]
    for buffer in (x, acc, both):
        gpu.free(buffer)
    with pytest.raises(InvalidProgram):
        gpu.download(acc)


def test_limits_are_checked_before_launch(gpu: VyreBackend) -> None:
    from vyre_async.programs import elementwise_xor

    a = np.zeros(4, np.uint32)
    with pytest.raises(UnsupportedFeature):
        gpu.dispatch(elementwise_xor(4), [a, a], DispatchConfig(grid_override=(1, 1 << 17, 1)))


def test_disk_cache_skips_nvrtc_in_a_fresh_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, sys, time
        import numpy as np
        from vyre_async import DiskPipelineCache, DispatchConfig
        from vyre_async.programs import standard_workloads
        from vyre_cupy import create_backend
        backend = create_backend(disk_cache=DiskPipelineCache(sys.argv[1]))
        w = next(w for w in standard_workloads() if w.name == "matmul")
        start = time.perf_counter()
        pipeline = backend.compile(w.program)
        took = time.perf_counter() - start
        inputs = w.inputs(1)
        out = pipeline.dispatch(inputs, DispatchConfig(grid_override=w.grid)).result()
        ok = all(a.tobytes() == b.tobytes() for a, b in zip(out, w.expected(inputs)))
        print(json.dumps({"source": pipeline.source, "seconds": took, "ok": ok}))
        """
    )
    env = dict(os.environ)
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["source"] == "compiled" and runs[1]["source"] == "disk"
    assert runs[0]["ok"] and runs[1]["ok"]


@pytest.mark.parametrize("mode", ["persistent", "command_reuse"])
def test_corpus_batched_as_one_persistent_launch_or_graph_replays(
    gpu: VyreBackend, mode: str
) -> None:
    """Every corpus case, 3 input sets per batch, equals the reference item by item."""
    from tests.cupy.test_cupy_batch import check_corpus_batched

    check_corpus_batched(gpu, mode)


def test_large_persistent_batch_loops_its_blocks_over_every_task(gpu: VyreBackend) -> None:
    """More tasks than the device holds at once: the persistent blocks loop in place."""
    from vyre_async.programs import elementwise_xor

    pipeline = gpu.compile(elementwise_xor(1 << 16))
    rng = np.random.default_rng(3)
    batch = [
        [rng.integers(0, 2**32, 1 << 16, dtype=np.uint32) for _ in range(2)] for _ in range(64)
    ]
    for mode in ("persistent", "command_reuse"):
        pendings = pipeline.dispatch_batch(batch, mode=mode)
        for (a, b), pending in zip(batch, pendings, strict=True):
            np.testing.assert_array_equal(pending.result()[0], a ^ b)
            assert pending.record.attributes["vyre.batch.mode"] == mode


def test_done_callbacks_and_shadow_comparisons_on_the_callback_thread(gpu: VyreBackend) -> None:
    """Done-callbacks of 512 GPU dispatches run once each on ``vyre-callbacks``;
    a callback may wait on the GPU itself; a shadow comparing every dispatch with the
    reference finds no divergence."""
    import anyio

    from vyre_async import ShadowBackend
    from vyre_async._pending import PendingDispatch, wait_for_callbacks
    from vyre_async.programs import elementwise_xor
    from vyre_reference import reference_backend

    program = elementwise_xor(1024)
    rng = np.random.default_rng(11)
    seen: list[tuple[int, str, bool]] = []
    nested: list[bool] = []
    all_ran = threading.Event()

    def record(index: int, a: np.ndarray, b: np.ndarray) -> Callable[[PendingDispatch], None]:
        def callback(pending: PendingDispatch) -> None:
            out = pending.result()[0]
            if index == 0:  # a callback may wait on its own backend
                again = gpu.dispatch_sync(program, [a, b])[0]
                nested.append(bool((again == a ^ b).all()))
            seen.append((index, threading.current_thread().name, bool((out == a ^ b).all())))
            if len(seen) == 512:
                all_ran.set()

        return callback

    pendings = []
    for index in range(512):
        a, b = (rng.integers(0, 2**32, 1024, dtype=np.uint32) for _ in range(2))
        pending = gpu.dispatch(program, [a, b])
        pending.add_done_callback(record(index, a, b))
        pendings.append(pending)
    assert all_ran.wait(timeout=60.0), f"{len(seen)} of 512 callbacks ran"
    assert wait_for_callbacks(timeout=60.0)
    assert sorted(i for i, _, _ in seen) == list(range(512))  # each once, any order
    assert all(ok and name == "vyre-callbacks" for _, name, ok in seen)
    assert nested == [True]

    shadow = ShadowBackend(gpu, reference_backend(), sample_rate=1.0, seed=1)

    async def main() -> None:
        for _ in range(64):
            a, b = (rng.integers(0, 2**32, 1024, dtype=np.uint32) for _ in range(2))
            (out,) = await shadow.dispatch(program, [a, b])
            np.testing.assert_array_equal(out, a ^ b)
        await shadow.flush()

    anyio.run(main)
    assert shadow.executor.stats.compared == 64 and shadow.executor.stats.divergences == 0


# Grid-wide barriers ------------------------------------------------------------------------
# Also run on the fake device by test_cupy_grid (their logic); only a GPU proves the
# cooperative launch itself (cooperative_groups::this_grid().sync() across resident blocks,
# the occupancy API of the real CuPy, cudaLaunchCooperativeKernel).


def _grid_cases() -> list[Any]:
    from vyre_async.ir.walk import ops_used

    return [c for c in cases() if c.error is None and "stmt.grid_barrier" in ops_used(c.program)]


def test_grid_barrier_programs_run_as_one_cooperative_launch(gpu: VyreBackend) -> None:
    """Every grid-barrier case of the corpus, with ``cooperative=True``, equals the reference.

    A device with cooperative launch claims ``grid_sync``; a small grid is co-resident, so
    each program with two or more phases runs as ONE cooperative launch. A grid the
    device cannot hold at once (more than 2 workgroups per SM: only on a small device,
    such as the fake one's 4 SMs) is refused with `CooperativeResidencyExceeded` and
    then runs split.
    """
    assert gpu.capabilities().grid_sync, "this GPU reports no cooperative launch"
    sms = gpu.executor.device_context.info.attribute("MultiProcessorCount", 1)  # type: ignore[attr-defined]
    grid_cases = _grid_cases()
    assert len(grid_cases) >= 4
    cooperative = 0
    for case in grid_cases:
        config = dataclasses.replace(case.config(), cooperative=True)
        try:
            pending = gpu.dispatch(case.program, case.inputs, config)
        except CooperativeResidencyExceeded as exc:
            blocks = int(str(exc).split("needs all ", 1)[1].split()[0])
            assert blocks > 2 * sms, f"{case.name}: {blocks} workgroups refused on {sms} SMs"
            pending = gpu.dispatch(case.program, case.inputs, case.config())
            assert dict(pending.record.attributes or {})["vyre.grid_sync"] == "split"
        outputs = pending.result()
        reference = execute(
            case.program,
            list(case.inputs),
            grid_override=case.grid,
            fixpoint_iterations=case.fixpoint_iterations,
        )
        for want in (list(case.expected), reference):
            divergence = compare_outputs(case.name, case.program, case.inputs, outputs, want)
            assert divergence is None, str(divergence)
        attributes = dict(pending.record.attributes or {})
        segments = attributes["vyre.segments"]
        assert segments == len(split_at_grid_barriers(case.program))
        if segments == 1:
            assert attributes["vyre.grid_sync"] == "split"
        cooperative += attributes["vyre.grid_sync"] == "cooperative"
    assert cooperative >= 3


def test_a_grid_too_large_to_be_co_resident_runs_split(
    gpu: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More workgroups than the device holds at once: one launch per segment, on one stream.

    No SM holds more than 32 blocks, so ``32 * SMs + 1`` workgroups are never co-resident.
    The result equals the numpy oracle; the span has one ``vyre.segment`` phase per
    segment, in order, inside its ``vyre.launch`` phase; ``cooperative=True`` is refused
    with `CooperativeResidencyExceeded`.
    """
    from vyre_async._pending import DispatchCompleter
    from vyre_async.programs import exclusive_scan, exclusive_scan_oracle

    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    info = gpu.executor.device_context.info  # type: ignore[attr-defined]
    workgroup = 32
    n = workgroup * (32 * info.attribute("MultiProcessorCount", 1) + 1)
    program = exclusive_scan(n, workgroup=workgroup)
    x = np.random.default_rng(5).integers(0, 2**32, n, dtype=np.uint32)
    pending = gpu.dispatch(program, [x])
    outputs = pending.result()
    for got, want in zip(outputs, exclusive_scan_oracle(x, workgroup), strict=True):
        assert got.tobytes() == np.asarray(want).tobytes()
    attributes = dict(pending.record.attributes or {})
    segments = len(split_at_grid_barriers(program))
    assert attributes["vyre.segments"] == segments > 1
    assert attributes["vyre.grid_sync"] == "split"
    assert attributes["vyre.grid_sync.reason"] == "not_co_resident"
    phases = pending.record.phases or []
    (launch,) = [(s, e) for name, s, e in phases if name == "vyre.launch"]
    spans = [(s, e) for name, s, e in phases if name == "vyre.segment"]
    assert len(spans) == segments
    slack = 1000  # ns: rounding, and the first event sits just after the launch's own
    assert launch[0] <= spans[0][0] <= launch[0] + slack
    assert all(start <= end for start, end in spans)
    assert all(end == start for (_, end), (start, _) in itertools.pairwise(spans))
    assert spans[-1][1] <= launch[1] + slack
    with pytest.raises(CooperativeResidencyExceeded) as refused:
        gpu.dispatch(program, [x], DispatchConfig(cooperative=True))
    assert "Fix:" in str(refused.value) and "cooperative=True" in str(refused.value)
