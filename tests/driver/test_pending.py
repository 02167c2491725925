"""PendingDispatch: awaitable on asyncio and trio, single take, timeouts, cancellation."""

from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import (
    BackendError,
    DispatchConfig,
    DispatchFailed,
    DispatchTimeout,
    ErrorCode,
    Launch,
)
from vyre_async._pending import PendingDispatch, ResultAlreadyTaken, wait_for_callbacks
from vyre_async.programs import elementwise_xor

pytestmark = pytest.mark.anyio

OUT = [np.arange(4, dtype=np.uint32)]


def _xor_inputs(n: int) -> list[np.ndarray]:
    return [np.arange(n, dtype=np.uint32), np.ones(n, dtype=np.uint32)]


def _later(seconds: float, fn: object, *args: object) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        fn(*args)  # type: ignore[operator]

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def test_await_result_settled_from_another_thread() -> None:
    pending, completer = PendingDispatch.create(label="t")
    assert not pending.done()
    thread = _later(0.02, completer.resolve, OUT)
    outputs = await pending
    thread.join()
    assert pending.done()
    assert outputs[0].tolist() == [0, 1, 2, 3]
    assert pending.timing is not None and pending.timing.wall_s is not None
    assert pending.timing.wall_s >= 0.015


async def test_the_loop_keeps_running_while_waiting() -> None:
    pending, completer = PendingDispatch.create()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not pending.done():
            ticks += 1
            await anyio.sleep(0.001)

    thread = _later(0.05, completer.resolve, OUT)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await pending
    thread.join()
    assert ticks >= 3  # the loop ran other tasks while the dispatch was pending


async def test_result_can_be_taken_once() -> None:
    pending, completer = PendingDispatch.create()
    completer.resolve(OUT)
    await pending
    with pytest.raises(ResultAlreadyTaken, match="Fix:") as info:
        await pending
    # A contract error like the others (docs/error-codes.md), and the RuntimeError it was.
    error = info.value
    assert isinstance(error, BackendError) and isinstance(error, RuntimeError)
    assert error.code is ErrorCode.InvalidProgram
    assert str(error).endswith("Fix: keep the outputs from the first await or result() call")
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
    with pytest.raises(ResultAlreadyTaken):
        pending.result()


async def test_errors_surface_when_taken_and_foreign_ones_are_wrapped() -> None:
    pending, completer = PendingDispatch.create()
    cause = ZeroDivisionError("boom")
    assert completer.fail(cause)
    with pytest.raises(DispatchFailed, match="Fix:") as info:
        await pending
    assert info.value.code is ErrorCode.DispatchFailed
    assert info.value.__cause__ is cause


async def test_timeout_counts_from_creation_and_requests_a_stop() -> None:
    pending, completer = PendingDispatch.create(timeout=0.05)
    start = time.monotonic()
    with pytest.raises(DispatchTimeout, match="Fix:") as info:
        await pending
    waited = time.monotonic() - start
    assert 0.04 <= waited < 1.5  # prompt, with room for a loaded CI machine
    assert isinstance(info.value, TimeoutError)
    assert completer.stop_requested.is_set()
    assert not completer.resolve(OUT)  # late completion is discarded


async def test_cancelling_the_waiter_leaves_the_dispatch_untaken() -> None:
    pending, completer = PendingDispatch.create()
    with anyio.move_on_after(0.02):
        await pending
    assert not pending.done()
    completer.resolve(OUT)
    assert (await pending)[0].tolist() == [0, 1, 2, 3]


async def test_many_waiters_wake() -> None:
    pairs = [PendingDispatch.create() for _ in range(200)]
    results: list[int] = []

    async def wait(p: PendingDispatch) -> None:
        results.append(int((await p)[0][3]))

    def settle_all() -> None:
        for _, completer in pairs:
            completer.resolve(OUT)

    async with anyio.create_task_group() as tg:
        for p, _ in pairs:
            tg.start_soon(wait, p)
        await anyio.sleep(0.01)
        thread = _later(0.0, settle_all)
    thread.join()
    assert results == [3] * 200


async def test_blocking_result_inside_a_loop_is_refused() -> None:
    pending, completer = PendingDispatch.create()
    with pytest.raises(RuntimeError, match="Fix: use `await pending`"):
        pending.result()
    completer.resolve(OUT)
    assert pending.result()[0].size == 4  # ready results may be taken anywhere


def test_result_blocks_in_plain_code() -> None:
    pending, completer = PendingDispatch.create()
    thread = _later(0.02, completer.resolve, OUT)
    assert pending.result(timeout=5)[0].size == 4
    thread.join()


