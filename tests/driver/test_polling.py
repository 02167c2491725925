"""Polling a dispatch: `DispatchCompleter.poll_with`, its budget and ``give_up``; the fast paths.

A backend that can notice completion cheaply registers a poll; an asyncio task
awaiting the dispatch calls it between its loop turns for up to the budget,
then parks. ``give_up`` tells the backend that nobody polls any more. Trio
tasks and ``result()`` do not poll between turns (they look once, through
``done()``). None of these tests relies on timing for ordering: the settling
threads wait for ``give_up`` (an event), and budgets are either tiny (so they
are surely spent) or a minute long (so they surely are not).
"""

from __future__ import annotations

import asyncio
import threading
import time
import types

import anyio
import anyio.to_thread
import numpy as np
import pytest

from vyre_async._pending import DispatchCompleter, PendingDispatch

pytestmark = pytest.mark.anyio

OUT = [np.arange(4, dtype=np.uint32)]
#: A budget no test reaches: the awaiting task polls for as long as the test runs.
LONG_BUDGET_S = 60.0

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])
trio_only = pytest.mark.parametrize("anyio_backend", ["trio"])


class Poll:
    """A registered poll: counts its calls, and settles the dispatch on call ``settle_at``."""

    def __init__(self, completer: DispatchCompleter, settle_at: int | None = None) -> None:
        self.completer = completer
        self.settle_at = settle_at
        self.calls = 0
        self.threads: set[int] = set()
        self.give_ups = 0
        self.calls_at_give_up: int | None = None
        self.gave_up = threading.Event()

    def check(self) -> None:
        self.calls += 1
        self.threads.add(threading.get_ident())
        if self.settle_at is not None and self.calls >= self.settle_at:
            self.completer.resolve(OUT)

    def give_up(self) -> None:
        self.give_ups += 1
        self.calls_at_give_up = self.calls
        self.gave_up.set()


def polled(
    budget_s: float = LONG_BUDGET_S, settle_at: int | None = None
) -> tuple[PendingDispatch, DispatchCompleter, Poll]:
    """A new pending dispatch with a registered `Poll`."""
    pending, completer = PendingDispatch.create(label="polled")
    poll = Poll(completer, settle_at)
    completer.poll_with(poll.check, budget_s=budget_s, give_up=poll.give_up)
    return pending, completer, poll


def settle_after_give_up(
    completer: DispatchCompleter, poll: Poll, *, wait_s: float = 10.0
) -> threading.Thread:
    """Resolve ``completer`` from another thread once ``give_up`` was called (or ``wait_s`` passed).

    Settling only after ``give_up`` shows the waiter had stopped polling and was
    parked, relying on the backend's own completion path.
    """

    def run() -> None:
        poll.gave_up.wait(wait_s)
        completer.resolve(OUT)

    thread = threading.Thread(target=run, name="settler")
    thread.start()
    return thread


# Polling between loop turns (asyncio) -------------------------------------------------


@asyncio_only
async def test_an_awaiting_task_polls_between_its_loop_turns_until_the_poll_settles_it() -> None:
    pending, _, poll = polled(settle_at=5)
    finished = False
    other_turns = 0

    async def other_task() -> None:
        nonlocal other_turns
        while not finished:
            other_turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other_task())
    try:
        with anyio.fail_after(5):  # nothing but the poll settles it
            outputs = await pending
    finally:
        finished = True
        await task
    assert outputs[0].tolist() == [0, 1, 2, 3]
    assert poll.calls == 5  # polled until it settled, then no more
    assert poll.threads == {threading.get_ident()}  # on the loop's own thread
    assert other_turns >= 3  # the loop ran another task between the polls
    assert poll.give_ups == 0  # settled within the budget: nobody had to take over
    assert pending.done()


@asyncio_only
async def test_give_up_is_called_once_when_the_budget_is_spent_then_a_thread_settles_it() -> None:
    pending, completer, poll = polled(budget_s=1e-3)  # the poll never finds it done
    settler = settle_after_give_up(completer, poll)
    try:
        with anyio.fail_after(5):
            outputs = await pending
    finally:
        settler.join()
    assert outputs[0].tolist() == [0, 1, 2, 3]
    assert poll.give_ups == 1
    assert poll.calls >= 1
    assert poll.calls == poll.calls_at_give_up  # no polling after giving up


async def test_result_in_a_worker_thread_gives_up_polling_before_it_blocks() -> None:
    pending, completer, poll = polled()
    settler = settle_after_give_up(completer, poll)
    try:
        # result() blocks until settled, and the settler waits for give_up: without
        # give_up before blocking this ends in TimeoutError after 5 s.
        outputs = await anyio.to_thread.run_sync(pending.result, 5.0)
    finally:
        settler.join()
    assert outputs[0].tolist() == [0, 1, 2, 3]
    assert poll.give_ups == 1
    assert poll.calls >= 1  # result() looked first (done() polls)


def test_result_in_plain_code_gives_up_polling_before_it_blocks() -> None:
    pending, completer, poll = polled()
    settler = settle_after_give_up(completer, poll)
    try:
        outputs = pending.result(timeout=5.0)
    finally:
        settler.join()
    assert outputs[0].tolist() == [0, 1, 2, 3]
    assert poll.give_ups == 1


def test_result_of_a_dispatch_its_first_poll_settles_needs_no_give_up() -> None:
    pending, _, poll = polled(settle_at=1)
    assert pending.result(timeout=5.0)[0].tolist() == [0, 1, 2, 3]
    assert poll.calls == 1
    assert poll.give_ups == 0


