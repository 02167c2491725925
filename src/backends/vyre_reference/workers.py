"""`WorkerPool`: the reference backend's bounded FIFO pool of daemon worker threads.

Why not `concurrent.futures.ThreadPoolExecutor`: its threads are joined at
interpreter exit, however long their work takes, so one runaway dispatch kept
the process alive forever. These threads are daemons; the backend stops their
work at the engine's next safe point when it is closed or the interpreter
exits, and never waits for them without a bound.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Protocol

from vyre_async.abc import public_dir as _public_dir

__all__ = ["Job", "WorkerPool"]
__dir__ = _public_dir(__name__)


class Job(Protocol):
    """One unit of work: ``run()`` on a worker, or ``drop()`` if the pool closes first."""

    def run(self) -> None:
        """Do the work; what it raises is reported (`threading.excepthook`), the worker goes on."""

    def drop(self) -> None:
        """Give up without running (the pool closed while the job was queued)."""


class WorkerPool:
    """Run jobs in submission order on at most ``max_workers`` daemon threads.

    Threads start on demand and live until `close` (call it when the owner is
    done: idle threads wait for work until then). Jobs start in FIFO order (a
    job never starts before one submitted earlier). A job that raises is
    reported through `threading.excepthook` and its thread takes the next job.

    Args:
        max_workers: Most threads running jobs at once (>= 1).
        name: Thread name prefix.
    """

    def __init__(self, max_workers: int, *, name: str) -> None:
        self.max_workers = max_workers
        self._name = name
        self._queue: deque[Job] = deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._running = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    @property
    def busy(self) -> int:
        """Jobs queued or running."""
        with self._cond:
            return len(self._queue) + self._running

    def submit(self, job: Job) -> None:
        """Queue ``job``; start a thread if none is idle and the pool has room.

        Raises:
            RuntimeError: the pool was closed, or no thread could be started while
                none is running (the job is then not queued).
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("the worker pool was closed")
            self._queue.append(job)
            if self._idle < len(self._queue) and len(self._threads) < self.max_workers:
                thread = threading.Thread(
                    target=self._work,
                    name=f"{self._name}-{len(self._threads)}",
                    daemon=True,
                )
                try:
                    thread.start()
                except RuntimeError:  # "can't start new thread": out of threads or memory
                    if not self._threads:  # nobody would ever run the job
                        self._queue.pop()
                        raise
                    self._cond.notify()  # a running thread takes it in turn
                else:
                    self._threads.append(thread)
            else:
                self._cond.notify()

    def close(self) -> list[Job]:
        """Refuse new jobs, let the threads exit after their current job; return the queued ones.

        The returned jobs were never started: the caller drops them.
        """
        with self._cond:
            self._closed = True
            queued = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        return queued

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every thread to exit; return True if they did."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                if not self._queue:  # closed and drained
                    return
                job = self._queue.popleft()
                self._running += 1
            try:
                job.run()
            except BaseException as exc:  # a job's failure must not cost the pool a thread
                threading.excepthook(
                    threading.ExceptHookArgs(
                        (type(exc), exc, exc.__traceback__, threading.current_thread())
                    )
                )
            finally:
                del job  # an idle worker must not keep the last dispatch alive
                with self._cond:
                    self._running -= 1
