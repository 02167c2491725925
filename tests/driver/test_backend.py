"""VyreBackend's shared machinery: pipelines and caches, dispatch checks, defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import (
    DispatchTimeout,
    InvalidProgram,
    Launch,
    PendingDispatch,
    UnsupportedFeature,
)
from vyre_async._backend import CORE_OPS, VyreBackend, ops_used
from vyre_async._cache import DiskPipelineCache, PipelineCacheWarning
from vyre_async._config import DispatchConfig
from vyre_async._pipeline import compile
from vyre_async.abc import Executor
from vyre_async.ir import Access, BufferDecl, DType, Program, Store, f32, gid
from vyre_async.programs import elementwise_xor, histogram, saxpy

U = np.uint32


def _xor_inputs(n: int) -> list[np.ndarray]:
    return [np.arange(n, dtype=U), np.ones(n, U)]


def test_compile_once_then_hit() -> None:
    backend = backend_of(BytesBackend)
    program = elementwise_xor(64)
    first = compile(backend, program)
    again = backend.compile(elementwise_xor(64))
    assert first is again
    assert backend.executor.builds == 1
    stats = backend.cache_stats()
    assert (stats.hits, stats.misses, stats.miss_reasons) == (1, 1, {"empty": 1})
    assert first.source == "compiled" and first.compile_s >= 0


def test_resizing_a_buffer_does_not_recompile() -> None:
    backend = backend_of(BytesBackend)
    backend.compile(elementwise_xor(64))
    assert backend.compile(elementwise_xor(100_000)).native is not None
    assert backend.executor.builds == 1


def test_a_shared_pipeline_is_planned_with_the_dispatched_programs_sizes() -> None:
    backend = backend_of(BytesBackend)
    assert backend.dispatch_sync(elementwise_xor(1000), _xor_inputs(1000))[0].size == 1000
    assert backend.dispatch_sync(elementwise_xor(8), _xor_inputs(8))[0].size == 8
    assert backend.executor.builds == 1
    assert backend.executor.launches[-1].plan.program == elementwise_xor(8)


def test_a_pipeline_compiled_for_another_size_dispatches_with_this_programs_sizes() -> None:
    backend = backend_of(BytesBackend)
    backend.compile(elementwise_xor(1000))
    small = backend.compile(elementwise_xor(8), DispatchConfig(label="small"))
    assert backend.executor.builds == 1
    assert small.program == elementwise_xor(8) and small.config.label == "small"
    assert small.dispatch(_xor_inputs(8)).result()[0].size == 8
    assert small.dispatch_batch([_xor_inputs(8)])[0].result()[0].size == 8


def test_miss_reasons() -> None:
    backend = backend_of(BytesBackend)
    backend.compile(elementwise_xor(8))
    backend.compile(saxpy(8))
    assert backend.pipelines.last_miss_reason == "program_changed"
    backend.compile(elementwise_xor(8), DispatchConfig(ulp_budget=1))
    assert backend.pipelines.last_miss_reason == "policy_changed"
    backend.compile(elementwise_xor(8), DispatchConfig(ulp_budget=1, timeout=3, label="x"))
    assert backend.pipelines.last_miss_reason == "policy_changed"  # the previous was a hit
    assert backend.cache_stats().hits == 1
    backend.store._device_key = "another-gpu"  # as if the driver changed under a new process
    backend.store._identities.clear()
    backend.store._hot.clear()
    backend.compile(elementwise_xor(8))
    assert backend.pipelines.last_miss_reason == "device_changed"
    assert backend.cache_stats().miss_reasons == {
        "empty": 1,
        "program_changed": 1,
        "policy_changed": 1,
        "device_changed": 1,
    }


def test_memory_cache_is_bounded() -> None:
    backend = backend_of(BytesBackend, pipeline_cache_capacity=2)
    for n in range(1, 5):
        backend.compile(histogram(bins=n))
    stats = backend.cache_stats()
    assert stats.entries == 2 and stats.evictions == 2


def test_disk_cache_skips_the_build_in_a_new_backend(tmp_path: Path) -> None:
    disk = DiskPipelineCache(tmp_path)
    backend_of(BytesBackend, disk_cache=disk).compile(histogram())
    fresh = backend_of(BytesBackend, disk_cache=DiskPipelineCache(tmp_path))
    pipeline = fresh.compile(histogram())
    assert (fresh.executor.builds, fresh.executor.loads, pipeline.source) == (0, 1, "disk")
    other_device = backend_of(
        BytesBackend, disk_cache=DiskPipelineCache(tmp_path), fingerprint="host-b"
    )
    other_device.compile(histogram())
    assert other_device.executor.builds == 1


def test_corrupt_disk_entry_rebuilds_with_a_warning(tmp_path: Path) -> None:
    disk = DiskPipelineCache(tmp_path)
    pipeline = backend_of(BytesBackend, disk_cache=disk).compile(histogram())
    path = disk.path_for(pipeline.identity.hex)
    path.write_bytes(path.read_bytes()[:-3])
    fresh = backend_of(BytesBackend, disk_cache=disk)
    with pytest.warns(PipelineCacheWarning):
        assert fresh.compile(histogram()).source == "compiled"
    assert fresh.executor.builds == 1
    assert backend_of(BytesBackend, disk_cache=disk).compile(histogram()).source == "disk"


def test_dispatch_outputs_and_launch_plan() -> None:
    backend = backend_of(BytesBackend)
    pending = backend.dispatch(elementwise_xor(10), _xor_inputs(10), DispatchConfig(label="L"))
    assert pending.done()
    assert pending.result()[0].tolist() == [0] * 10
    launch = backend.executor.launches[-1]
    assert launch.plan.geometry.grid == (1, 1, 1)
    assert launch.config.label == "L"
    assert pending.record.cache_hit is False
    assert backend.dispatch(elementwise_xor(10), _xor_inputs(10)).record.cache_hit is True


def test_inputs_are_copied_before_dispatch_returns() -> None:
    backend = backend_of(BytesBackend)
    hist = np.arange(256, dtype=U)
    pending = backend.dispatch(histogram(), [np.zeros(4, U), hist])
    hist[:] = 7
    assert pending.result()[0].tolist() == list(range(256))


def test_dispatch_sync_and_pipeline_batch() -> None:
    backend = backend_of(BytesBackend)
    assert backend.dispatch_sync(elementwise_xor(4), _xor_inputs(4))[0].size == 4
    pipeline = backend.compile(elementwise_xor(4))
    results = [p.result() for p in pipeline.dispatch_batch([_xor_inputs(4)] * 3)]
    assert len(results) == 3 and backend.executor.builds == 1


@pytest.mark.parametrize(
    ("program", "inputs", "config", "error", "needle"),
    [
        (elementwise_xor(4), [np.zeros(4, U)], None, InvalidProgram, "takes 2 input"),
        (elementwise_xor(4), [np.zeros(4, np.float32)] * 2, None, InvalidProgram, "dtype float32"),
        (
            elementwise_xor(4),
            _xor_inputs(4),
            DispatchConfig(max_output_bytes=8),
            InvalidProgram,
            "max_output_bytes",
        ),
        (
            elementwise_xor(4),
            _xor_inputs(4),
            DispatchConfig(cooperative=True),
            UnsupportedFeature,
            "cooperative",
        ),
        (
            elementwise_xor(4),
            _xor_inputs(4),
            DispatchConfig(persistent_thread="force"),
            UnsupportedFeature,
            "persistent",
        ),
        (
            Program(
                [BufferDecl("o", 0, Access.WRITE, DType.U32, 4)], 4, [Store("o", gid(), f32(1.0))]
            ),
            [],
            None,
            InvalidProgram,
            "V014",
        ),
        ("not a program", [], None, InvalidProgram, "expects a Program"),
    ],
)
def test_errors_before_launch(
    program: object,
    inputs: list[object],
    config: DispatchConfig | None,
    error: type[Exception],
    needle: str,
) -> None:
    backend = backend_of(BytesBackend)
    with pytest.raises(error, match="Fix:") as info:
        backend.dispatch(program, inputs, config)  # type: ignore[arg-type]
    assert needle in str(info.value)
    assert backend.executor.launches == []


def test_pipeline_refuses_a_config_that_needs_other_code() -> None:
    backend = backend_of(BytesBackend)
    pipeline = backend.compile(elementwise_xor(4), DispatchConfig(ulp_budget=1))
    pipeline.dispatch(_xor_inputs(4), DispatchConfig(ulp_budget=1, label="fine")).result()
    with pytest.raises(InvalidProgram, match="compile a pipeline for this config"):
        pipeline.dispatch(_xor_inputs(4), DispatchConfig(ulp_budget=3))


def test_unsupported_operations_are_named() -> None:
    class NoAtomics(BytesBackend):
        def supported_ops(self) -> frozenset[str]:
            return frozenset(op for op in CORE_OPS if not op.startswith("atomic."))

    assert "atomic.add" in ops_used(histogram())
    with pytest.raises(UnsupportedFeature, match=r"atomic\.add"):
        backend_of(NoAtomics).dispatch(histogram(), [np.zeros(4, U), np.zeros(256, U)])


def test_conservative_defaults() -> None:
    backend = backend_of(BytesBackend)
    assert Executor.capabilities(backend.executor).features == frozenset()
    assert Executor.capabilities(backend.executor).max_workgroup_size == (1, 1, 1)
    assert Executor.capabilities(backend.executor).max_grid_size is None
    assert backend.supported_ops() == CORE_OPS - {"stmt.grid_barrier"}
    assert not backend.device_lost()
    with pytest.raises(UnsupportedFeature, match="device recovery"):
        backend.try_recover()
    for call in (
        lambda: backend.upload(np.zeros(2, U)),
        lambda: backend.alloc(DType.U32, 4),
        lambda: backend.free(None),  # type: ignore[arg-type]
        lambda: backend.download(None),  # type: ignore[arg-type]
    ):
        with pytest.raises(UnsupportedFeature, match="resident buffers") as info:
            call()
        assert "Fix:" in str(info.value)


def test_vyre_backend_is_final_and_takes_an_executor() -> None:
    with pytest.raises(TypeError, match=r"VyreBackend is final.*Fix: write the backend as a"):

        class Mine(VyreBackend):  # type: ignore[misc]
            pass

    with pytest.raises(InvalidProgram, match="needs an Executor, got a str") as info:
        VyreBackend("reference")  # type: ignore[arg-type]
    assert "\nFix: " in str(info.value)
    executor = BytesBackend()
    backend = VyreBackend(executor, prefetch=False)
    assert (backend.executor, backend.id, backend.version) == (executor, "bytes-test", "1.0")
    assert backend.prefetcher is None
    with pytest.raises(AttributeError, match="stats"):  # (slotted: no stale attribute lands)
        backend.stats = 1  # type: ignore[attr-defined]


def test_the_caller_gets_the_drivers_pending_whatever_enqueue_returns() -> None:
    class OwnPending(BytesBackend):  # hands back a pending of its own, without the timeout
        def enqueue(self, launch: Launch) -> Any:
            self.launches.append(launch)
            return PendingDispatch.create(label="mine")[0]

    backend = backend_of(OwnPending, prefetch=False)
    pending = backend.dispatch(elementwise_xor(4), _xor_inputs(4), DispatchConfig(timeout=0.05))
    (launch,) = backend.executor.launches
    assert pending is launch.pending
    with pytest.raises(DispatchTimeout):
        pending.result(timeout=10)  # the driver's deadline holds: the executor never settled it


def test_a_backend_needs_an_id() -> None:
    class Nameless(BytesBackend):
        id = ""

    with pytest.raises(TypeError, match="class attribute id"):
        backend_of(Nameless)


@pytest.mark.anyio
async def test_async_context_manager_and_compile_async() -> None:
    async with backend_of(BytesBackend) as backend:
        pipeline = await backend.compile_async(elementwise_xor(4))
        assert (await pipeline.dispatch(_xor_inputs(4)))[0].size == 4


def test_config_validation() -> None:
    for bad in [
        {"fixpoint_iterations": 0},
        {"timeout": 0},
        {"timeout": float("nan")},
        {"ulp_budget": -1},
        {"max_output_bytes": -1},
        {"speculation": "sometimes"},
        {"persistent_thread": "yes"},
        {"workgroup_override": (0, 1, 1)},
        {"grid_override": (1, 2, 3, 4)},
        {"cooperative": 1},
        {"label": 5},
    ]:
        with pytest.raises(InvalidProgram, match="Fix:"):
            DispatchConfig(**bad)  # type: ignore[arg-type]
    cfg = DispatchConfig(grid_override=8, workgroup_override=[32])  # type: ignore[arg-type]
    assert cfg.grid_override == (8, 1, 1) and cfg.workgroup_override == (32, 1, 1)
    assert cfg.same_launch_shape(dataclasses.replace(cfg, timeout=1.0, label="other"))
    assert not cfg.same_launch_shape(dataclasses.replace(cfg, fixpoint_iterations=2))
    assert DispatchConfig().same_launch_shape(DispatchConfig(fixpoint_iterations=1))
    assert DispatchConfig(fixpoint_iterations=3).iterations == 3


# Regressions found in review ------------------------------------------------------


class _SlowCompile(BytesBackend):
    def build_pipeline(self, program: Program, config: DispatchConfig) -> object:
        import time

        time.sleep(0.3)
        return super().build_pipeline(program, config)


def test_timeout_counts_compilation_from_dispatch() -> None:
    from vyre_async import DispatchTimeout

    backend = backend_of(_SlowCompile, prefetch=False)
    pending = backend.dispatch(elementwise_xor(4), _xor_inputs(4), DispatchConfig(timeout=0.1))
    with pytest.raises(DispatchTimeout):
        pending.result()


def test_foreign_compile_errors_become_kernel_compile_failed() -> None:
    from vyre_async import KernelCompileFailed

    class Broken(BytesBackend):
        def build_pipeline(self, program: Program, config: DispatchConfig) -> object:
            raise OSError("compiler binary vanished")

    with pytest.raises(KernelCompileFailed, match="compiler binary vanished") as info:
        backend_of(Broken, prefetch=False).dispatch(elementwise_xor(4), _xor_inputs(4))
    assert isinstance(info.value.__cause__, OSError)


def test_an_unloadable_disk_entry_is_a_miss_then_rebuilt(tmp_path: Path) -> None:
    class Picky(BytesBackend):
        def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> object:
            raise ValueError("entry from an incompatible toolkit")

    disk = DiskPipelineCache(tmp_path)
    backend_of(BytesBackend, disk_cache=disk, prefetch=False).compile(histogram())
    picky = backend_of(Picky, disk_cache=disk, prefetch=False)
    with pytest.warns(PipelineCacheWarning, match="incompatible toolkit"):
        assert picky.compile(histogram()).source == "compiled"
    assert picky.executor.builds == 1


def test_dispatch_sync_inside_a_running_loop_is_refused_before_anything_runs() -> None:
    import anyio

    backend = backend_of(BytesBackend)

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="dispatch_sync\\(\\) would block"):
            backend.dispatch_sync(elementwise_xor(4), _xor_inputs(4))

    anyio.run(inside)
    assert backend.executor.launches == []  # nothing was dispatched and left running


def test_compile_options_that_read_other_config_fields_get_their_own_pipeline() -> None:
    class ProfiledBackend(BytesBackend):
        def compile_options(self, config: DispatchConfig) -> dict[str, object]:
            return {"debug": config.profile == "debug"}

    backend = backend_of(ProfiledBackend)
    program = elementwise_xor(4)
    plain = backend.compile(program)
    debug = backend.compile(program, DispatchConfig(profile="debug"))
    assert backend.executor.builds == 2  # not the plain build served for the debug options
    assert plain.identity != debug.identity
    assert backend.compile(program, DispatchConfig(profile="debug")).identity == debug.identity
    assert backend.executor.builds == 2


def test_pipelines_served_from_memory_keep_their_disk_entries_when_others_are_written(
    tmp_path: Path,
) -> None:
    """Disk recency is the entry's mtime; a pipeline in use is touched before each put."""
    import os
    import time

    disk = DiskPipelineCache(tmp_path)
    backend = backend_of(BytesBackend, disk_cache=disk)
    hot = backend.compile(histogram(bins=8))
    hot_path = disk.path_for(hot.identity.hex)
    an_hour_ago = time.time() - 3600
    os.utime(hot_path, (an_hour_ago, an_hour_ago))  # loaded long ago, served from memory since
    disk.max_bytes = int(2.5 * hot_path.stat().st_size)  # room for two entries
    for bins in (16, 32, 64):  # other pipelines compiled meanwhile: each put may evict
        backend.compile(histogram(bins=bins))
        backend.compile(histogram(bins=8))  # the hot one, from memory
    assert hot_path.exists()
    fresh = backend_of(BytesBackend, disk_cache=DiskPipelineCache(tmp_path))
    assert fresh.compile(histogram(bins=8)).source == "disk"
