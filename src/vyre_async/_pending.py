"""`PendingDispatch`: the awaitable result of one launched dispatch.

A backend creates the pair ``pending, completer = PendingDispatch.create(...)``,
hands ``pending`` to the caller at once and settles it later through
``completer`` from any thread (a worker, a CUDA event poller).

Waiting costs what the waiting side needs and nothing more:

* awaited from asyncio, a dispatch that is already settled costs no loop turn;
  one that is not costs one loop future, set directly when it settles on the
  loop's own thread and through ``loop.call_soon_threadsafe`` from any other;
  a deadline adds one loop timer (no cancel scope, no event object);
* awaited from trio, the task parks in ``wait_task_rescheduled`` and is
  rescheduled through the run's ``TrioToken``;
* ``result()`` creates the one `threading.Event` it blocks on, on first use;
* a backend that can notice completion cheaply (a CUDA event query) registers
  a poll (`DispatchCompleter.poll_with`) that the awaiting loop calls between
  its turns for a short, bounded time before parking on the future.

Done-callbacks (`PendingDispatch.add_done_callback`) never run on the thread
that settles a dispatch (a backend's worker, a CUDA completion thread, Ray's
callback thread): when a dispatch settles its waiters wake first, then its
callbacks are queued for the one callback thread (``vyre-callbacks``), which
runs them one at a time in the order they were queued. A callback may block, wait on
its own backend (``download``, ``dispatch_sync``, ``result()``) or close it:
the machinery that must finish that work is never the thread running it. The
driver's and backends' own bookkeeping uses `settle_hook` instead: run inline,
before the waiters wake, and never blocking.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vyre_async._arguments import to_seconds, wait_seconds
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import (
    BackendError,
    DispatchFailed,
    DispatchTimeout,
    InvalidArgument,
    InvalidProgram,
)

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "DEFAULT_POLL_BUDGET_S",
    "DispatchCompleter",
    "DispatchRecord",
    "DispatchTiming",
    "PendingDispatch",
    "ResultAlreadyTaken",
    "defer_to_callbacks",
    "settle_hook",
    "wait_for_callbacks",
]
__dir__ = _public_dir(__name__)

Outputs = list[np.ndarray]
#: Longest single blocking wait; longer waits loop (platform clocks overflow near 2**63 ns).
_MAX_WAIT_STEP = 86_400.0
_PENDING, _DONE, _TIMED_OUT = "pending", "done", "timed_out"
#: Default seconds an awaiting loop polls a dispatch that registered a poll, before
#: it parks on its future and lets the backend's completion thread wake it.
DEFAULT_POLL_BUDGET_S = 200e-6
#: Every loop turn polls for the first half of the budget; then the turns between
#: two polls grow 2, 4, 4, 4 ... (the backoff).
_MAX_POLL_SKIP = 4


class ResultAlreadyTaken(InvalidProgram, RuntimeError):
    """The result of a `PendingDispatch` was already taken (it can be taken once).

    A contract error like any other: code 1006 (`InvalidProgram`, the call broke
    a rule of the API), and still a `RuntimeError` as it always was.
    """

    default_fix = "keep the outputs from the first await or result() call"


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchTiming:
    """Where the time of one dispatch went, in seconds (``None`` when not known).

    Attributes:
        wall_s: From ``dispatch()`` to completion, host clock.
        queue_s: From ``dispatch()`` to the start of execution.
        device_s: Execution time as the backend measured it (device events on GPUs).
        compile_s: Compile time this dispatch waited for (0.0 on a cache hit).
    """

    wall_s: float | None
    queue_s: float | None
    device_s: float | None
    compile_s: float | None


class DispatchRecord:
    """What the driver knows about one dispatch besides its result (typed, slotted).

    The front end fills it at launch, backends add to it through the completer
    (`DispatchCompleter.annotate`, `record_phase`), telemetry reads it when the
    dispatch settles. Read it as ``pending.record``.

    Attributes:
        cache_hit: The pipeline came from the memory cache.
        attributes: Span attributes set since launch (policy verdicts, backend
            annotations such as ``vyre.stream``), or None.
        phases: ``(name, start_ns, end_ns)`` intervals (``time.time_ns`` clock), or None.
        prefetch: The shape prediction's outcome, ``(hit, rolling hit rate)``,
            when the prefetcher scored the dispatch and telemetry records it; or None.
        trace: Telemetry's own record of the dispatch while it records one (a
            `vyre_async.telemetry.DispatchTrace`: its span, the once-only claim
            of its outcome), else None.
        on_await_cancelled: Called with the pending dispatch when an awaiting task
            is cancelled while the dispatch still runs.
        on_settled: Called as ``on_settled(pending, wall_s, queue_s, device_s)``
            when the dispatch settles, in the settling thread, before its
            done-callbacks and waiters (telemetry ends the span and counts the
            outcome here), or None. The times are those of `PendingDispatch.timing`.
    """

    __slots__ = (
        "attributes",
        "cache_hit",
        "on_await_cancelled",
        "on_settled",
        "phases",
        "prefetch",
        "trace",
    )

    def __init__(self, cache_hit: bool = False) -> None:
        self.cache_hit = cache_hit
        self.attributes: dict[str, str | bool | int | float] | None = None
        self.phases: list[tuple[str, int, int]] | None = None
        self.prefetch: tuple[bool, float] | None = None
        self.trace: Any = None
        self.on_await_cancelled: Callable[[PendingDispatch], None] | None = None
        self.on_settled: (
            Callable[[PendingDispatch, float, float | None, float | None], None] | None
        ) = None

    def __repr__(self) -> str:
        return f"<DispatchRecord cache_hit={self.cache_hit} attributes={self.attributes!r}>"


class _StopFlag(threading.Event):
    """A stop request that is also raised once the dispatch deadline has passed."""

    def __init__(self, deadline: float | None) -> None:
        super().__init__()
        self._deadline = deadline

    def is_set(self) -> bool:
        if super().is_set():
            return True
        return self._deadline is not None and time.monotonic() >= self._deadline


class _AsyncioWaiter:
    """One asyncio task parked on a loop future."""

    __slots__ = ("future", "loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
        self.loop = loop
        self.future = future
        self.thread = threading.get_ident()

    def wake(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the dispatch ran
            if threading.get_ident() == self.thread:
                _set_future(self.future)
            else:
                self.loop.call_soon_threadsafe(_set_future, self.future)


class _TrioWaiter:
    """One trio task parked in ``wait_task_rescheduled``."""

    __slots__ = ("parked", "task", "token")

    def __init__(self, token: Any, task: Any) -> None:
        self.token = token
        self.task = task
        self.parked = True

    def wake(self) -> None:
        trio = sys.modules["trio"]
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self.reschedule)

    def reschedule(self) -> None:  # in the trio thread, like the abort that clears parked
        if self.parked:
            self.parked = False
            sys.modules["trio"].lowlevel.reschedule(self.task)


class _ThreadWaiter:
    """A thread blocked in ``result()``."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()


