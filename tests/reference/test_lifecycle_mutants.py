"""The reference backend's worker pool, its close, and what interpreter exit does.

Found by mutation testing (issue 28). `WorkerPool` (documented in
docs/reference-engine.md) promises: at most ``max_workers`` daemon threads, a
new one only when no thread is idle, jobs started in FIFO order, a job that
raises reported through `threading.excepthook` without costing the pool its
thread, ``busy`` counting jobs queued or running, and a ``join`` bounded by its
timeout. The backend's close waits for running dispatches to reach a safe point
(and no longer), says why a dispatch was stopped, and a direct ``shutdown()``
works without a prefetcher. At interpreter exit one backend whose stop fails
must not keep the others running, and whoever waits on a dispatch stuck outside
the engine's safe points is released after the exit bound, with one warning per
backend; the exit scenarios run in a fresh interpreter (as in test_lifecycle.py).

Idle workers are recognised by where their thread is parked (the pool's
``Condition.wait``), never by sleeping.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import vyre_reference.backend as backend_module
from vyre_async import BackendClosed, DispatchConfig, DispatchTimeout
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    DType,
    Let,
    Load,
    Loop,
    Program,
    Store,
    Var,
    u32,
)
from vyre_reference import reference_backend
from vyre_reference.cancel import Cancelled
from vyre_reference.workers import WorkerPool

#: Bound on every wait for a thread (never reached when the code is right).
WAIT_S = 10.0
#: Bound on a fresh interpreter plus its scenario on a loaded 2-core machine.
LIMIT_S = 60.0

_CONDITION_WAIT = threading.Condition.wait.__code__


class _Job:
    """A job that records that it ran; with ``gate``, it waits for it first (bounded)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate
        self.started = threading.Event()
        self.ran = threading.Event()
        self.gate_opened: bool | None = None

    def run(self) -> None:
        self.started.set()
        if self.gate is not None:
            self.gate_opened = self.gate.wait(WAIT_S)
        self.ran.set()

    def drop(self) -> None:
        raise AssertionError("no test here closes a pool with jobs queued")


def _workers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"{name}-")]


def _parked(name: str) -> int:
    """How many workers of pool ``name`` wait for work (in the pool's own Condition.wait)."""
    frames = sys._current_frames()
    parked = 0
    for thread in _workers(name):
        frame = frames.get(thread.ident or 0)
        caller = frame.f_back if frame is not None else None
        if frame is not None and frame.f_code is _CONDITION_WAIT and caller is not None:
            parked += "_work" in caller.f_code.co_name  # (mutmut renames it x..._work__mutmut_N)
    return parked


def _all_parked(name: str) -> int:
    """Wait until every worker of pool ``name`` waits for work; return how many there are."""
    deadline = time.monotonic() + WAIT_S
    while (parked := _parked(name)) != len(_workers(name)):
        assert time.monotonic() < deadline, f"{name}: only {parked} workers went idle"
        time.sleep(0.001)
    return parked


def _run_one(pool: WorkerPool, name: str) -> int:
    """Run one job; return the number of workers once all of them are idle again."""
    job = _Job()
    pool.submit(job)
    assert job.ran.wait(WAIT_S)
    return _all_parked(name)


