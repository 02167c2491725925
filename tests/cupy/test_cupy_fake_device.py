"""The cupy backend (`CupyExecutor`) end to end on a fake CUDA device (``fake_cupy.py``), no GPU.

The backend runs unchanged — probe, codegen, "NVRTC", module loading, stream
pool, pinned staging, arena upload/memset/launch/readback, event timing,
resident buffers, the completion bridge, error translation, the disk cache —
against a fake ``cupy`` whose streams are worker threads and whose kernels run
in the CPU emulator. The driver's own contract tests (``tests/contract``) run
here unchanged against it.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from opentelemetry import trace

import vyre_cupy.launch as cuda_launch
from tests import otel_sdk
from tests.contract import test_contract as contract
from tests.cupy import test_cupy_gpu as gpu_tests
from tests.cupy.conftest import Toolchain, installed
from tests.cupy.device_programs import accumulate, gate
from tests.cupy.fake_cupy import FakeDevice
from vyre_async import (
    Access,
    BackendClosed,
    DeviceLost,
    DeviceOutOfMemory,
    DiskPipelineCache,
    DispatchConfig,
    DispatchTimeout,
    DType,
    InvalidProgram,
    ResidentBuffer,
    UnsupportedFeature,
    VyreBackend,
    telemetry,
)
from vyre_async._cache.disk import PipelineCacheWarning
from vyre_async._pending import DispatchCompleter, PendingDispatch
from vyre_async.programs import elementwise_xor, standard_workloads
from vyre_cupy import create_backend
from vyre_cupy.layout import Source, plan_layout

pytestmark = pytest.mark.anyio

# The driver's contract tests, unchanged, with `backend` bound to the fake-device backend below.
test_corpus_byte_for_byte = contract.test_corpus_byte_for_byte
test_errors_before_launch_carry_a_fix = contract.test_errors_before_launch_carry_a_fix
test_a_result_is_taken_once = contract.test_a_result_is_taken_once
test_dispatches_settle_as_soon_as_their_work_ends = (
    contract.test_dispatches_settle_as_soon_as_their_work_ends
)
test_done_callbacks_run_once_on_the_callback_thread = (
    contract.test_done_callbacks_run_once_on_the_callback_thread
)
test_outputs_belong_to_the_caller = contract.test_outputs_belong_to_the_caller
test_the_reported_workgroup_limits_are_honoured = (
    contract.test_the_reported_workgroup_limits_are_honoured
)
test_many_dispatches_in_flight_complete_correctly = (
    contract.test_many_dispatches_in_flight_complete_correctly
)
test_timeout_raises_promptly_and_the_backend_recovers = (
    contract.test_timeout_raises_promptly_and_the_backend_recovers
)
test_dispatch_returns_before_the_work_ends = contract.test_dispatch_returns_before_the_work_ends
test_claimed_concurrency_is_real = contract.test_claimed_concurrency_is_real
# Not contract.test_closing_ends_a_dispatch_that_would_run_for_hours: it closes the backend
# the module shares, and its runaway kernels would keep the emulator busy for seconds each;
# test_closing_gives_up_on_a_kernel_it_cannot_stop below holds a kernel with a flag instead.
# Not contract.test_cancelling_waiters_leaves_everything_else_intact: it assumes a
# spin(200_000) dispatch outlasts the dispatching of 200 tasks, which a fast device (this
# fake one, or a GPU) does not, so some victims finish before they are cancelled. The
# variant below checks the same guarantees without that timing assumption.
test_load_10000_dispatches_from_200_tasks = contract.test_load_10000_dispatches_from_200_tasks
test_dispatches_sharing_a_resident_buffer_take_effect_in_submission_order = (
    contract.test_dispatches_sharing_a_resident_buffer_take_effect_in_submission_order
)
test_a_timed_out_dispatch_keeps_the_order_of_those_behind_it = (
    contract.test_a_timed_out_dispatch_keeps_the_order_of_those_behind_it
)

# The GPU tests whose programs are known in advance, on the fake device (checks their logic;
# the random-program and fresh-process tests need a real GPU).
test_gpu_corpus = gpu_tests.test_corpus_byte_for_byte
test_gpu_every_operator_on_edge_values = gpu_tests.test_every_operator_on_edge_values
test_gpu_subnormals_survive = gpu_tests.test_subnormals_survive
test_gpu_timing_and_one_completion_thread = (
    gpu_tests.test_device_timing_phases_and_one_completion_thread
)
test_gpu_resident_buffers = gpu_tests.test_resident_buffers
test_gpu_limits = gpu_tests.test_limits_are_checked_before_launch
test_gpu_callbacks_and_shadow = (
    gpu_tests.test_done_callbacks_and_shadow_comparisons_on_the_callback_thread
)


@pytest.fixture(scope="module")
def backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    backend = create_backend(disk_cache=None)
    yield backend
    anyio.run(backend.shutdown)


@pytest.fixture
def vyre_backend(backend: VyreBackend) -> VyreBackend:
    """The contract tests below (shared with `vyre_async.testing`) run on the fake device."""
    return backend


@pytest.fixture(scope="module")
def gpu(backend: VyreBackend) -> VyreBackend:
    """The fake-device backend, under the name the GPU tests use."""
    return backend


@pytest.fixture
def fresh_device(toolchain: Toolchain, fake: FakeDevice) -> Iterator[FakeDevice]:
    """A second fake device (for fault injection that poisons its context)."""
    with installed(toolchain) as device:
        yield device


def test_probe_and_capabilities(backend: VyreBackend) -> None:
    caps = backend.capabilities()
    assert caps.device_name == "Emulated sm_90 (CPU)"
    assert caps.async_compute and not caps.subgroup_ops
    assert caps.grid_sync  # the fake device reports CooperativeLaunch (test_cupy_grid)
    assert "stmt.grid_barrier" in backend.supported_ops()
    assert caps.max_workgroup_size == (1024, 1024, 64) and caps.max_workgroup_lanes == 1024
    assert caps.max_workgroup_memory_bytes == 48 * 1024 and caps.subgroup_size == 32
    assert "sm_90" in backend.device_fingerprint() and "cupy 13.6.0+fake" in (
        backend.device_fingerprint()
    )
    assert "-ftz=false" in backend.compiler_fingerprint()
    assert "-arch=sm_90" in backend.compiler_fingerprint()


@pytest.mark.anyio
async def test_outputs_are_private_arrays_with_device_timing_and_phases(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = elementwise_xor(100)
    a = np.arange(100, dtype=np.uint32)
    enabled = telemetry.is_enabled()
    telemetry.set_enabled(False)  # (another test may have installed an SDK)
    try:
        untraced = backend.dispatch(program, [a, a * 3])  # no span: no phase bookkeeping
        await untraced
    finally:
        telemetry.set_enabled(enabled)
    assert untraced.record.phases is None
    assert untraced.timing is not None and untraced.timing.device_s is not None
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    pending = backend.dispatch(program, [a, a * 3])
    outputs = await pending
    assert outputs[0].tolist() == (a ^ (a * 3)).tolist()
    assert outputs[0].flags.owndata and outputs[0].flags.writeable
    assert pending.timing is not None and pending.timing.device_s is not None
    phases = [name for name, _, _ in pending.record.phases]
    assert phases[-3:] == ["vyre.upload", "vyre.launch", "vyre.readback"]
    assert all(start <= end for _, start, end in pending.record.phases)
    assert "vyre.stream" in pending.record.attributes


@pytest.mark.anyio
async def test_one_completion_thread_for_many_dispatches(backend: VyreBackend) -> None:
    program = elementwise_xor(64)
    a = np.arange(64, dtype=np.uint32)
    pendings = [backend.dispatch(program, [a, np.full(64, k, np.uint32)]) for k in range(300)]
    names = {t.name for t in threading.enumerate()}
    assert sum(n.startswith("vyre-cupy-completion") for n in names) == 1
    for k, pending in enumerate(pendings):
        assert (await pending)[0].tolist() == (a ^ k).tolist()
    assert max(backend.executor.device_context.streams.busy()) == 0
    assert (
        backend.executor.device_context.streams.created()
        <= backend.executor.device_context.streams.size
    )


@pytest.mark.anyio
async def test_resident_buffers(backend: VyreBackend) -> None:
    program = accumulate()
    x = backend.upload(np.arange(256, dtype=np.uint32), label="x")
    acc = backend.alloc(DType.U32, 256, label="acc")
    for _ in range(3):  # each dispatch waits for the previous write of acc (stream ordering)
        outputs = await backend.dispatch(program, [x, acc])
    assert outputs[0].tolist() == [9 * i for i in range(256)]
    assert backend.download(acc).tolist() == [9 * i for i in range(256)]
    # Chained without awaiting: writes to a resident buffer stay ordered across streams.
    pendings = [backend.dispatch(program, [x, acc]) for _ in range(8)]
    for pending in pendings:
        await pending
    assert backend.download(acc).tolist() == [33 * i for i in range(256)]
    # The same buffer as READ input and READ_WRITE input: each slot starts from the same
    # contents, then the READ_WRITE result is written back (as on the reference backend).
    both = backend.upload(np.arange(256, dtype=np.uint32))
    outputs = await backend.dispatch(program, [both, both])
    assert outputs[0].tolist() == [4 * i for i in range(256)]
    assert backend.download(both).tolist() == [4 * i for i in range(256)]
    floats = backend.upload(np.zeros(4, np.float32))
    with pytest.raises(InvalidProgram):
        backend.dispatch(program, [floats, acc])
    assert backend.upload(b"\x01\x00\x00\x00").count == 1
    pending = backend.dispatch(program, [x, acc])
    backend.free(acc)  # in-flight work keeps the memory alive
    await pending
    with pytest.raises(InvalidProgram):
        backend.download(acc)
    with pytest.raises(InvalidProgram):
        backend.free(acc)
    for buffer in (x, both, floats):
        backend.free(buffer)


@pytest.mark.anyio
async def test_device_out_of_memory_surfaces_at_the_result(
    backend: VyreBackend, fake: FakeDevice
) -> None:
    program = elementwise_xor(1 << 16)
    a = np.zeros(1 << 16, np.uint32)
    limit, fake.memory_limit = fake.memory_limit, fake.allocated + 1024
    try:
        with pytest.raises(DeviceOutOfMemory) as info:
            await backend.dispatch(program, [a, a])
        assert "Fix:" in str(info.value)
        with pytest.raises(DeviceOutOfMemory):
            backend.alloc(DType.U32, 1 << 20)
    finally:
        fake.memory_limit = limit
    assert (await backend.dispatch(program, [a, a + 1]))[0][0] == 1


def test_a_resident_buffer_updated_in_place_needs_no_copy_of_it(
    backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A READ_WRITE resident buffer passed once is bound in place, not copied into the arena:
    the dispatch runs on a device with far less memory left than the buffer's size."""
    n = 1 << 16  # 256 KiB per buffer
    x = backend.upload(np.arange(n, dtype=np.uint32))
    acc = backend.alloc(DType.U32, n)
    try:
        gc.collect()
        monkeypatch.setattr(fake, "memory_limit", fake.allocated + (16 << 10))
        outputs = backend.dispatch_sync(accumulate(), [x, acc])
        want = [3 * i for i in range(n)]
        assert outputs[0].tolist() == want
        assert backend.download(acc).tolist() == want
    finally:
        backend.free(x)
        backend.free(acc)


