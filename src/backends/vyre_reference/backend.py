"""`ReferenceExecutor`: the numpy engine behind the driver contract (id ``"reference"``).

`reference_backend()` builds ``VyreBackend(ReferenceExecutor(...))``, as the
registry does.

Tiny dispatches (estimated below the cost of a thread hand-off) run inline in
``dispatch()``; everything else runs on a bounded pool of daemon worker threads
(2 by default: numpy holds the GIL between operations and the event loop must
stay responsive). The estimate cannot be fooled into running unbounded work
inline: every loop iteration, statement and expression node costs something,
and a loop whose trip count is not a literal always goes to the pool.

Closing (``backend.aclose()``, the end of ``async with``) stops running
dispatches at the engine's next safe point and fails them with `BackendClosed`; interpreter exit
does the same, so a runaway kernel never keeps the process alive. Resident
buffers are host arrays owned by the backend instance that made them.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import math
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import anyio
import numpy as np

from vyre_async.abc import (
    DRIVER_VERSION,
    BackendCapabilities,
    BindingPlan,
    DispatchConfig,
    Executor,
    Launch,
    ResidentBuffer,
    alloc_request,
    check_buffer,
    poll_until,
    upload_request,
    whole_number,
)
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    DispatchFailed,
    DispatchTimeout,
    InvalidProgram,
    host_out_of_memory,
)
from vyre_async.ir.expr import Atomic, Const
from vyre_async.ir.limits import MAX_WORKGROUP_BYTES, MAX_WORKGROUP_LANES
from vyre_async.ir.ops import CORE_OPS
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Block, If, Loop, Stmt
from vyre_async.ir.types import Access, DType
from vyre_async.ir.walk import child_exprs, stmt_exprs
from vyre_reference.cancel import Cancelled
from vyre_reference.compile import compile_program
from vyre_reference.engine import run_plan
from vyre_reference.workers import WorkerPool

if TYPE_CHECKING:
    from vyre_async.abc import Calibration, VyreBackend

__all__ = ["ReferenceExecutor", "reference_backend"]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.reference")
#: Numbers calibrate()'s probe programs: each call compiles programs never seen before.
_CALIBRATIONS = itertools.count()

#: Estimated cost (ns) of handing a dispatch to a worker thread and waking the loop.
HANDOFF_NS = 60_000
#: How often a worker waiting on an earlier dispatch checks for a stop request.
_ORDER_POLL_S = 0.005
#: Cost model of the engine (measured on numpy 2, rounded up): per statement
#: executed, per expression node evaluated, per loop iteration (even an empty
#: one), per lane-statement, and per lane of an atomic (colliding lanes retry).
_STMT_NS = 4_000
_EXPR_NS = 1_000
_ITERATION_NS = 1_000
_LANE_STMT_NS = 2
_ATOMIC_LANE_NS = 200
#: ... and per byte copied or zero-filled (inputs, outputs, WORKGROUP buffers).
_BYTE_NS = 0.25
#: Most lanes in one launch: the engine holds arrays of one value per lane.
MAX_LANES = 1 << 30
#: Largest buffer the engine takes (u32 indices address it).
_MAX_BUFFER_BYTES = (1 << 32) - 4
#: Seconds interpreter exit waits for running dispatches to stop.
_EXIT_TIMEOUT_S = 2.0


def reference_backend(
    *, max_workers: int = 2, inline_ns: int = HANDOFF_NS, **kwargs: Any
) -> VyreBackend:
    """Build the ``reference`` backend: ``VyreBackend(ReferenceExecutor(...), **kwargs)``.

    The registry's factory.

    Args:
        max_workers: Worker threads for dispatches too large to run inline (>= 1).
        inline_ns: Dispatches estimated below this many nanoseconds run inside
            ``dispatch()`` itself (0 disables inline execution).
        **kwargs: Passed to `VyreBackend` (``pipeline_cache_capacity``,
            ``disk_cache``, ``prefetch``, ``close_timeout``: how long closing
            waits for running dispatches to reach a safe point; worker threads
            are daemons and never keep the process alive).

    Raises:
        InvalidArgument: an argument is out of range.
    """
    from vyre_async.abc import VyreBackend

    return VyreBackend(ReferenceExecutor(max_workers=max_workers, inline_ns=inline_ns), **kwargs)


class ReferenceExecutor(Executor):
    """The exact oracle backend's executor, on numpy (CPU).

    Args:
        max_workers: Worker threads for dispatches too large to run inline (>= 1).
        inline_ns: Dispatches estimated below this many nanoseconds run inside
            ``dispatch()`` itself (0 disables inline execution).

    Raises:
        InvalidArgument: an argument is out of range.
    """

    id = "reference"
    version = DRIVER_VERSION

    def __init__(self, *, max_workers: int = 2, inline_ns: int = HANDOFF_NS) -> None:
        self.max_workers = whole_number(
            "max_workers", max_workers, minimum=1, example="max_workers=2"
        )
        self.inline_ns = whole_number("inline_ns", inline_ns, example=f"inline_ns={HANDOFF_NS}")
        self._closed = False  # set by close() (and interpreter exit): workers stop
        self._pool: WorkerPool | None = None
        self._pool_lock = threading.Lock()
        self._running: set[_Job] = set()  # queued or running on the pool
        self._resident: dict[int, ResidentBuffer] = {}
        self._orders: dict[int, _BufferOrder] = {}  # resident buffer id -> its last users
        self._order_lock = threading.Lock()

    # Description ----------------------------------------------------------------
    def capabilities(self) -> BackendCapabilities:
        """Report the engine's limits and what it runs natively.

        ``grid_sync`` is True: the engine runs every lane of the grid in lockstep,
        so a `vyre_async.ir.GridBarrier` holds within one run. Every other
        native-feature flag is False (nothing is emulated).
        """
        return BackendCapabilities(
            grid_sync=True,
            max_workgroup_size=(MAX_WORKGROUP_LANES, MAX_WORKGROUP_LANES, 64),
            max_workgroup_lanes=MAX_WORKGROUP_LANES,
            max_storage_buffer_bytes=_MAX_BUFFER_BYTES,
            max_workgroup_memory_bytes=MAX_WORKGROUP_BYTES,
            device_name="numpy reference (CPU)",
            ordered_resident_buffers=True,  # workers wait for each buffer's earlier users
        )

    def supported_ops(self) -> frozenset[str]:
        """Every operation of `CORE_OPS`, the grid-wide barrier included."""
        return CORE_OPS

    def device_fingerprint(self) -> str:
        """The numpy version: it decides the exact results of transcendental ops."""
        return f"numpy-{np.__version__}"

    def calibrate(self) -> Calibration:
        """Measure the engine's per-dispatch overhead, compile cost and host copy bandwidth.

        Takes well under a second. The engine has no graph replay and no
        persistent kernels, so those costs are not measured (None). Use
        `vyre_async.calibration_for(backend, measure=True)` to
        measure once and cache the record on disk.
        """
        from vyre_async.abc import elementwise_xor, measure_host_costs

        probe = reference_backend(max_workers=1, inline_ns=HANDOFF_NS, prefetch=False)
        xor = elementwise_xor(1024)

        def compile_fresh(i: int) -> None:  # a new program (the engine memoises plans), new
            # on every call too: a second calibrate() in a process must not time cache hits
            name = f"calibrate.{next(_CALIBRATIONS)}.{i}"
            compile_program(Program(xor.buffers, xor.workgroup_size, xor.body, op_id=name))

        return measure_host_costs(self, probe, compile_once=compile_fresh, copy_bytes=4 << 20)

    # Pipelines --------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        """Compile the program into the engine's executable plan."""
        return compile_program(program)

    # Dispatch ---------------------------------------------------------------------
    def plan_shape(self, native: Any, plan: BindingPlan, config: DispatchConfig) -> _Shape:
        """Decide once per launch shape whether it runs inline (tiny) or on the pool.

        Raises:
            InvalidProgram: the launch has more than `MAX_LANES` lanes.
        """
        lanes = plan.geometry.lanes
        if lanes > MAX_LANES:
            raise InvalidProgram(
                f"the launch has {lanes} lanes (grid {plan.geometry.grid} x workgroup "
                f"{plan.geometry.workgroup}); the reference engine holds one value "
                f"per lane in host memory and takes at most {MAX_LANES}",
                fix="use a smaller grid_override, or split the work into several dispatches",
            )
        return _Shape(
            tiny=self._estimate_ns(plan, config, lanes) < self.inline_ns,
            iterations=config.iterations,
        )

    def _estimate_ns(self, plan: BindingPlan, config: DispatchConfig, lanes: int) -> float:
        """Upper-bound estimate of the launch's engine time (inf when not bounded statically).

        Statements, expression nodes and loop iterations (`_static_cost`), per
        lane, plus the bytes the engine copies or zero-fills: inputs, outputs,
        resident write-backs and every workgroup's WORKGROUP buffers.
        """
        program = plan.program
        cost = program.memo.get("reference.cost")
        if cost is None:
            fixed_ns, lane_steps, atomics = _static_cost(program.body)
            shared = 4 * sum(d.count for d in program.buffers if d.access is Access.WORKGROUP)
            per_lane_ns = lane_steps * _LANE_STMT_NS + atomics * _ATOMIC_LANE_NS
            cost = (fixed_ns, per_lane_ns, shared * _BYTE_NS)
            program.memo["reference.cost"] = cost
        fixed_ns, per_lane_ns, shared_ns = cost
        copied_ns = (plan.bytes_in + plan.bytes_out) * _BYTE_NS
        if not lanes:
            return copied_ns
        per_launch = fixed_ns + lanes * per_lane_ns
        if shared_ns:
            per_launch += plan.geometry.workgroups * shared_ns
        return copied_ns + config.iterations * per_launch

    def enqueue(self, launch: Launch) -> None:
        """Run the launch inline when tiny and unblocked, else on the worker pool.

        Dispatches that share a resident buffer take effect in submission order:
        one that writes it waits for earlier readers and writers, one that reads
        it waits for earlier writers (in the worker, never in the event loop).

        Raises:
            BackendClosed: the executor was closed.
            DispatchFailed: no worker thread could be started.
        """
        if self._closed:
            self._check_open()
        shape = launch.shape
        if shape is None:  # (a launch built by hand, not by the driver)
            shape = self.plan_shape(launch.pipeline.native, launch.plan, launch.config)
        tiny = shape.tiny
        inputs = launch.inputs
        if not launch.resident:
            if tiny:
                self._run_inline(launch, shape.iterations)
            else:
                self._submit(_Job(self, launch, list(inputs), (), None))  # type: ignore[arg-type]
            return
        natives = [
            item.native(self) if isinstance(item, ResidentBuffer) else item for item in inputs
        ]
        # Registering and queueing happen under one lock, so the pool (FIFO) never
        # holds a dispatch ahead of an earlier one it waits for.
        with self._order_lock:
            waits, done = self._order(launch)
            if tiny and not waits:
                job = None
            else:
                job = _Job(self, launch, natives, waits, done)
                self._submit(job)
        if job is None:
            self._run(launch, None, natives, (), done)

    def _run_inline(self, launch: Launch, iterations: int) -> None:
        """Run a tiny launch without resident buffers here and now, and settle it.

        Nothing else can want to stop it while it runs (the caller is running
        it), so the engine checks for a stop only when the dispatch has a deadline.
        """
        completer = launch.completer
        completer.mark_started()
        phases = completer.wants_phases
        started_ns = time.time_ns() if phases else 0
        start = time.perf_counter()
        try:
            outputs = run_plan(
                launch.plan,
                launch.inputs,  # type: ignore[arg-type]  # host arrays only (checked)
                compiled=launch.pipeline.native,
                fixpoint_iterations=iterations,
                cancel=None if launch.config.timeout is None else completer.stop_requested,
            )
        except Exception as exc:
            completer.fail(self._failure(launch, exc))
            return
        device_s = time.perf_counter() - start
        if phases:
            completer.record_phase("vyre.launch", started_ns, time.time_ns())
        completer.resolve(outputs, device_s=device_s, compile_s=launch.compile_s)

    def _submit(self, job: _Job) -> None:
        with self._pool_lock:
            if not self._closed:
                if self._pool is None:
                    self._pool = pool = WorkerPool(self.max_workers, name="vyre-reference")
                    _live.add(self)
                    weakref.finalize(self, pool.close)  # an unclosed backend's idle threads end
                self._running.add(job)
                try:
                    self._pool.submit(job)
                    return
                except RuntimeError as exc:
                    self._running.discard(job)
                    failure: BaseException = DispatchFailed(
                        f"the reference backend could not start a worker thread ({exc})",
                        fix="lower the number of threads in the process, or free memory",
                    )
                    failure.__cause__ = exc
            else:
                failure = BackendClosed(
                    f"backend {self.id!r} was closed; it runs nothing more", backend_id=self.id
                )
        if job.done is not None:  # later users of its buffers must not wait on it
            job.done.set()  # (dispatch() raises, so nobody holds its pending)
        raise failure

    def _order(self, launch: Launch) -> tuple[tuple[threading.Event, ...], threading.Event]:
        """Register ``launch`` on its resident buffers; return what it waits for, and its done.

        Called with ``_order_lock`` held.
        """
        written = {d.name for d in launch.plan.inputs if d.access is Access.READ_WRITE}
        uses: dict[int, bool] = {}
        for decl, item in zip(launch.plan.inputs, launch.inputs, strict=True):
            if isinstance(item, ResidentBuffer):
                uses[item.id] = uses.get(item.id, False) or decl.name in written
        done = threading.Event()
        waits: list[threading.Event] = []
        for buffer_id, writes in uses.items():
            order = self._orders.setdefault(buffer_id, _BufferOrder())
            if order.last_write is not None and not order.last_write.is_set():
                waits.append(order.last_write)
            if writes:
                waits += [e for e in order.readers if not e.is_set()]
                order.last_write, order.readers = done, []
            else:
                order.readers = [e for e in order.readers if not e.is_set()]
                order.readers.append(done)
        return tuple(waits), done

    def run_job(self, job: _Job) -> None:
        """Run a job the worker pool took (called by the pool through `_Job.run`)."""
        try:
            self._run(job.launch, job.queued_ns, job.natives, job.waits, job.done)
        finally:
            self._forget(job)

    def drop_job(self, job: _Job) -> None:
        """Fail a queued job that will never run (the pool was stopped)."""
        if job.done is not None:  # first, as in _run: later users (and its own
            job.done.set()  # done-callbacks) must not wait on it
        try:
            job.launch.completer.fail(self._stopped(job.launch))
        finally:
            self._forget(job)

    def _forget(self, job: _Job) -> None:
        with self._pool_lock:
            self._running.discard(job)

    def _run(
        self,
        launch: Launch,
        queued_ns: int | None,
        natives: list[np.ndarray],
        waits: tuple[threading.Event, ...],
        done: threading.Event | None,
    ) -> None:
        """Execute one launch (inline, or on a worker when ``queued_ns`` is given) and settle it.

        A launch that fails is settled only after its done event is set, like
        one that succeeds: its done-callbacks may use its resident buffers
        (``download``) without waiting on themselves.
        """
        error: BackendError | None = None
        try:
            error = self._execute(launch, queued_ns, natives, waits, done)
        except Exception as exc:  # outside the engine's own handling (e.g. settling)
            error = self._failure(launch, exc)
        finally:
            if done is not None:
                # A dispatch that stopped early (timeout) still ends after the ones it
                # waited for: later users of its buffers rely on its done event alone.
                # They are ahead of it in the FIFO pool, so this always returns.
                for event in waits:
                    event.wait()
                done.set()
        if error is not None:
            launch.completer.fail(error)  # dropped if already settled (a timeout)

    def _execute(
        self,
        launch: Launch,
        queued_ns: int | None,
        natives: list[np.ndarray],
        waits: tuple[threading.Event, ...],
        done: threading.Event | None,
    ) -> BackendError | None:
        """Run the launch; resolve it on success (after ``done``), else return its error."""
        completer = launch.completer
        for event in waits:  # earlier dispatches on the same resident buffers
            while not event.wait(_ORDER_POLL_S):
                if completer.should_stop():
                    break
        if completer.should_stop():
            return self._stopped(launch)  # nothing runs
        completer.mark_started()
        phases = completer.wants_phases  # (only a recorded span shows them)
        started_ns = time.time_ns() if phases else 0
        if phases and queued_ns is not None:
            completer.record_phase("vyre.wait", queued_ns, started_ns)
        start = time.perf_counter()
        try:
            arrays = [
                np.array(native, copy=True) if isinstance(item, ResidentBuffer) else native
                for item, native in zip(launch.inputs, natives, strict=True)
            ]
            outputs = run_plan(
                launch.plan,
                arrays,
                compiled=launch.pipeline.native,
                fixpoint_iterations=launch.config.iterations,
                cancel=completer.stop_requested,
            )
            self._write_back(launch, natives, outputs)
        except Exception as exc:
            return self._failure(launch, exc)
        if done is not None:  # its buffers are final: later users may start (and a
            done.set()  # done-callback may download them) before it resolves
        device_s = time.perf_counter() - start
        if phases:
            completer.record_phase("vyre.launch", started_ns, time.time_ns())
        completer.resolve(outputs, device_s=device_s, compile_s=launch.compile_s)
        return None

    def _failure(self, launch: Launch, exc: Exception) -> BackendError:
        """Return the error a launch that raised ``exc`` settles with."""
        if isinstance(exc, Cancelled):
            return self._stopped(launch)
        if isinstance(exc, BackendError):
            return exc
        what = launch.plan.program.op_id or "a program"
        if isinstance(exc, MemoryError):
            error: BackendError = host_out_of_memory(
                math.inf, f"running {what} over {launch.plan.geometry.lanes} lanes"
            )
        else:
            error = DispatchFailed(
                f"the reference engine failed on {what}: {type(exc).__name__}: {exc}",
                fix="this is a bug in vyre_reference; report it with the program's wire bytes",
            )
        error.__cause__ = exc
        return error

    def _stopped(self, launch: Launch) -> BackendError:
        """The error of a launch stopped at a safe point: closed backend, else its timeout."""
        if self._closed:
            return BackendClosed(
                f"{_called(launch)} was stopped: "
                "the reference backend was closed while it was queued or running",
                fix="await the dispatches you need (or backend.flush()) before closing the backend",
            )
        return _timeout(launch)

    def _write_back(
        self, launch: Launch, natives: list[np.ndarray], outputs: list[np.ndarray]
    ) -> None:
        """Update resident READ_WRITE inputs in place with their final contents."""
        names = [d.name for d in launch.plan.inputs]
        by_name = dict(zip(names, zip(launch.inputs, natives, strict=True), strict=True))
        for decl, output in zip(launch.plan.outputs, outputs, strict=True):
            item, native = by_name.get(decl.name, (None, None))
            if decl.access is Access.READ_WRITE and isinstance(item, ResidentBuffer):
                assert native is not None
                native[...] = output

    # Resident buffers -------------------------------------------------------------
    def upload(self, data: np.ndarray | bytes, *, label: str | None = None) -> ResidentBuffer:
        """Copy ``data`` (a numpy array, or bytes holding u32 words) into a resident buffer.

        Raises:
            InvalidProgram: an unsupported dtype or type, or data over 4 GiB.
            InvalidArgument: ``label`` is not a str or None.
            DeviceOutOfMemory: the host could not hold the copy.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        dtype, array = upload_request(data, label=label, max_bytes=_MAX_BUFFER_BYTES)
        return self._keep(dtype, array, label)

    def alloc(self, dtype: DType | str, count: int, *, label: str | None = None) -> ResidentBuffer:
        """Allocate a zero-filled resident buffer of ``count`` elements.

        Raises:
            InvalidArgument: an unknown dtype, a count that is not an int >= 0, or
                a label that is not a str.
            InvalidProgram: a buffer over 4 GiB.
            DeviceOutOfMemory: the host could not allocate it.
            BackendClosed: the backend was closed.
        """
        self._check_open()
        kind, elements = alloc_request(dtype, count, max_bytes=_MAX_BUFFER_BYTES, label=label)
        try:
            array = np.zeros(elements, kind.numpy)
        except MemoryError as exc:
            raise host_out_of_memory(4 * elements, "allocating a resident buffer") from exc
        return self._keep(kind, array, label)

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Return a copy of a resident buffer's contents (after earlier dispatches wrote it).

        Blocks the calling thread until the last dispatch submitted to write the
        buffer has written it (a dispatch's done-callbacks already see its writes).

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was freed.
            InvalidArgument: ``buffer`` is not a `ResidentBuffer`.
            BackendClosed: the backend was closed (also while waiting).
        """
        self._check_open()
        native = check_buffer(buffer, "download").native(self)
        with self._order_lock:
            order = self._orders.get(buffer.id)
            last_write = None if order is None else order.last_write
        if last_write is not None:
            while not last_write.wait(_ORDER_POLL_S):
                self._check_open()
        return np.array(native, copy=True)

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer (freeing twice is an error; allowed after close).

        Dispatches already queued with it keep its memory and run as submitted.

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was freed.
            InvalidArgument: ``buffer`` is not a `ResidentBuffer`.
        """
        check_buffer(buffer, "free").native(self)
        buffer.release(self)
        self._resident.pop(buffer.id, None)
        with self._order_lock:
            self._orders.pop(buffer.id, None)

    def _keep(self, dtype: DType, array: np.ndarray, label: str | None) -> ResidentBuffer:
        buffer = ResidentBuffer(
            owner=self, dtype=dtype, count=array.size, native=array, label=label
        )
        self._resident[buffer.id] = buffer
        return buffer

    @property
    def resident_count(self) -> int:
        """Number of live resident buffers."""
        return len(self._resident)

    @property
    def in_flight(self) -> int:
        """Dispatches queued or running on the worker pool."""
        return len(self._running)

    # Lifecycle --------------------------------------------------------------------
    async def flush(self) -> None:
        """Wait (without blocking the loop) until every queued dispatch has run."""
        await poll_until(lambda: not self._running)

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109 - the contract's bound
        """Stop: refuse new work, stop queued and running dispatches, release the workers.

        Running dispatches stop at the engine's next safe point (between
        statements and loop iterations) and fail with `BackendClosed`, as do
        queued ones. Waits at most ``timeout`` seconds (without blocking the
        event loop); a dispatch still running after that is failed with
        `BackendClosed` and left to its daemon thread, with a warning logged.
        """
        pool = self._stop_all()
        if pool is None:
            return
        with anyio.move_on_after(timeout):
            await poll_until(lambda: not self._running)
        self._abandon(timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed(
                f"backend {self.id!r} was closed; it runs nothing more", backend_id=self.id
            )

    def stop_at_exit(self) -> WorkerPool | None:
        """Interpreter exit: stop all work as `aclose` would; return the pool to join."""
        return self._stop_all()

    def abandon_at_exit(self, waited: float) -> None:
        """Interpreter exit: fail what still runs after ``waited`` seconds."""
        self._abandon(waited)

    def _stop_all(self) -> WorkerPool | None:
        """Mark closed, drop queued jobs and ask running ones to stop; return the pool."""
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
            running = list(self._running)
        if pool is None:
            return None
        for job in pool.close():
            job.drop()
        for job in running:
            job.launch.completer.stop_requested.set()
        return pool

    def _abandon(self, waited: float) -> None:
        """Fail what is still running after ``waited`` seconds; its daemon thread is left."""
        with self._pool_lock:
            stuck = list(self._running)
        for job in stuck:
            job.launch.completer.fail(self._stopped(job.launch))
        # (with nothing stuck, a worker not ended yet is an idle daemon on its way out)
        if stuck:
            _log.warning(
                "reference backend closed with %d dispatch(es) still running after %.1f s; "
                "they were failed with BackendClosed and their daemon threads abandoned",
                len(stuck),
                waited,
            )


class _Job:
    """One launch queued on the worker pool."""

    __slots__ = ("backend", "done", "launch", "natives", "queued_ns", "waits")

    def __init__(
        self,
        backend: ReferenceExecutor,
        launch: Launch,
        natives: list[np.ndarray],
        waits: tuple[threading.Event, ...],
        done: threading.Event | None,
    ) -> None:
        self.backend = backend
        self.launch = launch
        self.natives = natives
        self.waits = waits
        self.done = done
        self.queued_ns = time.time_ns()

    def run(self) -> None:
        self.backend.run_job(self)

    def drop(self) -> None:
        self.backend.drop_job(self)


#: Backends that have started worker threads (stopped at interpreter exit).
_live: weakref.WeakSet[ReferenceExecutor] = weakref.WeakSet()


def _stop_live_backends() -> None:
    """Interpreter exit: stop every live backend's work, then wait for all of it, bounded."""
    stopping = []
    for backend in list(_live):
        try:
            pool = backend.stop_at_exit()
        except Exception as exc:  # one backend's failure must not keep the others running
            _log.warning("stopping a reference backend at exit failed: %s", exc)
            continue
        if pool is not None:
            stopping.append((backend, pool))
    deadline = time.monotonic() + _EXIT_TIMEOUT_S
    for _, pool in stopping:
        pool.join(max(0.0, deadline - time.monotonic()))
    for backend, _ in stopping:  # whoever still waits on a stuck dispatch is released
        backend.abandon_at_exit(_EXIT_TIMEOUT_S)


