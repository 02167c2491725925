"""`ReferenceBackend`: the numpy engine behind the driver contract (id ``"reference"``).

Tiny dispatches (estimated below the cost of a thread hand-off) run inline in
``dispatch()``; everything else runs on a bounded worker pool (2 threads by
default: numpy holds the GIL between operations and the event loop must stay
responsive). Resident buffers are host arrays owned by the backend.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import anyio
import numpy as np

from vyre_async import __version__
from vyre_async.backend import VyreBackend
from vyre_async.calibration import Calibration, measure_host_costs
from vyre_async.capabilities import BackendCapabilities
from vyre_async.config import DispatchConfig
from vyre_async.errors import BackendError, DispatchFailed, DispatchTimeout, InvalidProgram
from vyre_async.ir.expr import Const
from vyre_async.ir.limits import MAX_WORKGROUP_BYTES, MAX_WORKGROUP_LANES
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Block, If, Loop, Stmt
from vyre_async.ir.types import Access, BufferDecl, DType
from vyre_async.pending import PendingDispatch
from vyre_async.pipeline import Launch
from vyre_async.plan import normalize_input
from vyre_async.resident import ResidentBuffer
from vyre_reference.cancel import Cancelled
from vyre_reference.compile import compile_program
from vyre_reference.engine import run_plan

__all__ = ["ReferenceBackend"]

#: Estimated cost (ns) of handing a dispatch to a worker thread and waking the loop.
HANDOFF_NS = 60_000
#: How often a worker waiting on an earlier dispatch checks for a stop request.
_ORDER_POLL_S = 0.005
#: Rough cost model of the engine: per statement executed, and per lane-statement.
_STMT_NS = 4_000
_LANE_STMT_NS = 2


class ReferenceBackend(VyreBackend):
    """The exact oracle backend, on numpy (CPU).

    Args:
        max_workers: Worker threads for dispatches too large to run inline.
        inline_ns: Dispatches estimated below this many nanoseconds run inside
            ``dispatch()`` itself (0 disables inline execution).
        **kwargs: Passed to `VyreBackend` (pipeline cache capacity).
    """

    id = "reference"
    version = __version__

    def __init__(self, *, max_workers: int = 2, inline_ns: int = HANDOFF_NS, **kwargs: Any) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        super().__init__(**kwargs)
        self.max_workers = max_workers
        self.inline_ns = inline_ns
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._in_flight: set[Future[None]] = set()
        self._resident: dict[int, ResidentBuffer] = {}
        self._orders: dict[int, _BufferOrder] = {}  # resident buffer id -> its last users
        self._order_lock = threading.Lock()
        self._closed = False

    # Description ----------------------------------------------------------------
    def capabilities(self) -> BackendCapabilities:
        """Report the engine's limits; every native-feature flag is False (nothing is emulated)."""
        return BackendCapabilities(
            max_workgroup_size=(MAX_WORKGROUP_LANES, MAX_WORKGROUP_LANES, 64),
            max_workgroup_lanes=MAX_WORKGROUP_LANES,
            max_storage_buffer_bytes=(1 << 32) - 4,
            max_workgroup_memory_bytes=MAX_WORKGROUP_BYTES,
            device_name="numpy reference (CPU)",
            ordered_resident_buffers=True,  # workers wait for each buffer's earlier users
        )

    def device_fingerprint(self) -> str:
        """The numpy version: it decides the exact results of transcendental ops."""
        return f"numpy-{np.__version__}"

    def calibrate(self) -> Calibration:
        """Measure the engine's per-dispatch overhead, compile cost and host copy bandwidth.

        Takes well under a second. The engine has no graph replay and no
        persistent kernels, so those costs are not measured (None). Use
        `vyre_async.calibration.calibration_for(backend, measure=True)` to
        measure once and cache the record on disk.
        """
        from vyre_async.programs import elementwise_xor

        probe = ReferenceBackend(max_workers=1, inline_ns=HANDOFF_NS, prefetch=False)
        xor = elementwise_xor(1024)

        def compile_fresh(i: int) -> None:  # a new program: the engine memoises plans
            compile_program(Program(xor.buffers, xor.workgroup_size, xor.body, op_id=f"cal.{i}"))

        return measure_host_costs(self, probe, compile_once=compile_fresh, copy_bytes=4 << 20)

    # Pipelines --------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        """Compile the program into the engine's executable plan."""
        return compile_program(program)

    # Dispatch ---------------------------------------------------------------------
    def _estimate_ns(self, launch: Launch) -> float:
        program = launch.plan.program
        steps = program._memo.get("reference.steps")
        if steps is None:
            steps = _static_steps(program.body)
            program._memo["reference.steps"] = steps
        lanes = launch.plan.geometry.lanes
        return float(launch.config.iterations * steps * (_STMT_NS + lanes * _LANE_STMT_NS))

    def enqueue(self, launch: Launch) -> PendingDispatch:
        """Run the launch inline when tiny and unblocked, else on the worker pool.

        Dispatches that share a resident buffer take effect in submission order:
        one that writes it waits for earlier readers and writers, one that reads
        it waits for earlier writers (in the worker, never in the event loop).
        """
        if self._closed:
            raise InvalidProgram(
                "the reference backend was shut down", fix="acquire or create a new backend"
            )
        tiny = launch.plan.geometry.lanes == 0 or self._estimate_ns(launch) < self.inline_ns
        natives = [
            item.native(self.id) if isinstance(item, ResidentBuffer) else item
            for item in launch.inputs
        ]
        done: threading.Event | None = None
        if not any(isinstance(item, ResidentBuffer) for item in launch.inputs):
            future = None if tiny else self._submit(launch, natives, (), None)
        else:
            # Registering and queueing happen under one lock, so the pool (FIFO) never
            # holds a dispatch ahead of an earlier one it waits for.
            with self._order_lock:
                waits, done = self._order(launch)
                future = None if tiny and not waits else self._submit(launch, natives, waits, done)
        if future is None:
            self._run(launch, None, natives, (), done)
            return launch.pending
        with self._pool_lock:
            self._in_flight.add(future)
        future.add_done_callback(self._forget)
        return launch.pending

    def _submit(
        self,
        launch: Launch,
        natives: list[np.ndarray],
        waits: tuple[threading.Event, ...],
        done: threading.Event | None,
    ) -> Future[None]:
        try:
            return self._executor().submit(self._run, launch, time.time_ns(), natives, waits, done)
        except BaseException as exc:
            if done is not None:
                done.set()  # never leave later dispatches waiting on one that never ran
            if isinstance(exc, RuntimeError):  # the pool shut down meanwhile
                raise InvalidProgram(
                    "the reference backend was shut down", fix="acquire or create a new backend"
                ) from exc
            raise

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

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._closed:
                raise RuntimeError("the reference backend was shut down")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix="vyre-reference"
                )
            return self._pool

    def _forget(self, future: Future[None]) -> None:
        with self._pool_lock:
            self._in_flight.discard(future)

    def _run(
        self,
        launch: Launch,
        queued_ns: int | None,
        natives: list[np.ndarray],
        waits: tuple[threading.Event, ...],
        done: threading.Event | None,
    ) -> None:
        """Execute one launch (inline, or on a worker when ``queued_ns`` is given)."""
        try:
            self._execute(launch, queued_ns, natives, waits, done)
        finally:
            if done is not None:
                # A dispatch that stopped early (timeout) still ends after the ones it
                # waited for: later users of its buffers rely on its done event alone.
                # They are ahead of it in the FIFO pool, so this always returns.
                for event in waits:
                    event.wait()
                done.set()

    def _execute(
        self,
        launch: Launch,
        queued_ns: int | None,
        natives: list[np.ndarray],
        waits: tuple[threading.Event, ...],
        done: threading.Event | None,
    ) -> None:
        completer = launch.completer
        for event in waits:  # earlier dispatches on the same resident buffers
            while not event.wait(_ORDER_POLL_S):
                if completer.stop_requested.is_set():
                    break
        if completer.stop_requested.is_set():
            completer.fail(_timeout(launch))  # dropped if already settled: nothing runs
            return
        completer.mark_started()
        started_ns = time.time_ns()
        if queued_ns is not None:
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
            if done is not None:  # its buffers are final: later users may start (and a
                done.set()  # done-callback may download them) before it resolves
        except Cancelled:
            completer.fail(_timeout(launch))
            return
        except BackendError as exc:
            completer.fail(exc)
            return
        except Exception as exc:
            completer.fail(
                DispatchFailed(
                    f"the reference engine failed on "
                    f"{launch.plan.program.op_id or 'a program'}: {type(exc).__name__}: {exc}",
                    fix="this is a bug in vyre_reference; report it with the program's wire bytes",
                )
            )
            return
        device_s = time.perf_counter() - start
        completer.record_phase("vyre.launch", started_ns, time.time_ns())
        completer.resolve(outputs, device_s=device_s, compile_s=launch.compile_s)

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
        """Copy ``data`` (a numpy array, or bytes holding u32 words) into a resident buffer."""
        if isinstance(data, np.ndarray):
            dtype = _dtype_of(data)
            array = np.array(data, dtype=dtype.numpy, copy=True).reshape(-1)
        else:
            dtype = DType.U32
            array = normalize_input(BufferDecl(label or "upload", 0, Access.READ, dtype), data)
        return self._keep(dtype, array, label)

    def alloc(self, dtype: DType | str, count: int, *, label: str | None = None) -> ResidentBuffer:
        """Allocate a zero-filled resident buffer of ``count`` elements."""
        kind = DType(dtype)
        if count < 0:
            raise InvalidProgram(f"cannot allocate {count} elements", fix="pass a count >= 0")
        array = np.zeros(count, kind.numpy)
        return self._keep(kind, array, label)

    def download(self, buffer: ResidentBuffer) -> np.ndarray:
        """Return a copy of a resident buffer's contents (after earlier dispatches wrote it).

        Blocks the calling thread until the last dispatch submitted to write the
        buffer has written it (a dispatch's done-callbacks already see its writes).
        """
        native = buffer.native(self.id)
        with self._order_lock:
            order = self._orders.get(buffer.id)
            last_write = None if order is None else order.last_write
        if last_write is not None:
            last_write.wait()
        return np.array(native, copy=True)

    def free(self, buffer: ResidentBuffer) -> None:
        """Release a resident buffer (freeing twice is an error).

        Dispatches already queued with it keep its memory and run as submitted.
        """
        buffer.native(self.id)
        buffer._release()
        self._resident.pop(buffer.id, None)
        with self._order_lock:
            self._orders.pop(buffer.id, None)

    def _keep(self, dtype: DType, array: np.ndarray, label: str | None) -> ResidentBuffer:
        buffer = ResidentBuffer(
            backend_id=self.id, dtype=dtype, count=array.size, native=array, label=label
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
        return len(self._in_flight)

    # Lifecycle --------------------------------------------------------------------
    async def flush(self) -> None:
        """Wait (without blocking the loop) until every queued dispatch has run."""
        while True:
            with self._pool_lock:
                pending = list(self._in_flight)
            if not pending:
                return
            await anyio.to_thread.run_sync(_wait_all, pending)

    async def shutdown(self) -> None:
        """Finish queued work and stop the worker threads; the backend refuses new work."""
        if self.prefetcher is not None:
            self.prefetcher.close()
        with self._pool_lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            await anyio.to_thread.run_sync(pool.shutdown, True)


class _BufferOrder:
    """The last dispatch writing a resident buffer and the readers since (done events)."""

    __slots__ = ("last_write", "readers")

    def __init__(self) -> None:
        self.last_write: threading.Event | None = None
        self.readers: list[threading.Event] = []


def _static_steps(statements: tuple[Stmt, ...]) -> float:
    """Statements executed per lane, multiplying literal loop trip counts; inf if unknown."""
    total = 0.0
    for stmt in statements:
        total += 1
        match stmt:
            case If(then=then, orelse=orelse):
                total += _static_steps(then) + _static_steps(orelse)
            case Block(body=inner):
                total += _static_steps(inner)
            case Loop(start=Const() as lo, end=Const() as hi, body=inner):
                total += max(0, int(hi.value) - int(lo.value)) * _static_steps(inner)
            case Loop():
                return math.inf
    return total


def _wait_all(futures: list[Future[None]]) -> None:
    for future in futures:
        future.exception()


def _timeout(launch: Launch) -> DispatchTimeout:
    return DispatchTimeout(
        f"dispatch {launch.config.label or launch.plan.program.op_id or ''} was stopped: "
        f"past its timeout of {launch.config.timeout} s",
        fix="raise DispatchConfig.timeout or split the work into smaller dispatches",
        timeout=launch.config.timeout,
    )


def _dtype_of(array: np.ndarray) -> DType:
    for dtype in (DType.U32, DType.I32, DType.F32):
        if array.dtype == dtype.numpy:
            return dtype
    if array.dtype == np.bool_:
        return DType.BOOL
    raise InvalidProgram(
        f"cannot upload an array of dtype {array.dtype}",
        fix="convert it to uint32, int32, float32 or bool first",
    )
