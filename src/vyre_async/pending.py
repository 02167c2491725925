"""`PendingDispatch`: the awaitable result of one launched dispatch.

A backend creates the pair ``pending, completer = PendingDispatch.create(...)``,
hands ``pending`` to the caller at once and settles it later through
``completer`` from any thread (a worker, a CUDA event poller). Waiting never
blocks an event loop: an awaiting task parks on an anyio event that the
completing thread sets through the loop's own thread-safe entry point
(``call_soon_threadsafe`` on asyncio, ``TrioToken.run_sync_soon`` on trio).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from vyre_async.arguments import to_seconds
from vyre_async.errors import BackendError, DispatchFailed, DispatchTimeout, InvalidProgram

__all__ = [
    "DispatchCompleter",
    "DispatchTiming",
    "PendingDispatch",
    "ResultAlreadyTaken",
]

Outputs = list[np.ndarray]
#: Longest single blocking wait; longer waits loop (platform clocks overflow near 2**63 ns).
_MAX_WAIT_STEP = 86_400.0
_PENDING, _DONE, _TIMED_OUT = "pending", "done", "timed_out"


class ResultAlreadyTaken(RuntimeError):
    """The result of a `PendingDispatch` was already taken (it can be taken once)."""


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


class _StopFlag(threading.Event):
    """A stop request that is also raised once the dispatch deadline has passed."""

    def __init__(self, deadline: float | None) -> None:
        super().__init__()
        self._deadline = deadline

    def is_set(self) -> bool:
        if super().is_set():
            return True
        return self._deadline is not None and time.monotonic() >= self._deadline


class PendingDispatch:
    """The awaitable result of a dispatch: ``outputs = await pending``.

    Created by backends with `PendingDispatch.create`; never constructed by users.

    * awaitable under asyncio and trio without blocking the event loop;
    * `done` never blocks; `result` blocks (for plain synchronous code);
    * the result is taken once — a second take raises `ResultAlreadyTaken`;
    * cancelling an awaiting task leaves the dispatch running and untaken;
    * past ``DispatchConfig.timeout`` (counted from ``dispatch()``) awaiting or
      `result` raises `DispatchTimeout` and the backend is asked to stop.
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_created",
        "_deadline",
        "_error",
        "_label",
        "_lock",
        "_outputs",
        "_settled",
        "_started",
        "_state",
        "_stop",
        "_taken",
        "_timeout",
        "_timing",
        "_wakers",
        "context",
    )

    def __init__(
        self,
        *,
        _token: object = None,
        timeout: float | None,
        label: str | None,
        created: float | None = None,
    ) -> None:
        if _token is not _CREATE:
            raise TypeError(
                "PendingDispatch objects come from backend.dispatch(); "
                "backends create them with PendingDispatch.create()"
            )
        self._created = time.monotonic() if created is None else created
        self._timeout = timeout
        self._deadline = None if timeout is None else self._created + to_seconds(timeout)
        self._label = label
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._state = _PENDING
        self._outputs: Outputs | None = None
        self._error: BaseException | None = None
        self._taken = False
        self._timing: DispatchTiming | None = None
        self._started: float | None = None
        self._callbacks: list[Callable[[PendingDispatch], None]] = []
        self._wakers: list[Callable[[], None]] = []
        self._stop = _StopFlag(self._deadline)
        #: Free slot for the driver (telemetry span, shape-prediction bookkeeping).
        self.context: dict[str, Any] = {}

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
        pending = cls(_token=_CREATE, timeout=timeout, label=label, created=created)
        return pending, DispatchCompleter(pending)

    # Caller side ----------------------------------------------------------------
    def done(self) -> bool:
        """Return True once the dispatch has finished, failed or timed out. Never blocks."""
        if self._state is _PENDING and self._past_deadline():
            self._expire()
        return self._state is not _PENDING

    @property
    def timing(self) -> DispatchTiming | None:
        """Timing of the finished dispatch, or ``None`` while it runs."""
        return self._timing

    @property
    def created(self) -> float:
        """``time.monotonic()`` when ``dispatch()`` was called (the timeout counts from here)."""
        return self._created

    @property
    def label(self) -> str | None:
        """The dispatch label from its config."""
        return self._label

    @property
    def stop_requested(self) -> threading.Event:
        """Set when the result is no longer wanted (timeout); backends poll it at safe points."""
        return self._stop

    def add_done_callback(self, fn: Callable[[PendingDispatch], None]) -> None:
        """Call ``fn(self)`` once the dispatch settles (at once if it already has).

        Callbacks run in the thread that settles the dispatch (a worker or the
        caller); keep them short and thread-safe. Exceptions they raise are
        reported through `threading.excepthook` and do not affect the dispatch.

        Raises:
            InvalidProgram: ``fn`` is not callable.
        """
        if not callable(fn):
            raise InvalidProgram(
                f"add_done_callback needs a callable, got {fn!r}",
                fix="pass a function taking the PendingDispatch",
            )
        with self._lock:
            if self._state is _PENDING:
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def result(self, timeout: float | None = None) -> Outputs:
        """Block until the outputs are ready and return them (for synchronous code).

        Args:
            timeout: Seconds to wait (any non-negative number, however large;
                ``None`` waits as long as the dispatch's own deadline allows).
                Expiring raises the builtin `TimeoutError` and takes nothing, so
                the result can still be awaited later.

        Raises:
            InvalidProgram: ``timeout`` is not a number (or is NaN).
            DispatchTimeout: the dispatch's own deadline passed.
            ResultAlreadyTaken: the result was already taken.
            RuntimeError: called from inside a running event loop before the
                result is ready (that would freeze the loop).
            BackendError: the dispatch failed.
        """
        limit = _wait_limit(timeout)
        if not self._settled.is_set() and not self.done():
            _refuse_blocking_in_loop()
            if not _wait(self._settled, min(limit, self._remaining())):
                if self._past_deadline():
                    self._expire()
                else:
                    raise TimeoutError(
                        f"dispatch {self._describe()} not finished after {timeout} s of waiting; "
                        "it keeps running and its result can still be taken"
                    )
        return self._take()

    def __await__(self) -> Generator[Any, None, Outputs]:
        return self._wait().__await__()

    async def _wait(self) -> Outputs:
        if not self.done():
            event = anyio.Event()
            wake = _thread_safe_setter(event)
            if self._add_waker(wake):
                try:
                    with anyio.move_on_after(self._remaining()):
                        await event.wait()
                except BaseException:
                    with self._lock:
                        still_running = self._state is _PENDING
                    if still_running:  # the awaiting task was cancelled mid-flight
                        hook = self.context.get("await_cancelled")
                        if hook is not None:
                            hook(self)
                    raise
                finally:
                    self._remove_waker(wake)
            if not self.done():  # woken by the deadline, not by completion
                self._expire()
        return self._take()

    def __repr__(self) -> str:
        state = "taken" if self._taken else self._state
        return f"<PendingDispatch {self._describe()} {state}>"

    # Internals ------------------------------------------------------------------
    def _describe(self) -> str:
        return repr(self._label) if self._label else f"at 0x{id(self):x}"

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _remaining(self) -> float:
        if self._deadline is None:
            return math.inf
        return max(0.0, self._deadline - time.monotonic())

    def _add_waker(self, wake: Callable[[], None]) -> bool:
        with self._lock:
            if self._state is not _PENDING:
                return False
            self._wakers.append(wake)
            return True

    def _remove_waker(self, wake: Callable[[], None]) -> None:
        with self._lock:
            if wake in self._wakers:
                self._wakers.remove(wake)

    def _take(self) -> Outputs:
        with self._lock:
            if self._taken:
                raise ResultAlreadyTaken(
                    f"the result of dispatch {self._describe()} was already taken\n"
                    "Fix: keep the outputs from the first await or result() call"
                )
            self._taken = True
            outputs, error = self._outputs, self._error
            self._outputs = None  # the caller owns the arrays now
        if error is not None:
            raise error
        assert outputs is not None
        return outputs

    def _expire(self) -> None:
        error = DispatchTimeout(
            f"dispatch {self._describe()} did not finish within its timeout of "
            f"{self._timeout} s (counted from dispatch())",
            fix="raise DispatchConfig.timeout or split the work into smaller dispatches",
            timeout=self._timeout,
        )
        self._settle(_TIMED_OUT, None, error, None)

    def _settle(
        self,
        state: str,
        outputs: Outputs | None,
        error: BaseException | None,
        timing: DispatchTiming | None,
    ) -> bool:
        with self._lock:
            if self._state is not _PENDING:
                return False
            self._state, self._outputs, self._error = state, outputs, error
            self._timing = timing or self._host_timing()
            callbacks, self._callbacks = self._callbacks, []
            wakers, self._wakers = self._wakers, []
        if state is _TIMED_OUT:
            self._stop.set()
        # Callbacks (span end, bookkeeping) run before waiters wake, so a caller that
        # resumes sees them done; waiters wake even if a callback raises SystemExit.
        try:
            for fn in callbacks:
                _run_callback(fn, self)
        finally:
            self._settled.set()
            for wake in wakers:
                wake()
        return True

    def _host_timing(self) -> DispatchTiming:
        now = time.monotonic()
        queue = None if self._started is None else self._started - self._created
        return DispatchTiming(
            wall_s=now - self._created, queue_s=queue, device_s=None, compile_s=None
        )


