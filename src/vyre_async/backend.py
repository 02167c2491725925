"""`VyreBackend`: the abstract base class every concrete driver implements.

A backend supplies an ``id`` and the `VyreBackend.enqueue` hook; everything
else has a conservative default. `VyreBackend.dispatch` is the shared front
half of every dispatch — validate (memoised), compile or fetch the pipeline,
check inputs and config, plan the launch — after which ``enqueue`` only has to
start the work and settle the `PendingDispatch` when it ends.
"""

from __future__ import annotations

import abc
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import anyio
import numpy as np

from vyre_async import telemetry
from vyre_async.annotations import current_dispatch_attributes
from vyre_async.arguments import duration, whole_number
from vyre_async.cache.disk import DiskPipelineCache, PipelineCacheWarning
from vyre_async.cache.identity import PipelineIdentity, pipeline_identity, policy_digest
from vyre_async.cache.memory import CacheStats, MemoryPipelineCache
from vyre_async.capabilities import BackendCapabilities
from vyre_async.config import DispatchConfig
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    InvalidProgram,
    KernelCompileFailed,
    UnsupportedFeature,
)
from vyre_async.execution import ExecutionDecision, annotate_mode
from vyre_async.ir.expr import Atomic, Bin, Un
from vyre_async.ir.ops import AtomicOp, BinOp, UnOp
from vyre_async.ir.program import Program
from vyre_async.ir.types import DType
from vyre_async.ir.validate import validate_or_raise
from vyre_async.ir.walk import iter_exprs
from vyre_async.pending import PendingDispatch
from vyre_async.pipeline import CompiledPipeline, InputLike, Launch
from vyre_async.plan import (
    check_buffer_bytes,
    check_input_count,
    normalize_input,
    plan_dispatch,
)
from vyre_async.prefetch import Prefetcher, PrefetchJob
from vyre_async.resident import ResidentBuffer

if TYPE_CHECKING:
    from vyre_async.calibration import Calibration

__all__ = ["CORE_OPS", "VyreBackend", "ops_used", "poll_until"]

#: Every operation of the core IR, as ``"bin.<op>"``, ``"un.<op>"`` and ``"atomic.<op>"``.
CORE_OPS: frozenset[str] = frozenset(
    [f"bin.{op.value}" for op in BinOp]
    + [f"un.{op.value}" for op in UnOp]
    + [f"atomic.{op.value}" for op in AtomicOp]
)

_DEFAULT_CONFIG = DispatchConfig()
#: Default seconds `VyreBackend.shutdown` waits for work it cannot stop at once.
CLOSE_TIMEOUT_S = 5.0


class _Unstarted:
    """Marks a `_dispatch_pipeline` call whose dispatch trace has not started yet."""


_UNSTARTED = _Unstarted()


def ops_used(program: Program) -> frozenset[str]:
    """Return the operations ``program`` uses, named as in `CORE_OPS` (memoised)."""
    cached = program.memo.get("ops_used")
    if cached is None:
        found: set[str] = set()
        for expr in iter_exprs(program.body):
            if isinstance(expr, Bin):
                found.add(f"bin.{expr.op.value}")
            elif isinstance(expr, Un):
                found.add(f"un.{expr.op.value}")
            elif isinstance(expr, Atomic):
                found.add(f"atomic.{expr.op.value}")
        cached = frozenset(found)
        program.memo["ops_used"] = cached
    return frozenset(cached)