_Waiter = _AsyncioWaiter | _TrioWaiter | _ThreadWaiter


def _set_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Core:
    """The state both sides of one dispatch share (`PendingDispatch`, `DispatchCompleter`).

    Fields that start as None live on the class until first written: creating
    one per dispatch sets only what differs.
    """

    outputs: Outputs | None = None
    error: BaseException | None = None
    taken = False
    started: float | None = None
    settled_at: float | None = None
    device_s: float | None = None
    compile_s: float | None = None
    callbacks: list[Callable[[PendingDispatch], None]] | None = None
    hooks: list[Callable[[PendingDispatch], None]] | None = None
    waiters: list[_Waiter] | None = None
    stop: _StopFlag | None = None
    poll: Callable[[], object] | None = None
    give_up: Callable[[], object] | None = None
    poll_budget = DEFAULT_POLL_BUDGET_S

    def __init__(self, timeout: float | None, label: str | None, created: float | None) -> None:
        self.created = created = time.monotonic() if created is None else created
        self.timeout = timeout
        self.deadline = None if timeout is None else created + to_seconds(timeout)
        self.label = label
        self.lock = threading.Lock()
        self.state = _PENDING
        self.record = DispatchRecord()

    def describe(self) -> str:
        return repr(self.label) if self.label else f"at 0x{id(self):x}"

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def remaining(self) -> float:
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - time.monotonic())

    def stop_flag(self) -> _StopFlag:
        stop = self.stop
        if stop is None:
            with self.lock:
                if self.stop is None:
                    self.stop = _StopFlag(self.deadline)
                    if self.state is _TIMED_OUT:  # made after the timeout: set, as settle
                        self.stop.set()  # would have (so wait() returns at once)
                stop = self.stop
        return stop

    def add_waiter(self, waiter: _Waiter) -> bool:
        with self.lock:
            if self.state is not _PENDING:
                return False
            if self.waiters is None:
                self.waiters = [waiter]
            else:
                self.waiters.append(waiter)
            return True

    def remove_waiter(self, waiter: _Waiter) -> None:
        with self.lock:
            if self.waiters is not None and waiter in self.waiters:
                self.waiters.remove(waiter)

    def expire(self, pending: PendingDispatch) -> None:
        error = DispatchTimeout(
            f"dispatch {self.describe()} did not finish within its timeout of "
            f"{self.timeout} s (counted from dispatch())",
            fix="raise DispatchConfig.timeout or split the work into smaller dispatches",
            timeout=self.timeout,
        )
        self.settle(pending, _TIMED_OUT, None, error)

    def settle(
        self,
        pending: PendingDispatch,
        state: str,
        outputs: Outputs | None,
        error: BaseException | None,
        device_s: float | None = None,
        compile_s: float | None = None,
    ) -> bool:
        with self.lock:
            if self.state is not _PENDING:
                return False
            # Everything before ``state``: done() and timing read without the lock.
            self.settled_at = time.monotonic()
            self.outputs, self.error = outputs, error
            self.device_s, self.compile_s = device_s, compile_s
            self.state = state
            callbacks, self.callbacks = self.callbacks, None
            hooks, self.hooks = self.hooks, None
            waiters, self.waiters = self.waiters, None
            stop = self.stop
        if state is _TIMED_OUT and stop is not None:
            stop.set()  # (a flag made later reads the passed deadline)
        # The record's hook and the settle hooks (span end, bookkeeping: short, never
        # blocking) run inline before waiters wake, so a caller that resumes sees them
        # done. Then the waiters wake; then the done-callbacks go to the callback
        # thread (they may block). A hook that raises SystemExit or KeyboardInterrupt
        # stops neither the others nor the wake-up: it is raised once all ran.
        interrupt: BaseException | None = None
        try:
            hook = self.record.on_settled
            if hook is not None:
                started = self.started
                try:
                    hook(
                        pending,
                        self.settled_at - self.created,
                        None if started is None else started - self.created,
                        device_s,
                    )
                except Exception as exc:  # reported, never the dispatch's problem
                    _report_callback_error(exc)
                except BaseException as exc:
                    interrupt = exc
            if hooks:
                for fn in hooks:
                    try:
                        _run_callback(fn, pending)
                    except BaseException as exc:  # (Exceptions are reported inside)
                        interrupt = interrupt or exc
        finally:
            if waiters:
                for waiter in waiters:
                    try:
                        waiter.wake()
                    except Exception as exc:  # one waiter's failure must not strand the rest
                        _report_callback_error(exc)
            if callbacks:
                try:
                    _CALLBACKS.submit(callbacks, pending)
                except BaseException as exc:  # no thread to be had (the interpreter exits):
                    _report_callback_error(exc)  # settling must not fail for it
        if interrupt is not None:
            raise interrupt
        return True

    def take(self) -> Outputs:
        with self.lock:
            if self.taken:
                raise ResultAlreadyTaken(
                    f"the result of dispatch {self.describe()} was already taken"
                )
            self.taken = True
            outputs, error = self.outputs, self.error
            self.outputs = None  # the caller owns the arrays now
        if error is not None:
            raise error
        assert outputs is not None
        return outputs


