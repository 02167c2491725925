"""PendingDispatch: the behaviour mutation testing (issue 28) found unchecked.

Exact error texts and what a dispatch's hooks and callbacks are handed; the
deadline at its exact instant and the polling backoff (both on an injected
clock: ``time`` inside `vyre_async._pending` is replaced, nothing sleeps for
them); how asyncio and trio waiters are woken or left alone; where a broken
error reporter's output goes; and the callback thread in a fresh interpreter,
in a forked child and after it died (or could not start). Orders are made by
events, loop turns and trio's ``wait_all_tasks_blocked``; the only timed checks
have margins of 50x or more.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import numpy as np
import pytest
import trio
import trio.testing

import vyre_async._pending as pending_module
from vyre_async import DispatchFailed, DispatchTimeout, InvalidProgram
from vyre_async._pending import (
    DispatchCompleter,
    DispatchRecord,
    DispatchTiming,
    PendingDispatch,
    defer_to_callbacks,
    settle_hook,
    wait_for_callbacks,
)

OUT = [np.arange(4, dtype=np.uint32)]
T = TypeVar("T")
BOUND_S = 10.0  # an upper bound for what happens at once (reached only when a test fails)


class Clock:
    """Stands in for the `time` module inside `vyre_async._pending`: a clock the test moves.

    ``monotonic`` and ``perf_counter`` read the same value; the steps used are
    binary fractions, so sums land exactly on deadlines and budget marks.
    """

    def __init__(self, now: float = 1024.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(pending_module, "time", fake)
    return fake


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """What `threading.excepthook` was handed while the test ran."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


async def _await(pending: PendingDispatch) -> list[np.ndarray]:
    return await pending


