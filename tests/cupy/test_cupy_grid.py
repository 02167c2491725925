"""Grid-wide barriers on the ``cupy`` backend, without a GPU (`vyre_cupy.grid`).

On the fake CUDA device (``fake_cupy.py``): the split path (one kernel per
segment, launched back to back on the dispatch's one stream) and the
cooperative path (one kernel synchronising the grid, run by the emulator's
cooperative launch: every lane of the grid a thread, workgroups taking turns
phase by phase) both come out byte-identical to the reference engine; the
co-residency decision is a pure function of occupancy numbers, taken once per
launch shape; ``cooperative=True`` is refused when the grid cannot be one
launch; spans carry the mode, the segment count and, on the split path, one
``vyre.segment`` phase per launch from device events. The nvcc build of every
cooperative and segment kernel is ``test_nvcc_compile``'s; the corpus's
cooperative kernels also run in the batch emulator (``test_emulation_corpus``).

What only a GPU proves (the real cooperative launch, CuPy's occupancy API, the
driver's ``cooperative_groups`` header through NVRTC) is in ``test_cupy_gpu``,
whose grid tests also run here on the fake device.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests.conformance.corpus import Case, cases
from tests.contract import test_contract as contract
from tests.cupy import test_cupy_gpu as gpu_tests
from tests.cupy.fake_cupy import FakeDevice
from vyre_async import (
    CooperativeResidencyExceeded,
    DiskPipelineCache,
    DispatchConfig,
    KernelCompileFailed,
    PendingDispatch,
    UnsupportedFeature,
    VyreBackend,
    split_at_grid_barriers,
)
from vyre_async._pending import DispatchCompleter
from vyre_async._shadow import compare_outputs
from vyre_async.ir.walk import ops_used
from vyre_async.programs import exclusive_scan, exclusive_scan_oracle
from vyre_cupy import create_backend
from vyre_cupy.codegen import generate
from vyre_cupy.grid import choose_mode, co_resident
from vyre_cupy.kernel import GridKernel
from vyre_reference import execute

#: The fake device's multiprocessors here: 4 x 32 blocks of 32 lanes = 128 workgroups
#: co-resident, so small exclusive scans cross the boundary.
SMS = 4

GRID_CASES = [c for c in cases() if c.error is None and "stmt.grid_barrier" in ops_used(c.program)]

# The GPU checks of grid barriers, on the fake device (their logic; a GPU proves CUDA).
test_gpu_grid_cooperative = gpu_tests.test_grid_barrier_programs_run_as_one_cooperative_launch
test_gpu_grid_split = gpu_tests.test_a_grid_too_large_to_be_co_resident_runs_split
# The driver contract's grid-barrier test, on a device with and one without cooperative launch.
test_contract_grid = pytest.mark.anyio(
    contract.test_a_grid_barrier_program_is_one_dispatch_and_cooperative_means_one_launch
)


@pytest.fixture(scope="module")
def backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    """A backend on a device with cooperative launch (and few SMs)."""
    fake.sm_count, fake.cooperative = SMS, True
    backend = create_backend(disk_cache=None)
    yield backend
    anyio.run(backend.shutdown)


@pytest.fixture(scope="module")
def split_backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    """A backend on a device without cooperative launch: grid-barrier programs always split."""
    fake.sm_count, fake.cooperative = SMS, False
    try:
        backend = create_backend(disk_cache=None)  # (the probe reads the attribute now)
    finally:
        fake.cooperative = True
    yield backend
    anyio.run(backend.shutdown)


@pytest.fixture(scope="module")
def gpu(backend: VyreBackend) -> VyreBackend:
    return backend


@pytest.fixture(params=["cooperative", "split"])
def vyre_backend(
    request: pytest.FixtureRequest, backend: VyreBackend, split_backend: VyreBackend
) -> VyreBackend:
    return backend if request.param == "cooperative" else split_backend


def _attributes(pending: PendingDispatch) -> dict[str, Any]:
    return dict(pending.record.attributes or {})


def _check(case: Case, outputs: list[np.ndarray]) -> None:
    """``outputs`` equal the case's expectation and the reference engine's, byte for byte."""
    reference = execute(
        case.program,
        list(case.inputs),
        grid_override=case.grid,
        fixpoint_iterations=case.fixpoint_iterations,
    )
    for want in (list(case.expected), reference):
        divergence = compare_outputs(case.name, case.program, case.inputs, outputs, want)
        assert divergence is None, str(divergence)
        for got, wanted in zip(outputs, want, strict=True):
            assert got.tobytes() == np.asarray(wanted).tobytes()


def _kernel_index(fake: FakeDevice, program: Any) -> int:
    return fake.kernels[generate(program, batch=False).source]


# The decision --------------------------------------------------------------------------
def test_co_residency_is_occupancy_times_multiprocessors() -> None:
    assert co_resident(128, 32, 4)
    assert not co_resident(129, 32, 4)
    assert co_resident(1, 1, 1) and not co_resident(2, 1, 1)
    assert co_resident(132 * 16, 16, 132) and not co_resident(132 * 16 + 1, 16, 132)
    assert not co_resident(1, 0, 132)  # the kernel fits no SM at all (too much shared memory)
    assert not co_resident(1, 32, 0)
    assert co_resident(0, 1, 1)  # an empty grid launches nothing


def test_the_mode_follows_segments_kernel_and_residency() -> None:
    fits = {"blocks": 128, "blocks_per_sm": 32, "sm_count": 4}
    assert choose_mode(segments=3, reason="", **fits) == (True, "")
    assert choose_mode(segments=1, reason="", **fits) == (False, "one_segment")
    assert choose_mode(segments=3, reason="no_cooperative_launch", **fits) == (
        False,
        "no_cooperative_launch",
    )
    assert choose_mode(segments=3, reason="", blocks=129, blocks_per_sm=32, sm_count=4) == (
        False,
        "not_co_resident",
    )
    assert choose_mode(segments=3, reason="", blocks=1, blocks_per_sm=None, sm_count=4) == (
        False,
        "occupancy_unknown",
    )


# The code ------------------------------------------------------------------------------
def test_the_cooperative_kernel_syncs_the_grid_and_rezeroes_shared_memory() -> None:
    for case in GRID_CASES:
        source = generate(case.program).source
        segments = split_at_grid_barriers(case.program)
        syncs = source.count("cooperative_groups::this_grid().sync();")
        assert syncs == len(segments) - 1, case.name  # empty phases need none
        assert ("#include <cooperative_groups.h>" in source) == (syncs > 0)
        lines = source.splitlines()
        for at, line in enumerate(lines):
            if "this_grid().sync()" not in line:
                continue
            assert lines[at - 1].strip() == "__threadfence();"
            if "__shared__" in source:  # zeroed again, then a block barrier, before any use
                block = lines[at + 1 : at + 8]
                assert block[0].strip() == "{" and "vy_i] = 0" in "\n".join(block)
                assert "__syncthreads();" in [text.strip() for text in block]
        for segment in segments:
            kernel = generate(segment, batch=False)
            assert not kernel.grid_sync and kernel.batch_entry is None
            assert "this_grid" not in kernel.source


def test_a_segment_declares_only_the_shared_arrays_it_uses() -> None:
    program = exclusive_scan(3000, workgroup=32)
    *up, down = split_at_grid_barriers(program)
    assert "__shared__" in generate(up[0]).source
    assert "__shared__" not in generate(down).source  # adds a block's total: no scratch


# The split path -------------------------------------------------------------------------
@pytest.mark.parametrize("case", GRID_CASES, ids=[c.name for c in GRID_CASES])
def test_split_runs_each_segment_on_one_stream_equal_to_the_reference(
    split_backend: VyreBackend, fake: FakeDevice, case: Case
) -> None:
    assert not split_backend.capabilities().grid_sync
    assert "stmt.grid_barrier" in split_backend.supported_ops()
    before = len(fake.launch_log)
    pending = split_backend.dispatch(case.program, case.inputs, case.config())
    _check(case, pending.result())
    launches = fake.launch_log[before:]
    segments = split_at_grid_barriers(case.program)
    iterations = case.fixpoint_iterations
    assert [index for index, *_ in launches] == [
        _kernel_index(fake, s) for s in segments
    ] * iterations
    assert not any(cooperative for *_, cooperative, _ in launches)
    assert len({stream for *_, stream in launches}) == 1  # stream order is the fence
    attributes = _attributes(pending)
    assert attributes["vyre.grid_sync"] == "split"
    assert attributes["vyre.segments"] == len(segments)
    assert attributes["vyre.grid_sync.reason"] == (
        "no_cooperative_launch" if len(segments) > 1 else "one_segment"
    )


def test_without_cooperative_launch_cooperative_true_is_refused(
    split_backend: VyreBackend,
) -> None:
    case = GRID_CASES[-1]
    with pytest.raises(UnsupportedFeature) as refused:
        split_backend.dispatch(case.program, case.inputs, DispatchConfig(cooperative=True))
    assert "Fix:" in str(refused.value)


def test_resident_buffers_pass_through_every_segment(split_backend: VyreBackend) -> None:
    case = next(c for c in GRID_CASES if c.name == "grid_barrier_many_phases")
    (start,) = case.inputs
    resident = split_backend.upload(start)
    outputs = split_backend.dispatch(case.program, [resident]).result()
    _check(case, outputs)
    # The READ_WRITE buffer itself holds the final state (written by the last segments).
    assert split_backend.download(resident).tobytes() == case.expected[0].tobytes()
    split_backend.free(resident)


# The cooperative path --------------------------------------------------------------------
@pytest.mark.parametrize("case", GRID_CASES, ids=[c.name for c in GRID_CASES])
def test_cooperative_is_one_launch_equal_to_the_reference(
    backend: VyreBackend, fake: FakeDevice, case: Case
) -> None:
    assert backend.capabilities().grid_sync
    before = len(fake.launch_log)
    pending = backend.dispatch(case.program, case.inputs, case.config())
    _check(case, pending.result())
    launches = fake.launch_log[before:]
    segments = split_at_grid_barriers(case.program)
    if len(segments) == 1:  # nothing to synchronise: one ordinary launch
        assert [(i, c) for i, _, _, c, _ in launches] == [(_kernel_index(fake, segments[0]), False)]
        assert _attributes(pending)["vyre.grid_sync.reason"] == "one_segment"
        return
    _, grid, block, _, _ = launches[0]
    if math.prod(grid) > SMS * fake.resident_per_sm(math.prod(block)):  # array_sum: 313
        assert [(i, c) for i, _, _, c, _ in launches] == [
            (_kernel_index(fake, s), False) for s in segments
        ]
        assert _attributes(pending)["vyre.grid_sync.reason"] == "not_co_resident"
        return
    assert [(i, c) for i, _, _, c, _ in launches] == [(_kernel_index(fake, case.program), True)]
    assert _attributes(pending)["vyre.grid_sync"] == "cooperative"
    assert "vyre.grid_sync.reason" not in _attributes(pending)


@pytest.mark.parametrize("blocks", [SMS * 32, SMS * 32 + 1])
def test_the_residency_boundary_decides_cooperative_or_split(
    backend: VyreBackend, fake: FakeDevice, blocks: int
) -> None:
    """A grid of exactly SMs x occupancy workgroups is one launch; one more splits."""
    program = exclusive_scan(32 * blocks, workgroup=32)
    x = np.random.default_rng(blocks).integers(0, 2**32, 32 * blocks, dtype=np.uint32)
    fits = blocks <= SMS * 32
    before = fake.cooperative_launches
    pending = backend.dispatch(program, [x])
    for got, want in zip(pending.result(), exclusive_scan_oracle(x, 32), strict=True):
        assert got.tobytes() == want.tobytes()
    assert fake.cooperative_launches == before + fits
    assert _attributes(pending)["vyre.grid_sync"] == ("cooperative" if fits else "split")
    if fits:
        assert backend.dispatch(program, [x], DispatchConfig(cooperative=True)).result()
        return
    assert _attributes(pending)["vyre.grid_sync.reason"] == "not_co_resident"
    with pytest.raises(CooperativeResidencyExceeded) as refused:
        backend.dispatch(program, [x], DispatchConfig(cooperative=True))
    message = str(refused.value)
    assert f"all {blocks} workgroups" in message and f"at most {SMS * 32}" in message
    assert "Fix:" in message and "drop DispatchConfig(cooperative=True)" in message


def test_residency_is_asked_once_per_launch_shape(fake: FakeDevice) -> None:
    case = next(c for c in GRID_CASES if c.name == "grid_barrier_cross_workgroup_reduction")
    fake.sm_count, fake.cooperative = SMS, True
    backend = create_backend(disk_cache=None)  # (its own pipelines: nothing planned yet)
    try:
        before = fake.occupancy_calls
        for _ in range(4):
            _check(case, backend.dispatch(case.program, case.inputs).result())
        assert fake.occupancy_calls == before + 1  # planned once; every dispatch reuses it
    finally:
        anyio.run(backend.shutdown)


# Spans ------------------------------------------------------------------------------------
def _segment_phases(pending: PendingDispatch) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    phases = pending.record.phases or []
    (launch,) = [(start, end) for name, start, end in phases if name == "vyre.launch"]
    return launch, [(start, end) for name, start, end in phases if name == "vyre.segment"]


def test_a_traced_split_dispatch_times_each_segment_from_device_events(
    split_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    case = next(c for c in GRID_CASES if c.name == "grid_barrier_many_phases")
    segments = len(split_at_grid_barriers(case.program))
    for iterations in (1, 2):
        config = dataclasses.replace(case.config(), fixpoint_iterations=iterations)
        pending = split_backend.dispatch(case.program, case.inputs, config)
        outputs = pending.result()
        reference = execute(case.program, list(case.inputs), fixpoint_iterations=iterations)
        assert [o.tobytes() for o in outputs] == [r.tobytes() for r in reference]
        launch, spans = _segment_phases(pending)
        assert len(spans) == segments * iterations  # one per launch, in order
        assert spans[0][0] == launch[0]
        assert all(start <= end for start, end in spans)
        assert all(end == start for (_, end), (start, _) in itertools.pairwise(spans))
        assert spans[-1][1] <= launch[1] + 1000  # (ns: each end rounded on its own)
        assert _attributes(pending)["vyre.segments"] == segments


def test_untraced_or_cooperative_dispatches_record_no_segment_times(
    backend: VyreBackend, split_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = next(c for c in GRID_CASES if c.name == "grid_barrier_many_phases")
    # (whether a span records a dispatch depends on telemetry other tests may have set up)
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: False))
    pending = split_backend.dispatch(case.program, case.inputs)
    _check(case, pending.result())
    assert not any(name == "vyre.segment" for name, _, _ in pending.record.phases or [])
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    pending = backend.dispatch(case.program, case.inputs)
    _check(case, pending.result())
    launch, spans = _segment_phases(pending)  # one launch: its time, no invented split
    assert spans == [] and launch[1] >= launch[0]
    assert _attributes(pending)["vyre.grid_sync"] == "cooperative"


# Batches, the disk cache, a cooperative kernel NVRTC rejects -----------------------------
def test_a_batch_of_grid_barrier_dispatches_runs_plain_and_says_why(backend: VyreBackend) -> None:
    case = next(c for c in GRID_CASES if c.name == "grid_barrier_cross_workgroup_reduction")
    pipeline = backend.compile(case.program)
    for mode in ("persistent", "command_reuse"):
        pendings = pipeline.dispatch_batch([list(case.inputs)] * 3, mode=mode)  # type: ignore[arg-type]
        for pending in pendings:
            _check(case, pending.result())
            attributes = _attributes(pending)
            assert attributes["vyre.batch.mode"] == "plain"
            assert attributes["vyre.batch.mode.reason"] == "grid_barrier"


@pytest.mark.anyio
async def test_the_disk_cache_keeps_every_kernel_of_a_grid_program(
    fake: FakeDevice, tmp_path: Path
) -> None:
    fake.sm_count, fake.cooperative = SMS, True
    case = next(c for c in GRID_CASES if c.name == "grid_barrier_workgroup_memory_is_zero_after")
    cache = DiskPipelineCache(tmp_path)
    first = create_backend(disk_cache=cache)
    before = fake.compiles
    _check(case, await first.dispatch(case.program, case.inputs, case.config()))
    segments = len(split_at_grid_barriers(case.program))
    assert fake.compiles == before + segments + 1  # the segments and the cooperative kernel
    second = create_backend(disk_cache=cache)  # like a new process
    pipeline = second.compile(case.program, case.config())
    assert pipeline.source == "disk" and fake.compiles == before + segments + 1
    native = pipeline.native
    assert isinstance(native, GridKernel) and native.cooperative is not None
    assert len(native.segments) == segments
    _check(case, await pipeline.dispatch(case.inputs, case.config()))
    third = create_backend(disk_cache=cache)  # a record it cannot use: warned, recompiled
    cache.put(pipeline.identity.hex, b"VYCG not a grid record")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rebuilt = third.compile(case.program, case.config())
    assert any("recompiling" in str(w.message) for w in caught)
    assert isinstance(rebuilt.native, GridKernel)
    assert fake.compiles == before + 2 * (segments + 1)
    for each in (first, second, third):
        await each.shutdown()


def test_a_cooperative_kernel_nvrtc_rejects_leaves_the_split_path(
    fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vyre_cupy.backend as cupy_backend

    compile_kernel = cupy_backend.compile_kernel

    def refuse_grid_sync(kernel: Any, **options: Any) -> Any:
        if kernel.grid_sync:
            raise KernelCompileFailed(
                "NVRTC rejected the generated CUDA kernel 'vyre_main':\n"
                'catastrophic error: cannot open source file "cooperative_groups.h"',
                fix="a fix",
            )
        return compile_kernel(kernel, **options)

    monkeypatch.setattr(cupy_backend, "compile_kernel", refuse_grid_sync)
    fake.sm_count, fake.cooperative = SMS, True
    backend = create_backend(disk_cache=None)
    try:
        case = next(c for c in GRID_CASES if c.name == "grid_barrier_many_phases")
        pending = backend.dispatch(case.program, case.inputs)
        _check(case, pending.result())
        attributes = _attributes(pending)
        assert attributes["vyre.grid_sync"] == "split"
        assert attributes["vyre.grid_sync.reason"] == "cooperative_kernel_failed"
        with pytest.raises(UnsupportedFeature) as refused:
            backend.dispatch(case.program, case.inputs, DispatchConfig(cooperative=True))
        assert "cooperative_groups.h" in str(refused.value) and "Fix:" in str(refused.value)
    finally:
        anyio.run(backend.shutdown)
