"""`RayExecutor`: dispatches served by a pool of Ray actors, each with its own local backend.

The caller's side does what every backend's does — validation, input checks,
planning, the `PendingDispatch` — so errors knowable before launch raise in
``dispatch()``. A launch then goes to one worker (`vyre_ray.worker.Worker`):
the one that already holds the program (by fingerprint) unless it is much
busier than the least busy, else the least busy one, which is sent the
program's wire bytes with its first call. Inputs travel as Ray arguments
(large ones through the object store, submitted off the calling thread after
one copy); the result settles the dispatch from Ray's future callback, so it
is awaitable from asyncio and trio alike. Outputs are copied out of Ray's
read-only views.

Faults: workers restart (``max_restarts=-1``) and Ray retries a call on the
new worker (`TASK_RETRIES`); a retried call that reaches a worker without the
program is sent again with the bytes. What cannot be retried fails with
`DeviceLost`. Ray's exceptions become vyre-async errors in `vyre_ray.errors`
only. Past its deadline a dispatch fails with `DispatchTimeout` and its remote
task is cancelled. The caller's span context travels with each call: a
worker's dispatch span is a child of the caller's ``vyre.dispatch`` span.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import logging
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
from opentelemetry import propagate, trace

from vyre_async.abc import (
    CORE_OPS,
    DRIVER_VERSION,
    FEATURES,
    BackendCapabilities,
    BindingPlan,
    DispatchConfig,
    Executor,
    Launch,
    PendingDispatch,
    VyreBackend,
    defer_to_callbacks,
    poll_until,
    settle_hook,
    whole_number,
)
from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import (
    BackendClosed,
    BackendError,
    DeviceLost,
    InvalidArgument,
    UnsupportedFeature,
)
from vyre_async.ir.program import Program
from vyre_ray.errors import UnknownProgram, cause_of, not_installed, translate
from vyre_ray.worker import PROGRAMS_KEPT

__all__ = [
    "TASK_RETRIES",
    "RayExecutor",
    "WorkerInfo",
    "cluster_target",
    "create_backend",
    "local_backend",
]
__dir__ = _public_dir(__name__)

_log = logging.getLogger("vyre_async.ray")

#: Times Ray retries a call whose worker died (on the restarted worker).
TASK_RETRIES = 3
#: Inputs above this many bytes in all are copied and submitted off the calling thread.
OFF_THREAD_BYTES = 1 << 20
#: A worker holding the program is chosen unless it has more than this many calls in
#: flight beyond the least busy worker.
AFFINITY_SLACK = 8
#: Seconds to wait for a new pool's workers to start and describe themselves.
START_TIMEOUT_S = 120.0
#: How often the pool checks that its Ray runtime is still up while it is open.
WATCH_S = 0.25


#: `RayExecutor`'s own arguments (`create_backend` hands the rest to `VyreBackend`).
_EXECUTOR_ARGS = frozenset(
    ("address", "workers", "inner", "num_gpus_per_worker", "trace", "worker_env")
)


def create_backend(**kwargs: Any) -> VyreBackend:
    """Build the ``ray`` backend: ``VyreBackend(RayExecutor(...), ...)`` (the registry's factory).

    Connects to the cluster named by ``RAY_ADDRESS``; with
    ``VYRE_RAY_LOCAL_WORKERS=N`` set instead, starts a local cluster of N workers
    (for development and tests). ``RAY_ADDRESS`` wins when both are set.

    Args:
        **kwargs: `RayExecutor`'s arguments (``address``, ``workers``, ``inner``,
            ``num_gpus_per_worker``, ``trace``, ``worker_env``); the others go to
            `VyreBackend` (``close_timeout``, ``prefetch``, ...).

    Raises:
        UnsupportedFeature: Ray is not installed, or neither variable is set.
        InvalidArgument: ``VYRE_RAY_LOCAL_WORKERS`` is not a whole number >= 1.
    """
    own = {k: v for k, v in kwargs.items() if k in _EXECUTOR_ARGS}
    rest = {k: v for k, v in kwargs.items() if k not in _EXECUTOR_ARGS}
    return VyreBackend(RayExecutor(**own), **rest)


def local_backend(workers: int = 2, inner: str | None = "reference", **kwargs: Any) -> VyreBackend:
    """Start (or join) a local Ray cluster and a pool of ``workers`` workers on it.

    Args:
        workers: Pool size.
        inner: The local backend every worker holds.
        **kwargs: As for `create_backend`.
    """
    return create_backend(workers=workers, inner=inner, **kwargs)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerInfo:
    """One worker of the pool, as `RayExecutor.workers` reports it.

    Attributes:
        index: Its place in the pool.
        node: The Ray node id it runs on.
        pid: Its process id.
        inner: The id of its local backend (``"reference"``, ``"cupy"``).
        device: Its local backend's device fingerprint.
        cached_programs: Programs it holds (by fingerprint).
        in_flight: Dispatches it is running now.
    """

    index: int
    node: str
    pid: int
    inner: str
    device: str
    cached_programs: int
    in_flight: int


@dataclass(eq=False)
class _Member:
    """The caller's view of one worker: its handle, the programs it holds, its load.

    ``seen`` and ``in_flight`` change under the backend's lock only.
    """

    index: int
    handle: Any
    seen: OrderedDict[bytes, None] = dataclasses.field(default_factory=OrderedDict)
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class _Shipped:
    """A program as the pool receives it: its fingerprint and wire bytes (per launch shape)."""

    digest: bytes
    wire: bytes


@dataclass(frozen=True, slots=True)
class _Call:
    """One launch as it is sent (and resent): the program, the inputs, the trace context.

    ``inputs`` are the backend's own copies (a call is serialised again when it
    is resent or submitted off the calling thread; the caller may reuse its arrays).
    """

    launch: Launch
    shipped: _Shipped
    inputs: list[np.ndarray]
    carrier: dict[str, str]


def probe(environ: Mapping[str, str] | None = None) -> None:
    """Check that the ``ray`` backend could start here, without importing Ray or connecting.

    Ray counts as installed when it can be found (a broken install shows when
    the backend is acquired); a process already connected to Ray can start it.

    Raises:
        UnsupportedFeature: Ray is not installed, or no cluster is named (neither
            ``RAY_ADDRESS`` nor ``VYRE_RAY_LOCAL_WORKERS``).
        InvalidArgument: ``VYRE_RAY_LOCAL_WORKERS`` is not a whole number >= 1.
    """
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # connected already: acquire uses it
        return
    if importlib.util.find_spec("ray") is None:  # (installed; not imported: ~1 s)
        raise not_installed(ModuleNotFoundError("No module named 'ray'"))
    cluster_target(None, None, os.environ if environ is None else environ)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise not_installed(exc) from exc
    return ray


def _local_workers(environ: Mapping[str, str] | None = None) -> int | None:
    raw = (os.environ if environ is None else environ).get("VYRE_RAY_LOCAL_WORKERS")
    if raw is None or not raw.strip():
        return None
    try:
        workers = int(raw)
    except ValueError:
        workers = 0
    if workers < 1:
        raise InvalidArgument(
            f"VYRE_RAY_LOCAL_WORKERS must be a whole number >= 1, got {raw!r}",
            fix="set VYRE_RAY_LOCAL_WORKERS=2 (or unset it and set RAY_ADDRESS)",
        )
    return workers


_connect_lock = threading.Lock()
#: Whether this process started the local cluster it is connected to.
_started_here = False


def cluster_target(
    address: str | None, workers: int | None, environ: Mapping[str, str]
) -> tuple[str, str | int]:
    """Where a new connection goes: ``("address", ADDRESS)`` or ``("local", WORKERS)``.

    An explicit ``address`` wins, then ``RAY_ADDRESS``, then a local cluster of
    ``workers`` or ``VYRE_RAY_LOCAL_WORKERS`` workers.

    Raises:
        UnsupportedFeature: none of them is given.
        InvalidArgument: ``VYRE_RAY_LOCAL_WORKERS`` is not a whole number >= 1.
    """
    target = address or environ.get("RAY_ADDRESS") or None
    if target is not None:
        return "address", target
    local = workers or _local_workers(environ)
    if local is None:
        raise UnsupportedFeature(
            "the 'ray' backend needs a Ray cluster: none is named and none was asked to start",
            fix="set RAY_ADDRESS to a running cluster (ray start --head prints it), or set "
            "VYRE_RAY_LOCAL_WORKERS=2 to start a local one, or use "
            "vyre_ray.local_backend(workers=2)",
            backend_id="ray",
            cause="no-cluster",
        )
    return "local", local


def _split_fix(error: BackendError) -> tuple[str, str | None]:
    """``error``'s message without its ``Fix:`` line, and that line's advice.

    The last line counts as the Fix when it starts with ``Fix:``, as `BackendError`
    decides whether to append one (so a caller's error always ends with its own).
    """
    text, _, last = error.message.rpartition("\n")
    if text and last.startswith("Fix:"):
        return text, last.removeprefix("Fix:").strip() or None
    return error.message, None


def _connect(ray: Any, address: str | None, workers: int | None) -> tuple[int, bool]:
    """Connect this process to Ray (once); return a new pool's size, and if it is per GPU."""
    global _started_here
    with _connect_lock:
        if not ray.is_initialized():
            kind, where = cluster_target(address, workers, os.environ)
            address = str(where) if kind == "address" else None
            local = int(where) if kind == "local" else None
            options: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.ERROR,
                "namespace": "vyre",
            }
            if address is None:
                options["num_cpus"] = local
            try:
                ray.init(address=address, **options)
            except Exception as exc:  # a wrong address, a cluster that is not up
                error = translate(exc, doing=f"connecting to the Ray cluster at {address!r}")
                raise UnsupportedFeature(
                    f"the 'ray' backend cannot reach its cluster: {_split_fix(error)[0]}",
                    fix="check RAY_ADDRESS and that the cluster is up (ray status)",
                    backend_id="ray",
                    cause="unreachable",
                ) from exc
            _started_here = address is None
        if workers is not None:
            return workers, False
        local = _local_workers()
        if local is not None and _started_here:
            return local, False
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0))
        if gpus:
            return gpus, True
        return max(1, int(resources.get("CPU", 1))), False