def test_corpus_with_every_input_resident_equals_the_expected_outputs(
    backend: VyreBackend,
) -> None:
    """Every (non-bool) input uploaded first: READ inputs bound in place, READ_WRITE ones
    written in place (and read back from there), WRITE outputs still start at zero."""
    from tests.conformance.corpus import cases
    from vyre_async._shadow import compare_outputs

    ran = 0
    for case in cases():
        if case.error is not None or not case.inputs:
            continue
        decls = [d for d in case.program.buffers if d.access.is_input]
        inputs = [  # (a bool buffer takes host data only)
            a if d.dtype is DType.BOOL else backend.upload(np.asarray(a))
            for d, a in zip(decls, case.inputs, strict=True)
        ]
        try:
            outputs = backend.dispatch_sync(case.program, inputs, case.config())
        finally:
            for item in inputs:
                if not isinstance(item, np.ndarray):
                    backend.free(item)
        divergence = compare_outputs(
            case.name,
            case.program,
            list(case.inputs),
            outputs,
            list(case.expected),
            ulp_budget=case.ulp_budget,
        )
        assert divergence is None, str(divergence)
        ran += 1
    assert ran >= 30


def test_device_limits_are_checked_before_launch(backend: VyreBackend) -> None:
    program = elementwise_xor(4)
    a = np.zeros(4, np.uint32)
    with pytest.raises(UnsupportedFeature) as info:
        backend.dispatch(program, [a, a], DispatchConfig(grid_override=(1, 70000, 1)))
    assert "grid" in str(info.value) and "Fix:" in str(info.value)
    # The executor reports the device's grid limit; the driver's front end refuses a wider grid.
    assert backend.capabilities().max_grid_size == (2**31 - 1, 65535, 65535)
    assert info.value.feature == "grid size" and "'cupy'" in str(info.value)