def test_result_timeout_is_the_callers_own_wait() -> None:
    pending, completer = PendingDispatch.create(timeout=10)
    with pytest.raises(TimeoutError) as info:
        pending.result(timeout=0.01)
    assert not isinstance(info.value, DispatchTimeout)
    completer.resolve(OUT)
    assert pending.result()[0].size == 4  # nothing was consumed


def test_result_raises_dispatch_timeout_at_the_deadline() -> None:
    pending, _ = PendingDispatch.create(timeout=0.03)
    start = time.monotonic()
    with pytest.raises(DispatchTimeout):
        pending.result(timeout=5)
    assert time.monotonic() - start < 2.0


def test_done_callbacks_run_once_even_when_added_late() -> None:
    pending, completer = PendingDispatch.create()
    seen: list[PendingDispatch] = []
    pending.add_done_callback(seen.append)
    completer.resolve(OUT)
    completer.resolve(OUT)
    assert wait_for_callbacks(5) and seen == [pending]
    pending.add_done_callback(seen.append)  # settled already: soon, on the callback thread
    assert wait_for_callbacks(5)
    assert seen == [pending, pending]


def test_a_failing_callback_does_not_break_the_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    reported: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_value))
    pending, completer = PendingDispatch.create()
    pending.add_done_callback(lambda p: 1 / 0)  # type: ignore[arg-type, return-value]
    completer.resolve(OUT)
    assert wait_for_callbacks(5)
    assert isinstance(reported[0], ZeroDivisionError)
    assert pending.result()[0].size == 4


def test_users_cannot_construct_one() -> None:
    with pytest.raises(TypeError, match="backend"):
        PendingDispatch(timeout=None, label=None)


def test_a_result_arriving_after_the_deadline_is_discarded() -> None:
    pending, completer = PendingDispatch.create(timeout=0.02)
    time.sleep(0.05)
    assert not completer.resolve(OUT)  # nobody looked in time, still too late
    with pytest.raises(DispatchTimeout):
        pending.result()


def test_the_deadline_can_start_before_creation() -> None:
    pending, _ = PendingDispatch.create(timeout=0.05, created=time.monotonic() - 1.0)
    assert pending.done()
    with pytest.raises(DispatchTimeout):
        pending.result()


# The deadline belongs to dispatch(), not to whoever waits -------------------------------
#
# `created` stands for a dispatch() call made earlier: the await (or result()) that starts
# now must keep that call's deadline. A mutation that timed the wait from the await
# instead waited the whole timeout again. Each test leaves 1 s of a 6 s deadline: a
# stalled machine does not reach the deadline early, and the wrong clock is 5 s late.


async def test_a_late_await_keeps_the_deadline_of_dispatch() -> None:
    pending, _ = PendingDispatch.create(timeout=6.0, created=time.monotonic() - 5.0)
    assert not pending.done()  # 1 s of the 6 s is left
    with anyio.fail_after(4), pytest.raises(DispatchTimeout):  # a fresh 6 s hits fail_after
        await pending


@pytest.mark.parametrize("limit", [None, 60.0])
def test_a_late_result_keeps_the_deadline_of_dispatch(limit: float | None) -> None:
    pending, _ = PendingDispatch.create(timeout=6.0, created=time.monotonic() - 5.0)
    assert not pending.done()
    start = time.monotonic()
    with pytest.raises(DispatchTimeout):
        pending.result(timeout=limit)
    assert time.monotonic() - start < 4  # a fresh 6 s wait would take 6 s


def test_a_late_result_wait_shorter_than_the_deadline_is_the_callers() -> None:
    pending, completer = PendingDispatch.create(timeout=60.0, created=time.monotonic() - 30)
    with pytest.raises(TimeoutError) as info:
        pending.result(timeout=0.01)
    assert not isinstance(info.value, DispatchTimeout)
    completer.resolve(OUT)
    assert pending.result()[0].size == 4


def test_the_deadline_counts_compilation_in_dispatch() -> None:
    """dispatch() compiles before it enqueues: a compile longer than the timeout expires it."""

    class SlowCompile(BytesBackend):
        def build_pipeline(self, program: Any, config: Any) -> Any:
            time.sleep(0.3)
            return super().build_pipeline(program, config)

        def enqueue(self, launch: Launch) -> PendingDispatch:
            return launch.pending  # the device never finishes it

    backend = backend_of(SlowCompile)
    pending = backend.dispatch(elementwise_xor(8), _xor_inputs(8), DispatchConfig(timeout=0.2))
    assert pending.done()  # 0.3 s of compile already spent the 0.2 s
    with pytest.raises(DispatchTimeout):
        pending.result()


