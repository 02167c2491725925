"""The completion bridge: ONE thread settles every in-flight dispatch by polling its event.

Never a thread per dispatch, never Python inside a CUDA host callback (that
deadlocks against the GIL). Each in-flight dispatch is a `Watch`: a
non-blocking ``ready()`` probe (``cudaEventQuery`` on its completion event) and
a ``finish(error)`` that copies results out and settles the `PendingDispatch`
(which wakes awaiting tasks through their own loop's thread-safe entry point).

Cost model:

- Watches on one queue (a CUDA stream) complete in submission order, so only
  the head of each queue is probed: a round costs one query per busy stream,
  however many thousands of dispatches are queued behind them.
- Adaptive backoff: right after a submission or a completion the thread spins
  (yielding the GIL with ``sleep(0)``) for ``spin_s``; after that it sleeps
  ``ratio`` times the age of the newest outstanding work, between
  ``min_sleep_s`` and ``max_sleep_s`` — so a dispatch that has run for 4 ms is
  noticed within about 1 ms, and a long kernel costs a handful of wake-ups per
  second. A new submission interrupts the sleep. With nothing in flight the
  thread looks for work every ``IDLE_SLICE_S`` for ``IDLE_LINGER_S``, then
  blocks on a condition variable until a submission wakes it (no busy loop).

- An awaiting event loop may finish a watch itself (`CompletionBridge.poll`,
  registered as the dispatch's poll): short work is then noticed between loop
  turns, without a cross-thread wake-up. A watch submitted with ``quiet_s`` to
  an idle bridge opens a quiet window of that length (the loop is expected to
  poll it); later submissions do not extend it, and after every window the
  thread polls every head once, so work nobody polls waits at most one window.
  Whoever finds a watch ready first claims it under the bridge's lock, so it is
  finished exactly once. A claimed watch stays at the head of its queue until
  its ``finish`` returns, so the next watch on that queue is not finished
  before it (done-callbacks of one stream run in submission order, whichever
  thread finishes each).

The bridge is CUDA-agnostic (it only calls ``ready``/``finish``), so it is
tested without a GPU.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Protocol

from vyre_async.abc import public_dir as _public_dir

__all__ = ["IDLE_LINGER_S", "IDLE_SLICE_S", "CompletionBridge", "Watch"]
__dir__ = _public_dir(__name__)

#: After its last watch finished, the thread looks for new work every IDLE_SLICE_S
#: for IDLE_LINGER_S (so a busy stream of dispatches needs no wake-up per
#: submission), then blocks until the next submission wakes it.
IDLE_SLICE_S = 1e-3
IDLE_LINGER_S = 20e-3


class Watch(Protocol):
    """One in-flight unit of work the bridge waits for."""

    def ready(self) -> bool:
        """Return True once the work has finished (never blocks; may raise a device error)."""

    def finish(self, error: BaseException | None) -> None:
        """Settle the work; ``error`` is what ``ready`` raised, if anything."""

    def abandon(self, error: BaseException) -> None:
        """Settle what waits on the work with ``error`` now; `finish` still runs when it ends."""


class CompletionBridge:
    """One daemon thread that finishes every submitted `Watch` once it is ready.

    Args:
        name: The thread's name.
        spin_s: How long to re-poll without sleeping after new work or progress.
        min_sleep_s: Shortest sleep between polls once spinning stops.
        max_sleep_s: Longest sleep between polls.
        ratio: Sleep this fraction of the newest outstanding work's age.
        on_start: Called first on the bridge thread (e.g. to make a CUDA device current).
    """

    def __init__(
        self,
        *,
        name: str = "vyre-cupy-completion",
        spin_s: float = 100e-6,
        min_sleep_s: float = 50e-6,
        max_sleep_s: float = 2e-3,
        ratio: float = 0.25,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        if not 0 <= min_sleep_s <= max_sleep_s:
            raise ValueError("need 0 <= min_sleep_s <= max_sleep_s")
        self._name = name
        self._spin_s = spin_s
        self._min_sleep_s = min_sleep_s
        self._max_sleep_s = max_sleep_s
        self._ratio = ratio
        self._on_start = on_start
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._queues: dict[Hashable, deque[Watch]] = {}  # never empty deques
        self._skipped = False  # the thread passed by a claimed queue since it last woke
        self._count = 0
        self._newest = 0.0
        self._wake = False
        self._quiet_until = 0.0
        self._parked = False
        self._idle_waiters = 0  # threads in wait_idle (notified when the count reaches 0)
        self._closing = False
        self._thread: threading.Thread | None = None
        #: Polling rounds and sleeps so far (for tests and benchmarks).
        self.rounds = 0
        self.sleeps = 0
        #: Watches finished by `poll` (an awaiting loop) rather than by the thread.
        self.polled = 0

    @property
    def in_flight(self) -> int:
        """Number of submitted watches not finished yet."""
        return self._count

    @property
    def running(self) -> bool:
        """True while the bridge thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, watch: Watch, *, queue: Hashable, quiet_s: float = 0.0) -> None:
        """Hand ``watch`` to the bridge. Watches on one ``queue`` must finish in order.

        Args:
            watch: The work to finish.
            queue: Its queue (a stream): watches on one queue finish in order.
            quiet_s: Seconds the bridge leaves ``watch`` to an awaiting loop's
                `poll` before it polls itself (0: at once).

        Raises:
            RuntimeError: the bridge was closed.
        """
        with self._lock:
            if self._closing:
                raise RuntimeError("the completion bridge is closed")
            waiting = self._queues.get(queue)
            if waiting is None:
                self._queues[queue] = deque((watch,))
            else:
                waiting.append(watch)
            self._count += 1
            now = self._newest = time.monotonic()
            if quiet_s > 0 and self._thread is not None and not self._parked:
                # The thread looks again within IDLE_SLICE_S: no wake-up needed. A quiet
                # window opens only when none is open (never extended, so work nobody
                # polls waits at most one window) and the thread has nothing else.
                if self._count == 1 and self._quiet_until < now:
                    self._quiet_until = now + quiet_s
                return
            self._quiet_until = now + quiet_s if quiet_s > 0 else 0.0
            self._wake = True
            self._parked = False  # woken now: the next submissions need not wake it again
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._work.notify()

    def take_over(self) -> None:
        """End the quiet time and wake the thread: it polls every stream's head (the loop gave up).

        A stream whose head an awaiting loop is finishing right now is polled as
        soon as that loop lets go of it.
        """
        with self._lock:
            self._quiet_until = 0.0
            if self._count:
                self._wake = True
                self._work.notify()

    def poll(self, watch: Watch, *, queue: Hashable, ready: bool = False) -> bool:
        """Finish ``watch`` here and now if it heads ``queue`` and is ready; return True if so.

        For an awaiting event loop (the dispatch's registered poll): never blocks
        beyond the ``ready`` probe. Returns False when the watch is not ready, is
        waiting behind earlier work on its queue (including work another thread
        is finishing right now), or was finished already.
        ``ready=True``: the caller just saw ``watch.ready()`` answer True (work
        that ended stays ended), so it is not asked again.
        """
        with self._lock:
            waiting = self._queues.get(queue)
            if not waiting or waiting[0] is not watch:  # claimed, finished or behind others
                return False
            error: BaseException | None = None
            try:
                if not ready and not watch.ready():
                    return False
            except Exception as exc:  # a device error settles the watch with it
                error = exc
            waiting[0] = _CLAIMED  # it leaves the queue once finished
            self.polled += 1
        # `_finish`, inline: this is every polled dispatch's path.
        try:
            watch.finish(error)
        except Exception as exc:  # a bug in finish must not stop the dispatch path
            _report(exc)
        finally:  # also when a done-callback raised SystemExit: the stream moves on
            with self._lock:
                waiting.popleft()
                if not waiting:
                    del self._queues[queue]
                elif self._skipped:  # the thread passed this queue by while it was claimed
                    self._skipped = False
                    self._wake = True
                    self._work.notify()
                self._count -= 1
                if self._count == 0 and self._idle_waiters:
                    self._idle.notify_all()
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is in flight; return False if ``timeout`` expired first.

        Blocking: call it from a worker thread, never from an event loop.
        """
        with self._lock:
            self._idle_waiters += 1
            try:
                return self._idle.wait_for(lambda: self._count == 0, timeout)
            finally:
                self._idle_waiters -= 1

    def abandon(self, error: BaseException) -> int:
        """Call ``abandon(error)`` on every watch not finished yet; return how many there are.

        A watch being finished right now is left to its ``finish``.

        The watches stay queued: each is still finished (its resources released)
        when its work ends.
        """
        with self._lock:
            watches = [w for queue in self._queues.values() for w in queue if w is not _CLAIMED]
        for watch in watches:
            try:
                watch.abandon(error)
            except Exception as exc:  # a bug in one watch must not stop the others
                _report(exc)
        return len(watches)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new work, let in-flight work finish, and stop the thread."""
        with self._lock:
            self._closing = True
            self._work.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # Bridge thread ------------------------------------------------------------------
    def _run(self) -> None:
        if self._on_start is not None:
            try:
                self._on_start()
            except Exception as exc:
                _report(exc)
        last_progress = time.monotonic()
        after_quiet = False
        while True:
            with self._lock:
                idle_since = None
                while self._count == 0 and not self._closing:
                    now = time.monotonic()
                    idle_since = idle_since or now
                    if now - idle_since < IDLE_LINGER_S:  # more work is likely soon
                        self._work.wait(IDLE_SLICE_S)
                    else:  # idle: block until a submission wakes the thread
                        self._parked = True
                        self._work.wait()
                        self._parked = False
                        idle_since = None  # woken by work: linger afresh after it
                if self._count == 0:
                    return
                quiet = self._quiet_until - time.monotonic()
                if quiet > 0 and not self._closing and not after_quiet:
                    self._wake = False  # an awaiting loop polls this work meanwhile
                    self._work.wait(quiet)
                    after_quiet = True  # then one round over every head, whatever came
                    continue
                after_quiet = False
                heads = [(key, q[0]) for key, q in self._queues.items() if q[0] is not _CLAIMED]
                # A claimed queue passed by: its poller wakes the thread when it lets go.
                self._skipped = len(heads) < len(self._queues)
                self._wake = False
                newest = self._newest
            self.rounds += 1
            if any(self._drain(key, head) for key, head in heads):
                last_progress = time.monotonic()
                continue
            age = time.monotonic() - max(newest, last_progress)
            if age < self._spin_s:
                time.sleep(0)  # yield the GIL, then poll again
                continue
            delay = min(self._max_sleep_s, max(self._min_sleep_s, age * self._ratio))
            self.sleeps += 1
            with self._lock:
                if not self._wake:  # (also when closing: work still running is polled, not spun on)
                    self._work.wait(delay)

    def _drain(self, key: Hashable, head: Watch) -> bool:
        """Finish ``head`` and its successors on ``key`` while they are ready."""
        progressed = False
        watch: Watch | None = head
        while watch is not None:
            error: BaseException | None = None
            try:
                if not watch.ready():
                    break
            except Exception as exc:  # a device error settles the watch with it
                error = exc
            with self._lock:
                queue = self._queues.get(key)
                if not queue:  # an awaiting loop finished it
                    return True
                if queue[0] is _CLAIMED:  # an awaiting loop is finishing it
                    self._skipped = True  # (its poller wakes the thread when it lets go)
                    return progressed
                if queue[0] is not watch:  # an awaiting loop finished it
                    return True
                queue[0] = _CLAIMED
            watch = self._finish(key, queue, watch, error)
            progressed = True
        return progressed

    def _finish(
        self, key: Hashable, queue: deque[Watch], watch: Watch, error: BaseException | None
    ) -> Watch | None:
        """Finish ``watch``, claimed at the head of ``queue``; return the next head, if any.

        The claim (`_CLAIMED` in the watch's place) leaves the queue only after
        ``finish`` returns: until then no one claims the watch behind it.
        """
        try:
            watch.finish(error)
        except BaseException as exc:  # a bug in finish (even SystemExit) must not stop the bridge
            _report(exc)
        with self._lock:
            queue.popleft()
            following = queue[0] if queue else None
            if not queue:
                del self._queues[key]
            self._count -= 1
            if self._count == 0 and self._idle_waiters:
                self._idle.notify_all()
        return following


class _Claimed:
    """Stands at the head of a queue for a watch being finished (never ready)."""

    __slots__ = ()

    def ready(self) -> bool:
        return False

    def finish(self, error: BaseException | None) -> None:
        raise AssertionError("a claimed watch is finished by whoever claimed it")

    def abandon(self, error: BaseException) -> None:
        pass


#: Put in a claimed watch's place at the head of its queue until its ``finish`` returns.
_CLAIMED: Watch = _Claimed()


def _report(exc: BaseException) -> None:
    """Report an exception raised by a watch through `threading.excepthook`."""
    args = threading.ExceptHookArgs((type(exc), exc, exc.__traceback__, threading.current_thread()))
    threading.excepthook(args)