@pytest.mark.anyio
async def test_a_sticky_error_loses_the_device(fresh_device: FakeDevice) -> None:
    backend = create_backend(disk_cache=None)
    program = elementwise_xor(8)
    a = np.ones(8, np.uint32)
    assert (await backend.dispatch(program, [a, a]))[0].tolist() == [0] * 8
    fresh_device.fail_next_launch = True
    with pytest.raises(DeviceLost) as info:
        await backend.dispatch(program, [a, a])
    assert info.value.cuda_status == 700 and "Fix:" in str(info.value)
    assert backend.device_lost()
    with pytest.raises(DeviceLost):
        backend.dispatch(program, [a, a])
    await backend.shutdown()


def test_a_resident_upload_that_fails_on_the_device_is_logged_and_loses_it(
    fresh_device: FakeDevice, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An upload into a resident buffer ends after `upload` returned: nobody waits on it, so a
    device error it meets is logged (what failed, while doing what), and the device is lost."""
    backend = create_backend(disk_cache=None, prefetch=False)
    try:
        with caplog.at_level(logging.ERROR, logger="vyre_async.cupy"):
            backend.upload(np.arange(8, dtype=np.uint32))
            anyio.run(backend.flush)
            assert not caplog.records  # an upload that worked logs nothing
            runtime = backend.executor.device_context.runtime
            memcpy = runtime.memcpyAsync
            reached, gate = threading.Event(), threading.Event()

            def hold() -> None:
                reached.set()
                gate.wait()

            def held(dst: int, src: int, size: int, kind: int, stream: int) -> None:
                fresh_device.streams[stream].enqueue(hold)  # the copy waits for the gate
                memcpy(dst, src, size, kind, stream)

            monkeypatch.setattr(runtime, "memcpyAsync", held)
            backend.upload(np.arange(8, dtype=np.uint32))
            assert reached.wait(30)
            fresh_device.sticky = 700  # cudaErrorIllegalAddress: the context is gone
            gate.set()
            anyio.run(backend.flush)
        (message,) = [r.getMessage() for r in caplog.records if r.filename == "launch.py"]
        assert message.startswith("resident buffer copy failed: ")
        assert "while copying a resident buffer" in message and "no longer usable" in message
        assert backend.device_lost()
    finally:
        anyio.run(backend.shutdown)


@pytest.mark.anyio
async def test_disk_cache_lets_a_new_backend_skip_nvrtc(fake: FakeDevice, tmp_path: Path) -> None:
    workload = next(w for w in standard_workloads() if w.name == "sum")
    inputs = workload.inputs(3)
    expected = workload.expected(inputs)
    cache = DiskPipelineCache(tmp_path)
    first = create_backend(disk_cache=cache)
    before = fake.compiles
    out = await first.dispatch(
        workload.program, inputs, DispatchConfig(grid_override=workload.grid)
    )
    assert fake.compiles == before + 1 and cache.info().entries == 1
    second = create_backend(disk_cache=cache)  # like a new process: an empty memory cache
    pipeline = second.compile(workload.program)
    assert pipeline.source == "disk" and fake.compiles == before + 1
    again = await pipeline.dispatch(inputs, DispatchConfig(grid_override=workload.grid))
    for got, want in zip((out[0], again[0]), expected * 2, strict=False):
        assert got.tobytes() == want.tobytes()
    # A corrupt record in a valid cache entry is ignored with a warning and recompiled.
    third = create_backend(disk_cache=cache)
    cache.put(pipeline.identity.hex, b"not a kernel record")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rebuilt = third.compile(workload.program)
    assert any("recompiling" in str(w.message) for w in caught)
    assert not any(issubclass(w.category, PipelineCacheWarning) for w in caught)
    assert rebuilt.native.compiled.entry == "vyre_main" and fake.compiles == before + 2
    for backend in (first, second, third):
        await backend.shutdown()


@pytest.mark.anyio
async def test_shutdown_finishes_work_and_refuses_more(fake: FakeDevice) -> None:
    backend = create_backend(disk_cache=None)
    program = elementwise_xor(64)
    a = np.arange(64, dtype=np.uint32)
    pendings = [backend.dispatch(program, [a, a]) for _ in range(20)]
    await backend.shutdown()
    assert all(p.done() for p in pendings)
    assert not backend.executor.device_context.bridge.running
    with pytest.raises(BackendClosed):
        backend.dispatch(program, [a, a])


async def test_cancelling_waiters_releases_everything(backend: VyreBackend) -> None:
    spin, xor = contract.spin(), elementwise_xor(256)
    flag = backend.upload(np.zeros(1, np.uint32))
    await anyio.to_thread.run_sync(backend.download, flag)  # the upload finished
    warm = [backend.dispatch(spin, [np.array([5000], np.uint32)]) for _ in range(8)]
    for pending in warm:
        await pending
    await backend.flush()
    threads_before = _threads()
    cancelled = survivors_ok = 0
    scopes: list[anyio.CancelScope] = []
    rng = np.random.default_rng(7)

    async def victim() -> None:
        nonlocal cancelled
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await backend.dispatch(gate(), [flag], DispatchConfig(timeout=10.0))
        cancelled += int(scope.cancelled_caught)

    async def survivor() -> None:
        nonlocal survivors_ok
        a = rng.integers(0, 2**32, 256, dtype=np.uint32)
        b = rng.integers(0, 2**32, 256, dtype=np.uint32)
        outputs = await backend.dispatch(xor, [a, b])
        survivors_ok += int(np.array_equal(outputs[0], a ^ b))

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(victim if i % 2 == 0 else survivor)
        with anyio.fail_after(30):  # every victim awaits its gated dispatch (a loaded
            while len(scopes) < 100:  # machine may need more than one loop turn)
                await anyio.lowlevel.checkpoint()
        for scope in scopes:
            scope.cancel()
        # The victims' kernels are still spinning (the gate is shut): open it, so they end
        # and the survivors queued behind them on the same streams run.
        ctypes.memmove(flag.native(backend.executor).ptr, np.ones(1, np.uint32).ctypes.data, 4)
    assert len(scopes) == 100 and cancelled == 100
    assert survivors_ok == 100
    await backend.flush()  # the cancelled dispatches' device work ended and was released
    assert (
        backend.executor.in_flight == 0 and max(backend.executor.device_context.streams.busy()) == 0
    )
    assert _threads() <= threads_before
    out = await backend.dispatch(xor, [np.full(256, 3, np.uint32), np.ones(256, np.uint32)])
    assert out[0].tolist() == [2] * 256
    backend.free(flag)


def _threads() -> int:
    """Threads other than the fake device's stream workers (real CUDA streams are not threads)."""
    return sum(not t.name.startswith("fake-stream") for t in threading.enumerate())


async def test_empty_buffers_and_results_discarded_after_a_timeout(backend: VyreBackend) -> None:
    empty = np.zeros(0, np.uint32)
    outputs = await backend.dispatch(accumulate(), [empty, empty])
    assert outputs[0].shape == (0,) and outputs[0].dtype == np.uint32
    flag = backend.upload(np.zeros(1, np.uint32))
    await anyio.to_thread.run_sync(backend.download, flag)
    pending = backend.dispatch(gate(), [flag], DispatchConfig(timeout=0.05, label="gated"))
    with pytest.raises(DispatchTimeout) as info:
        await pending
    assert "gated" in str(info.value) and "Fix:" in str(info.value)
    ctypes.memmove(flag.native(backend.executor).ptr, np.ones(1, np.uint32).ctypes.data, 4)
    await backend.flush()  # the kernel ended; its result was dropped and its memory released
    assert (
        backend.executor.in_flight == 0 and max(backend.executor.device_context.streams.busy()) == 0
    )
    backend.free(flag)


def test_factory_uses_the_default_disk_cache(
    fake: FakeDevice, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VYRE_CACHE_DIR", str(tmp_path))
    backend = create_backend()
    assert backend.disk_cache is not None and backend.disk_cache.root == tmp_path
    assert create_backend(disk_cache=None).disk_cache is None
    with pytest.raises(ValueError):
        create_backend(disk_cache="elsewhere")


async def test_arm_graph_joins_layers_on_the_device(backend: VyreBackend) -> None:
    """Every arm submitted at once; stream events order them on their resident buffers."""
    from tests.policies.kernels import binop
    from vyre_async._graph import ArmGraph
    from vyre_reference import reference_backend

    rng = np.random.default_rng(11)
    graph = ArmGraph(label="fake-device")
    for name in ("x", "y", "z"):
        graph.resource(name, "u32", 64, initial=rng.integers(0, 2**32, 64, dtype=np.uint32))
    for name in ("p", "q", "r"):
        graph.resource(name, "u32", 64)
    xor, add = binop("xor", 64), binop("add", 64)
    graph.arm(xor, {"a": "x", "b": "y", "out": "p"})
    graph.arm(add, {"a": "y", "b": "z", "out": "q"})
    graph.arm(xor, {"a": "p", "b": "q", "out": "r"})
    graph.arm(add, {"a": "r", "b": "p", "out": "x"})  # rewrites x, read by the first arm
    on_device = await graph.run(backend)
    reference = reference_backend()
    expected = await graph.run(reference)
    await reference.shutdown()
    assert on_device.report.joins_on == "device"
    assert on_device.report.layers == ((0, 1), (2,), (3,))
    assert all(isinstance(a.stream, int) for a in on_device.report.arms)  # pool stream index
    for name in ("p", "q", "r", "x"):
        assert on_device.outputs[name].tolist() == expected.outputs[name].tolist(), name


def test_policy_benchmark_runs_on_the_fake_device(fake: FakeDevice) -> None:
    """benchmarks/cuda_policies.py end to end on the fake device: the plumbing, not figures.

    (Its bare-CuPy graph-capture peer needs a real GPU.)
    """
    from benchmarks import cuda_policies as bench

    arms = bench.arm_concurrency(1)
    assert arms["streams_1"]["streams_used"] == [0]
    assert len(arms["streams_4"]["streams_used"]) >= 1
    assert arms["concurrency_factor"] > 0 and isinstance(arms["met"], bool)
    overlap = bench.copy_overlap(2, 1024)
    assert overlap["bytes_per_upload"] == 4096
    assert overlap["pipelined_ms"] > 0 and isinstance(overlap["met"], bool)
    modes = bench.dispatch_batch_modes(8)
    ran = {mode: figures["ran_as"] for mode, figures in modes["vyre_dispatch_batch"].items()}
    assert ran == {"plain": "plain", "command_reuse": "command_reuse", "persistent": "persistent"}
    assert modes["calibration"]["replay_ns"] > 0 and modes["vyre_policy_verdict"]
    prefetch = bench.prefetch_latency(1, 0.02)
    assert prefetch["prefetch_off"]["compile_waits"] == prefetch["prefetch_off"]["dispatches"] == 3
    assert prefetch["prefetch_on"]["dispatches"] == 3


def test_calibrate_measures_launch_modes_compile_and_copies(
    fake: FakeDevice, tmp_path: Path
) -> None:
    from vyre_async._calibration import CalibrationStore, calibration_for, format_calibration
    from vyre_async._execution import choose_execution_mode

    def completion_threads() -> int:
        return sum(t.name == "vyre-cupy-completion" for t in threading.enumerate())

    backend = create_backend(disk_cache=None)
    # The probes of calibration_for (fusion gain, arm overlap) dispatch on the backend
    # itself, which starts its own completion thread: start it first.
    xor = elementwise_xor(256)
    backend.dispatch_sync(xor, [np.zeros(256, np.uint32)] * 2)
    threads = completion_threads()
    store = CalibrationStore(tmp_path)
    record = calibration_for(backend, measure=True, store=store)
    assert record is not None and record.backend_id == "cupy"
    assert record.device_fingerprint == backend.device_fingerprint()
    assert record.launch_ns > 0 and (record.compile_ns or 0) > 0
    assert (record.h2d_bytes_per_s or 0) > 0 and (record.d2h_bytes_per_s or 0) > 0
    # graph replay and persistent batches were really run and timed
    assert (record.record_ns or 0) > 0 and (record.replay_ns or 0) > 0
    assert record.persistent_setup_ns is not None and record.persistent_item_ns is not None
    assert store.load("cupy", backend.version, backend.device_fingerprint()) == record
    assert completion_threads() == threads  # the probe backend's thread is gone
    decision = choose_execution_mode(backend, batch_size=100, repeats=100, calibration=record)
    assert decision.calibrated and decision.persistent.reason != "uncalibrated"
    assert decision.reuse.reason != "uncalibrated"
    print(format_calibration(record))
    anyio.run(backend.shutdown)


@pytest.fixture
def own_backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    """A fake-device backend of the test's own, which the test closes."""
    backend = create_backend(disk_cache=None)
    yield backend
    if not backend.closed:
        anyio.run(backend.aclose)


async def test_a_closed_backend_refuses_every_operation(own_backend: VyreBackend) -> None:
    await contract.test_a_closed_backend_refuses_every_operation(own_backend)


async def test_a_resident_buffer_of_another_instance_is_refused(own_backend: VyreBackend) -> None:
    await contract.test_a_resident_buffer_of_another_instance_is_refused(own_backend)


async def test_closing_gives_up_on_a_kernel_it_cannot_stop(own_backend: VyreBackend) -> None:
    """A kernel cannot be stopped: close waits close_timeout, then fails its dispatch."""
    own_backend.close_timeout = 0.2
    flag = own_backend.upload(np.zeros(1, np.uint32))
    await anyio.to_thread.run_sync(own_backend.download, flag)
    pending = own_backend.dispatch(gate(), [flag])  # spins until the flag is set
    await anyio.sleep(0.05)
    assert not pending.done()
    try:
        with anyio.fail_after(20):
            await own_backend.aclose()
        with pytest.raises(BackendClosed, match="still ran on the GPU"):
            await pending
        with pytest.raises(BackendClosed):
            own_backend.dispatch(gate(), [flag])
    finally:  # let the abandoned kernel end, so the emulator thread stops spinning
        ctypes.memmove(flag.native(own_backend.executor).ptr, np.ones(1, np.uint32).ctypes.data, 4)


@pytest.mark.anyio
async def test_the_span_is_the_callers_child_when_the_completion_thread_ends_it(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Traced dispatch finished on the completion thread: the caller's trace, phases on it."""
    exporter, _ = otel_sdk.install()
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", 0.0)  # nobody polls: the thread finishes
    program = elementwise_xor(64)
    a = np.arange(64, dtype=np.uint32)
    await backend.dispatch(program, [a, a])  # compiled
    bridge = backend.executor.device_context.bridge
    polled = bridge.polled
    exporter.clear()
    with trace.get_tracer("tests").start_as_current_span("request") as request:
        outputs = await backend.dispatch(program, [a, a + 1])
    assert outputs[0].tolist() == (a ^ (a + 1)).tolist()
    assert bridge.polled == polled  # finished by the completion thread
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "vyre.dispatch"]
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.context.trace_id == request.get_span_context().trace_id
    attributes = span.attributes or {}
    for phase in ("upload", "launch", "readback"):  # from the device events
        assert isinstance(attributes[f"vyre.phase.{phase}_s"], float)


async def test_a_download_is_ordered_before_a_writer_submitted_after_it(
    backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """download() (blocking: from a worker thread) counts as a reader of the buffer."""
    from tests.cupy.fake_cupy import MEMCPY_D2H

    ctx = backend.executor.device_context
    x = backend.upload(np.ones(64, np.uint32))
    acc = backend.upload(np.zeros(64, np.uint32))
    assert (await anyio.to_thread.run_sync(backend.download, acc)).tolist() == [0] * 64
    real = ctx.runtime.memcpyAsync
    main = threading.main_thread()
    copying = threading.Event()

    def slow_download(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        if kind == MEMCPY_D2H and threading.current_thread() is not main:

            def copy() -> None:  # a large transfer: the copy takes a while on its stream
                copying.set()
                time.sleep(0.3)
                ctypes.memmove(dst, src, size)

            fake._stream(stream).enqueue(copy)
        else:
            real(dst, src, size, kind, stream)

    monkeypatch.setattr(ctx.runtime, "memcpyAsync", slow_download)
    downloaded: list[np.ndarray] = []

    async def download() -> None:
        downloaded.append(await anyio.to_thread.run_sync(backend.download, acc))

    async with anyio.create_task_group() as group:
        group.start_soon(download)
        # The download's copy is on its stream (and download() blocks on it).
        assert await anyio.to_thread.run_sync(copying.wait, 10)
        out = await backend.dispatch(accumulate(), [x, acc])  # a writer, submitted after
        assert out[0].tolist() == [3] * 64
    assert downloaded[0].tolist() == [0] * 64  # what was there when download() was called
    backend.free(x)
    backend.free(acc)


def test_forked_test_processes_load_library_copies_of_their_own(tmp_path: Path) -> None:
    # mutmut runs each mutant's tests in a process forked from one that imported
    # fake_cupy: two such processes copied the emulator library to one path (the count
    # was their parent's), and one truncated the file the other had loaded.
    from tests.cupy.fake_cupy import _UBSAN

    library = tmp_path / "libemu.so"
    library.write_bytes(b"\x7fELF and the rest")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child copies, reports its path and ends at once)
        try:
            os.write(write, str(_UBSAN.private_copy(library)).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child = Path(os.read(read, 4096).decode())
    os.close(read)
    mine = _UBSAN.private_copy(library)  # (the same count the child had)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child != mine
    assert child.read_bytes() == mine.read_bytes() == library.read_bytes()


def _hold_next_upload(
    monkeypatch: pytest.MonkeyPatch, backend: VyreBackend, device: FakeDevice, count: int = 1
) -> tuple[threading.Event, threading.Event]:
    """Hold the next ``count`` host-to-device copies on the device: their streams stop before.

    Returns ``(reached, gate)``: ``reached`` is set once the first stream stopped there;
    setting ``gate`` lets them go on. Later copies are not held.
    """
    runtime = backend.executor.device_context.runtime
    memcpy = runtime.memcpyAsync
    reached, gate = threading.Event(), threading.Event()
    left = [count]

    def hold() -> None:
        reached.set()
        gate.wait()

    def held(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        left[0] -= 1
        if not left[0]:
            monkeypatch.setattr(runtime, "memcpyAsync", memcpy)
        device.streams[stream].enqueue(hold)
        memcpy(dst, src, size, kind, stream)

    monkeypatch.setattr(runtime, "memcpyAsync", held)
    return reached, gate


def test_a_dispatch_with_resident_inputs_held_on_the_device_holds_back_no_other(
    own_backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dispatches with resident inputs settle on their own streams: one held on the device
    holds back no later one that shares no buffer with it."""
    own_backend.close_timeout = 1.0  # (a failure leaves the held one held: closing gives up)
    x1 = own_backend.upload(np.arange(64, dtype=np.uint32))
    x2 = own_backend.upload(np.arange(64, dtype=np.uint32))
    anyio.run(own_backend.flush)
    reached, gate = _hold_next_upload(monkeypatch, own_backend, fake)
    held = own_backend.dispatch(accumulate(), [x1, np.zeros(64, np.uint32)])
    assert reached.wait(30)
    other = own_backend.dispatch(accumulate(), [x2, np.ones(64, np.uint32)])
    assert other.result(timeout=30)[0].tolist() == [1 + 3 * i for i in range(64)]
    assert not held.done()
    gate.set()
    assert held.result()[0].tolist() == [3 * i for i in range(64)]


def test_a_writer_waits_for_the_readers_of_its_buffer_only(
    own_backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatch that writes a resident buffer waits for the earlier dispatches reading it,
    and for nothing else: not for other work, on another stream, still on the device."""
    own_backend.close_timeout = 1.0  # (a failure leaves the held one held: closing gives up)
    x = own_backend.upload(np.arange(64, dtype=np.uint32))
    read = own_backend.dispatch(accumulate(), [x, np.zeros(64, np.uint32)])  # reads x
    assert read.result()[0].tolist() == [3 * i for i in range(64)]
    anyio.run(own_backend.flush)  # that reader is over, its events handed back
    reached, gate = _hold_next_upload(monkeypatch, own_backend, fake)
    a = np.arange(100, dtype=np.uint32)
    held = own_backend.dispatch(elementwise_xor(100), [a, a])  # unrelated work
    assert reached.wait(30)
    write = own_backend.dispatch(accumulate(), [np.ones(64, np.uint32), x])  # x += 3
    assert write.result(timeout=30)[0].tolist() == [i + 3 for i in range(64)]
    assert not held.done()
    gate.set()
    assert not held.result()[0].any()


def test_a_dispatch_with_resident_inputs_out_of_memory_frees_its_stream(
    backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = backend.executor.device_context.streams
    # The module's backend is shared: the last flight of an earlier test may still be
    # handing its stream back on the completion thread. Start from idle streams.
    deadline = time.monotonic() + 10
    while max(streams.busy()) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert max(streams.busy()) == 0, "an earlier test's stream never came back"
    x = backend.upload(np.arange(1 << 12, dtype=np.uint32))
    try:
        gc.collect()
        monkeypatch.setattr(fake, "memory_limit", fake.allocated + 1024)  # less than its arena
        with pytest.raises(DeviceOutOfMemory, match="Fix:"):
            backend.dispatch_sync(accumulate(), [x, np.zeros(1 << 12, np.uint32)])
        assert max(streams.busy()) == 0  # its stream is free again, at once
    finally:
        backend.free(x)


def test_a_dispatch_with_resident_inputs_times_its_own_work(
    own_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its device time and upload/launch/readback phases come from its own events: none
    negative or longer than the dispatch took (on a backend of its own every event is new:
    one left unrecorded would read as the clock's zero)."""
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    x = own_backend.upload(np.arange(64, dtype=np.uint32))
    pending = own_backend.dispatch(accumulate(), [x, np.zeros(64, np.uint32)])
    assert pending.result()[0].tolist() == [3 * i for i in range(64)]
    _assert_timed_by_its_own_events(pending, empty_phases=True)


def test_dispatches_that_only_read_a_resident_buffer_wait_for_no_one_another(
    own_backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers of one resident buffer wait for its last write only: one held on the device
    holds back no later reader."""
    own_backend.close_timeout = 1.0  # (a failure leaves the held one held: closing gives up)
    x = own_backend.upload(np.arange(64, dtype=np.uint32))
    anyio.run(own_backend.flush)
    reached, gate = _hold_next_upload(monkeypatch, own_backend, fake)
    held = own_backend.dispatch(accumulate(), [x, np.zeros(64, np.uint32)])
    assert reached.wait(30)
    other = own_backend.dispatch(accumulate(), [x, np.ones(64, np.uint32)])
    assert other.result(timeout=30)[0].tolist() == [1 + 3 * i for i in range(64)]
    assert not held.done()
    gate.set()
    assert held.result()[0].tolist() == [3 * i for i in range(64)]


def test_a_kernel_that_fails_on_the_device_says_so(
    fresh_device: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel that faults after its dispatch was enqueued fails it with what was running."""
    backend = create_backend(disk_cache=None, prefetch=False)
    try:
        a = np.ones(8, np.uint32)
        reached, gate = _hold_next_upload(monkeypatch, backend, fresh_device)
        fresh_device.fail_next_launch = True  # its launch leaves a sticky error
        pending = backend.dispatch(elementwise_xor(8), [a, a])  # all enqueued: no error yet
        assert reached.wait(30)
        gate.set()
        with pytest.raises(DeviceLost, match=r"while running the kernel(.|\n)*Fix:"):
            pending.result()
    finally:
        anyio.run(backend.shutdown)


def test_a_launch_shape_keeps_two_stagings_for_its_next_launches(
    own_backend: VyreBackend, fake: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to two stagings (device arena and pinned buffer) of a launch shape stay allocated
    for its next launches, for arenas up to SPARE_ARENA_BYTES included."""
    program = elementwise_xor(5440)
    layout = plan_layout([d.access for d in program.buffers], [5440] * 3, [None] * 3)
    arena = layout.total_bytes
    assert arena == cuda_launch.SPARE_ARENA_BYTES
    a = np.arange(5440, dtype=np.uint32)
    gc.collect()
    base = fake.allocated
    reached, gate = _hold_next_upload(monkeypatch, own_backend, fake, count=3)
    pendings = [own_backend.dispatch(program, [a, a]) for _ in range(3)]  # 3 at once: 3 stagings
    assert reached.wait(30)
    gate.set()
    assert all(not p.result()[0].any() for p in pendings)
    anyio.run(own_backend.flush)
    gc.collect()
    assert fake.allocated == base + 2 * arena
    assert not own_backend.dispatch_sync(program, [a, a])[0].any()  # reuses one
    anyio.run(own_backend.flush)
    gc.collect()
    assert fake.allocated == base + 2 * arena


def _assert_timed_by_its_own_events(pending: PendingDispatch, *, empty_phases: bool) -> Any:
    """Device time within the wall time, and upload/launch/readback phases each no longer
    than the dispatch took (and not empty, unless ``empty_phases``); return the timing."""
    timing = pending.timing
    assert timing is not None and timing.wall_s is not None and timing.device_s is not None
    assert 0 <= timing.device_s <= timing.wall_s
    phases = (pending.record.phases or [])[-3:]
    assert [name for name, _, _ in phases] == ["vyre.upload", "vyre.launch", "vyre.readback"]
    for _, start, end in phases:
        assert end - start >= 0 if empty_phases else end - start > 0
        assert end - start <= timing.wall_s * 1e9
    return timing


def test_launch_shapes_beyond_the_templates_kept_still_run(
    own_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_launch, "TEMPLATES_PER_KERNEL", 2)  # a third shape drops one
    templates = own_backend.compile(accumulate()).native.templates
    kept = [[(64, 64)], [(64, 64), (63, 63)], [(63, 63), (62, 62)], [(62, 62), (61, 61)]]
    for n, shapes in zip((64, 63, 62, 61), kept, strict=True):
        x = np.arange(n, dtype=np.uint32)
        outputs = own_backend.dispatch_sync(accumulate(), [x, np.ones(n, np.uint32)])
        assert outputs[0].tolist() == [1 + 3 * i for i in range(n)]
        assert list(templates) == shapes  # the oldest shape goes first
    x = np.arange(64, dtype=np.uint32)  # a shape dropped: still runs
    outputs = own_backend.dispatch_sync(accumulate(), [x, np.ones(64, np.uint32)])
    assert outputs[0].tolist() == [1 + 3 * i for i in range(64)]


def test_a_plain_dispatch_times_its_own_work(
    own_backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its device time and phases come from its own events: none empty, negative or longer
    than the dispatch took (on a backend of its own every event is new: one left unrecorded
    would read as the clock's zero)."""
    monkeypatch.setattr(DispatchCompleter, "wants_phases", property(lambda self: True))
    a = np.arange(64, dtype=np.uint32)
    pending = own_backend.dispatch(elementwise_xor(64), [a, a])
    assert not pending.result()[0].any()
    timing = _assert_timed_by_its_own_events(pending, empty_phases=False)
    assert timing.compile_s is not None
    monkeypatch.undo()  # no span: device time without phases
    pending = own_backend.dispatch(elementwise_xor(64), [a, a])
    assert not pending.result()[0].any()
    timing = pending.timing
    assert timing is not None and timing.wall_s is not None and timing.device_s is not None
    assert 0 < timing.device_s <= timing.wall_s
    assert timing.compile_s is not None


# Resident buffers bound twice, and the readers a writer waits for -------------------------


def _resident(owner: object, buf: cuda_launch.DeviceBuffer) -> ResidentBuffer:
    return ResidentBuffer(owner=owner, dtype=DType.U32, count=4, native=buf)


def _param(access: Access) -> Any:
    return SimpleNamespace(decl=SimpleNamespace(access=access))


def test_a_read_write_resident_buffer_also_bound_elsewhere_is_copied_into_the_arena() -> None:
    """Bound in place it would be written while the other slot reads it: the kernel gets a
    device copy to write (`Source.DEVICE`); a buffer bound once is bound in place."""
    owner = SimpleNamespace(id="cupy")
    buf = cuda_launch.DeviceBuffer(memory=None, ptr=0, nbytes=16)
    shared, alone = _resident(owner, buf), _resident(owner, buf)
    params = [_param(Access.READ_WRITE), _param(Access.READ), _param(Access.READ_WRITE)]
    x = np.zeros(4, np.uint32)
    assert cuda_launch.resident_sources(params, [shared, shared, x]) == [
        Source.DEVICE,
        Source.DIRECT,
        None,
    ]
    assert cuda_launch.resident_sources(params, [shared, alone, alone]) == [
        Source.DIRECT,
        Source.DIRECT,
        Source.DEVICE,
    ]


class Waits:
    """A stream that records the events it was made to wait for."""

    def __init__(self) -> None:
        self.waited: list[object] = []

    def wait_event(self, event: object) -> None:
        self.waited.append(event)


@pytest.mark.parametrize(
    "written_first", [True, False], ids=["written-then-read", "read-then-written"]
)
def test_a_buffer_written_through_one_slot_and_read_through_another_counts_as_written(
    written_first: bool,
) -> None:
    owner = SimpleNamespace(id="cupy")
    buf = cuda_launch.DeviceBuffer(memory=None, ptr=0, nbytes=16)
    buf.last_write, buf.readers = "upload", ["reader-1", "reader-2"]
    item = _resident(owner, buf)
    slots = [SimpleNamespace(readback=0), SimpleNamespace(readback=None)]  # written, read
    if not written_first:
        slots.reverse()
    layout: Any = SimpleNamespace(slots=slots)
    ctx: Any = SimpleNamespace(lock=threading.Lock())
    stream = Waits()
    uses = cuda_launch._order_residents(ctx, owner, [item, item], layout, stream)
    assert uses == [(buf, True)]  # one use of the buffer, a write
    assert stream.waited == ["upload", "reader-1", "reader-2"]  # the write waits for readers


class Done:
    def __init__(self, done: bool) -> None:
        self.done = done


def test_pruning_a_buffers_readers_keeps_every_reader_still_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cuda_launch, "_READERS_KEPT", 4)
    buf = cuda_launch.DeviceBuffer(memory=None, ptr=0, nbytes=16)
    running, ended = Done(False), Done(True)
    readers = [ended, running, ended, Done(False)]
    buf.readers = list(readers)
    newest = Done(False)
    cuda_launch.note_reader(buf, newest)
    assert buf.readers == [running, readers[3], newest]  # a later writer waits for these