def _intersect(capabilities: Sequence[BackendCapabilities]) -> BackendCapabilities:
    """What every worker supports (the pool is only as capable as its weakest worker)."""
    first = capabilities[0]
    values: dict[str, Any] = {}
    for f in dataclasses.fields(first):
        seen = [getattr(c, f.name) for c in capabilities]
        if f.name in FEATURES or f.name == "ordered_resident_buffers":
            values[f.name] = all(seen)
        elif f.name == "max_workgroup_size":
            values[f.name] = tuple(min(axis) for axis in zip(*seen, strict=True))
        elif f.name == "max_grid_size":  # (None: that worker reports no limit)
            limits = [limit for limit in seen if limit is not None]
            values[f.name] = (
                tuple(min(axis) for axis in zip(*limits, strict=True)) if limits else None
            )
        elif f.name == "subgroup_size":
            values[f.name] = seen[0] if len(set(seen)) == 1 else None
        elif f.name == "device_name":
            names = sorted(set(seen))
            values[f.name] = names[0] if len(names) == 1 else ", ".join(names)
        else:
            values[f.name] = min(seen)
    values["distributed"] = True
    values["ordered_resident_buffers"] = False  # no resident buffers on the pool (yet)
    return BackendCapabilities(**values)


class RayExecutor(Executor):
    """Dispatch on a pool of Ray actors, each holding a local backend with warm caches.

    Build the backend with `create_backend` (or `local_backend`), which wraps
    this executor in a `VyreBackend`.

    Args:
        address: The cluster to connect to (``"ray://host:10001"``, ``"auto"``);
            default ``RAY_ADDRESS``, or a local cluster of
            ``VYRE_RAY_LOCAL_WORKERS`` workers. A process connects to one
            cluster: later instances share the first connection.
        workers: Pool size; default one per GPU of the cluster (or per CPU
            without GPUs; the local cluster's size when this process started it).
        inner: The local backend every worker holds (``"reference"``,
            ``"cupy"``); default ``acquire_preferred_backend(allow_reference=True)``
            on each worker.
        num_gpus_per_worker: GPUs each worker requests from Ray, which then sets its
            ``CUDA_VISIBLE_DEVICES`` (default: 1 when the pool size is the cluster's
            GPU count, else none; pass 1 for GPU workers).
        trace: A `vyre_async.tracing.configure_tracing` spec each worker exports
            its own spans with (``"otlp"`` reads the ``OTEL_*`` variables of the
            worker's environment), or None.
        worker_env: Environment variables for the workers' processes (Ray's
            ``runtime_env``), e.g. ``{"OTEL_EXPORTER_OTLP_ENDPOINT": ...}``.

    Raises:
        UnsupportedFeature: Ray is not installed, no cluster is named, or it
            cannot be reached; the workers cannot start.
        InvalidArgument: ``workers`` or ``VYRE_RAY_LOCAL_WORKERS`` is not >= 1;
            ``num_gpus_per_worker`` is not a number >= 0; ``worker_env`` does
            not map str to str.
    """

    id = "ray"
    version = DRIVER_VERSION
    #: Inputs are serialised into Ray's call (or copied first, for large ones) before
    #: ``dispatch()`` returns: the front end hands the caller's arrays over uncopied.
    copies_inputs = True

    def __init__(
        self,
        address: str | None = None,
        *,
        workers: int | None = None,
        inner: str | None = None,
        num_gpus_per_worker: float | None = None,
        trace: str | None = None,
        worker_env: Mapping[str, str] | None = None,
    ) -> None:
        ray = _import_ray()  # first: a machine without Ray fails before any set-up
        if workers is not None:
            workers = whole_number("workers", workers, minimum=1, example="workers=2")
        _check_worker_options(num_gpus_per_worker, worker_env)
        self._closed = False  # set by close(): every later operation raises BackendClosed
        self._ray = ray
        size, per_gpu = _connect(ray, address, workers)
        if per_gpu and num_gpus_per_worker is None:
            num_gpus_per_worker = 1  # one worker per GPU: each gets its own (CUDA_VISIBLE_DEVICES)
        from vyre_ray.worker import Worker

        self._members = []
        try:
            actor = ray.remote(Worker).options(
                max_restarts=-1,
                max_task_retries=TASK_RETRIES,
                max_concurrency=1000,
                num_cpus=0,
                num_gpus=num_gpus_per_worker or 0,
                scheduling_strategy="SPREAD",
                **({"runtime_env": {"env_vars": dict(worker_env)}} if worker_env else {}),
            )
            for i in range(size):
                self._members.append(_Member(i, actor.remote(inner, i, trace)))
            described = ray.get(
                [m.handle.describe.remote() for m in self._members], timeout=START_TIMEOUT_S
            )
        except Exception as exc:
            for member in self._members:
                try:
                    ray.kill(member.handle)
                except Exception:  # gone already: the error that matters is the start's
                    _log.debug("killing a worker that did not start failed", exc_info=True)
            error = translate(exc, doing="starting the pool's workers")
            message, own_fix = _split_fix(error)
            raise UnsupportedFeature(
                f"the 'ray' backend's workers could not start: {message}",
                # (a worker's own error, its backend refusing to start, knows best)
                fix=own_fix
                if error is cause_of(exc) and own_fix
                else "check the cluster's resources (ray status) and the workers' logs; "
                "with num_gpus_per_worker, the cluster needs that many GPUs per worker",
                backend_id="ray",
                cause="workers",
            ) from exc
        self._caps = _intersect([d["capabilities"] for d in described])
        self._devices = sorted({str(d["device"]) for d in described})
        self._inner = sorted({str(d["inner"]) for d in described})
        self._lock = threading.Lock()
        self._running: dict[Any, Launch] = {}  # ref -> its launch (the call in flight)
        self._open: dict[int, Launch] = {}  # every launch enqueued and not settled yet
        self._submitter: concurrent.futures.ThreadPoolExecutor | None = None
        #: Set by `close` once its wait for in-flight work is over: from then on
        #: what is still unsettled fails with `BackendClosed` and nothing is resent.
        self._giving_up = False
        #: Set when the Ray runtime this pool was made on went away (``ray.shutdown()``
        #: elsewhere in the process): everything fails with `DeviceLost` from then on,
        #: and no Ray call is made again (one would start a fresh, unrelated cluster).
        self._lost = False
        self._watchdog: threading.Thread | None = None

    # Description ----------------------------------------------------------------
    def capabilities(self) -> BackendCapabilities:
        """What every worker's backend supports, with ``distributed=True``."""
        return self._caps

    def device_fingerprint(self) -> str:
        """The pool: its workers' backends and devices."""
        return f"ray pool of {len(self._members)} ({', '.join(self._inner)}): " + "; ".join(
            self._devices
        )

    def supported_ops(self) -> frozenset[str]:
        """Every operation of `CORE_OPS`: programs ship whole, as wire bytes, to a worker
        whose own backend runs them (grid barriers included, natively or split); a worker
        backend that lacks one refuses the dispatch with its `UnsupportedFeature`."""
        return CORE_OPS

    def compiler_fingerprint(self) -> str:
        """Workers compile for themselves; the pool's pipelines are the programs' wire bytes."""
        return f"vyre_ray {DRIVER_VERSION}: wire bytes, compiled on each worker"

    def workers(self) -> list[WorkerInfo]:
        """Describe every worker now (asks each; blocks up to 30 s).

        Raises:
            BackendClosed: the backend was closed.
            DeviceLost: a worker did not answer within 30 s, or died; or the
                pool's Ray runtime was shut down.
        """
        self._check_open()
        self._check_runtime()
        try:
            described = self._ray.get(
                [m.handle.describe.remote() for m in self._members], timeout=30
            )
        except Exception as exc:
            raise translate(exc, doing="describing the workers") from exc
        return [
            WorkerInfo(
                index=int(d["index"]),
                node=str(d["node"]),
                pid=int(d["pid"]),
                inner=str(d["inner"]),
                device=str(d["device"]),
                cached_programs=int(d["cached_programs"]),
                in_flight=int(d["in_flight"]),
            )
            for d in described
        ]

    # Pipelines --------------------------------------------------------------------
    def build_pipeline(self, program: Program, config: DispatchConfig) -> _Shipped:
        """The program as the workers receive it (each compiles it on first use)."""
        return _Shipped(program.fingerprint(), program.to_wire())

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed(
                f"backend {self.id!r} was closed; it runs nothing more", backend_id=self.id
            )

    # Dispatch ---------------------------------------------------------------------
    def plan_shape(self, native: Any, plan: BindingPlan, config: DispatchConfig) -> _Shipped:
        """The dispatched program (with its buffer counts) as the workers receive it, once."""
        program = plan.program
        return _Shipped(program.fingerprint(), program.to_wire())

    def enqueue(self, launch: Launch) -> None:
        """Send the launch to a worker; settle it from Ray's future callback.

        Raises:
            BackendClosed: the backend was closed.
        """
        self._check_open()
        self._check_runtime()
        shipped = launch.shape
        if not isinstance(shipped, _Shipped):  # (a launch built by hand, not by the driver)
            shipped = self.plan_shape(launch.pipeline.native, launch.plan, launch.config)
        inputs = [np.array(item, copy=True) for item in launch.inputs]  # (see `_Call`)
        call = _Call(launch, shipped, inputs, self._carrier(launch))
        with self._lock:
            # (checked again with the insert, under the lock the watchdog's sweep takes:
            # a launch is either failed by the sweep or refused here, never left behind)
            if self._lost:
                raise _runtime_gone()
            self._open[id(launch)] = launch
            if self._watchdog is None:  # (holds the backend weakly: no leak if unclosed)
                self._watchdog = threading.Thread(
                    target=_watch_runtime, args=(weakref.ref(self),), name="vyre-ray-watchdog",
                    daemon=True,
                )  # fmt: skip
                self._watchdog.start()
        settle_hook(launch.pending, lambda _: self._forget(launch))
        if sum(item.nbytes for item in inputs) > OFF_THREAD_BYTES:
            self._off_thread(call)
        else:
            self._submit(call)
        return

    def _runtime_down(self) -> bool:
        """Whether the pool's Ray runtime went away (for good: a later ``ray.init()`` is another).

        Checked before every Ray call: one after ``ray.shutdown()`` would start a
        fresh, unrelated local cluster.
        """
        if not self._lost and not self._ray.is_initialized():
            self._lost = True
        return self._lost

    def _check_runtime(self) -> None:
        """Refuse with `DeviceLost` once the pool's Ray runtime went away."""
        if self._runtime_down():
            raise _runtime_gone()

    def _runtime_lost(self) -> None:
        """Fail every dispatch in flight with `DeviceLost`: the Ray runtime went away."""
        with self._lock:
            self._lost = True  # (under the lock enqueue checks it in)
            left = list(self._open.values())
            self._running.clear()
        error = _runtime_gone()
        for launch in left:
            launch.completer.fail(error)

    def _forget(self, launch: Launch) -> None:
        with self._lock:
            self._open.pop(id(launch), None)

    def _off_thread(self, call: _Call, member: _Member | None = None) -> None:
        """Submit from the submission thread (large inputs; resends from Ray's callbacks)."""
        with self._lock:
            if self._submitter is None and not self._giving_up:
                self._submitter = concurrent.futures.ThreadPoolExecutor(
                    max_workers=2, thread_name_prefix="vyre-ray-submit"
                )
            submitter = self._submitter
        try:
            if submitter is None:
                raise RuntimeError("the backend is closing")
            submitter.submit(self._submit, call, member)
        except RuntimeError:  # the submitter was shut down: the backend is closing
            self._unbusy(member)
            call.launch.completer.fail(_closed_error())

    def _unbusy(self, member: _Member | None) -> None:
        """Count a call chosen for ``member`` but never sent off as gone."""
        if member is not None:
            with self._lock:
                member.in_flight -= 1

    @staticmethod
    def _carrier(launch: Launch) -> dict[str, str]:
        """The caller's trace context (its dispatch span, if one records) for the worker."""
        carrier: dict[str, str] = {}
        span = launch.completer.span
        context = trace.set_span_in_context(span) if span is not None else None
        propagate.inject(carrier, context=context)
        return carrier

    def _choose(self, digest: bytes) -> tuple[_Member, bool]:
        """The worker for a call of ``digest``, counted busy, and whether to send the bytes."""
        with self._lock:
            members = self._members
            least = min(members, key=lambda m: m.in_flight)
            holders = [m for m in members if digest in m.seen]
            if holders:
                best = min(holders, key=lambda m: m.in_flight)
                if best.in_flight <= least.in_flight + AFFINITY_SLACK:
                    least = best
            least.in_flight += 1
            return least, digest not in least.seen

    def _config_for(self, launch: Launch) -> DispatchConfig:
        """The launch's config for the worker: the time left of its deadline, if any."""
        config = launch.config
        if config.timeout is None:
            return config
        left = launch.pending.created + float(config.timeout) - time.monotonic()
        return dataclasses.replace(config, timeout=max(left, 1e-3))

    def _submit(self, call: _Call, member: _Member | None = None) -> None:
        """Send one call; ``member`` (already counted busy) resends it there with the bytes."""
        launch, shipped = call.launch, call.shipped
        completer = launch.completer
        if completer.should_stop():  # past its deadline before it went out: not sent at all
            self._unbusy(member)
            launch.pending.done()  # (settles it as timed out)
            return
        if self._runtime_down():  # (an off-thread submit or a resend)
            self._unbusy(member)
            completer.fail(_runtime_gone())
            return
        sent = False
        try:
            if member is None:
                member, send = self._choose(shipped.digest)
            else:
                send = True  # a resend: the worker did not have the program
            # Until a call of the program succeeded on a worker, every call to it sends
            # the bytes: an async actor may start a later call before an earlier one
            # decoded them.
            completer.mark_started()
            ref = member.handle.run.remote(
                shipped.digest,
                shipped.wire if send else None,
                call.inputs,
                self._config_for(launch),
                call.carrier,
            )
            sent = True
            with self._lock:
                self._running[ref] = launch
            if launch.config.timeout is not None:
                settle_hook(launch.pending, lambda p: self._cancel_if_late(p, ref))
            ref.future().add_done_callback(lambda future: self._settle(call, member, ref, future))
        except Exception as exc:
            if not sent:
                self._unbusy(member)
            completer.fail(translate(exc, doing="sending the dispatch to a worker"))

    def _cancel_if_late(self, pending: PendingDispatch, ref: Any) -> None:
        """A dispatch that settled with an error (a timeout): cancel its remote task.

        A settle hook: the Ray call (which may block) goes to the callback thread.
        """
        with self._lock:
            running = ref in self._running
        if running and pending.exception() is not None:
            defer_to_callbacks(pending, lambda _: self._cancel(ref))

    def _cancel(self, ref: Any) -> None:
        if self._runtime_down():
            return
        try:
            self._ray.cancel(ref)
        except Exception:  # already finished, or its worker is gone
            _log.debug("cancelling a late Ray task failed", exc_info=True)

    def _settle(
        self, call: _Call, member: _Member, ref: Any, future: concurrent.futures.Future[Any]
    ) -> None:
        """Ray's callback (its thread): settle the dispatch with the worker's outputs or error."""
        launch, digest = call.launch, call.shipped.digest
        completer = launch.completer
        try:
            with self._lock:
                self._running.pop(ref, None)
                member.in_flight -= 1
            try:
                outputs = future.result()
            except Exception as exc:
                if isinstance(cause_of(exc), UnknownProgram) and not self._giving_up:
                    # A restarted worker got a retried call without the program: send it
                    # again with the bytes, from the submission thread (not Ray's).
                    with self._lock:
                        member.seen.pop(digest, None)
                        member.in_flight += 1
                    self._off_thread(call, member)
                    return
                if self._giving_up:  # the worker was killed by shutdown, most likely
                    completer.fail(_closed_error())
                else:
                    completer.fail(translate(exc, doing="running the dispatch on a worker"))
                return
            with self._lock:  # the worker holds the program now
                member.seen[digest] = None
                member.seen.move_to_end(digest)
                if len(member.seen) > PROGRAMS_KEPT:  # as the worker forgets them
                    member.seen.popitem(last=False)
            # Ray's arrays may be read-only views of its object store: every backend's
            # are writable.
            outputs = [a if a.flags.writeable else a.copy() for a in outputs]
            completer.resolve(outputs, compile_s=launch.compile_s)
        except Exception as exc:  # never leave the dispatch unsettled
            completer.fail(translate(exc, doing="settling the dispatch"))

    # Lifecycle ------------------------------------------------------------------
    async def flush(self) -> None:
        """Wait, without blocking the event loop, until every dispatch enqueued so far settled.

        Dispatches enqueued meanwhile (by other tasks) are not waited for.
        """
        with self._lock:
            waiting = set(self._open)
        await poll_until(lambda: waiting.isdisjoint(self._open))

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109 - the contract's bound
        """Let in-flight work finish (at most ``timeout`` seconds), then stop the workers.

        Dispatches still unsettled then (queued for submission, or running) fail
        with `BackendClosed`; the workers export the spans they hold (bounded)
        and are killed, which ends what they still run. The cluster stays up
        (other pools may share it).
        """
        self._closed = True
        with anyio.move_on_after(timeout):
            await poll_until(lambda: not self._open)
        with self._lock:
            self._giving_up = True
            submitter, self._submitter = self._submitter, None
        if submitter is not None:
            submitter.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            left = list(self._open.values())
            refs = list(self._running)
            self._running.clear()
        error = _closed_error()
        for ref in refs if not self._runtime_down() else ():
            try:
                self._ray.cancel(ref, force=False)
            except Exception:  # it ends with its worker below anyway
                _log.debug("cancelling a Ray task at close failed", exc_info=True)
        for launch in left:
            launch.completer.fail(error)
        # Ray's calls block: off the event loop (up to the 2 s the workers get to export).
        await anyio.to_thread.run_sync(self._stop_workers)

    def _stop_workers(self) -> None:
        """Let the workers export the spans they hold (2 s at most), then kill them."""
        if self._runtime_down():  # gone with the runtime: no Ray
            return  # call (one would start a fresh cluster only to kill nothing in it)
        handles = [m.handle for m in self._members]
        try:  # spans still buffered on the workers
            self._ray.get([h.flush_telemetry.remote() for h in handles], timeout=2.0)
        except Exception:
            _log.debug("the workers did not flush their spans in time", exc_info=True)
        for handle in handles:
            try:
                self._ray.kill(handle, no_restart=True)
            except Exception:  # already gone
                _log.debug("killing a Ray worker failed", exc_info=True)