@pytest.fixture
def pool_name(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"test-pool-{request.node.name}"
    yield name
    for thread in _workers(name):  # every test closes its pool: its threads end
        thread.join(WAIT_S)


# WorkerPool --------------------------------------------------------------------------------
def test_a_new_pool_is_open_and_not_busy(pool_name: str) -> None:
    pool = WorkerPool(2, name=pool_name)
    assert pool.closed is False
    assert pool.busy == 0
    assert pool.close() == []
    assert pool.closed is True


def test_submit_after_close_raises_and_queues_nothing(pool_name: str) -> None:
    pool = WorkerPool(1, name=pool_name)
    pool.close()
    with pytest.raises(RuntimeError) as info:
        pool.submit(_Job())
    assert str(info.value) == "the worker pool was closed"
    assert pool.busy == 0 and _workers(pool_name) == []


def test_busy_counts_jobs_queued_and_running_until_they_end(pool_name: str) -> None:
    pool = WorkerPool(2, name=pool_name)
    gate = threading.Event()
    first, second, third = _Job(gate), _Job(gate), _Job()
    try:
        pool.submit(first)
        pool.submit(second)
        assert first.started.wait(WAIT_S) and second.started.wait(WAIT_S)
        pool.submit(third)  # both workers are busy: it waits in the queue
        assert pool.busy == 3
        gate.set()
        assert third.ran.wait(WAIT_S)
        assert _all_parked(pool_name) == 2
        assert pool.busy == 0
    finally:
        gate.set()
        pool.close()


def test_the_pool_never_runs_more_threads_than_max_workers(pool_name: str) -> None:
    pool = WorkerPool(1, name=pool_name)
    gate = threading.Event()
    first, second = _Job(gate), _Job()
    try:
        pool.submit(first)
        pool.submit(second)
        assert len(_workers(pool_name)) == 1
        assert first.started.wait(WAIT_S)
        assert not second.started.is_set()  # FIFO on one thread: it waits for the first
        gate.set()
        assert second.ran.wait(WAIT_S)
        assert len(_workers(pool_name)) == 1
    finally:
        gate.set()
        pool.close()


def test_an_idle_worker_takes_the_next_job_without_a_new_thread(pool_name: str) -> None:
    pool = WorkerPool(2, name=pool_name)
    try:
        assert [_run_one(pool, pool_name) for _ in range(3)] == [1, 1, 1]
    finally:
        pool.close()


def test_two_idle_workers_take_two_jobs_without_a_third_thread(pool_name: str) -> None:
    pool = WorkerPool(3, name=pool_name)
    gate = threading.Event()
    first, second = _Job(gate), _Job(gate)
    try:
        pool.submit(first)
        pool.submit(second)
        assert first.started.wait(WAIT_S) and second.started.wait(WAIT_S)
        gate.set()
        assert first.ran.wait(WAIT_S) and second.ran.wait(WAIT_S)
        assert _all_parked(pool_name) == 2
        third, fourth = _Job(), _Job()
        pool.submit(third)
        pool.submit(fourth)
        assert third.ran.wait(WAIT_S) and fourth.ran.wait(WAIT_S)
        assert len(_workers(pool_name)) == 2
    finally:
        gate.set()
        pool.close()


def test_a_pool_that_went_idle_still_runs_two_jobs_at_once(pool_name: str) -> None:
    pool = WorkerPool(2, name=pool_name)
    try:
        assert _run_one(pool, pool_name) == 1
        other = _Job()
        waiting = _Job(other.started)  # runs until the other job started beside it
        pool.submit(waiting)
        assert waiting.started.wait(WAIT_S)  # the idle worker took it: none is idle now
        pool.submit(other)
        assert waiting.ran.wait(WAIT_S + 5)
        assert waiting.gate_opened is True
    finally:
        pool.close()


def test_a_job_that_raises_is_reported_and_its_worker_takes_the_next_job(
    monkeypatch: pytest.MonkeyPatch, pool_name: str
) -> None:
    reported: list[Any] = []
    report_seen = threading.Event()

    def hook(args: Any) -> None:
        reported.append(args)
        report_seen.set()

    monkeypatch.setattr(threading, "excepthook", hook)
    boom = ValueError("boom")

    class Failing(_Job):
        def run(self) -> None:
            raise boom

    pool = WorkerPool(1, name=pool_name)
    after = _Job()
    try:
        pool.submit(Failing())
        pool.submit(after)
        assert report_seen.wait(WAIT_S)
        (args,) = reported
        assert (args.exc_type, args.exc_value) == (ValueError, boom)
        assert args.exc_traceback is boom.__traceback__
        assert args.thread is not None and args.thread.name == f"{pool_name}-0"
        assert after.ran.wait(WAIT_S)  # the same worker went on
        assert len(_workers(pool_name)) == 1
    finally:
        pool.close()


def test_workers_are_daemon_threads(pool_name: str) -> None:
    pool = WorkerPool(1, name=pool_name)
    try:
        assert _run_one(pool, pool_name) == 1
        assert [t.daemon for t in _workers(pool_name)] == [True]
    finally:
        pool.close()


def test_join_waits_no_longer_than_its_timeout_and_says_whether_the_workers_ended(
    pool_name: str,
) -> None:
    pool = WorkerPool(2, name=pool_name)
    gate = threading.Event()
    jobs = [_Job(gate), _Job(gate)]
    try:
        for job in jobs:
            pool.submit(job)
        assert all(job.started.wait(WAIT_S) for job in jobs)
        assert pool.close() == []
        started = time.monotonic()
        assert pool.join(0.05) is False  # both still run their job
        assert time.monotonic() - started < 1.0  # 0.05 s for both, not per worker
        opener = threading.Timer(0.2, gate.set)  # while join waits
        opener.start()
        assert pool.join(WAIT_S) is True
        assert _workers(pool_name) == []
    finally:
        gate.set()
        pool.close()


# ReferenceExecutor: close ---------------------------------------------------------------------
def _runaway(op_id: str) -> Program:
    """A kernel of ~2**32 loop iterations (hours in the engine) unless it is stopped."""
    return Program(
        [
            BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 1),
        ],
        1,
        [
            Let("acc", u32(0)),
            Loop("i", u32(0), Load("n", u32(0)), [Assign("acc", Var("acc") + Var("i"))]),
            Store("out", u32(0), Var("acc")),
        ],
        op_id=op_id,
    )