class PendingDispatch:
    """The awaitable result of a dispatch: ``outputs = await pending``.

    Created by backends with `PendingDispatch.create`; never constructed by users.

    * awaitable under asyncio and trio without blocking the event loop;
    * `done` never blocks; `result` blocks (for plain synchronous code);
    * the result is taken once — a second take raises `ResultAlreadyTaken`;
    * cancelling an awaiting task leaves the dispatch running and untaken;
    * past ``DispatchConfig.timeout`` (counted from ``dispatch()``) awaiting or
      `result` raises `DispatchTimeout` and the backend is asked to stop.

    Attributes:
        record: The `DispatchRecord` of this dispatch (cache hit, attributes, phases).
    """

    __slots__ = ("__weakref__", "_core", "record")

    def __init__(self, _core: Any = None, **_: object) -> None:
        if type(_core) is not _Core or _:
            raise TypeError(
                "PendingDispatch objects come from backend.dispatch(); "
                "backends create them with PendingDispatch.create()"
            )
        self._core = _core
        self.record = _core.record

    @classmethod
    def create(
        cls,
        *,
        timeout: float | None = None,
        label: str | None = None,
        created: float | None = None,
    ) -> tuple[PendingDispatch, DispatchCompleter]:
        """Return a new pending dispatch and the completer that settles it (for backends).

        Args:
            timeout: Seconds after ``created`` after which the result is a `DispatchTimeout`.
            label: Shown in errors.
            created: ``time.monotonic()`` when ``dispatch()`` was called (default: now),
                so the timeout counts validation and compilation too.
        """
        core = _Core(timeout, label, created)
        pending = cls(core)
        return pending, DispatchCompleter(core, pending)

    # Caller side ----------------------------------------------------------------
    def done(self) -> bool:
        """Return True once the dispatch has finished, failed or timed out. Never blocks."""
        core = self._core
        if core.state is _PENDING:
            if core.deadline is not None and time.monotonic() >= core.deadline:
                core.expire(self)
            elif core.poll is not None:
                core.poll()
        return core.state is not _PENDING

    @property
    def timing(self) -> DispatchTiming | None:
        """Timing of the finished dispatch, or ``None`` while it runs."""
        core = self._core
        if core.settled_at is None:
            return None
        return DispatchTiming(
            wall_s=core.settled_at - core.created,
            queue_s=None if core.started is None else core.started - core.created,
            device_s=core.device_s,
            compile_s=core.compile_s,
        )

    @property
    def label(self) -> str | None:
        """The dispatch label from its config."""
        return self._core.label

    @property
    def created(self) -> float:
        """``time.monotonic()`` when ``dispatch()`` was called (the timeout counts from here)."""
        return self._core.created

    @property
    def stop_requested(self) -> threading.Event:
        """Set when the result is no longer wanted (timeout); backends poll it at safe points."""
        return self._core.stop_flag()

    def exception(self) -> BaseException | None:
        """Return the error the dispatch settled with; None while it runs or if it succeeded.

        Never blocks and takes nothing (for done-callbacks and telemetry).
        """
        return self._core.error

    def add_done_callback(self, fn: Callable[[PendingDispatch], None]) -> None:
        """Call ``fn(self)`` once the dispatch settles (soon, if it already has).

        Callbacks run on vyre-async's callback thread (``vyre-callbacks``), after
        the dispatch's waiters woke, one at a time in the order they were queued
        (a dispatch's when it settles, in the order added; for one settled
        already, when this call queues it), never on a backend's worker or
        completion thread nor on the caller's (an event loop's, say): a callback
        may block, wait on its own backend (``download``, ``dispatch_sync``,
        ``result()``) or close it. One that blocks delays only what is queued
        after it: other callbacks, and the driver's own deferred work, such as
        `ShadowBackend`'s comparisons (`wait_for_callbacks` waits for what is
        queued so far).
        What they raise, ``SystemExit`` included, is handed to
        `threading.excepthook` (whose default prints all but ``SystemExit``) and
        affects neither the dispatch nor the thread.

        Raises:
            InvalidArgument: ``fn`` is not callable.
        """
        if not callable(fn):
            raise InvalidArgument(
                f"add_done_callback needs a callable, got {fn!r}",
                fix="pass a function taking the PendingDispatch",
            )
        core = self._core
        with core.lock:
            if core.state is _PENDING:
                if core.callbacks is None:
                    core.callbacks = [fn]
                else:
                    core.callbacks.append(fn)
                return
        _CALLBACKS.submit([fn], self)  # settled already: still on the callback thread

    def result(self, timeout: float | None = None) -> Outputs:
        """Block until the outputs are ready and return them (for synchronous code).

        Args:
            timeout: Seconds to wait (any non-negative number, however large;
                ``None`` waits as long as the dispatch's own deadline allows).
                Expiring raises the builtin `TimeoutError` and takes nothing, so
                the result can still be awaited later.

        Raises:
            InvalidArgument: ``timeout`` is not a number (or is NaN).
            DispatchTimeout: the dispatch's own deadline passed.
            ResultAlreadyTaken: the result was already taken.
            RuntimeError: called from inside a running event loop before the
                result is ready (that would freeze the loop).
            BackendError: the dispatch failed.
        """
        limit = wait_seconds(timeout, example="pending.result(timeout=1.0)")
        core = self._core
        if not self.done():
            refuse_blocking_in_loop("PendingDispatch.result()", "await pending")
            self._stop_polling()
            waiter = _ThreadWaiter()
            if core.add_waiter(waiter):
                try:
                    woken = _wait(waiter.event, min(limit, core.remaining()))
                finally:
                    core.remove_waiter(waiter)
                if not woken and not self.done():
                    if core.past_deadline():
                        core.expire(self)
                    else:
                        raise TimeoutError(
                            f"dispatch {core.describe()} not finished after {timeout} s of "
                            "waiting; it keeps running and its result can still be taken"
                        )
        return core.take()

    def __await__(self) -> Generator[Any, None, Outputs]:
        core = self._core
        if core.state is _PENDING and not self.done():
            loop = _asyncio_loop()
            if loop is None:  # not asyncio: trio
                yield from self._wait_trio().__await__()
            else:
                if core.poll is not None:
                    yield from self._poll_turns()
                if core.state is _PENDING:
                    yield from self._wait_asyncio(loop)
        return core.take()

    def __repr__(self) -> str:
        core = self._core
        state = "taken" if core.taken else core.state
        return f"<PendingDispatch {core.describe()} {state}>"

    # Internals ------------------------------------------------------------------
    def _poll_turns(self) -> Generator[None, None, None]:
        """Call the backend's poll between loop turns, with backoff, for the poll budget."""
        core = self._core
        poll = core.poll
        assert poll is not None
        started = time.perf_counter()
        stop_at = started + core.poll_budget
        half_way = started + core.poll_budget / 2
        skip = turn = 0
        while core.state is _PENDING:
            try:
                yield  # one loop turn (a bare yield reschedules an asyncio task)
            except BaseException:  # the awaiting task was cancelled while polling
                self._stop_polling()
                hook = core.record.on_await_cancelled
                if core.state is _PENDING and hook is not None:
                    _run_callback(hook, self)  # (what it raises is reported, not raised here)
                raise
            turn += 1
            if turn < skip:
                continue
            poll()
            if core.state is not _PENDING:
                return
            now = time.perf_counter()
            if now >= stop_at or (
                core.deadline is not None and time.monotonic() >= core.deadline
            ):  # budget spent, or past the dispatch's deadline: stop polling
                self._stop_polling()
                return
            if now >= half_way:  # still running past half the budget: poll less often
                turn, skip = 0, min(_MAX_POLL_SKIP, skip * 2 or 2)

    def _stop_polling(self) -> None:
        """Tell the backend nobody polls this dispatch any more (once)."""
        core = self._core
        give_up, core.give_up = core.give_up, None
        if give_up is not None:
            give_up()

    def _wait_asyncio(self, loop: asyncio.AbstractEventLoop) -> Generator[Any, None, None]:
        core = self._core
        waiter = _AsyncioWaiter(loop, loop.create_future())
        if not core.add_waiter(waiter):
            return
        timer = None
        if core.deadline is not None:
            timer = loop.call_later(core.remaining(), _set_future, waiter.future)
        try:
            yield from waiter.future
        except BaseException:
            self._await_cancelled(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if core.state is _PENDING:  # woken by the deadline, not by completion
            if core.waiters:
                core.remove_waiter(waiter)
            core.expire(self)

    async def _wait_trio(self) -> None:
        trio = sys.modules.get("trio")
        if trio is None:
            raise RuntimeError(
                "a PendingDispatch can only be awaited inside an asyncio or trio event loop\n"
                "Fix: await it from async code, or call pending.result() from plain code"
            )
        core = self._core
        self._stop_polling()  # a trio task never polls: the backend watches at once
        waiter = _TrioWaiter(trio.lowlevel.current_trio_token(), trio.lowlevel.current_task())
        if not core.add_waiter(waiter):
            return

        def abort(_: object) -> Any:
            waiter.parked = False
            return trio.lowlevel.Abort.SUCCEEDED

        try:
            if core.deadline is None:
                await trio.lowlevel.wait_task_rescheduled(abort)
            else:
                with trio.move_on_at(trio.current_time() + core.remaining()):
                    await trio.lowlevel.wait_task_rescheduled(abort)
        except BaseException:
            self._await_cancelled(waiter)
            raise
        if core.state is _PENDING:  # woken by the deadline, not by completion
            core.remove_waiter(waiter)
            core.expire(self)

    def _await_cancelled(self, waiter: _Waiter) -> None:
        core = self._core
        core.remove_waiter(waiter)
        hook = core.record.on_await_cancelled
        if core.state is _PENDING and hook is not None:  # cancelled mid-flight
            _run_callback(hook, self)  # (what it raises is reported, not raised here)


class DispatchCompleter:
    """The backend's side of a `PendingDispatch`: settle it from any thread, once.

    Attributes:
        pending: The pending dispatch it settles.
    """

    __slots__ = ("_core", "pending")

    def __init__(self, core: Any = None, pending: Any = None) -> None:
        if type(core) is not _Core or not isinstance(pending, PendingDispatch):
            raise TypeError(
                "DispatchCompleter objects come with their pending dispatch: backends "
                "create both with PendingDispatch.create()"
            )
        self._core: _Core = core
        self.pending: PendingDispatch = pending

    @property
    def stop_requested(self) -> threading.Event:
        """True once the result is no longer wanted (its deadline passed).

        Poll ``is_set()`` at safe points; the deadline does not wake a thread
        blocked in ``wait()`` (an explicit stop does).
        """
        return self._core.stop_flag()

    @property
    def record(self) -> DispatchRecord:
        """The dispatch's `DispatchRecord`."""
        return self._core.record

    def should_stop(self) -> bool:
        """Return True once the result is no longer wanted: ``stop_requested.is_set()``.

        Cheaper: it creates no event object when nobody asked for a stop.
        """
        core = self._core
        if core.deadline is not None and time.monotonic() >= core.deadline:
            return True
        stop = core.stop
        return stop is not None and stop.is_set()

    @property
    def wants_phases(self) -> bool:
        """True when a span records this dispatch, so `record_phase` intervals are shown.

        A backend may skip taking the timestamps for phases when this is False.
        """
        trace = self._core.record.trace
        return trace is not None and trace.span is not None

    @property
    def span(self) -> Any:
        """The open ``vyre.dispatch`` span while telemetry records one, else None.

        For a backend that carries the trace context on (a remote worker's spans
        as its children); the span itself is telemetry's to end.
        """
        trace = self._core.record.trace
        return None if trace is None else trace.span

    def mark_started(self) -> None:
        """Record that execution started (ends the queueing time)."""
        self._core.started = time.monotonic()

    def poll_with(
        self,
        check: Callable[[], object],
        *,
        budget_s: float = DEFAULT_POLL_BUDGET_S,
        give_up: Callable[[], object] | None = None,
    ) -> None:
        """Let an awaiting event loop notice completion by calling ``check()`` between turns.

        For work that usually ends within microseconds (a short GPU kernel): an
        awaiting asyncio task calls ``check()`` after each of its loop turns
        (with a backoff) for up to ``budget_s`` seconds — never past the
        dispatch's deadline — then parks until the dispatch settles. ``check``
        must be cheap and non-blocking, callable from any thread (the loop's, or
        one calling `PendingDispatch.done`), and settle the dispatch itself
        (`resolve`/`fail`) when it sees the work finished; its return value is
        ignored. It may spin for a few microseconds when it expects the work to end
        within them (`vyre_cupy`'s hybrid polling), never longer. The backend must
        still settle the dispatch on its own (a completion thread) if nobody
        polls; settling is once-only, so a race between the two is harmless.
        `PendingDispatch.done` calls ``check()`` too. ``give_up()``, when given, is
        called once when nobody will poll any more with the dispatch still
        running (the budget is spent, the awaiting task is cancelled, a trio
        task awaits it, or a thread blocks in ``result()``): the backend's own
        completion path should then watch it at once.
        """
        core = self._core
        core.poll_budget = budget_s
        core.give_up = give_up
        core.poll = check

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record an interval (``time.time_ns()`` clock) shown as a child span of the dispatch.

        Names: ``vyre.compile``, ``vyre.wait``, ``vyre.upload``, ``vyre.launch``,
        ``vyre.readback``, and ``vyre.segment`` once per segment of a program run
        split at its grid barriers (`vyre_async.split_at_grid_barriers`), in order.
        """
        record = self._core.record
        if record.phases is None:
            record.phases = [(name, start_ns, end_ns)]
        else:
            record.phases.append((name, start_ns, end_ns))

    def annotate(self, key: str, value: str | bool | int | float) -> None:
        """Attach an attribute (``vyre.stream``, ``vyre.policy.*``) to the dispatch span."""
        record = self._core.record
        if record.attributes is None:
            record.attributes = {key: value}
        else:
            record.attributes[key] = value

    def annotate_all(self, attributes: Mapping[str, str | bool | int | float]) -> None:
        """Attach several attributes at once (as `annotate` each)."""
        record = self._core.record
        if record.attributes is None:
            record.attributes = dict(attributes)
        else:
            record.attributes.update(attributes)

    def resolve(
        self,
        outputs: Sequence[np.ndarray],
        *,
        device_s: float | None = None,
        compile_s: float | None = None,
    ) -> bool:
        """Settle with ``outputs``; return False if the dispatch had already settled (timed out)."""
        core = self._core
        if core.deadline is not None and time.monotonic() >= core.deadline:
            core.expire(self.pending)  # too late: the result is a DispatchTimeout
            return False
        return core.settle(self.pending, _DONE, list(outputs), None, device_s, compile_s)

    def fail(self, error: BaseException, *, compile_s: float | None = None) -> bool:
        """Settle with ``error``; foreign exceptions are wrapped in `DispatchFailed`.

        Returns False if the dispatch had already settled.
        """
        core = self._core
        if core.past_deadline():
            core.expire(self.pending)
            return False
        if not isinstance(error, BackendError):
            wrapped = DispatchFailed(
                f"dispatch {core.describe()} failed: {type(error).__name__}: {error}",
                fix="inspect the chained exception; check inputs and backend health",
            )
            wrapped.__cause__ = error
            error = wrapped
        return core.settle(self.pending, _DONE, None, error)


def _wait(event: threading.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` (inf: forever) for ``event``, in steps the platform accepts."""
    if seconds == math.inf:
        return event.wait()
    deadline = time.monotonic() + seconds
    while True:
        step = min(deadline - time.monotonic(), _MAX_WAIT_STEP)
        if event.wait(max(0.0, step)):
            return True
        if time.monotonic() >= deadline:
            return False


def settle_hook(pending: PendingDispatch, fn: Callable[[PendingDispatch], None]) -> None:
    """Call ``fn(pending)`` inline when ``pending`` settles (at once if it has).

    For the driver's and backends' own bookkeeping (a pool forgetting a finished
    call, a shadow comparison handing on a result): ``fn`` runs in the thread
    that settles the dispatch, before its waiters wake, so it must be short and
    must never block or wait on a backend. Users want
    `PendingDispatch.add_done_callback`. Exceptions are reported through
    `threading.excepthook`.
    """
    core = pending._core  # noqa: SLF001 - the module's own class
    with core.lock:
        if core.state is _PENDING:
            if core.hooks is None:
                core.hooks = [fn]
            else:
                core.hooks.append(fn)
            return
    _run_callback(fn, pending)


class _CallbackThread:
    """The one daemon thread that runs done-callbacks, in the order they were queued.

    Started on first use (and again in a forked child, or if it ever died).
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[
            tuple[list[Callable[[PendingDispatch], None]], PendingDispatch] | threading.Event
        ] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(
        self, callbacks: list[Callable[[PendingDispatch], None]], pending: PendingDispatch
    ) -> None:
        self._queue.put((callbacks, pending))
        self._running()

    def drain(self, timeout: float) -> bool:
        if self._thread is None:
            return True
        if self._thread is threading.current_thread():
            return False  # (a callback cannot wait for the callbacks queued after it)
        marker = threading.Event()
        self._queue.put(marker)
        self._running()
        return _wait(marker, timeout)

    def _running(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="vyre-callbacks", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            self._next()

    def _next(self) -> None:
        # (its own frame: each item is dropped when it returns, so a finished dispatch's
        # callbacks and outputs are not held while the thread waits for the next)
        item = self._queue.get()
        if isinstance(item, threading.Event):
            item.set()
        else:
            _run_all(*item)

    def after_fork(self) -> None:
        """In a forked child: a fresh queue and no thread (the parent's did not come along)."""
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None


def _run_all(callbacks: list[Callable[[PendingDispatch], None]], pending: PendingDispatch) -> None:
    """Run one dispatch's callbacks in order; nothing a callback raises stops the others."""
    for fn in callbacks:
        try:
            _run_callback(fn, pending)
        except BaseException as exc:  # SystemExit too: reported, the thread goes on
            _report_callback_error(exc)


_CALLBACKS = _CallbackThread()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_CALLBACKS.after_fork)


def defer_to_callbacks(pending: PendingDispatch, fn: Callable[[PendingDispatch], None]) -> None:
    """Run ``fn(pending)`` on the callback thread, in turn with the done-callbacks.

    For the driver's and backends' own follow-up work that may take time (a
    shadow comparison and its ``on_divergence``): never on the settling
    thread, never on the caller's.
    """
    _CALLBACKS.submit([fn], pending)


def wait_for_callbacks(timeout: float | None = None) -> bool:
    """Wait until the done-callbacks queued so far have run; False if ``timeout`` passed.

    Returns False at once when called from a done-callback itself (the callbacks
    queued after it cannot run before it returns).

    Raises:
        InvalidArgument: ``timeout`` is not a number of seconds (any size) or None.
    """
    return _CALLBACKS.drain(wait_seconds(timeout, example="wait_for_callbacks(timeout=5.0)"))


def _run_callback(fn: Callable[[PendingDispatch], None], pending: PendingDispatch) -> None:
    try:
        fn(pending)
    except Exception as exc:  # a callback's bug must not break the dispatch
        _report_callback_error(exc)


def _report_callback_error(exc: BaseException) -> None:
    """Report an exception a done-callback raised through `threading.excepthook`.

    A hook that raises itself (a broken error reporter) falls back to stderr;
    whatever that write raises is dropped: reporting must never stop the thread
    that reports (nor the next callbacks of its dispatch).
    """
    args = threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, threading.current_thread()))
    try:
        threading.excepthook(args)
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback  # (rarely needed: not paid at import)

            traceback.print_exception(exc, file=sys.__stderr__ or sys.stderr)


def _asyncio_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop of this thread, or None.

    asyncio is not imported for this: no asyncio loop can run in a process that
    has not imported it (and vyre-async's import skips its ~20 ms).
    """
    module = sys.modules.get("asyncio")
    if module is None:
        return None
    try:
        loop: asyncio.AbstractEventLoop = module.get_running_loop()
    except RuntimeError:  # no asyncio loop runs in this thread
        return None
    return loop


def _running_library() -> str | None:
    """Return ``"asyncio"`` or ``"trio"`` when called inside that running loop, else None."""
    if _asyncio_loop() is not None:
        return "asyncio"
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
            return "trio"
        except RuntimeError:
            pass
    return None


def refuse_blocking_in_loop(what: str, instead: str) -> None:
    """Raise RuntimeError if called inside a running asyncio or trio event loop.

    ``what`` blocks until a dispatch finishes; ``instead`` is its async form.
    """
    library = _running_library()
    if library is None:
        return
    raise RuntimeError(
        f"{what} would block the running {library} event loop\n"
        f"Fix: use `{instead}` inside async code (or {what} from a worker thread)"
    )
