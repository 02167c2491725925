"""A fake ``ray`` for the ``ray`` backend's driver-side tests (no cluster).

`RayExecutor` takes Ray from ``vyre_ray.backend._import_ray``; the ``fake``
fixture makes that return a `FakeRay`, whose actors hold real
`vyre_ray.worker.Worker`s in this process. Each actor serves its calls on an
event loop thread of its own, as an async Ray actor does. Arguments, results
and a worker's exceptions cross a pickle round trip; results arrive read-only,
as views of Ray's object store do; a worker's exception arrives wrapped as Ray
wraps it. Cancelling a call ends it with ``TaskCancelledError`` before
``ray.cancel`` returns (the quickest Ray can be), and killing an actor ends its
calls with ``ActorDiedError``. A test can hold an actor's calls, restart its
worker, have Ray refuse a call, or stop the threads that send calls at a gate.

Used by ``test_ray_driver_mutants.py`` and ``test_ray_pool_mutants.py``; a test
module uses the fixtures by importing them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import pickle
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

import ray.exceptions as rex

import ray as real_ray
import vyre_ray.backend as rb
from vyre_async import (
    DispatchConfig,
    PendingDispatch,
)
from vyre_async._backend import VyreBackend
from vyre_async._capabilities import BackendCapabilities
from vyre_async.programs import elementwise_xor
from vyre_ray.backend import (
    AFFINITY_SLACK,
    TASK_RETRIES,
)
from vyre_ray.worker import Worker

#: The bound of every wait here (each takes milliseconds; a mutant that never settles costs
#: this once per test, so it stays small).
WAIT_S = 10.0
XOR = elementwise_xor(16)
A = np.arange(16, dtype=np.uint32)
NODE = "node-7"
#: What ray.init is always given.
QUIET = {
    "include_dashboard": False,
    "log_to_driver": False,
    "logging_level": logging.ERROR,
    "namespace": "vyre",
}
#: The actor options of a pool asking for no GPU.
ACTOR_OPTIONS = {
    "max_restarts": -1,
    "max_task_retries": TASK_RETRIES,
    "max_concurrency": 1000,
    "num_cpus": 0,
    "num_gpus": 0,
    "scheduling_strategy": "SPREAD",
}
CLOSED = (
    "the ray backend was closed while the dispatch still ran on a worker; its result was "
    "discarded\nFix: await the dispatches you need (or backend.flush()) before closing, or "
    "raise close_timeout"
)
GONE = (
    "the Ray runtime this 'ray' backend was connected to was shut down (ray.shutdown() in this "
    "process); its workers are gone\nFix: close this backend and build a new one "
    "(acquire_backend('ray') builds a fresh one after close), which connects again"
)
OWN_FIX = "\nFix: inspect the chained exception; check the Ray cluster (ray status)"
#: The pool's own Fix when its workers cannot start (and their error has none of its own).
WORKERS_FIX = (
    "\nFix: check the cluster's resources (ray status) and the workers' logs; with "
    "num_gpus_per_worker, the cluster needs that many GPUs per worker"
)


# The fake ------------------------------------------------------------------------------------


def over_the_wire(value: Any) -> Any:
    """``value`` as Ray hands it to the other side: a pickled copy, its arrays read-only
    (as a large array is: a view of Ray's object store)."""
    copy = pickle.loads(pickle.dumps(value))
    items = copy if isinstance(copy, list | tuple) else [copy]
    for item in items:
        for array in item if isinstance(item, list) else [item]:
            if isinstance(array, np.ndarray):
                array.flags.writeable = False
    return copy


def as_ray_raises(exc: Exception) -> Exception:
    """A worker's exception as ``ref.future()`` raises it: pickled across, and wrapped."""
    try:
        cause = pickle.loads(pickle.dumps(exc))
    except Exception as broken:  # Ray could not bring it across either
        return broken
    error = rex.RayTaskError("Worker.run", "(traceback)", cause)  # type: ignore[no-untyped-call]
    wrapped: Exception = error.as_instanceof_cause()  # type: ignore[no-untyped-call]
    return wrapped


class FakeRef:
    """An object ref of the fake: one call, settled by its actor's loop."""

    def __init__(self, actor: FakeActor) -> None:
        self.actor = actor
        self.task: asyncio.Task[None] | None = None
        self._future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        #: Set once the call settled and the callbacks on its future ran.
        self.ended = threading.Event()

    def future(self) -> concurrent.futures.Future[Any]:
        return self._future

    def cancel_task(self) -> None:  # (on the actor's loop)
        if self.task is not None:
            self.task.cancel()

    def task_ended(self, task: asyncio.Task[None]) -> None:  # (on the actor's loop)
        if not self._future.done():  # cancelled before it started
            self._future.set_exception(
                rex.ActorDiedError() if self.actor.dead else rex.TaskCancelledError()
            )
        self.ended.set()


@dataclass(frozen=True)
class Sent:
    """One ``run.remote`` call as it left the caller."""

    worker: int
    wire: bool  # the program's wire bytes went with it
    config: DispatchConfig
    carrier: dict[str, str] | None  # the caller's trace context
    thread: str  # the name of the thread that sent it
    sender: threading.Thread  # that thread
    ref: FakeRef


class _Method:
    """``handle.method``: ``.remote(*args)`` sends a call, as on a Ray actor handle."""

    def __init__(self, actor: FakeActor, name: str) -> None:
        self._actor, self._name = actor, name

    def remote(self, *args: Any) -> FakeRef:
        return self._actor.call(self._name, args)


class FakeActor:
    """An actor handle of the fake, holding a real `Worker`, served on a thread of its own."""

    def __init__(self, ray: FakeRay, inner: str | None, index: int, trace: str | None) -> None:
        self.ray, self.index = ray, index
        self.created_with = (inner, index, trace)
        #: Set by a test: ``run.remote`` raises it (Ray refusing to send the call).
        self.refuse: Exception | None = None
        self.worker: Worker | None = None
        self.dead = False
        self.open = asyncio.Event()  # cleared while the test holds this actor's calls
        self.open.set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name=f"fake-ray-actor-{index}", daemon=True
        )
        self.thread.start()
        self.restart()
        self.describe = _Method(self, "describe")
        self.run = _Method(self, "run")
        self.flush_telemetry = _Method(self, "flush_telemetry")

    def restart(self) -> None:
        """Start the worker anew (as Ray restarts an actor): it holds no program.

        Without ``inner`` it holds the reference backend (the preferred one of
        this process could be another test's fake). Its ``trace`` is not passed
        on: `configure_tracing` would install this process's global tracer
        provider, which can be set once per process.
        """
        inner = self.created_with[0]
        try:
            self.worker = Worker(inner or "reference", self.index)
        except Exception:  # its constructor failed: Ray reports the actor dead
            self.worker = None

    def hold(self) -> None:
        """Hold this actor's ``run`` calls (received, not started) until `release`."""
        self._on_loop(self.open.clear)

    def release(self) -> None:
        self._on_loop(self.open.set)

    def call(self, name: str, args: tuple[Any, ...]) -> FakeRef:
        ref = FakeRef(self)
        if name == "run":
            self.ray.pass_gate()
            if self.refuse is not None:
                raise self.refuse
            _, wire, _, config, carrier = args
            thread = threading.current_thread()
            self.ray.note_sent(
                Sent(self.index, wire is not None, config, carrier, thread.name, thread, ref)
            )
        elif name == "flush_telemetry":
            self.ray.note_flush()
        args = over_the_wire(args)
        self.loop.call_soon_threadsafe(self._start, ref, name, args)
        return ref

    def _start(self, ref: FakeRef, name: str, args: tuple[Any, ...]) -> None:
        ref.task = self.loop.create_task(self._serve(ref, name, args))
        ref.task.add_done_callback(ref.task_ended)

    async def _serve(self, ref: FakeRef, name: str, args: tuple[Any, ...]) -> None:
        future = ref.future()
        try:
            if self.dead or self.worker is None:
                future.set_exception(rex.ActorDiedError())
                return
            value: Any
            if name == "run":
                await self.open.wait()
                value = await self.worker.run(*args)
            elif name == "describe":
                value = self.worker.describe()
                if self.ray.capabilities is not None:
                    value["capabilities"] = self.ray.capabilities[self.index]
                if self.ray.devices is not None:
                    value["inner"], value["device"] = self.ray.devices[self.index]
            else:
                value = self.worker.flush_telemetry()
            value = over_the_wire(value)
        except asyncio.CancelledError:
            future.set_exception(rex.ActorDiedError() if self.dead else rex.TaskCancelledError())
        except Exception as exc:
            future.set_exception(as_ray_raises(exc))
        else:
            future.set_result(value)

    def kill(self) -> None:
        """End the actor: its calls fail with ``ActorDiedError``, and so do later ones."""
        asyncio.run_coroutine_threadsafe(self._die(), self.loop).result(timeout=WAIT_S)

    async def _die(self) -> None:
        self.dead = True
        calls = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)

    def stop(self) -> None:
        """Kill the actor and end its thread (the test's end)."""
        self.kill()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), f"{self.thread.name} did not end"
        self.loop.close()

    def _on_loop(self, fn: Callable[[], object]) -> None:
        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=WAIT_S)