N = [np.array([0xFFFF_FFFF], np.uint32)]
CLOSED_FIX = "\nFix: await the dispatches you need (or backend.flush()) before closing the backend"


@pytest.mark.anyio
async def test_close_waits_for_a_dispatch_to_reach_its_safe_point_and_says_why_it_stopped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    entered = threading.Event()

    def slow_to_stop(*args: Any, cancel: threading.Event, **kwargs: Any) -> Any:
        entered.set()
        assert cancel.wait(WAIT_S)  # the close's stop request, then 0.3 s to a safe point
        time.sleep(0.3)
        raise Cancelled

    monkeypatch.setattr(backend_module, "run_plan", slow_to_stop)
    caplog.set_level(logging.WARNING, logger="vyre_async.reference")
    backend = reference_backend(close_timeout=WAIT_S)
    pending = backend.dispatch(_runaway(""), N)
    assert entered.wait(WAIT_S)
    started = time.monotonic()
    await backend.aclose()
    assert time.monotonic() - started < WAIT_S / 2  # until the safe point, not close_timeout
    assert backend.executor.in_flight == 0  # nothing was left running
    # (nothing abandoned: no warning, however long the idle workers take to end)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    with pytest.raises(BackendClosed) as info:
        await pending
    assert str(info.value) == (  # no label, no op_id
        "a dispatch was stopped: the reference backend was closed while it was queued or "
        "running" + CLOSED_FIX
    )


@pytest.mark.anyio
async def test_a_closed_dispatch_is_named_by_its_label_first() -> None:
    backend = reference_backend()
    pending = backend.dispatch(_runaway("test.runaway"), N, DispatchConfig(label="mine"))
    await backend.aclose()
    with pytest.raises(BackendClosed) as info:
        await pending
    assert str(info.value).startswith(
        "dispatch mine was stopped: the reference backend was closed while it was queued or running"
    )


@pytest.mark.anyio
async def test_shutdown_called_directly_stops_a_backend_without_a_prefetcher() -> None:
    backend = reference_backend(prefetch=False)
    pending = backend.dispatch(_runaway("test.runaway"), N)
    await backend.shutdown()
    assert backend.closed
    with pytest.raises(BackendClosed):
        await pending


@pytest.mark.anyio
async def test_a_stop_asked_through_stop_requested_is_a_stop_not_an_engine_failure() -> None:
    async with reference_backend() as backend:
        pending = backend.dispatch(_runaway("test.runaway"), N)
        pending.stop_requested.set()  # as its deadline would, but with the backend open
        with pytest.raises(DispatchTimeout) as info:
            await pending
    assert str(info.value).startswith("dispatch test.runaway was stopped: ")