_CREATE = object()


class DispatchCompleter:
    """The backend's side of a `PendingDispatch`: settle it from any thread, once."""

    __slots__ = ("pending",)

    def __init__(self, pending: PendingDispatch) -> None:
        self.pending = pending

    @property
    def stop_requested(self) -> threading.Event:
        """True once the result is no longer wanted (its deadline passed).

        Poll ``is_set()`` at safe points; the deadline does not wake a thread
        blocked in ``wait()`` (an explicit stop does).
        """
        return self.pending._stop

    def mark_started(self) -> None:
        """Record that execution started (ends the queueing time)."""
        self.pending._started = time.monotonic()

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record an interval (``time.time_ns()`` clock) shown as a child span of the dispatch.

        Names: ``vyre.compile``, ``vyre.wait``, ``vyre.upload``, ``vyre.launch``,
        ``vyre.readback``.
        """
        self.pending.context.setdefault("phases", []).append((name, start_ns, end_ns))

    def annotate(self, key: str, value: str | bool | int | float) -> None:
        """Attach an attribute (``vyre.stream``, ``vyre.policy.*``) to the dispatch span."""
        self.pending.context.setdefault("attributes", {})[key] = value

    def annotate_all(self, attributes: Mapping[str, str | bool | int | float]) -> None:
        """Attach several attributes at once (as `annotate` each)."""
        self.pending.context.setdefault("attributes", {}).update(attributes)

    def resolve(
        self,
        outputs: Sequence[np.ndarray],
        *,
        device_s: float | None = None,
        compile_s: float | None = None,
    ) -> bool:
        """Settle with ``outputs``; return False if the dispatch had already settled (timed out)."""
        p = self.pending
        if p._past_deadline():  # too late: the result is a DispatchTimeout, discard this
            p._expire()
            return False
        now = time.monotonic()
        queue = None if p._started is None else p._started - p._created
        timing = DispatchTiming(
            wall_s=now - p._created, queue_s=queue, device_s=device_s, compile_s=compile_s
        )
        return p._settle(_DONE, list(outputs), None, timing)

    def fail(self, error: BaseException, *, compile_s: float | None = None) -> bool:
        """Settle with ``error``; foreign exceptions are wrapped in `DispatchFailed`.

        Returns False if the dispatch had already settled.
        """
        if self.pending._past_deadline():
            self.pending._expire()
            return False
        if not isinstance(error, BackendError):
            wrapped = DispatchFailed(
                f"dispatch {self.pending._describe()} failed: {type(error).__name__}: {error}",
                fix="inspect the chained exception; check inputs and backend health",
            )
            wrapped.__cause__ = error
            error = wrapped
        return self.pending._settle(_DONE, None, error, None)


def _wait_limit(timeout: object) -> float:
    """Return ``result(timeout=...)`` as seconds (inf for None), or raise a clear error."""
    if timeout is None:
        return math.inf
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or (isinstance(timeout, float) and math.isnan(timeout))
    ):
        raise InvalidProgram(
            f"result(timeout=...) must be a number of seconds or None, got {timeout!r}",
            fix="pass e.g. pending.result(timeout=1.0)",
        )
    return max(0.0, to_seconds(timeout))


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


def _run_callback(fn: Callable[[PendingDispatch], None], pending: PendingDispatch) -> None:
    try:
        fn(pending)
    except Exception as exc:  # a callback's bug must not break the dispatch
        args = threading.ExceptHookArgs(
            (type(exc), exc, exc.__traceback__, threading.current_thread())
        )
        threading.excepthook(args)


def _running_library() -> str | None:
    """Return ``"asyncio"`` or ``"trio"`` when called inside that running loop, else None."""
    import asyncio

    try:
        asyncio.get_running_loop()
        return "asyncio"
    except RuntimeError:
        pass
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
            return "trio"
        except RuntimeError:
            pass
    return None


def _thread_safe_setter(event: anyio.Event) -> Callable[[], None]:
    """Return a function that sets ``event`` from any thread, through the running loop."""
    if _running_library() == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def wake_trio() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(event.set)

        return wake_trio
    import asyncio

    loop = asyncio.get_running_loop()

    def wake_asyncio() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the dispatch ran
            loop.call_soon_threadsafe(event.set)

    return wake_asyncio


def _refuse_blocking_in_loop() -> None:
    library = _running_library()
    if library is None:
        return
    raise RuntimeError(
        f"PendingDispatch.result() would block the running {library} event loop\n"
        "Fix: use `await pending` inside async code (or result() from a worker thread)"
    )
