"""`VyreBackend`: the base class every concrete driver implements — the backend authors' seam.

A backend supplies an ``id`` and the `VyreBackend.enqueue` hook; every other
hook has a conservative default. The machinery behind ``dispatch`` and
``compile`` lives in its own modules, which reach the backend only through its
public hooks: the pipeline store (`vyre_async.store`: cache identity, memory
and disk caches, compile once), the dispatch front end (`vyre_async.frontend`:
input checks, launch templates, the `Launch` record) and the shape-prediction
prefetcher (`vyre_async.prefetch`). ``docs/architecture.md`` follows one
dispatch through them.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vyre_async import telemetry
from vyre_async._exports import public_dir as _public_dir
from vyre_async.arguments import duration, whole_number
from vyre_async.cache.identity import PipelineIdentity
from vyre_async.cache.memory import CacheStats, MemoryPipelineCache
from vyre_async.capabilities import BackendCapabilities
from vyre_async.config import DispatchConfig
from vyre_async.errors import BackendClosed, InvalidProgram, UnsupportedFeature
from vyre_async.frontend import DispatchFrontEnd, InputLike, Launch, as_config
from vyre_async.ir.ops import AtomicOp, BinOp, UnOp
from vyre_async.ir.program import Program
from vyre_async.ir.types import DType
from vyre_async.ir.validate import validate_or_raise
from vyre_async.pending import PendingDispatch, refuse_blocking_in_loop
from vyre_async.pipeline import CompiledPipeline
from vyre_async.resident import ResidentBuffer
from vyre_async.store import PipelineStore, ops_used

if TYPE_CHECKING:
    from vyre_async.cache.disk import DiskPipelineCache
    from vyre_async.calibration import Calibration
    from vyre_async.execution import ExecutionDecision
    from vyre_async.prefetch import Prefetcher

__all__ = ["CORE_OPS", "VyreBackend", "ops_used", "poll_until"]
__dir__ = _public_dir(__name__)


def _anyio() -> Any:
    """anyio, imported by the first async helper that needs it (not with vyre-async)."""
    import anyio
    import anyio.to_thread

    return anyio


def _is_disk_cache(value: object) -> bool:
    """``isinstance(value, DiskPipelineCache)``, importing the disk cache only when one is given."""
    from vyre_async.cache.disk import DiskPipelineCache

    return isinstance(value, DiskPipelineCache)


#: Every operation of the core IR, as ``"bin.<op>"``, ``"un.<op>"`` and ``"atomic.<op>"``.
CORE_OPS: frozenset[str] = frozenset(
    [f"bin.{op.value}" for op in BinOp]
    + [f"un.{op.value}" for op in UnOp]
    + [f"atomic.{op.value}" for op in AtomicOp]
)

_DEFAULT_CONFIG = DispatchConfig()
#: Default seconds `VyreBackend.shutdown` waits for work it cannot stop at once.
CLOSE_TIMEOUT_S = 5.0


async def poll_until(done: Callable[[], bool]) -> None:
    """Wait, without blocking the event loop, until ``done()`` is true.

    For backends whose work ends on other threads (``flush``; bound it with
    ``anyio.move_on_after`` in a ``shutdown``): polls with a backoff from
    0.2 ms to 10 ms.
    """
    delay = 0.0002
    while not done():
        await _anyio().sleep(delay)
        delay = min(delay * 2, 0.01)


class VyreBackend(abc.ABC):
    """Base class of every backend.

    A subclass must set ``id`` (a unique string) and implement `enqueue`.
    Every other member has a conservative default, documented on the member.
    Backends are built by the registry (`acquire_backend`) or directly by the
    user; ``async with backend:`` prepares it and shuts it down.

    Args:
        pipeline_cache_capacity: Entries of the in-memory pipeline LRU.
        disk_cache: Where compiled pipeline bytes persist across processes; only
            used by backends whose `serialize_pipeline` returns bytes.
        prefetch: Record every dispatch's shape and compile the predicted next
            pipeline in the background (`vyre_async.prefetch`); ``backend.prefetcher``
            is None when False.
        close_timeout: Seconds `shutdown` waits for work it cannot stop at once
            before giving up on it (failing its dispatches with `BackendClosed`).

    Raises:
        InvalidProgram: an argument is out of range.
    """

    id: ClassVar[str]
    version: str = "unspecified"
    #: True when `enqueue` (and `enqueue_batch`) copy every host input into the
    #: backend's own memory before they return: ``launch.inputs`` then holds the
    #: caller's arrays themselves (checked for dtype and size, of any shape and
    #: strides; read them only inside those calls), so each input is copied once,
    #: straight into its final place. Default False: the driver hands private,
    #: flat copies that the backend may keep.
    copies_inputs: ClassVar[bool] = False

    def __init__(
        self,
        *,
        pipeline_cache_capacity: int = 256,
        disk_cache: DiskPipelineCache | None = None,
        prefetch: bool = True,
        close_timeout: float = CLOSE_TIMEOUT_S,
    ) -> None:
        backend_id = getattr(type(self), "id", None)
        if not isinstance(backend_id, str) or not backend_id:
            raise TypeError(f"{type(self).__name__} must set a class attribute id = '<name>'")
        capacity = whole_number(
            "pipeline_cache_capacity",
            pipeline_cache_capacity,
            minimum=1,
            example="pipeline_cache_capacity=256",
        )
        if disk_cache is not None and not _is_disk_cache(disk_cache):
            raise InvalidProgram(
                f"disk_cache must be a DiskPipelineCache or None, got {disk_cache!r}",
                fix="pass disk_cache=DiskPipelineCache() (or a directory: DiskPipelineCache(path))",
            )
        #: Seconds `shutdown` waits for work it cannot stop at once.
        self.close_timeout = duration(
            "close_timeout", close_timeout, example=f"close_timeout={CLOSE_TIMEOUT_S}"
        )
        self._closed = False
        #: Shape-prediction prefetcher (None when built with ``prefetch=False``).
        self.prefetcher: Prefetcher | None = None
        #: The dispatch front end (`vyre_async.frontend.DispatchFrontEnd`).
        self.front = DispatchFrontEnd(self, None)
        #: The pipeline store (`vyre_async.store.PipelineStore`).
        self.store = PipelineStore(self, self.front, capacity, disk_cache)
        #: The in-memory pipeline LRU (``store.memory``).
        self.pipelines: MemoryPipelineCache[CompiledPipeline] = self.store.memory
        #: Where compiled pipelines persist across processes, or None.
        self.disk_cache = disk_cache
        if prefetch:
            from vyre_async.prefetch import Prefetcher  # (with the first backend, not at import)

            self.prefetcher = self.front.prefetcher = Prefetcher(self.store)

    # Description ----------------------------------------------------------------
    def supported_ops(self) -> frozenset[str]:
        """Return the operations this backend executes. Default: `CORE_OPS`, all of them."""
        return CORE_OPS

    def capabilities(self) -> BackendCapabilities:
        """Return what the backend supports natively. Default: nothing (every feature False)."""
        return BackendCapabilities()

    def device_fingerprint(self) -> str:
        """Return a string that changes whenever compiled code stops being reusable.

        Part of the pipeline cache identity: device model and architecture, driver
        and runtime versions. Default: ``""`` (one host, nothing to distinguish).
        """
        return ""

    def compiler_fingerprint(self) -> str:
        """Return the compiler's name, version and fixed options. Default: ``""``."""
        return ""

    def compile_options(self, config: DispatchConfig) -> Mapping[str, object]:
        """Return options that change generated code for ``config``. Default: none."""
        return {}

    def calibrate(self) -> Calibration | None:
        """Measure the costs the launch policies need on this device, now.

        A backend returns a `vyre_async.calibration.Calibration` (per-launch
        overhead, record/replay and persistent setup costs where it has those
        paths, transfer bandwidth, compile cost). Callers use
        `vyre_async.calibration.calibration_for`, which measures once per device
        and caches the result on disk by device fingerprint. Default: None
        (nothing measured; policies that need costs choose plain launches).
        """
        return None

    # Lifecycle ------------------------------------------------------------------
    async def prepare(self) -> None:
        """Open devices and warm up. Default: nothing to do."""
        return None

    async def flush(self) -> None:
        """Wait until every submitted dispatch has finished. Default: nothing to do."""
        return None

    async def shutdown(self) -> None:
        """Stop work and release devices and workers; called once by `aclose`.

        A backend stops what it can at its next safe point, settles every
        dispatch it has not finished with `BackendClosed`, waits a bounded time
        for the rest and never hangs. Default: marks the backend closed.
        """
        self._closed = True

    async def aclose(self) -> None:
        """Close the backend: refuse new work, stop the prefetcher, then `shutdown`.

        From then on every operation raises `BackendClosed`; calling it again
        does nothing. Dispatches still running are stopped where the backend
        can stop them and fail with `BackendClosed`: await the ones you need
        (or `flush`) before closing.
        """
        if self._closed:
            return
        self._closed = True
        if self.prefetcher is not None:
            self.prefetcher.close()
        with _anyio().CancelScope(shield=True):  # bounded by close_timeout; release even when
            await self.shutdown()  # the closing task is being cancelled

    @property
    def closed(self) -> bool:
        """True once the backend was closed (`aclose`, `shutdown`, the end of ``async with``)."""
        return self._closed

    def check_open(self) -> None:
        """Raise `BackendClosed` if the backend was closed (for backend authors' own operations).

        Raises:
            BackendClosed: the backend was closed.
        """
        if self._closed:
            raise BackendClosed(
                f"backend {self.id!r} was closed; it runs nothing more",
                backend_id=self.id,
            )

    async def __aenter__(self) -> VyreBackend:
        await self.prepare()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def device_lost(self) -> bool:
        """Return True once the device is unusable. Default: False."""
        return False

    def try_recover(self) -> None:
        """Try to bring a lost device back.

        Raises:
            UnsupportedFeature: by default (device recovery not implemented).
        """
        raise UnsupportedFeature(
            f"backend {self.id!r} does not support device recovery",
            fix="acquire a new backend instance",
            feature="device recovery",
        )

    # Resident buffers ------------------------------------------------------------
    def _no_resident(self, what: str) -> UnsupportedFeature:
        return UnsupportedFeature(
            f"backend {self.id!r} has no resident buffers ({what} is not supported)",
            fix="pass numpy arrays as dispatch inputs instead of resident buffers",
            feature="resident buffers",
        )

    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer:
        """Copy ``data`` into a new resident buffer.

        Raises:
            UnsupportedFeature: by default — never a silent host fallback.
            BackendClosed: the backend was closed.
        """
        self.check_open()
        raise self._no_resident("upload")

    def alloc(self, dtype: DType | str, count: int, *, label: str | None = None) -> ResidentBuffer:
        """Allocate a zero-filled resident buffer.

        Raises:
            UnsupportedFeature: by default.
            BackendClosed: the backend was closed.
        """
        self.check_open()
        raise self._no_resident("alloc")

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Copy a resident buffer back to a new host array.

        Raises:
            UnsupportedFeature: by default.
            BackendClosed: the backend was closed.
        """
        self.check_open()
        raise self._no_resident("download")

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer (allowed after close: releasing never fails for that).

        Raises:
            UnsupportedFeature: by default.
        """
        raise self._no_resident("free")

    # Pipelines --------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        """Compile ``program`` into the backend's native artifact. Default: None (pass-through).

        Raises:
            KernelCompileFailed: the backend's compiler rejected the generated code.
        """
        return None

    def serialize_pipeline(self, native: Any) -> bytes | None:
        """Return bytes `load_pipeline` can rebuild ``native`` from. Default: None (memory only)."""
        return None

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> Any:
        """Rebuild a native artifact from `serialize_pipeline` bytes.

        Raises:
            UnsupportedFeature: by default (the backend does not use the disk cache).
        """
        raise UnsupportedFeature(
            f"backend {self.id!r} cannot load pipelines from bytes",
            fix="disable the disk cache for this backend",
            feature="pipeline serialization",
        )

    def pipeline_identity(
        self, program: Program, config: DispatchConfig | None = None
    ) -> PipelineIdentity:
        """Return the cache identity of ``program`` compiled under ``config`` on this backend.

        Raises:
            InvalidProgram: ``program`` is not a valid `Program` (checked first: a
                program nested past the IR's limits is refused, not hashed), or
                ``config`` is not a `DispatchConfig`.
        """
        if not isinstance(program, Program):
            raise InvalidProgram(
                f"pipeline_identity needs a Program, got {type(program).__name__}",
                fix="pass the Program you dispatch",
            )
        validate_or_raise(program)
        return self.store.identity(program, as_config(config, _DEFAULT_CONFIG))

    def compile(self, program: Program, config: DispatchConfig | None = None) -> CompiledPipeline:
        """Return ``program`` compiled for this backend (memory cache → disk cache → build).

        Raises:
            InvalidProgram: the program does not validate, or ``config`` is not a
                `DispatchConfig`.
            UnsupportedFeature: the program uses an operation this backend lacks.
            KernelCompileFailed: the backend's compiler rejected it.
            BackendClosed: the backend was closed.
        """
        cfg = as_config(config, _DEFAULT_CONFIG)
        pipeline, _ = self.store.lookup(program, cfg)
        if pipeline.program != program or pipeline.config != cfg:
            # One compiled kernel serves programs that differ only in buffer counts
            # (and configs that differ only outside the policy): this caller's
            # pipeline plans with this caller's program and config.
            pipeline = pipeline.rebind(program, cfg)
        return pipeline

    async def compile_async(
        self, program: Program, config: DispatchConfig | None = None
    ) -> CompiledPipeline:
        """Compile like `compile` on a worker thread, without blocking the event loop."""
        pipeline: CompiledPipeline = await _anyio().to_thread.run_sync(
            self.compile, program, config
        )
        return pipeline

    def cache_stats(self) -> CacheStats:
        """Return the in-memory pipeline cache counters."""
        return self.pipelines.stats()

    # Dispatch ----------------------------------------------------------------------
    @abc.abstractmethod
    def enqueue(self, launch: Launch) -> PendingDispatch:
        """Start one planned launch and return ``launch.pending`` at once.

        A backend must not block on the work: it queues it (worker pool, device
        stream) and later settles ``launch.completer`` exactly once, with the
        outputs (one array per output buffer, in order) or with an error, from
        any thread. It should stop at a safe point once
        ``launch.completer.stop_requested`` is set (the result is no longer wanted).
        """

    def enqueue_batch(self, launches: Sequence[Launch], decision: ExecutionDecision) -> None:
        """Start the planned launches of one `CompiledPipeline.dispatch_batch` call.

        ``decision`` is the execution-mode verdict for the batch. A backend with a
        native persistent kernel or graph replay runs ``launches`` that way when
        ``decision.mode.kind`` asks for it and the launches allow it. Whatever it
        runs, it records the mode on every launch (`vyre_async.execution.annotate_mode`)
        before starting it, and settles every completer exactly once, as `enqueue`.
        Default: plain launches, one `enqueue` each.
        """
        # (imported with the first batch: the policies stay out of `import vyre_async`)
        from vyre_async.execution import annotate_mode

        annotate_mode(launches, decision, "plain")
        for launch in launches:
            self.enqueue(launch)

    def dispatch(
        self,
        program: Program,
        inputs: Sequence[InputLike],
        config: DispatchConfig | None = None,
    ) -> PendingDispatch:
        """Launch ``program`` on ``inputs`` and return its `PendingDispatch` at once.

        Synchronous and fast: validates (memoised), fetches or compiles the
        pipeline, checks inputs and config, plans the launch and enqueues it.
        ``await`` the result (asyncio or trio) or call ``.result()`` in plain code.

        Args:
            program: The kernel.
            inputs: One per input buffer (READ, UNIFORM, READ_WRITE), in binding
                order: numpy arrays of the buffer's dtype, little-endian bytes, or
                resident buffers of this backend. They are copied before this returns.
            config: Dispatch options; defaults to ``DispatchConfig()``.

        Raises:
            InvalidProgram: invalid program, inputs that are not a list with one
                item per input buffer, wrong input size/dtype, a buffer over the
                backend's ``max_storage_buffer_bytes``, or a config that is not a
                `DispatchConfig` or that the program cannot run with.
            UnsupportedFeature: the config or program needs a feature this
                backend lacks (a ``workgroup_override`` over its limits included).
            BackendClosed: the backend was closed.
            DeviceOutOfMemory: the host could not hold a copy of the inputs.
        """
        called = time.monotonic()  # the timeout counts from here, compilation included
        trace = telemetry.start_dispatch()
        try:
            cfg = as_config(config, _DEFAULT_CONFIG)
            started_ns = time.time_ns()
            pipeline, hit = self.store.lookup(program, cfg)
            if hit:  # (positional: this is every warm dispatch)
                return self.front.launch(
                    pipeline, inputs, cfg, True, 0.0, trace, None, program, called
                )
            compiled_ns = time.time_ns()
            return self.front.launch(
                pipeline,
                inputs,
                cfg,
                cache_hit=False,
                compile_s=(compiled_ns - started_ns) / 1e9,
                trace=trace,
                compile_phase=(started_ns, compiled_ns),
                program=program,
                called=called,
            )
        except BaseException as exc:
            telemetry.fail_before_launch(trace, exc, self.id, program)
            raise

    def dispatch_sync(
        self,
        program: Program,
        inputs: Sequence[InputLike],
        config: DispatchConfig | None = None,
    ) -> list[np.ndarray]:
        """Dispatch and block for the outputs: ``dispatch(...).result()`` (outside event loops).

        Raises:
            RuntimeError: called inside a running event loop (checked before
                anything is dispatched: blocking would freeze the loop).
        """
        refuse_blocking_in_loop("dispatch_sync()", "await backend.dispatch(...)")
        return self.dispatch(program, inputs, config).result()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} id={self.id!r} version={self.version!r}{state}>"