# Interpreter exit ----------------------------------------------------------------------------
PRELUDE = textwrap.dedent(
    """
    import atexit, logging, threading, time, numpy as np
    import vyre_reference.backend as module
    from vyre_async.ir import Access, Assign, BufferDecl, DType, Let, Load, Loop, Program
    from vyre_async.ir import Store, Var, u32
    from vyre_reference import ReferenceExecutor, reference_backend
    from vyre_reference.cancel import Cancelled

    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    RUNAWAY = Program(
        [BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
         BufferDecl("out", 1, Access.WRITE, DType.U32, 1)],
        1,
        [Let("acc", u32(0)),
         Loop("i", u32(0), Load("n", u32(0)), [Assign("acc", Var("acc") + Var("i"))]),
         Store("out", u32(0), Var("acc"))],
        op_id="test.exit",
    )
    N = [np.array([0xFFFF_FFFF], np.uint32)]
    """
)


def _exit_scenario(body: str) -> tuple[list[str], list[str]]:
    """Run ``body`` after PRELUDE in a fresh interpreter; return its stdout and stderr lines."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - the regression
        pytest.fail(f"the process was still running after {LIMIT_S} s: {exc.stdout!r}")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines(), done.stderr.splitlines()


def test_exit_stops_every_other_backend_when_one_fails_to_stop() -> None:
    out, err = _exit_scenario(
        """
        module._EXIT_TIMEOUT_S = 30.0  # the exit waits for what stops, however slowly

        def slow_to_stop(*args, cancel, **kwargs):
            cancel.wait()  # the stop request, then 0.3 s to the next safe point
            time.sleep(0.3)
            raise Cancelled()

        module.run_plan = slow_to_stop
        stop_at_exit, stops = ReferenceExecutor.stop_at_exit, []

        def first_stop_fails(self):
            stops.append(self)
            if len(stops) == 1:
                raise RuntimeError("boom")
            return stop_at_exit(self)

        ReferenceExecutor.stop_at_exit = first_stop_fails
        backends = [reference_backend(), reference_backend()]
        pendings = {id(b.executor): b.dispatch(RUNAWAY, N) for b in backends}

        def report():
            for name, executor in zip(["failed", "stopped"], stops):
                error = pendings[id(executor)].exception()
                print(name, type(error).__name__, executor.in_flight, flush=True)

        atexit.register(report)  # runs after the threading exit hooks
        """
    )
    assert out == ["failed NoneType 1", "stopped BackendClosed 0"]
    assert err == [
        "WARNING vyre_async.reference: stopping a reference backend at exit failed: boom"
    ]


def test_exit_releases_waiters_on_stuck_dispatches_after_its_bound_and_warns() -> None:
    out, err = _exit_scenario(
        """
        module._EXIT_TIMEOUT_S = 0.1
        entered = threading.Semaphore(0)

        def stuck(*args, **kwargs):
            entered.release()
            threading.Event().wait(5)  # never checks the cancel event
            raise RuntimeError("released")

        module.run_plan = stuck
        backends = [reference_backend(), reference_backend()]
        pendings = [b.dispatch(RUNAWAY, N) for b in backends]

        def wait():
            for pending in pendings:
                try:
                    pending.result(timeout=30)
                except Exception as exc:
                    print(type(exc).__name__, str(exc).splitlines()[0], flush=True)

        threading.Thread(target=wait).start()  # not a daemon: exit joins it
        for _ in pendings:
            assert entered.acquire(timeout=10)
        atexit.register(lambda: print("exit took", round(time.monotonic() - t0, 3)))
        t0 = time.monotonic()
        """
    )
    released = (
        "BackendClosed dispatch test.exit was stopped: "
        "the reference backend was closed while it was queued or running"
    )
    assert out[:2] == [released, released]
    assert float(out[2].removeprefix("exit took ")) < 1.5  # 0.1 s for both, not per backend
    warning = (
        "WARNING vyre_async.reference: reference backend closed with 1 dispatch(es) still running "
        "after 0.1 s; they were failed with BackendClosed and their daemon threads abandoned"
    )
    assert err == [warning, warning]