def _watch_runtime(backend_ref: weakref.ref[RayExecutor]) -> None:
    """While the backend is open, check every `WATCH_S` that its Ray runtime is still up.

    Ray's futures never settle once the runtime is shut down under them: the
    dispatches in flight then fail with `DeviceLost` (within `WATCH_S`).
    """
    while True:
        time.sleep(WATCH_S)
        backend = backend_ref()
        if backend is None or backend._closed:  # noqa: SLF001 - the module's own class
            return
        if backend._runtime_down():  # noqa: SLF001 - the module's own class
            backend._runtime_lost()  # noqa: SLF001
            return
        del backend


def _check_worker_options(
    num_gpus_per_worker: float | None, worker_env: Mapping[str, str] | None
) -> None:
    """Refuse worker options Ray would reject with its own exceptions, before any set-up."""
    if num_gpus_per_worker is not None and (
        isinstance(num_gpus_per_worker, bool)
        or not isinstance(num_gpus_per_worker, int | float)
        or not num_gpus_per_worker >= 0
    ):
        raise InvalidArgument(
            f"num_gpus_per_worker must be a number >= 0, got {num_gpus_per_worker!r}",
            fix="pass num_gpus_per_worker=1 for one GPU per worker, or leave it out",
        )
    if worker_env is not None and (
        not isinstance(worker_env, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in worker_env.items())
    ):
        raise InvalidArgument(
            f"worker_env must map str to str, got {worker_env!r}",
            fix='pass strings, e.g. worker_env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://..."}',
        )


def _runtime_gone() -> DeviceLost:
    """The error of every dispatch once the pool's Ray runtime went away."""
    return DeviceLost(
        "the Ray runtime this 'ray' backend was connected to was shut down "
        "(ray.shutdown() in this process); its workers are gone",
        fix="close this backend and build a new one (acquire_backend('ray') builds a "
        "fresh one after close), which connects again",
        backend_id="ray",
        cause="runtime-gone",
    )


def _closed_error() -> BackendClosed:
    return BackendClosed(
        "the ray backend was closed while the dispatch still ran on a worker; its result "
        "was discarded",
        fix="await the dispatches you need (or backend.flush()) before closing, or raise "
        "close_timeout",
        backend_id="ray",
    )