def _run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, bounded: a broken wake-up fails the test instead of hanging it."""
    return asyncio.run(asyncio.wait_for(main, BOUND_S))


# What errors say -------------------------------------------------------------------
# Kills: xǁ_Coreǁdescribe__mutmut_1..4.
def test_repr_names_the_label_or_a_distinct_address() -> None:
    labelled, _ = PendingDispatch.create(label="job")
    assert repr(labelled) == "<PendingDispatch 'job' pending>"
    a, _ = PendingDispatch.create()
    b, _ = PendingDispatch.create()
    assert re.fullmatch(r"<PendingDispatch at 0x[0-9a-f]+ pending>", repr(a))
    assert repr(a) != repr(b)  # two live dispatches, two addresses


# Kills: xǁDispatchCompleterǁfail__mutmut_7, 9, 10, 11, 12, 15, 16.
def test_a_foreign_error_is_wrapped_with_its_type_and_fix_and_hooks_get_the_dispatch() -> None:
    pending, completer = PendingDispatch.create(label="job")
    hooked: list[PendingDispatch] = []
    called_back: list[PendingDispatch] = []
    settle_hook(pending, hooked.append)
    pending.add_done_callback(called_back.append)
    cause = ZeroDivisionError("boom")
    assert completer.fail(cause) is True
    assert repr(pending) == "<PendingDispatch 'job' done>"
    error = pending.exception()
    assert isinstance(error, DispatchFailed) and error.__cause__ is cause
    assert str(error) == (
        "dispatch 'job' failed: ZeroDivisionError: boom\n"
        "Fix: inspect the chained exception; check inputs and backend health"
    )
    assert hooked == [pending]
    assert wait_for_callbacks(BOUND_S)
    assert called_back == [pending]


# Kills: xǁDispatchCompleterǁfail__mutmut_2, 3; xǁ_Coreǁexpire__mutmut_4, 7, 8, 9, 10, 11.
def test_failing_past_the_deadline_is_a_timeout_that_names_the_timeout_and_fix() -> None:
    pending, completer = PendingDispatch.create(
        timeout=1.5, label="late", created=time.monotonic() - 10.0
    )
    called_back: list[PendingDispatch] = []
    pending.add_done_callback(called_back.append)
    assert completer.fail(ZeroDivisionError("boom")) is False  # too late: not its outcome
    error = pending.exception()
    assert isinstance(error, DispatchTimeout)
    assert error.timeout == 1.5  # type: ignore[attr-defined]  # (set from its context)
    assert str(error) == (
        "dispatch 'late' did not finish within its timeout of 1.5 s (counted from dispatch())\n"
        "Fix: raise DispatchConfig.timeout or split the work into smaller dispatches"
    )
    assert wait_for_callbacks(BOUND_S)
    assert called_back == [pending]


# Kills: xǁPendingDispatchǁadd_done_callback__mutmut_4, 6, 7, 8, 9.
def test_a_done_callback_that_is_not_callable_is_refused_with_the_fix() -> None:
    pending, _ = PendingDispatch.create()
    with pytest.raises(InvalidProgram) as info:
        pending.add_done_callback(42)  # type: ignore[arg-type]
    assert str(info.value) == (
        "add_done_callback needs a callable, got 42\n"
        "Fix: pass a function taking the PendingDispatch"
    )


# Kills: x_wait_for_callbacks__mutmut_3, 6, 7.
def test_wait_for_callbacks_refuses_a_timeout_that_is_not_seconds_with_an_example() -> None:
    with pytest.raises(InvalidProgram) as info:
        wait_for_callbacks(float("nan"))
    assert str(info.value).endswith("\nFix: pass e.g. wait_for_callbacks(timeout=5.0)")


# Kills: x__running_library__mutmut_2, 3.
def test_result_inside_a_running_asyncio_loop_is_refused_naming_asyncio() -> None:
    async def main() -> str:
        pending, _ = PendingDispatch.create()
        with pytest.raises(RuntimeError) as info:
            pending.result()
        return str(info.value)

    assert _run(main()) == (
        "PendingDispatch.result() would block the running asyncio event loop\n"
        "Fix: use `await pending` inside async code "
        "(or PendingDispatch.result() from a worker thread)"
    )


# Kills: xǁPendingDispatchǁ_wait_trio__mutmut_6..12.
def test_awaiting_outside_asyncio_and_trio_says_how_to_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "trio")  # (restored after the test)
    pending, _ = PendingDispatch.create()
    coroutine = _await(pending)
    with pytest.raises(RuntimeError) as info:
        coroutine.send(None)  # no event loop runs this coroutine
    coroutine.close()
    assert str(info.value) == (
        "a PendingDispatch can only be awaited inside an asyncio or trio event loop\n"
        "Fix: await it from async code, or call pending.result() from plain code"
    )


# Kills: x__wait__mutmut_16.
def test_result_with_a_short_timeout_gives_up_after_about_that_long() -> None:
    pending, _ = PendingDispatch.create(label="slow")
    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        pending.result(timeout=0.01)
    assert time.monotonic() - started < 0.9  # not a second-long minimum wait
    assert type(info.value) is TimeoutError  # the dispatch's own deadline did not pass
    assert str(info.value) == (
        "dispatch 'slow' not finished after 0.01 s of waiting; "
        "it keeps running and its result can still be taken"
    )


# The record: annotations, phases, hooks ---------------------------------------------
# Kills: xǁDispatchCompleterǁannotate__mutmut_2, 3, 4; xǁDispatchCompleterǁrecord_phase__mutmut_3.
def test_annotations_and_phases_accumulate_on_the_record() -> None:
    pending, completer = PendingDispatch.create()
    completer.annotate("vyre.stream", 3)
    completer.annotate("vyre.policy.order", "kept")
    completer.record_phase("vyre.compile", 1, 2)
    completer.record_phase("vyre.launch", 3, 4)
    assert pending.record.attributes == {"vyre.stream": 3, "vyre.policy.order": "kept"}
    assert pending.record.phases == [("vyre.compile", 1, 2), ("vyre.launch", 3, 4)]


# Kills: x_settle_hook__mutmut_5.
def test_every_settle_hook_runs_in_order_with_the_dispatch(
    reported: list[BaseException | None],
) -> None:
    pending, completer = PendingDispatch.create()
    ran: list[tuple[str, PendingDispatch]] = []
    settle_hook(pending, lambda p: ran.append(("first", p)))
    settle_hook(pending, lambda p: ran.append(("second", p)))
    assert completer.resolve(OUT)
    assert ran == [("first", pending), ("second", pending)]
    assert reported == []


# Kills: x_defer_to_callbacks__mutmut_2; xǁ_CallbackThreadǁ_running__mutmut_11, 14, 17.
def test_deferred_work_runs_on_the_daemon_callback_thread_with_its_dispatch() -> None:
    pending, _ = PendingDispatch.create()
    got: list[tuple[PendingDispatch, str, bool]] = []

    def work(p: PendingDispatch) -> None:
        thread = threading.current_thread()
        got.append((p, thread.name, thread.daemon))

    defer_to_callbacks(pending, work)
    assert wait_for_callbacks(BOUND_S)
    # A daemon: a callback that blocks never keeps the interpreter from exiting.
    assert got == [(pending, "vyre-callbacks", True)]


# Deadlines --------------------------------------------------------------------------
# Kills: xǁDispatchCompleterǁshould_stop__mutmut_4, xǁ_StopFlagǁis_set__mutmut_4,
# xǁ_Coreǁpast_deadline__mutmut_3 (and the same boundary in done() and resolve()).
def test_a_dispatch_is_past_its_deadline_from_the_deadline_instant_on(clock: Clock) -> None:
    pending, completer = PendingDispatch.create(timeout=2.0, created=clock.now)
    flagged, flagged_completer = PendingDispatch.create(timeout=2.0, created=clock.now)
    flag = flagged_completer.stop_requested  # made before the deadline: it reads the clock
    clock.now += 1.75
    assert not completer.should_stop() and not flag.is_set() and not pending.done()
    clock.now += 0.25  # exactly the deadline
    assert completer.should_stop()  # (no stop flag was made for this one)
    assert flag.is_set() and flagged.stop_requested.is_set()
    assert completer.fail(ZeroDivisionError("boom")) is False
    assert isinstance(pending.exception(), DispatchTimeout)

    resolved, completer = PendingDispatch.create(timeout=0.5, created=clock.now - 0.5)
    assert completer.resolve(OUT) is False
    assert isinstance(resolved.exception(), DispatchTimeout)
    looked_at, _ = PendingDispatch.create(timeout=0.5, created=clock.now - 0.5)
    assert looked_at.done()


# Kills: xǁPendingDispatchǁ_wait_asyncio__mutmut_22, xǁPendingDispatchǁ_wait_trio__mutmut_31.
@pytest.mark.anyio
async def test_a_deadline_that_fires_while_awaiting_hands_callbacks_the_dispatch() -> None:
    pending, _ = PendingDispatch.create(timeout=0.2, label="slow")
    called_back: list[PendingDispatch] = []
    pending.add_done_callback(called_back.append)
    with pytest.raises(DispatchTimeout):
        await pending  # parks at once; the deadline wakes it
    assert await anyio.to_thread.run_sync(wait_for_callbacks, BOUND_S)
    assert called_back == [pending]


# Cancelled awaiters -----------------------------------------------------------------
# Kills: xǁPendingDispatchǁ_await_cancelled__mutmut_3, 5, 7, 8, 9, 10.
@pytest.mark.anyio
async def test_cancelling_a_parked_awaiter_tells_the_record_once_with_the_dispatch(
    reported: list[BaseException | None],
) -> None:
    pending, completer = PendingDispatch.create()
    told: list[PendingDispatch] = []
    pending.record.on_await_cancelled = told.append
    with anyio.move_on_after(0.05):
        await pending
    assert told == [pending] and not pending.done()
    assert completer.resolve(OUT)
    assert (await pending)[0].tolist() == [0, 1, 2, 3]
    assert told == [pending] and reported == []


# Kills: xǁPendingDispatchǁ_poll_turns__mutmut_14, 16, 18, 19, 20, 21.
def test_cancelling_a_polling_awaiter_stops_the_poll_and_tells_the_record(
    reported: list[BaseException | None],
) -> None:
    pending, completer = PendingDispatch.create()
    told: list[PendingDispatch] = []
    pending.record.on_await_cancelled = told.append
    gave_up: list[int] = []
    calls = 0

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None

        def check() -> None:
            nonlocal calls
            calls += 1
            if calls == 3:  # the awaiting task is polling between its turns
                task.cancel()

        completer.poll_with(check, budget_s=60.0, give_up=lambda: gave_up.append(calls))
        with pytest.raises(asyncio.CancelledError):
            await pending

    _run(main())
    assert told == [pending] and gave_up == [3] and reported == []
    assert completer.resolve(OUT) and pending.result()[0].tolist() == [0, 1, 2, 3]


# Polling ----------------------------------------------------------------------------
def _poll_schedule(clock: Clock, *, budget_s: float, step_s: float) -> tuple[list[int], int]:
    """The loop turns at which an awaiting asyncio task polled, and the turn it gave up.

    Each poll moves the clock on by ``step_s``; a sibling task counts the turns
    and settles the dispatch once the awaiting task gave up polling.
    """
    pending, completer = PendingDispatch.create()
    turn = 0
    polled_at: list[int] = []
    gave_up: list[int] = []

    def check() -> None:
        polled_at.append(turn)
        clock.now += step_s

    completer.poll_with(check, budget_s=budget_s, give_up=lambda: gave_up.append(turn))

    async def turns() -> None:
        nonlocal turn
        while not gave_up and turn < 1000:
            turn += 1
            await asyncio.sleep(0)
        completer.resolve(OUT)

    async def main() -> None:
        ticker = asyncio.create_task(turns())
        await pending
        await ticker

    _run(main())
    assert len(gave_up) == 1
    return polled_at, gave_up[0]


# Kills: xǁPendingDispatchǁ_poll_turns__mutmut_8, 9, 10, 24, 25, 30, 34, 36, 41, 42, 44.
def test_an_awaiting_task_polls_every_turn_for_half_the_budget_then_every_2_then_4(
    clock: Clock,
) -> None:
    polled_at, gave_up_at = _poll_schedule(clock, budget_s=1.0, step_s=0.125)
    # done() looks once before the first turn (turn 0); the budget runs from there.
    # Turns 1-4 poll each turn; at 0.5 s (half the budget, exactly) the gaps grow
    # to 2, then 4; the poll at 1.0 s (the budget, exactly) is the last.
    assert polled_at == [0, 1, 2, 3, 4, 6, 10, 14, 18]
    assert gave_up_at == 18


# Kills: xǁPendingDispatchǁ_poll_turns__mutmut_33.
def test_polling_stops_at_the_deadline_instant(clock: Clock) -> None:
    pending, completer = PendingDispatch.create(timeout=1.0, created=clock.now)
    calls = 0
    gave_up: list[int] = []

    def check() -> None:
        nonlocal calls
        calls += 1
        clock.now += 0.25  # the fourth poll lands on the deadline exactly

    completer.poll_with(check, budget_s=60.0, give_up=lambda: gave_up.append(calls))

    async def main() -> None:
        with pytest.raises(DispatchTimeout):
            await pending

    _run(main())
    assert gave_up == [4]


# Waking waiters ---------------------------------------------------------------------
# Kills: xǁ_AsyncioWaiterǁ__init____mutmut_3.
def test_a_dispatch_settled_on_the_loop_thread_wakes_its_awaiter_without_an_extra_turn() -> None:
    async def main() -> list[str]:
        pending, completer = PendingDispatch.create()
        order: list[str] = []

        async def waiter() -> None:
            await pending
            order.append("awaiter resumed")

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter parks on its future
        completer.resolve(OUT)  # on the loop's own thread: the future is set directly
        await asyncio.sleep(0)
        order.append("settler's next turn")
        await task
        return order

    assert _run(main()) == ["awaiter resumed", "settler's next turn"]


# Kills: xǁPendingDispatchǁ_wait_trio__mutmut_22.
def test_a_trio_awaiter_cancelled_as_the_dispatch_settles_is_woken_once() -> None:
    async def main() -> list[np.ndarray]:
        pending, completer = PendingDispatch.create()
        scope = trio.CancelScope()

        async def waiter() -> None:
            with scope:
                await pending

        with trio.fail_after(BOUND_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()  # the waiter is rescheduled with Cancelled, still registered
                assert completer.resolve(OUT)  # and is woken by the settle
        return await pending  # (the cancelled await took nothing)

    assert trio.run(main)[0].tolist() == [0, 1, 2, 3]


# Kills: xǁ_TrioWaiterǁwake__mutmut_4.
def test_settling_after_the_awaiting_trio_run_ended_reports_nothing(
    reported: list[BaseException | None],
) -> None:
    pending, completer = PendingDispatch.create()
    parked = threading.Event()
    started: list[tuple[Any, trio.CancelScope]] = []

    async def main() -> None:
        async def waiter() -> None:
            with trio.CancelScope() as scope:
                started.append((trio.lowlevel.current_trio_token(), scope))
                await pending

        with trio.fail_after(BOUND_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                parked.set()

    run = threading.Thread(target=trio.run, args=(main,))
    run.start()
    assert parked.wait(BOUND_S)

    def end_the_run(_: PendingDispatch) -> None:
        # Inline in settle, after it took the waiters and before it wakes them.
        token, scope = started[0]
        token.run_sync_soon(scope.cancel)
        run.join(BOUND_S)

    settle_hook(pending, end_the_run)
    assert completer.resolve(OUT)
    assert not run.is_alive()
    assert reported == []  # waking a waiter whose run is over is no error


# A broken error reporter, the callback thread -------------------------------------
class _Unreportable(BaseException):
    """Not an Exception, like KeyboardInterrupt, yet a plain test failure where pytest sees it."""


class _Unwritable(io.StringIO):
    def __init__(self, error: type[BaseException]) -> None:
        super().__init__()
        self.error = error

    def write(self, s: str) -> int:
        raise self.error("this stream is broken on purpose")


def _break_excepthook(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: threading.ExceptHookArgs) -> None:
        raise RuntimeError("the reporter is broken on purpose")

    monkeypatch.setattr(threading, "excepthook", broken)


def _fails(_: PendingDispatch) -> None:
    raise ValueError("this callback fails on purpose")


# Kills: x__report_callback_error__mutmut_7, 9, 10.
def test_a_broken_excepthook_falls_back_to_the_process_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break_excepthook(monkeypatch)
    real, replaced = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "__stderr__", real)
    monkeypatch.setattr(sys, "stderr", replaced)
    pending, completer = PendingDispatch.create()
    pending.add_done_callback(_fails)
    completer.resolve(OUT)
    assert wait_for_callbacks(BOUND_S)
    assert "ValueError: this callback fails on purpose" in real.getvalue()
    assert replaced.getvalue() == ""


# Kills: x__report_callback_error__mutmut_5.
def test_a_broken_excepthook_and_stderr_stop_neither_settling_nor_the_next_callbacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break_excepthook(monkeypatch)
    monkeypatch.setattr(sys, "__stderr__", _Unwritable(OSError))
    pending, completer = PendingDispatch.create()
    ran: list[PendingDispatch] = []
    settle_hook(pending, _fails)
    pending.add_done_callback(_fails)
    pending.add_done_callback(ran.append)
    assert completer.resolve(OUT)  # the hook's error is lost, never raised here
    assert wait_for_callbacks(BOUND_S)
    assert ran == [pending]


def test_a_broken_hook_and_a_stream_raising_a_base_exception_stop_no_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Reporting drops whatever the stderr fallback raises, BaseExceptions too: the
    # dispatch's next callbacks run on the same thread.
    _break_excepthook(monkeypatch)
    monkeypatch.setattr(sys, "__stderr__", _Unwritable(_Unreportable))
    threads: list[threading.Thread] = []
    pending, completer = PendingDispatch.create()
    pending.add_done_callback(_fails)
    pending.add_done_callback(lambda _: threads.append(threading.current_thread()))
    completer.resolve(OUT)
    assert wait_for_callbacks(BOUND_S)
    assert len(threads) == 1 and threads[0].is_alive()


# Kills: xǁ_CallbackThreadǁ_running__mutmut_4, 7.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_callback_thread_is_started_again_after_it_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing a callback or its report raises ends the thread (above); an error in
    # the machinery itself would. Simulated: one item's run raises a BaseException.
    # The next submit starts a new thread, which runs the next callbacks.
    real = pending_module._run_all
    calls: list[int] = []

    def dies_once(callbacks: Any, pending: PendingDispatch) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise _Unreportable("the callback machinery fails on purpose")
        real(callbacks, pending)

    monkeypatch.setattr(pending_module, "_run_all", dies_once)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # (where threading reports its end)
    threads: list[threading.Thread] = []
    pending, completer = PendingDispatch.create()
    pending.add_done_callback(lambda _: None)
    completer.resolve(OUT)
    first = pending_module._CALLBACKS._thread
    assert first is not None
    first.join(BOUND_S)
    assert not first.is_alive()

    again, completer = PendingDispatch.create()
    again.add_done_callback(lambda _: threads.append(threading.current_thread()))
    completer.resolve(OUT)
    assert wait_for_callbacks(5.0)
    assert len(threads) == 1 and threads[0] is not first
    assert threads[0].name == "vyre-callbacks"


def _run_fresh(source: str, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``source`` in a fresh interpreter that imports this vyre_async (60 s at most)."""
    package_root = Path(pending_module.__file__).resolve().parents[1]
    paths = [str(package_root), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run(
        [sys.executable, *options, "-c", source],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


_FRESH_PROCESS = """
import threading
from vyre_async._pending import PendingDispatch, wait_for_callbacks

print(wait_for_callbacks(timeout=5.0))  # nothing was ever queued: True at once
pending, completer = PendingDispatch.create()
pending.add_done_callback(
    lambda p: print(threading.current_thread().name, p is pending, flush=True)
)
completer.resolve([])
print(wait_for_callbacks(timeout=5.0))
"""


# Kills: xǁ_CallbackThreadǁ__init____mutmut_1, 2, 3; xǁ_CallbackThreadǁdrain__mutmut_2.
def test_a_fresh_interpreter_runs_callbacks_and_waits_for_none_queued() -> None:
    # Its own interpreter: the callback thread's state is made at import, and
    # this process imported the package long before the test ran.
    done = _run_fresh(_FRESH_PROCESS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "vyre-callbacks True", "True"], done.stderr


def test_annotate_all_adds_attributes_as_annotate_does_each() -> None:
    # Kills xǁDispatchCompleterǁannotate_all__mutmut_1-5.
    pending, completer = PendingDispatch.create()
    completer.annotate_all({"vyre.stream": 1, "vyre.policy.a": "x"})
    assert pending.record.attributes == {"vyre.stream": 1, "vyre.policy.a": "x"}
    completer.annotate_all({"vyre.policy.a": "y", "vyre.policy.b": True})
    assert pending.record.attributes == {
        "vyre.stream": 1,
        "vyre.policy.a": "y",
        "vyre.policy.b": True,
    }
    given = {"k": 1}
    other, completer = PendingDispatch.create()
    completer.annotate_all(given)
    given["k"] = 2  # the record keeps its own copy
    assert other.record.attributes == {"k": 1}


def test_the_queueing_time_ends_when_execution_starts() -> None:
    # Kills xǁDispatchCompleterǁmark_started__mutmut_1.
    pending, completer = PendingDispatch.create()
    completer.mark_started()
    completer.resolve(OUT)
    timing = pending.timing
    assert timing is not None and timing.queue_s is not None
    assert timing.wall_s is not None and 0.0 <= timing.queue_s <= timing.wall_s
    unstarted, completer = PendingDispatch.create()
    completer.resolve(OUT)
    assert unstarted.timing is not None and unstarted.timing.queue_s is None


def test_repr_says_taken_once_the_result_was_taken() -> None:
    # Kills xǁPendingDispatchǁ__repr____mutmut_3, 5, 6.
    pending, completer = PendingDispatch.create(label="r")
    completer.resolve(OUT)
    assert not repr(pending).endswith(" taken>")
    pending.result()
    assert repr(pending) == "<PendingDispatch 'r' taken>"


def test_result_inside_a_running_trio_run_is_refused_naming_trio() -> None:
    # Kills x__running_library__mutmut_9, 10.
    pending, completer = PendingDispatch.create()  # not settled: result() would block

    async def inside() -> str:
        with pytest.raises(RuntimeError) as caught:
            pending.result()
        return str(caught.value)

    message = trio.run(inside)
    completer.resolve(OUT)
    assert " would block the running trio event loop\n" in message


# Construction: who may make the objects, and what a record starts as --------------
def test_pending_dispatches_come_only_from_create_with_the_way_to_make_one() -> None:
    # Kills xǁPendingDispatchǁ__init____mutmut_1, 5-10.
    pending, _ = PendingDispatch.create()
    with pytest.raises(TypeError) as info:
        PendingDispatch()
    assert str(info.value) == (
        "PendingDispatch objects come from backend.dispatch(); "
        "backends create them with PendingDispatch.create()"
    )
    with pytest.raises(TypeError, match=r"^PendingDispatch objects come from backend"):
        PendingDispatch(pending._core, timeout=1.0)  # a real core, and a keyword: refused


def test_a_completer_comes_only_with_its_pending_dispatch_with_the_way_to_make_one() -> None:
    # Kills xǁDispatchCompleterǁ__init____mutmut_1, 5-11.
    pending, completer = PendingDispatch.create()
    with pytest.raises(TypeError) as info:
        DispatchCompleter(None, pending)  # the right dispatch, no core: still refused
    assert str(info.value) == (
        "DispatchCompleter objects come with their pending dispatch: backends "
        "create both with PendingDispatch.create()"
    )
    with pytest.raises(TypeError, match=r"^DispatchCompleter objects come with their"):
        DispatchCompleter(completer._core, None)  # the right core, no dispatch
    assert completer.pending is pending


def test_a_dispatch_record_starts_empty_and_untraced() -> None:
    record = DispatchRecord()
    assert record.cache_hit is False
    assert (record.attributes, record.phases, record.trace) == (None,) * 3
    assert (record.on_await_cancelled, record.on_settled, record.prefetch) == (None,) * 3
    assert repr(record) == "<DispatchRecord cache_hit=False attributes=None>"
    assert DispatchRecord(cache_hit=True).cache_hit is True
    pending, completer = PendingDispatch.create()
    assert pending.record.cache_hit is False and pending.record.trace is None
    assert completer.span is None


# Settling: once, with the backend's times ------------------------------------------
def test_a_dispatch_settles_once_and_says_so_to_the_backend() -> None:
    # Kills xǁ_Coreǁsettle__mutmut_2, xǁDispatchCompleterǁresolve__mutmut_8.
    pending, completer = PendingDispatch.create(label="once")
    assert completer.resolve(OUT) is True
    assert repr(pending) == "<PendingDispatch 'once' done>"
    assert completer.resolve([np.zeros(1)]) is False  # the first outcome stands
    assert completer.fail(ZeroDivisionError("late")) is False
    assert pending.exception() is None
    assert pending.result()[0].tolist() == [0, 1, 2, 3]


def test_the_record_hook_and_the_timing_get_the_backends_times(clock: Clock) -> None:
    # Kills xǁDispatchCompleterǁresolve__mutmut_10, 11, 16, 17;
    # xǁ_Coreǁsettle__mutmut_17, 19, 20, 21, 23, 24, 25, 26, 28, 30.
    pending, completer = PendingDispatch.create(created=clock.now)
    seen: list[tuple[PendingDispatch, float, float | None, float | None]] = []
    pending.record.on_settled = lambda p, wall, queued, device: seen.append(
        (p, wall, queued, device)
    )
    clock.now += 0.25
    completer.mark_started()
    clock.now += 0.5
    assert completer.resolve(OUT, device_s=0.125, compile_s=0.0625)
    assert seen == [(pending, 0.75, 0.25, 0.125)]
    assert pending.timing == DispatchTiming(
        wall_s=0.75, queue_s=0.25, device_s=0.125, compile_s=0.0625
    )


def test_an_error_in_the_record_hook_is_reported_and_changes_nothing(
    reported: list[BaseException | None],
) -> None:
    # Kills xǁ_Coreǁsettle__mutmut_31.
    pending, completer = PendingDispatch.create()
    broken = ValueError("this hook fails on purpose")

    def on_settled(*_: object) -> None:
        raise broken

    pending.record.on_settled = on_settled
    hooked: list[PendingDispatch] = []
    called_back: list[PendingDispatch] = []
    settle_hook(pending, hooked.append)
    pending.add_done_callback(called_back.append)
    assert completer.resolve(OUT) is True
    assert reported == [broken] and hooked == [pending]
    assert wait_for_callbacks(BOUND_S) and called_back == [pending]
    assert pending.result()[0].tolist() == [0, 1, 2, 3]


def test_an_interrupt_in_the_record_hook_is_raised_once_all_else_ran() -> None:
    # Kills xǁ_Coreǁsettle__mutmut_32.
    pending, completer = PendingDispatch.create()
    interrupt = _Unreportable("the record hook is interrupted on purpose")

    def on_settled(*_: object) -> None:
        raise interrupt

    pending.record.on_settled = on_settled
    hooked: list[PendingDispatch] = []
    called_back: list[PendingDispatch] = []
    settle_hook(pending, hooked.append)
    pending.add_done_callback(called_back.append)
    with pytest.raises(_Unreportable) as info:
        completer.resolve(OUT)
    assert info.value is interrupt
    assert hooked == [pending]  # the settle hooks ran before it was raised
    assert wait_for_callbacks(BOUND_S) and called_back == [pending]
    assert pending.result()[0].tolist() == [0, 1, 2, 3]


def test_an_interrupt_in_a_settle_hook_is_raised_after_the_other_hooks() -> None:
    # Kills xǁ_Coreǁsettle__mutmut_37, 38.
    pending, completer = PendingDispatch.create()
    interrupt = _Unreportable("a settle hook is interrupted on purpose")

    def interrupted(_: PendingDispatch) -> None:
        raise interrupt

    hooked: list[PendingDispatch] = []
    settle_hook(pending, interrupted)
    settle_hook(pending, hooked.append)
    with pytest.raises(_Unreportable) as info:
        completer.resolve(OUT)
    assert info.value is interrupt and hooked == [pending]
    assert pending.result()[0].tolist() == [0, 1, 2, 3]


def test_of_two_interrupts_while_settling_the_first_is_raised() -> None:
    # Kills xǁ_Coreǁsettle__mutmut_32, 37, 38 (after a first, 'interrupt and exc' is the second).
    pending, completer = PendingDispatch.create()
    first = _Unreportable("the record hook is interrupted on purpose")
    second = _Unreportable("a settle hook is interrupted on purpose")

    def on_settled(*_: object) -> None:
        raise first

    def interrupted(_: PendingDispatch) -> None:
        raise second

    pending.record.on_settled = on_settled
    settle_hook(pending, interrupted)
    with pytest.raises(_Unreportable) as info:
        completer.resolve(OUT)
    assert info.value is first


def test_a_waiter_that_cannot_be_woken_is_reported_and_stops_nothing_else(
    reported: list[BaseException | None],
) -> None:
    # Kills xǁ_Coreǁsettle__mutmut_39. The awaiting task's loop refuses the wake-up
    # (a broken loop: asyncio's own closed-loop error is expected and dropped).
    pending, completer = PendingDispatch.create()
    called_back: list[PendingDispatch] = []
    pending.add_done_callback(called_back.append)
    broken = ValueError("this loop refuses callbacks on purpose")
    settled: list[bool] = []

    def refuse(*_: object) -> None:
        raise broken

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(_await(pending))
        await asyncio.sleep(0)  # the task parks on its future
        loop.call_soon_threadsafe = refuse  # type: ignore[method-assign,assignment]
        try:  # settled from another thread: woken through call_soon_threadsafe
            settler = threading.Thread(target=lambda: settled.append(completer.resolve(OUT)))
            settler.start()
            settler.join(BOUND_S)  # (blocks the loop: nothing else runs meanwhile)
        finally:
            del loop.call_soon_threadsafe
        task.cancel()  # never woken: it would wait for ever
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(main())
    assert settled == [True] and reported == [broken]
    assert wait_for_callbacks(BOUND_S) and called_back == [pending]
    assert pending.result()[0].tolist() == [0, 1, 2, 3]  # the cancelled await took nothing


def test_a_callback_thread_that_cannot_start_is_reported_and_settling_still_succeeds(
    monkeypatch: pytest.MonkeyPatch, reported: list[BaseException | None]
) -> None:
    # Kills xǁ_Coreǁsettle__mutmut_44. As at interpreter shutdown (Python 3.12+): no
    # callback thread runs yet, and no thread can be started.
    refused = RuntimeError("can't create new thread at interpreter shutdown")

    def refuse(_: threading.Thread) -> None:
        raise refused

    monkeypatch.setattr(pending_module, "_CALLBACKS", pending_module._CallbackThread())
    pending, completer = PendingDispatch.create()
    pending.add_done_callback(lambda _: None)
    with pytest.MonkeyPatch.context() as no_threads:  # (threads start again after it)
        no_threads.setattr(threading.Thread, "start", refuse)
        assert completer.resolve(OUT) is True
    assert reported == [refused]
    assert pending.result()[0].tolist() == [0, 1, 2, 3]


# The stop flag and the deadline ----------------------------------------------------
def test_a_timeout_sets_the_stop_flag_and_a_success_does_not(clock: Clock) -> None:
    # Kills xǁ_Coreǁsettle__mutmut_10, 12. Set (not only past its deadline), so a
    # backend blocked in stop_requested.wait() wakes; wait(0) reads just that.
    late, completer = PendingDispatch.create(timeout=1.0, created=clock.now)
    flag = completer.stop_requested  # made before the deadline
    assert flag.wait(timeout=0) is False
    clock.now += 1.0
    assert late.done() and isinstance(late.exception(), DispatchTimeout)
    assert flag.wait(timeout=0) is True

    finished, completer = PendingDispatch.create(timeout=1.0, created=clock.now)
    flag = completer.stop_requested
    assert completer.resolve(OUT)
    assert flag.wait(timeout=0) is False and not flag.is_set()
    assert not finished.stop_requested.is_set()


def test_a_trio_awaiter_waits_exactly_until_the_deadline(clock: Clock) -> None:
    # Kills xǁ_Coreǁremaining__mutmut_6 (a wait of at least a second). Trio's clock is
    # a MockClock that jumps to the next deadline; pending's is the test's Clock.
    pending, _ = PendingDispatch.create(timeout=1.0, created=clock.now - 0.75)

    async def main() -> float:
        start = trio.current_time()
        with pytest.raises(DispatchTimeout):
            await pending
        return trio.current_time() - start

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == 0.25


def test_a_trio_awaiter_of_a_dispatch_the_give_up_settles_returns_at_once() -> None:
    # Kills xǁ_Coreǁadd_waiter__mutmut_2. A trio task never polls: it tells the backend
    # at once (give_up), whose own completion path may find the work done and settle
    # inline, before the task would park.
    pending, completer = PendingDispatch.create()
    completer.poll_with(lambda: None, give_up=lambda: completer.resolve(OUT))

    async def main() -> list[np.ndarray]:
        with trio.fail_after(BOUND_S):  # (on the MockClock: at once if it parks for good)
            return await pending

    outputs = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert outputs[0].tolist() == [0, 1, 2, 3]


# A forked child ---------------------------------------------------------------------
_FORK_IN_A_FRESH_PROCESS = """
import os, sys, threading
from vyre_async._pending import PendingDispatch, defer_to_callbacks, wait_for_callbacks

# The parent's callback thread runs when it forks; the child has none (only the
# forking thread comes along), so it must start one of its own.
defer_to_callbacks(PendingDispatch.create()[0], lambda _: None)
assert wait_for_callbacks(5.0)
pid = os.fork()
if pid == 0:  # the child
    code = 1
    try:
        pending, completer = PendingDispatch.create()
        ran = []
        pending.add_done_callback(
            lambda p: ran.append((threading.current_thread().name, p is pending))
        )
        completer.resolve([])
        code = 0 if wait_for_callbacks(5.0) and ran == [("vyre-callbacks", True)] else 3
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_runs_done_callbacks_on_a_callback_thread_of_its_own() -> None:
    # Kills xǁ_CallbackThreadǁafter_fork__mutmut_1, 2, 3. The fork happens in a fresh
    # interpreter whose only other thread is the callback thread, never in this
    # multi-threaded pytest process (a lock held by another thread there at the
    # moment of the fork would hang the child).
    done = _run_fresh(_FORK_IN_A_FRESH_PROCESS, "-W", "ignore::DeprecationWarning")
    assert done.returncode == 0, done.stderr
