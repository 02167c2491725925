"""`VyreBackend`: the one backend class users hold, over an `Executor` that runs the work.

`VyreBackend(executor, ...)` is final. It owns what every backend shares — the
pipeline store (`vyre_async._store`: cache identity, memory and disk caches,
compile once), the dispatch front end (`vyre_async._frontend`: input checks,
launch templates, the `Launch` record), the shape-prediction prefetcher
(`vyre_async._prefetch`), the lifecycle and every user-facing method — and
hands the executor (`vyre_async.abc.Executor`) only planned launches and its
hooks. ``docs/architecture.md`` follows one dispatch through them;
``docs/backend-authors.md`` writes an executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from vyre_async._arguments import duration, whole_number
from vyre_async._cache.identity import PipelineIdentity
from vyre_async._capabilities import BackendCapabilities
from vyre_async._config import DispatchConfig
from vyre_async._executor import Executor, poll_until
from vyre_async._exports import public_dir as _public_dir
from vyre_async._frontend import DEFAULT_CONFIG, DispatchFrontEnd, InputLike, as_config
from vyre_async._pending import PendingDispatch, refuse_blocking_in_loop
from vyre_async._pipeline import CompiledPipeline
from vyre_async._resident import ResidentBuffer
from vyre_async._store import CacheStats, MemoryPipelineCache, PipelineStore
from vyre_async.errors import InvalidArgument, InvalidProgram
from vyre_async.ir.ops import CORE_OPS
from vyre_async.ir.program import Program
from vyre_async.ir.types import DType
from vyre_async.ir.validate import validate_or_raise
from vyre_async.ir.walk import ops_used

if TYPE_CHECKING:
    from vyre_async._cache.disk import DiskPipelineCache
    from vyre_async._calibration import Calibration
    from vyre_async._prefetch import Prefetcher

__all__ = ["CLOSE_TIMEOUT_S", "CORE_OPS", "VyreBackend", "ops_used", "poll_until"]
__dir__ = _public_dir(__name__)


def _anyio() -> Any:
    """anyio, imported by the first async helper that needs it (not with vyre-async)."""
    import anyio
    import anyio.to_thread

    return anyio


def _is_disk_cache(value: object) -> bool:
    """``isinstance(value, DiskPipelineCache)``, importing the disk cache only when one is given."""
    from vyre_async._cache.disk import DiskPipelineCache

    return isinstance(value, DiskPipelineCache)


#: Default seconds `VyreBackend.aclose` waits for work it cannot stop at once.
CLOSE_TIMEOUT_S = 5.0


class VyreBackend:
    """A backend: validates, caches, plans and traces dispatches, run by an `Executor`.

    Build one from an executor, or get one from the registry (`acquire_backend`,
    or a backend package's factory such as ``vyre_reference.reference_backend``)::

        backend = VyreBackend(ReferenceExecutor())
        async with backend:
            outputs = await backend.dispatch(program, inputs)

    The class is final: a new backend is a new `vyre_async.abc.Executor`, never
    a subclass of this one.

    Args:
        executor: What runs the work (`vyre_async.abc.Executor`); the backend's
            ``id`` and ``version`` are the executor's.
        pipeline_cache_capacity: Entries of the in-memory pipeline LRU.
        disk_cache: Where compiled pipeline bytes persist across processes; only
            used by executors whose ``serialize_pipeline`` returns bytes.
        prefetch: Record every dispatch's shape and compile the predicted next
            pipeline in the background (``backend.prefetcher``, None when False).
        close_timeout: Seconds `aclose` waits for work it cannot stop at once
            before giving up on it (failing its dispatches with `BackendClosed`).

    Raises:
        InvalidArgument: an argument is out of range, or ``executor`` is not an `Executor`.
    """

    # Slotted: a stale write (``backend.stats = ...`` for what is the executor's now)
    # raises AttributeError instead of creating an attribute nothing reads.
    __slots__ = (
        "__weakref__",
        "close_timeout",
        "disk_cache",
        "executor",
        "front",
        "pipelines",
        "prefetcher",
        "store",
    )

    def __init_subclass__(cls, **kwargs: Any) -> NoReturn:
        raise TypeError(
            f"VyreBackend is final: {cls.__name__} cannot subclass it. Fix: write the backend "
            "as a vyre_async.abc.Executor and build VyreBackend(YourExecutor()) "
            "(docs/backend-authors.md)"
        )

    def __init__(
        self,
        executor: Executor,
        *,
        pipeline_cache_capacity: int = 256,
        disk_cache: DiskPipelineCache | None = None,
        prefetch: bool = True,
        close_timeout: float = CLOSE_TIMEOUT_S,
    ) -> None:
        if not isinstance(executor, Executor):
            raise InvalidArgument(
                f"VyreBackend needs an Executor, got a {type(executor).__name__}",
                fix="pass an executor, e.g. VyreBackend(ReferenceExecutor()), or get a "
                'backend from the registry: acquire_backend("reference")',
            )
        backend_id = getattr(type(executor), "id", None)
        if not isinstance(backend_id, str) or not backend_id:
            raise TypeError(f"{type(executor).__name__} must set a class attribute id = '<name>'")
        capacity = whole_number(
            "pipeline_cache_capacity",
            pipeline_cache_capacity,
            minimum=1,
            example="pipeline_cache_capacity=256",
        )
        if disk_cache is not None and not _is_disk_cache(disk_cache):
            raise InvalidArgument(
                f"disk_cache must be a DiskPipelineCache or None, got {disk_cache!r}",
                fix="pass disk_cache=DiskPipelineCache() (or a directory: DiskPipelineCache(path))",
            )
        #: Seconds `aclose` waits for work it cannot stop at once.
        self.close_timeout = duration(
            "close_timeout", close_timeout, example=f"close_timeout={CLOSE_TIMEOUT_S}"
        )
        #: The executor that runs this backend's work (`vyre_async.abc.Executor`).
        self.executor = executor
        #: Shape-prediction prefetcher (None when built with ``prefetch=False``).
        self.prefetcher: Prefetcher | None = None
        #: The dispatch front end (`vyre_async._frontend.DispatchFrontEnd`).
        self.front = DispatchFrontEnd(executor, None)
        #: The pipeline store (`vyre_async._store.PipelineStore`).
        self.store = PipelineStore(executor, self.front, capacity, disk_cache, owner=self)
        self.front.lookup = self.store.lookup
        #: The in-memory pipeline LRU (``store.memory``).
        self.pipelines: MemoryPipelineCache[CompiledPipeline] = self.store.memory
        #: Where compiled pipelines persist across processes, or None.
        self.disk_cache = disk_cache
        if prefetch:
            from vyre_async._prefetch import Prefetcher  # (with the first backend, not at import)

            self.prefetcher = self.front.prefetcher = Prefetcher(self.store)

    # Description ----------------------------------------------------------------
    @property
    def id(self) -> str:
        """The backend's id (its executor's): the registry's key, part of every cache identity."""
        return self.executor.id

    @property
    def version(self) -> str:
        """The executor's version (part of every cache identity)."""
        return self.executor.version

    def supported_ops(self) -> frozenset[str]:
        """Return the operations this backend executes (named as in `CORE_OPS`)."""
        return self.executor.supported_ops()

    def capabilities(self) -> BackendCapabilities:
        """Return what the backend supports natively, and its limits."""
        return self.front.capabilities()

    def device_fingerprint(self) -> str:
        """Return what identifies the device and its runtime in cache identities."""
        return self.executor.device_fingerprint()

    def compiler_fingerprint(self) -> str:
        """Return the compiler's name, version and fixed options."""
        return self.executor.compiler_fingerprint()

    def compile_options(self, config: DispatchConfig) -> Mapping[str, object]:
        """Return the executor's options that change generated code for ``config``."""
        return self.executor.compile_options(config)

    def calibrate(self) -> Calibration | None:
        """Measure the costs the launch policies need on this device, now (see
        `vyre_async.calibration_for`, which measures once and caches).

        Returns:
            The measured record, or None where the executor measures nothing.
        """
        return self.executor.calibrate()

    # Lifecycle ------------------------------------------------------------------
    async def prepare(self) -> None:
        """Open devices and warm up (``async with backend:`` calls it).

        Raises:
            BackendClosed: the backend was closed.
        """
        self.check_open()
        await self.executor.open()

    async def flush(self) -> None:
        """Wait, without blocking the event loop, until every submitted dispatch has settled."""
        await self.executor.flush()

    async def aclose(self) -> None:
        """Close the backend: refuse new work, stop the prefetcher, then stop the executor.

        From then on every operation raises `BackendClosed`; calling it again
        does nothing. Dispatches still running are stopped where the executor
        can stop them and fail with `BackendClosed`; what cannot be stopped is
        waited for at most ``close_timeout`` seconds. Await the dispatches you
        need (or `flush`) before closing.
        """
        front = self.front
        if front.closed:
            return
        front.closed = True
        if self.prefetcher is not None:
            self.prefetcher.close()
        with _anyio().CancelScope(shield=True):  # bounded by close_timeout; release even when
            await self.executor.close(self.close_timeout)  # the closing task is cancelled

    async def shutdown(self) -> None:
        """Close the backend: the same as `aclose`."""
        await self.aclose()

    @property
    def closed(self) -> bool:
        """True once the backend was closed (`aclose`, the end of ``async with``)."""
        return self.front.closed

    def check_open(self) -> None:
        """Raise `BackendClosed` if the backend was closed.

        Raises:
            BackendClosed: the backend was closed.
        """
        if self.front.closed:
            self.front.check_open()

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
        """Return True once the device is unusable."""
        return self.executor.device_lost()

    def try_recover(self) -> None:
        """Try to bring a lost device back.

        Raises:
            UnsupportedFeature: the executor cannot recover its device.
        """
        self.executor.try_recover()

    # Resident buffers ------------------------------------------------------------
    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer:
        """Copy ``data`` into a new resident buffer of this backend.

        Raises:
            UnsupportedFeature: the backend has no resident buffers — never a
                silent host fallback.
            InvalidProgram: an unsupported dtype or type, or data over the
                backend's buffer limit.
            InvalidArgument: ``label`` is not a str or None.
            DeviceOutOfMemory: the device (or host) could not hold it.
            BackendClosed: the backend was closed.
        """
        self.check_open()
        return self.executor.upload(data, label=label)

    def alloc(self, dtype: DType | str, count: int, *, label: str | None = None) -> ResidentBuffer:
        """Allocate a zero-filled resident buffer of ``count`` elements.

        Raises:
            UnsupportedFeature: the backend has no resident buffers.
            InvalidArgument: an unknown dtype, a bad count, or a label that is not a str.
            InvalidProgram: a buffer over the limit.
            DeviceOutOfMemory: the device (or host) could not hold it.
            BackendClosed: the backend was closed.
        """
        self.check_open()
        return self.executor.alloc(dtype, count, label=label)

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Copy a resident buffer back to a new host array (after earlier dispatches wrote it).

        Raises:
            UnsupportedFeature: the backend has no resident buffers.
            InvalidProgram: the buffer belongs to another backend instance or was freed.
            InvalidArgument: ``buffer`` is not a `ResidentBuffer`.
            BackendClosed: the backend was closed.
        """
        self.check_open()
        return self.executor.download(buffer)

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer (allowed after close: releasing never fails for that).

        Raises:
            UnsupportedFeature: the backend has no resident buffers.
            InvalidProgram: the buffer belongs to another backend instance or was freed.
            InvalidArgument: ``buffer`` is not a `ResidentBuffer`.
        """
        self.executor.free(buffer)

    # Pipelines --------------------------------------------------------------------
    def pipeline_identity(
        self, program: Program, config: DispatchConfig | None = None
    ) -> PipelineIdentity:
        """Return the cache identity of ``program`` compiled under ``config`` on this backend.

        Raises:
            InvalidProgram: ``program`` is not a valid `Program` (checked first: a
                program nested past the IR's limits is refused, not hashed).
            InvalidArgument: ``config`` is not a `DispatchConfig`.
        """
        if not isinstance(program, Program):
            raise InvalidProgram(
                f"pipeline_identity needs a Program, got {type(program).__name__}",
                fix="pass the Program you dispatch",
            )
        validate_or_raise(program)
        return self.store.identity(program, as_config(config, DEFAULT_CONFIG))

    def compile(self, program: Program, config: DispatchConfig | None = None) -> CompiledPipeline:
        """Return ``program`` compiled for this backend (memory cache → disk cache → build).

        Raises:
            InvalidProgram: the program does not validate.
            InvalidArgument: ``config`` is not a `DispatchConfig`.
            UnsupportedFeature: the program uses an operation this backend lacks.
            KernelCompileFailed: the backend's compiler rejected it.
            BackendClosed: the backend was closed.
        """
        if self.front.closed:
            self.front.check_open()
        cfg = as_config(config, DEFAULT_CONFIG)
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
                backend's ``max_storage_buffer_bytes``, or a config that the
                program cannot run with.
            InvalidArgument: ``config`` is not a `DispatchConfig`.
            UnsupportedFeature: the config or program needs a feature this
                backend lacks (a ``workgroup_override`` over its limits included).
            BackendClosed: the backend was closed.
            DeviceOutOfMemory: the host could not hold a copy of the inputs.
        """
        return self.front.dispatch(program, inputs, config)

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
        state = " closed" if self.front.closed else ""
        return f"<{type(self).__name__} id={self.id!r} version={self.version!r}{state}>"