# threading's exit hooks run before the interpreter joins non-daemon threads (one may be
# blocked in pending.result() on a runaway dispatch); atexit hooks run only after that.
# concurrent.futures uses the same hook; fall back to atexit where it does not exist.
getattr(threading, "_register_atexit", atexit.register)(_stop_live_backends)


class _BufferOrder:
    """The last dispatch writing a resident buffer and the readers since (done events)."""

    __slots__ = ("last_write", "readers")

    def __init__(self) -> None:
        self.last_write: threading.Event | None = None
        self.readers: list[threading.Event] = []


def _static_cost(statements: tuple[Stmt, ...]) -> tuple[float, float, float]:
    """Return an upper bound of one launch's cost: (fixed ns, lane-steps, atomic evaluations).

    Every statement and expression node counts (both branches of an ``If``);
    a loop with literal bounds counts its trip count times (one iteration's
    floor plus its body), so an empty loop is not free; a loop whose bounds
    are not literals is unbounded (inf) and never runs inline.
    """
    fixed = steps = atomics = 0.0
    for stmt in statements:
        nodes, atoms = _expr_nodes(stmt)
        fixed += _STMT_NS + nodes * _EXPR_NS
        steps += 1 + nodes
        atomics += atoms
        match stmt:
            case If(then=then, orelse=orelse):
                for branch in (then, orelse):
                    f, s, a = _static_cost(branch)
                    fixed, steps, atomics = fixed + f, steps + s, atomics + a
            case Block(body=inner):
                f, s, a = _static_cost(inner)
                fixed, steps, atomics = fixed + f, steps + s, atomics + a
            case Loop(start=Const() as lo, end=Const() as hi, body=inner):
                trips = max(0, int(hi.value) - int(lo.value))
                f, s, a = _static_cost(inner)
                fixed += trips * (_ITERATION_NS + f)
                steps += trips * (1 + s)
                atomics += trips * a
            case Loop():
                return math.inf, math.inf, math.inf
    return fixed, steps, atomics