async def poll_until(done: Callable[[], bool]) -> None:
    """Wait, without blocking the event loop, until ``done()`` is true.

    For backends whose work ends on other threads (``flush``; bound it with
    ``anyio.move_on_after`` in a ``shutdown``): polls with a backoff from
    0.2 ms to 10 ms.
    """
    delay = 0.0002
    while not done():
        await anyio.sleep(delay)
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
        if disk_cache is not None and not isinstance(disk_cache, DiskPipelineCache):
            raise InvalidProgram(
                f"disk_cache must be a DiskPipelineCache or None, got {disk_cache!r}",
                fix="pass disk_cache=DiskPipelineCache() (or a directory: DiskPipelineCache(path))",
            )
        #: Seconds `shutdown` waits for work it cannot stop at once.
        self.close_timeout = duration(
            "close_timeout", close_timeout, example=f"close_timeout={CLOSE_TIMEOUT_S}"
        )
        self.pipelines: MemoryPipelineCache[CompiledPipeline] = MemoryPipelineCache(capacity)
        self.disk_cache = disk_cache
        self._identities: OrderedDict[tuple[Program, bytes], PipelineIdentity] = OrderedDict()
        self._identity_lock = threading.Lock()
        self._device_key: str | None = None
        # Compiles in progress by identity digest: a second caller (a dispatch racing
        # the prefetcher, or two tasks) waits for the first instead of compiling again.
        self._compiling: dict[bytes, Future[CompiledPipeline]] = {}
        self._compiling_lock = threading.Lock()
        #: Shape-prediction prefetcher (None when built with ``prefetch=False``).
        self.prefetcher: Prefetcher | None = Prefetcher(self) if prefetch else None
        self._closed = False
        # capabilities() as first read: the record is fixed for an instance's lifetime.
        self._reported: BackendCapabilities | None = None

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
        with anyio.CancelScope(shield=True):  # bounded by close_timeout; release even when
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
        """Return the cache identity of ``program`` compiled under ``config`` on this backend."""
        cfg = config or _DEFAULT_CONFIG
        memo_key = (program, policy_digest(cfg))
        with self._identity_lock:
            identity = self._identities.get(memo_key)
            if identity is not None:
                self._identities.move_to_end(memo_key)
                return identity
        if self._device_key is None:
            self._device_key = self.device_fingerprint()
        identity = pipeline_identity(
            program,
            cfg,
            backend_id=self.id,
            backend_version=self.version,
            device_fingerprint=self._device_key,
            compiler=self.compiler_fingerprint(),
            compile_options=self.compile_options(cfg),
        )
        with self._identity_lock:
            self._identities[memo_key] = identity
            while len(self._identities) > 4 * self.pipelines.capacity:
                self._identities.popitem(last=False)
        return identity

    def compile(self, program: Program, config: DispatchConfig | None = None) -> CompiledPipeline:
        """Return ``program`` compiled for this backend (memory cache → disk cache → build).

        Raises:
            InvalidProgram: the program does not validate, or ``config`` is not a
                `DispatchConfig`.
            UnsupportedFeature: the program uses an operation this backend lacks.
            KernelCompileFailed: the backend's compiler rejected it.
            BackendClosed: the backend was closed.
        """
        cfg = _as_config(config, _DEFAULT_CONFIG)
        pipeline, _ = self._pipeline_for(program, cfg)
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
        return await anyio.to_thread.run_sync(self.compile, program, config)

    def cache_stats(self) -> CacheStats:
        """Return the in-memory pipeline cache counters."""
        return self.pipelines.stats()

    def _pipeline_for(
        self, program: Program, config: DispatchConfig
    ) -> tuple[CompiledPipeline, bool]:
        if self._closed:
            self.check_open()
        if not isinstance(program, Program):
            raise InvalidProgram(
                f"dispatch expects a Program, got {type(program).__name__}",
                fix="build the kernel with vyre_async.ir.Program(...)",
            )
        validate_or_raise(program)
        missing = ops_used(program) - self.supported_ops()
        if missing:
            raise UnsupportedFeature(
                f"backend {self.id!r} does not implement {', '.join(sorted(missing))}",
                fix="rewrite the program without these operations or use another backend",
                feature=sorted(missing),
            )
        identity = self.pipeline_identity(program, config)
        cached = self.pipelines.get(identity)
        if cached is not None:
            return cached, True
        return self._compile_once(program, config, identity), False

    def _compile_once(
        self, program: Program, config: DispatchConfig, identity: PipelineIdentity
    ) -> CompiledPipeline:
        """Load or build ``identity`` and cache it; concurrent callers share one compile."""
        digest = identity.digest
        with self._compiling_lock:
            ready = self.pipelines.peek(identity)
            if ready is not None:  # finished while this caller was looking
                return ready
            running = self._compiling.get(digest)
            if running is None:
                mine: Future[CompiledPipeline] = Future()
                self._compiling[digest] = mine
        if running is not None:
            return running.result()  # the first caller's pipeline, or its error
        try:
            pipeline = self._load_or_build(program, config, identity)
            self.pipelines.put(identity, pipeline)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(pipeline)
            return pipeline
        finally:
            with self._compiling_lock:
                del self._compiling[digest]

    def _load_or_build(
        self, program: Program, config: DispatchConfig, identity: PipelineIdentity
    ) -> CompiledPipeline:
        def make(native: Any, compile_s: float, source: str) -> CompiledPipeline:
            return CompiledPipeline(
                backend=self,
                program=program,
                config=config,
                identity=identity,
                native=native,
                compile_s=compile_s,
                source=source,
            )

        if self.disk_cache is not None:
            payload = self.disk_cache.get(identity.hex)
            if payload is not None:
                try:
                    return make(self.load_pipeline(payload, program, config), 0.0, "disk")
                except Exception as exc:  # a bad entry is a miss, then overwritten
                    warnings.warn(
                        f"pipeline cache entry {identity.hex} could not be loaded by backend "
                        f"{self.id!r} ({type(exc).__name__}: {exc}); recompiling",
                        PipelineCacheWarning,
                        stacklevel=2,
                    )
        start = time.perf_counter()
        try:
            native = self.build_pipeline(program, config)
        except BackendError:
            raise
        except Exception as exc:
            raise KernelCompileFailed(
                f"backend {self.id!r} failed to compile {program.op_id or 'a program'}: "
                f"{type(exc).__name__}: {exc}",
                fix="report this with the program's wire bytes (program.to_wire())",
            ) from exc
        compile_s = time.perf_counter() - start
        if self.disk_cache is not None:
            payload = self.serialize_pipeline(native)
            if payload is not None:
                self.disk_cache.put(identity.hex, payload)
        return make(native, compile_s, "compiled")

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
            cfg = _as_config(config, _DEFAULT_CONFIG)
            started, started_ns = time.perf_counter(), time.time_ns()
            pipeline, hit = self._pipeline_for(program, cfg)
            compile_s = 0.0 if hit else time.perf_counter() - started
            compiled = None if hit else (started_ns, time.time_ns())
            return self._dispatch_pipeline(
                pipeline,
                inputs,
                cfg,
                cache_hit=hit,
                compile_s=compile_s,
                trace=trace,
                compile_phase=compiled,
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
        """Dispatch and block for the outputs: ``dispatch(...).result()`` (outside event loops)."""
        return self.dispatch(program, inputs, config).result()

    def _dispatch_pipeline(
        self,
        pipeline: CompiledPipeline,
        inputs: Sequence[InputLike],
        config: DispatchConfig | None,
        *,
        cache_hit: bool,
        compile_s: float = 0.0,
        trace: telemetry.DispatchTrace | _Unstarted | None = _UNSTARTED,
        compile_phase: tuple[int, int] | None = None,
        program: Program | None = None,
        called: float | None = None,
        batch: list[tuple[Launch, PrefetchJob | None]] | None = None,
    ) -> PendingDispatch:
        """Plan and enqueue one dispatch of ``program`` on a compiled ``pipeline``.

        ``program`` may differ from ``pipeline.program`` in buffer counts only
        (they share a kernel digest); the launch is planned with ``program``.
        With ``batch``, the planned launch (and its prefetch job) is appended
        there instead of being enqueued (`CompiledPipeline.dispatch_batch`).
        """
        if isinstance(trace, _Unstarted):  # pipeline.dispatch(): the span starts here
            trace = telemetry.start_dispatch()
            try:
                return self._dispatch_pipeline(
                    pipeline,
                    inputs,
                    config,
                    cache_hit=cache_hit,
                    compile_s=compile_s,
                    trace=trace,
                    compile_phase=compile_phase,
                    program=program,
                    called=called if called is not None else time.monotonic(),
                    batch=batch,
                )
            except BaseException as exc:
                telemetry.fail_before_launch(trace, exc, self.id, program or pipeline.program)
                raise
        if self._closed:
            self.check_open()
        cfg = _as_config(config, pipeline.config)
        if cfg is not pipeline.config and policy_digest(cfg) != policy_digest(pipeline.config):
            raise InvalidProgram(
                "this pipeline was compiled for another ulp_budget/workgroup_override",
                fix="compile a pipeline for this config: backend.compile(program, config)",
            )
        if cfg.speculation == "force" or cfg.cooperative or cfg.persistent_thread == "force":
            self._check_config(cfg)
        program = program or pipeline.program
        check_input_count(program, inputs)
        limit = (self._reported or self._capabilities_once()).max_storage_buffer_bytes
        if limit and program.memo.get("storage_checked") != limit:
            self._check_static_sizes(program, limit)
        prepared = tuple(
            self._prepare_input(decl, value, limit)
            for decl, value in zip(program.inputs, inputs, strict=True)
        )
        plan = plan_dispatch(
            program,
            [item.count if isinstance(item, ResidentBuffer) else item.size for item in prepared],
            grid_override=cfg.grid_override,
            workgroup_override=cfg.workgroup_override,
        )
        if cfg.workgroup_override is not None:
            self._check_workgroup(plan.geometry.workgroup)
        if cfg.max_output_bytes is not None and plan.bytes_out > cfg.max_output_bytes:
            raise InvalidProgram(
                f"the outputs would take {plan.bytes_out} bytes, over max_output_bytes="
                f"{cfg.max_output_bytes}",
                fix="raise DispatchConfig.max_output_bytes or dispatch less data",
            )
        pending, completer = PendingDispatch.create(
            timeout=cfg.timeout, label=cfg.label, created=called
        )
        pending.context["cache_hit"] = cache_hit
        extra = current_dispatch_attributes()  # arm scheduler / batch verdicts
        if extra is not None:
            pending.context["attributes"] = dict(extra)
        if compile_phase is not None:
            completer.record_phase("vyre.compile", *compile_phase)
        launch = Launch(
            pipeline=pipeline,
            plan=plan,
            inputs=prepared,
            config=cfg,
            pending=pending,
            completer=completer,
            compile_s=compile_s,
        )
        telemetry.attach(trace, launch, cache_hit=cache_hit)
        prefetcher = self.prefetcher if cfg.speculation != "disable" else None
        if prefetcher is None:
            if batch is not None:
                batch.append((launch, None))
                return pending
            return self.enqueue(launch)
        # Shape prediction: score and record before the enqueue (the span may end
        # inside it), start a predicted compile after it (while the device runs).
        job = prefetcher.observe(pipeline, plan.geometry, cache_hit, pending)
        if batch is not None:  # dispatch_batch enqueues (and schedules) once all are planned
            batch.append((launch, job))
            return pending
        result = self.enqueue(launch)
        if job is not None:
            prefetcher.schedule(job)
        return result

    def _prepare_input(self, decl: Any, value: object, limit: int) -> np.ndarray | ResidentBuffer:
        """Check one input (and copy a host one); ``limit``: largest buffer in bytes, 0 = none."""
        if isinstance(value, ResidentBuffer):
            value.native(self)  # ownership (this instance) and liveness
            if value.dtype is not decl.dtype:
                raise InvalidProgram(
                    f"resident buffer #{value.id} holds {value.dtype.value}; buffer "
                    f"{decl.name!r} is {decl.dtype.value}",
                    fix="upload the data with the buffer's dtype",
                )
            if decl.count and value.count != decl.count:
                raise InvalidProgram(
                    f"resident buffer #{value.id} has {value.count} elements; buffer "
                    f"{decl.name!r} declares count={decl.count}",
                    fix=f"pass a buffer of exactly {decl.count} elements",
                )
            return value
        if limit:  # checked before anything is copied: a huge (broadcast) input fails fast
            if isinstance(value, np.ndarray):
                nbytes = 4 * value.size
            elif isinstance(value, bytes | bytearray | memoryview):
                nbytes = memoryview(value).nbytes
            else:
                nbytes = 0  # normalize_input says what is wrong with it
            if nbytes > limit:  # compared here: a call per input would tax every dispatch
                check_buffer_bytes(nbytes, limit, f"the input for buffer {decl.name!r}")
        return normalize_input(decl, value)

    def _capabilities_once(self) -> BackendCapabilities:
        """Return `capabilities`, read once per instance (the dispatch checks use its limits)."""
        if self._reported is None:
            self._reported = self.capabilities()
        return self._reported

    def _check_static_sizes(self, program: Program, limit: int) -> None:
        """Refuse buffers whose declared size is over ``limit`` bytes (memoised on the program)."""
        for decl in program.buffers:
            check_buffer_bytes(4 * decl.count, limit, f"buffer {decl.name!r} as declared")
        program.memo["storage_checked"] = limit

    def _check_workgroup(self, workgroup: tuple[int, int, int]) -> None:
        """Refuse a workgroup over the backend's reported limits (not reported: IR limits only)."""
        caps = self._capabilities_once()
        per_axis, lanes = caps.max_workgroup_size, caps.max_workgroup_lanes
        if lanes <= 1:  # the conservative default record: nothing reported
            return
        total = workgroup[0] * workgroup[1] * workgroup[2]
        if total > lanes or any(w > m for w, m in zip(workgroup, per_axis, strict=True)):
            raise UnsupportedFeature(
                f"workgroup_override {workgroup} exceeds backend {self.id!r}'s limits "
                f"(at most {per_axis} per axis, {lanes} lanes)",
                fix="choose a workgroup within backend.capabilities().max_workgroup_size",
                feature="workgroup size",
            )

    def _check_config(self, config: DispatchConfig) -> None:
        """Refuse what a config forces and this backend lacks (called only when one is forced)."""
        if config.speculation == "force" and self.prefetcher is None:
            raise UnsupportedFeature(
                f"backend {self.id!r} was built with prefetch=False, so it cannot honour "
                'DispatchConfig(speculation="force")',
                fix='use speculation="auto", or build the backend with prefetch=True',
                feature="speculation",
            )
        caps = self._capabilities_once()
        if config.cooperative and not caps.grid_sync:
            raise UnsupportedFeature(
                f"backend {self.id!r} cannot run cooperative (grid-sync) launches",
                fix="set DispatchConfig(cooperative=False) or use a backend with grid_sync",
                feature="grid_sync",
            )
        if config.persistent_thread == "force" and not caps.persistent_threads:
            raise UnsupportedFeature(
                f"backend {self.id!r} has no persistent-thread execution",
                fix='use DispatchConfig(persistent_thread="auto")',
                feature="persistent_threads",
            )

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} id={self.id!r} version={self.version!r}{state}>"


def _as_config(config: object, default: DispatchConfig) -> DispatchConfig:
    """Return ``config`` (``default`` for None), refusing anything that is not a config."""
    if config is None:
        return default
    if isinstance(config, DispatchConfig):
        return config
    raise InvalidProgram(
        f"config must be a DispatchConfig or None, got a {type(config).__name__}",
        fix="pass DispatchConfig(...), e.g. DispatchConfig(timeout=1.0)",
    )