# Cancelled awaits leave nothing behind ------------------------------------------------


async def test_cancelled_awaits_leave_no_wakers_behind() -> None:
    pending, completer = PendingDispatch.create()
    for _ in range(100):
        with anyio.move_on_after(0):
            await pending
        with anyio.CancelScope() as scope:
            scope.cancel()
            await pending
    assert not pending._core.waiters  # 200 cancelled awaits, none still registered
    assert not pending.done()
    completer.resolve(OUT)
    assert (await pending)[0].tolist() == [0, 1, 2, 3]


async def test_cancelled_awaits_among_live_ones_remove_only_their_own_waker() -> None:
    pending, completer = PendingDispatch.create()
    got: list[int] = []

    async def keep_waiting() -> None:
        got.append(int((await pending)[0][1]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_waiting)
        await anyio.wait_all_tasks_blocked()
        assert len(pending._core.waiters or ()) == 1
        for _ in range(50):
            with anyio.move_on_after(0):
                await pending
        assert len(pending._core.waiters or ()) == 1  # only the live waiter's
        completer.resolve(OUT)
    assert got == [1]
    assert not pending._core.waiters


async def test_a_cancelled_await_then_the_deadline_leave_nothing() -> None:
    pending, _ = PendingDispatch.create(timeout=60.0)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await pending
    assert not pending._core.waiters
    expired, _ = PendingDispatch.create(timeout=60.0, created=time.monotonic() - 60.0)
    with pytest.raises(DispatchTimeout):  # past its deadline: no waker is even added
        await expired
    assert not expired._core.waiters


def test_a_callback_raising_systemexit_lets_the_others_run_and_the_waiters_wake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert wait_for_callbacks(5)  # (no other test's callback reports into this one)
    reported: list[type[BaseException]] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args.exc_type))
    pending, completer = PendingDispatch.create()
    ran: list[str] = []
    woke = threading.Event()

    def exits(_: PendingDispatch) -> None:
        # Waiters wake before callbacks run: a callback may wait for a waiter.
        ran.append(f"exits, the waiter woke: {woke.wait(5)}")
        raise SystemExit(3)

    def wait() -> None:
        ran.append(f"woke {pending.result()[0].size}")
        woke.set()

    pending.add_done_callback(exits)
    pending.add_done_callback(lambda _: ran.append("after"))
    waiter = threading.Thread(target=wait)
    waiter.start()
    while pending._core.waiters is None or not pending._core.waiters:  # parked
        time.sleep(0.001)
    completer.resolve(OUT)  # the settling thread is never the one running callbacks
    waiter.join(5)
    assert wait_for_callbacks(5)
    assert ran == ["woke 4", "exits, the waiter woke: True", "after"]
    assert reported == [SystemExit]
    # the callback thread survived its SystemExit
    later, done = PendingDispatch.create()
    later.add_done_callback(lambda _: ran.append("later"))
    done.resolve(OUT)
    assert wait_for_callbacks(5) and ran[-1] == "later"


def test_a_waiter_whose_loop_was_closed_does_not_strand_the_others() -> None:
    import asyncio

    pending, completer = PendingDispatch.create()
    loop = asyncio.new_event_loop()

    async def parked() -> None:
        await pending

    task = loop.create_task(parked())
    loop.run_until_complete(asyncio.sleep(0.01))  # the task is parked on the dispatch
    loop.close()  # ... and its loop is gone
    results: list[int] = []
    waiter = threading.Thread(target=lambda: results.append(pending.result(timeout=10)[0].size))
    waiter.start()
    while len(pending._core.waiters or ()) < 2:
        time.sleep(0.001)
    completer.resolve(OUT)  # wakes the closed loop's waiter on this, its own thread
    waiter.join(10)
    assert results == [4]
    assert not task.done()  # (it never ran again: its loop is closed)


def test_a_settled_dispatch_always_has_its_timing() -> None:
    """``done()`` and ``timing`` are read without the lock, while another thread settles."""
    import sys

    missing = 0
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython can
    try:
        for _ in range(400):
            batch = [PendingDispatch.create() for _ in range(100)]
            thread = threading.Thread(target=lambda b=batch: [c.resolve(OUT) for _, c in b])
            thread.start()
            for pending, _ in batch:
                while not pending.done():
                    pass
                missing += pending.timing is None
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert missing == 0