@asyncio_only
async def test_cancelling_a_polling_task_gives_up_and_leaves_the_dispatch_untaken() -> None:
    pending, completer, poll = polled()

    async def wait() -> None:
        await pending

    task = asyncio.create_task(wait())
    for _ in range(10_000):  # until the task has polled a few loop turns
        if poll.calls >= 3:
            break
        await asyncio.sleep(0)
    assert poll.calls >= 3 and poll.give_ups == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert poll.give_ups == 1
    calls = poll.calls
    for _ in range(5):
        await asyncio.sleep(0)
    assert poll.calls == calls  # nobody polls it any more
    assert not pending._core.waiters
    assert not pending.done()  # still running
    completer.resolve(OUT)
    assert (await pending)[0].tolist() == [0, 1, 2, 3]  # and its result was not taken
    assert poll.give_ups == 1


def test_done_calls_the_poll() -> None:
    pending, _, poll = polled(settle_at=2)
    assert not pending.done()
    assert poll.calls == 1
    assert pending.done()  # the second poll settled it
    assert poll.calls == 2
    assert pending.result()[0].tolist() == [0, 1, 2, 3]


def test_poll_with_replaces_an_earlier_poll() -> None:
    pending, completer, first = polled()
    second = Poll(completer, settle_at=1)
    completer.poll_with(second.check, give_up=second.give_up)
    assert pending.done()
    assert (first.calls, second.calls) == (0, 1)


# Trio does not poll ---------------------------------------------------------------------


@trio_only
async def test_trio_awaits_a_polled_dispatch_settled_from_another_thread() -> None:
    pending, completer, poll = polled()
    got: list[list[int]] = []

    async def wait() -> None:
        got.append((await pending)[0].tolist())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()  # the waiter is parked, not polling
            assert poll.calls <= 1  # at most the look before parking (done())
            assert poll.gave_up.is_set()  # told the backend at once: nobody will poll
            settler = threading.Thread(target=completer.resolve, args=(OUT,))
            settler.start()
    settler.join()
    assert got == [[0, 1, 2, 3]]
    assert poll.calls <= 1


# Already settled: no loop turn ------------------------------------------------------------


@asyncio_only
@pytest.mark.parametrize("how", ["resolved", "by_its_first_poll"])
async def test_awaiting_a_settled_dispatch_costs_no_loop_turn(how: str) -> None:
    if how == "resolved":
        pending, completer = PendingDispatch.create()
        completer.resolve(OUT)
    else:
        pending, _, _ = polled(settle_at=1)  # done() inside the await settles it
    ran = False

    async def other_task() -> None:
        nonlocal ran
        ran = True

    task = asyncio.create_task(other_task())  # runs at the loop's next turn
    outputs = await pending
    assert not ran  # the await did not yield to the loop
    assert outputs[0].tolist() == [0, 1, 2, 3]
    await task
    assert ran  # (it would have run, had the await yielded)


# should_stop / stop_requested / wants_phases ---------------------------------------------


def test_should_stop_is_false_before_the_deadline_and_makes_no_event() -> None:
    for pending, completer in (
        PendingDispatch.create(timeout=60.0),
        PendingDispatch.create(timeout=6.0, created=time.monotonic() - 5.0),
        PendingDispatch.create(),
    ):
        assert not completer.should_stop()
        assert pending._core.stop is None  # asking made no event
        assert not completer.stop_requested.is_set()
        assert not pending.stop_requested.is_set()


def test_should_stop_is_true_past_the_deadline_and_makes_no_event() -> None:
    pending, completer = PendingDispatch.create(timeout=5.0, created=time.monotonic() - 10.0)
    assert completer.should_stop()
    assert pending._core.stop is None
    assert completer.stop_requested.is_set()  # the event agrees (made now)
    assert pending.stop_requested.is_set()
    assert completer.should_stop()


def test_should_stop_sees_an_explicit_stop() -> None:
    pending, completer = PendingDispatch.create(timeout=60.0)
    completer.stop_requested.set()
    assert completer.should_stop()
    assert pending.stop_requested.is_set()


def test_should_stop_after_the_dispatch_timed_out() -> None:
    pending, completer = PendingDispatch.create(timeout=5.0, created=time.monotonic() - 10.0)
    assert pending.done()  # expired: settled with DispatchTimeout
    assert completer.should_stop()
    assert completer.stop_requested.is_set()


def test_wants_phases_only_while_a_span_records_the_dispatch() -> None:
    _, completer = PendingDispatch.create()
    assert completer.wants_phases is False
    trace = types.SimpleNamespace(span=None)  # telemetry's record of the dispatch
    completer.record.trace = trace
    assert completer.wants_phases is False and completer.span is None
    trace.span = span = object()  # what telemetry sets while a span is open
    assert completer.wants_phases is True and completer.span is span


def test_a_stop_flag_made_after_the_timeout_is_set_and_wakes_waiters() -> None:
    """A worker that asks for the flag late must not block in wait() for its whole step."""
    pending, completer = PendingDispatch.create(timeout=1.0, created=time.monotonic() - 2.0)
    assert pending.done()  # expired: the dispatch is a DispatchTimeout now
    flag = completer.stop_requested  # made only now
    assert flag.is_set()
    started = time.monotonic()
    assert flag.wait(5.0)  # set, not only "past the deadline": returns at once
    assert time.monotonic() - started < 1.0