class _ActorClass:
    """``ray.remote(Worker)``: its ``.options(...).remote(...)`` starts an actor."""

    def __init__(self, ray: FakeRay) -> None:
        self._ray = ray

    def options(self, **options: Any) -> _ActorClass:
        self._ray.options.append(options)
        return self

    def remote(self, inner: str | None, index: int, trace: str | None) -> FakeActor:
        actor = FakeActor(self._ray, inner, index, trace)
        self._ray.actors.append(actor)
        return actor


class FakeRay:
    """The ``ray`` module as `RayExecutor` uses it, recording what it is asked."""

    def __init__(self) -> None:
        self.initialized = False
        #: Set by a test: what ``init``, ``get``, ``kill`` and ``cancel`` raise.
        self.init_error: Exception | None = None
        self.get_error: Exception | None = None
        self.kill_error: Exception | None = None
        self.cancel_error: Exception | None = None
        self.resources: dict[str, float] = {"CPU": 3.0}
        #: Set by a test: what each worker (by index) reports it supports.
        self.capabilities: list[BackendCapabilities] | None = None
        #: Set by a test: the (inner backend, device) each worker (by index) reports.
        self.devices: list[tuple[str, str]] | None = None
        #: Cleared by a test: every thread sending a ``run`` call stops here until it is set.
        self.gate = threading.Event()
        self.gate.set()
        self.at_gate: list[threading.Thread] = []  # every thread that came to the gate
        self.inits: list[tuple[str | None, dict[str, Any]]] = []
        self.options: list[dict[str, Any]] = []  # each pool's actor options
        self.actors: list[FakeActor] = []
        self.sent: list[Sent] = []
        self.flushes = 0
        self.gets: list[float | None] = []  # the timeout of each ray.get
        self.cancelled: list[tuple[FakeRef, dict[str, Any]]] = []
        self.cancelling = threading.Event()
        self.killed: list[tuple[FakeActor, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._came = threading.Condition(self._lock)

    def pass_gate(self) -> None:
        with self._came:
            self.at_gate.append(threading.current_thread())
            self._came.notify_all()
        assert self.gate.wait(WAIT_S), "the gate was left closed"

    def wait_at_gate(self, threads: int) -> None:
        """Wait until ``threads`` calls in all came to the gate."""
        with self._came:
            assert self._came.wait_for(lambda: len(self.at_gate) >= threads, WAIT_S)

    def note_sent(self, sent: Sent) -> None:
        with self._lock:
            self.sent.append(sent)

    def note_flush(self) -> None:
        with self._lock:
            self.flushes += 1

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, address: str | None = None, **options: Any) -> None:
        self.inits.append((address, options))
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def cluster_resources(self) -> dict[str, float]:
        return dict(self.resources)

    def remote(self, cls: type[Worker]) -> _ActorClass:
        assert cls is Worker
        return _ActorClass(self)

    def get(self, refs: list[FakeRef], timeout: float | None = None) -> list[Any]:
        self.gets.append(timeout)
        if self.get_error is not None:
            raise self.get_error
        return [ref.future().result(timeout=WAIT_S) for ref in refs]

    def cancel(self, ref: FakeRef, **kwargs: Any) -> None:
        with self._lock:
            self.cancelled.append((ref, kwargs))
        self.cancelling.set()
        if self.cancel_error is not None:
            raise self.cancel_error
        ref.actor.loop.call_soon_threadsafe(ref.cancel_task)
        assert ref.ended.wait(WAIT_S), "a cancelled call did not end"

    def kill(self, actor: FakeActor, **kwargs: Any) -> None:
        with self._lock:
            self.killed.append((actor, kwargs))
        if self.kill_error is not None:
            raise self.kill_error
        actor.kill()


class _RuntimeContext:
    """``ray.get_runtime_context()`` for `Worker.describe` (the real one starts a cluster)."""

    @staticmethod
    def get_node_id() -> str:
        return NODE


@pytest.fixture(autouse=True)
def _ray_log_level() -> Iterator[None]:
    logger = logging.getLogger("ray")
    level = logger.level
    yield
    logger.setLevel(level)  # (every Worker sets it to ERROR)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRay]:
    """Ray as the fake; a local cluster of 2 is asked for. Its actors end with the test."""
    ray = FakeRay()
    monkeypatch.setattr(rb, "_import_ray", lambda: ray)
    # This process's connection state (the session's real cluster may have set it).
    monkeypatch.setattr(rb, "_started_here", False)
    # The watchdog's period: it ends within one after the pool is closed.
    monkeypatch.setattr(rb, "WATCH_S", 0.01)
    monkeypatch.setattr(real_ray, "get_runtime_context", _RuntimeContext)  # Worker.describe
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("VYRE_RAY_LOCAL_WORKERS", "2")
    try:
        yield ray
    finally:
        for actor in ray.actors:
            actor.stop()


@pytest.fixture
def closing(fake: FakeRay) -> Iterator[Callable[[VyreBackend], VyreBackend]]:
    """``closing(create_backend(...))``: closed at the test's end, its threads ended."""
    before = set(threading.enumerate())
    built: list[VyreBackend] = []

    def keep(backend: VyreBackend) -> VyreBackend:
        built.append(backend)
        return backend

    yield keep
    for actor in fake.actors:
        if not actor.dead:
            actor.release()
    for backend in built:
        if not backend.closed:
            backend.close_timeout = min(backend.close_timeout, 1.0)
            close(backend)
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith("vyre-ray"):  # the watchdog, the submission threads
            thread.join(WAIT_S)
            assert not thread.is_alive(), f"{thread.name} did not end"


def close(backend: VyreBackend) -> None:
    async def aclose() -> None:
        with anyio.fail_after(WAIT_S):
            await backend.aclose()

    anyio.run(aclose)


def xor_of(pending: PendingDispatch, a: np.ndarray, b: np.ndarray) -> None:
    """Check that ``pending`` settles with ``a ^ b``, in a writable array."""
    (out,) = pending.result(timeout=WAIT_S)
    assert np.array_equal(out, a ^ b) and out.flags.writeable


class Failing:
    """A worker's local backend whose dispatches raise ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def dispatch(self, *args: Any) -> Any:
        raise self.error


def holder_takes(fake: FakeRay, backend: VyreBackend, n: int) -> int:
    """How many held calls of ``elementwise_xor(n)`` the worker that ran it takes before
    one goes to another worker.

    ``AFFINITY_SLACK + 1`` when no worker has a call in flight: the pool's count
    of every worker's calls came back to zero after what ran before.
    """
    program, a = elementwise_xor(n), np.arange(n, dtype=np.uint32)
    xor_of(backend.dispatch(program, [a, a + 1]), a, a + 1)
    holder = fake.actors[fake.sent[-1].worker]
    calls: list[PendingDispatch] = []
    holder.hold()
    try:
        while len(calls) <= 2 * AFFINITY_SLACK:
            calls.append(backend.dispatch(program, [a, a + 1]))
            if fake.sent[-1].worker != holder.index:
                break
    finally:
        holder.release()
    for pending in calls:
        xor_of(pending, a, a + 1)
    return len(calls) - 1