def _expr_nodes(stmt: Stmt) -> tuple[int, int]:
    """Count the expression nodes of ``stmt`` itself (not nested statements) and its atomics."""
    nodes = atoms = 0
    stack = list(stmt_exprs(stmt))
    while stack:
        expr = stack.pop()
        nodes += 1
        atoms += isinstance(expr, Atomic)
        stack.extend(child_exprs(expr))
    return nodes, atoms


class _Shape:
    """What a launch shape decides for the reference backend (kept on its template)."""

    __slots__ = ("iterations", "tiny")

    def __init__(self, *, tiny: bool, iterations: int) -> None:
        self.tiny = tiny
        #: Launches per dispatch (``config.iterations``, read once per shape).
        self.iterations = iterations


def _called(launch: Launch) -> str:
    """How messages name a launch: by its label, else its program's op_id."""
    name = launch.config.label or launch.plan.program.op_id
    return f"dispatch {name}" if name else "a dispatch"


def _timeout(launch: Launch) -> DispatchTimeout:
    """The error of a launch stopped with the backend open: past its deadline, or asked to
    stop before it (``PendingDispatch.stop_requested`` set by hand)."""
    timeout = launch.config.timeout
    if timeout is not None and time.monotonic() - launch.pending.created >= timeout:
        return DispatchTimeout(
            f"{_called(launch)} was stopped: past its timeout of {timeout} s",
            fix="raise DispatchConfig.timeout or split the work into smaller dispatches",
            timeout=timeout,
        )
    return DispatchTimeout(
        f"{_called(launch)} was stopped: its stop was requested",
        fix="its PendingDispatch.stop_requested was set before it finished; dispatch it again "
        "if you need its outputs",
        timeout=timeout,
    )
