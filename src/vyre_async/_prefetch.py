"""Shape-prediction prefetch: compile the likely next pipeline while the device runs.

Every dispatch records its *shape fingerprint* — the pipeline cache identity
plus the launch geometry — in a `ShapeHistory`. After the dispatch is enqueued
the history predicts the next shape; if that pipeline is not in the backend's
memory cache, it is compiled on one background worker thread (never the event
loop's), so the next dispatch finds it ready instead of waiting for a compile.

A prediction is scored when the next dispatch arrives: a *hit* when the
dispatch has the predicted shape and its pipeline was ready (no compile wait).
The rolling hit rate over the last 64 predictions is exported through the
``vyre.prefetch.hits`` / ``vyre.prefetch.misses`` metrics and put on the
dispatch span as ``vyre.prefetch.hit`` and ``vyre.prefetch.hit_rate``.
Dispatches issued without a prediction (no pattern yet) are not scored.

Prefetching never raises into the dispatch path: a failed background compile is
logged and forgotten (the dispatch that needs the pipeline compiles it and
reports the error itself).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vyre_async import telemetry
from vyre_async._arguments import duration, wait_seconds, whole_number
from vyre_async._cache.identity import PipelineIdentity
from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async._plan import LaunchGeometry
from vyre_async.ir.program import Program
from vyre_async.policies.shapes import (
    HIT_RATE_WINDOW,
    SHAPE_HISTORY_CAPACITY,
    RollingHitRate,
    ShapeHistory,
)

if TYPE_CHECKING:
    import logging

    from vyre_async._pending import PendingDispatch
    from vyre_async._seams import PipelineLike
    from vyre_async._store import PipelineStore

__all__ = ["PrefetchJob", "PrefetchStats", "Prefetcher"]
__dir__ = _public_dir(__name__)


def _log() -> logging.Logger:
    """This module's logger (``logging`` is imported on the first message, not at import)."""
    import logging

    return logging.getLogger("vyre_async.prefetch")


ShapeFingerprint = tuple[bytes, tuple[int, int, int], tuple[int, int, int]]
#: The outcome of every dispatch in the steady state: a hit, all of the window hits.
_STEADY = (True, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefetchJob:
    """One pipeline to compile in the background.

    Attributes:
        program: The program to compile.
        config: The config it was dispatched with (its policy fields apply).
        identity: The pipeline cache identity the compile produces.
    """

    program: Program
    config: DispatchConfig
    identity: PipelineIdentity


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefetchStats:
    """A snapshot of a prefetcher's counters.

    Attributes:
        dispatches: Dispatches observed.
        predictions: Dispatches that had a prediction (scored), in total.
        hits: Scored dispatches that were hits, in total.
        hit_rate: Rolling hit rate over the last ``window`` predictions (None before any).
        window: Size of the rolling window.
        compiles: Background compiles finished.
        failures: Background compiles that failed (logged).
        dropped: Predictions not compiled because the queue was full.
        prefetched_used: Dispatches that used a pipeline compiled by the prefetcher.
    """

    dispatches: int
    predictions: int
    hits: int
    hit_rate: float | None
    window: int
    compiles: int
    failures: int
    dropped: int
    prefetched_used: int


class Prefetcher:
    """Records dispatch shapes, predicts the next one and compiles it in the background.

    Created by `VyreBackend` (``prefetch=True``, the default) and available as
    ``backend.prefetcher``. Thread-safe: dispatches may come from any thread.

    Args:
        store: The pipeline store of the backend whose pipelines are prefetched.
        capacity: Shape fingerprints kept (default 16).
        window: Predictions in the rolling hit rate (default 64).
        max_queue: Background compiles queued or running at most; further
            predictions are dropped (counted in ``dropped``).
        idle_s: Seconds the worker thread waits for work before it exits (at most
            a day: longer is taken as a day, the longest wait the clock can time).
    """

    def __init__(
        self,
        store: PipelineStore,
        *,
        capacity: int = SHAPE_HISTORY_CAPACITY,
        window: int = HIT_RATE_WINDOW,
        max_queue: int = 4,
        idle_s: float = 2.0,
    ) -> None:
        max_queue = whole_number("max_queue", max_queue, minimum=1, example="max_queue=4")
        capacity = whole_number("capacity", capacity, minimum=1, example="capacity=16")
        window = whole_number("window", window, minimum=1, example="window=64")
        idle_s = duration("idle_s", idle_s, positive=True, example="idle_s=2.0")
        self.store = store
        self.backend_id = store.executor.id
        self.max_queue = max_queue
        self.idle_s = min(idle_s, 86_400.0)
        self._history: ShapeHistory[ShapeFingerprint] = ShapeHistory(capacity)
        self.window = RollingHitRate(window).window
        self._outcomes: deque[bool] = deque(maxlen=self.window)
        self._window_hits = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._predicted: ShapeFingerprint | None = None
        self._queue: deque[PrefetchJob] = deque()
        self._inflight: set[bytes] = set()
        self._prefetched: set[bytes] = set()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._dispatches = 0
        self._predictions = 0
        self._hits = 0
        self._compiles = 0
        self._failures = 0
        self._dropped = 0
        self._used = 0
        # Steady state: the same shape again and again, predicted and ready. Its
        # dispatches only count repeats (`_steady_run`); the counters and the
        # history take them in at the next dispatch of another kind (`_fold`).
        self._steady: ShapeFingerprint | None = None
        self._steady_run = 0

    # Dispatch path (keep it cheap) ------------------------------------------------
    def observe(
        self,
        pipeline: PipelineLike,
        geometry: LaunchGeometry,
        cache_hit: bool,
        pending: PendingDispatch,
        fingerprint: ShapeFingerprint | None = None,
        recording: bool | None = None,
    ) -> PrefetchJob | None:
        """Score the previous prediction, record this dispatch and predict the next.

        Called by the driver for every dispatch, just before it is enqueued (so
        the span attributes are in place even when the backend finishes inline).

        Args:
            pipeline: The pipeline being dispatched.
            geometry: Its launch geometry.
            cache_hit: Whether the pipeline was ready without a compile wait.
            pending: The dispatch's pending result (its span gets the attributes).
            fingerprint: The dispatch's shape fingerprint when the caller keeps it
                (the front end keeps one per launch template); built here when None.
            recording: Whether telemetry records this dispatch (asked here when None).

        Returns:
            The job to hand to `schedule` after the enqueue, or None.
        """
        if cache_hit and fingerprint is not None and fingerprint is self._steady:
            with self._lock:  # steady state: one more repeat, nothing else changes
                steady = fingerprint is self._steady
                if steady:
                    self._steady_run += 1
            if steady:
                if recording or (recording is None and telemetry.is_recording()):
                    self._annotate(pending, True, 1.0)
                return None
        try:
            identity = pipeline.identity
            digest = identity.digest
            fp: ShapeFingerprint = fingerprint or (digest, geometry.grid, geometry.workgroup)
            job = None
            steady = False
            with self._lock:
                self._fold()
                self._dispatches += 1
                predicted = self._predicted
                if (
                    cache_hit
                    and (predicted is fp or predicted == fp)
                    and self._window_hits == self.window
                    and not self._prefetched
                    and self._history.latest() is fp
                ):  # the same shape again, predicted and ready: nothing changes but counts
                    self._predictions += 1
                    self._hits += 1
                    self._history.push(fp)  # a repeat of the latest: an append
                    hit, rate, steady = True, 1.0, True
                    self._steady = fp  # its next repeats take the short cut above
                elif predicted is None:
                    payload: object = (pipeline.program, pipeline.config, identity)
                else:
                    right = predicted == fp
                    hit = cache_hit and right
                    self._predictions += 1
                    self._hits += hit
                    # The rolling window (RollingHitRate's rule, inlined: this runs on
                    # every dispatch, and a full window of equal outcomes is unchanged).
                    outcomes = self._outcomes
                    full = len(outcomes) == self.window
                    if not (full and self._window_hits == (self.window if hit else 0)):
                        if full and outcomes[0]:
                            self._window_hits -= 1
                        outcomes.append(hit)
                        self._window_hits += hit
                    rate = self._window_hits / len(outcomes)
                    # A right prediction came from the window, where fp's payload still is.
                    payload = None if right else (pipeline.program, pipeline.config, identity)
                if not steady:
                    if cache_hit and self._prefetched and digest in self._prefetched:
                        self._prefetched.discard(digest)
                        self._used += 1
                    nxt = self._predicted = self._history.push(fp, payload)
                    if nxt is not None and nxt != fp and nxt[0] not in self._inflight:
                        job = self._job_for(nxt)
            if recording is None:
                recording = telemetry.is_recording()
            if predicted is not None and recording:
                self._annotate(pending, hit, rate)
            return job
        except Exception:  # never break a dispatch over bookkeeping
            _log().warning("shape-prediction bookkeeping failed", exc_info=True)
            return None

    @staticmethod
    def _annotate(pending: PendingDispatch, hit: bool, rate: float) -> None:
        """Keep a scored prediction on the dispatch's record, for its span and metrics.

        Telemetry reads it when the dispatch settles (``vyre.prefetch.hit`` and
        ``.hit_rate`` on a recorded span, the ``vyre.prefetch.hits``/``misses``
        counters with a meter provider).
        """
        pending.record.prefetch = _STEADY if hit and rate == 1.0 else (hit, rate)

    def _fold(self) -> None:
        """Leave the steady state: count its repeats and put them in the history (lock held)."""
        run, fp = self._steady_run, self._steady
        self._steady = None
        if run and fp is not None:
            self._steady_run = 0
            self._dispatches += run
            self._predictions += run
            self._hits += run
            self._history.repeat(fp, run)

    def _job_for(self, fp: ShapeFingerprint) -> PrefetchJob | None:
        """Return a compile job for ``fp`` when its pipeline is not cached (lock held)."""
        payload = self._history.payload_for(fp)
        if payload is None or self.store.peek(payload[2]) is not None:
            return None
        return PrefetchJob(program=payload[0], config=payload[1], identity=payload[2])

    def schedule(self, job: PrefetchJob) -> None:
        """Queue ``job`` for the background worker (deduplicated, bounded; never raises)."""
        try:
            with self._lock:
                if self._closed or job.identity.digest in self._inflight:
                    return
                if len(self._inflight) >= self.max_queue:
                    self._dropped += 1
                    return
                self._inflight.add(job.identity.digest)
                self._queue.append(job)
                if self._worker is None:
                    worker = threading.Thread(
                        target=self._serve, name=f"vyre-prefetch-{self.backend_id}", daemon=True
                    )
                    try:
                        worker.start()
                    except BaseException:  # no thread: nothing stays queued for a dead one
                        self._queue.pop()
                        self._inflight.discard(job.identity.digest)
                        self._dropped += 1
                        raise
                    self._worker = worker  # (set only once it runs)
                else:
                    self._wake.notify()
        except Exception:  # pragma: no cover - e.g. no thread can be started
            _log().warning("could not schedule a pipeline prefetch", exc_info=True)

    # Worker -------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._closed:
                    self._wake.wait(self.idle_s)
                if not self._queue or self._closed:
                    self._worker = None
                    self._queue.clear()
                    self._inflight.clear()
                    self._wake.notify_all()
                    return
                job = self._queue.popleft()
            self._compile(job)

    def _compile(self, job: PrefetchJob) -> None:
        digest = job.identity.digest
        try:
            if self.store.peek(job.identity) is None:
                self.store.compile_once(job.program, job.config, job.identity)
                with self._lock:
                    self._fold()  # a prefetched pipeline is scored when it is used
                    self._compiles += 1
                    self._prefetched.add(digest)
        except Exception:
            with self._lock:
                self._failures += 1
            _log().warning(
                "background compile of predicted pipeline %s failed; the next dispatch "
                "compiles it itself",
                job.identity.hex[:16],
                exc_info=True,
            )
        finally:
            with self._lock:
                self._inflight.discard(digest)
                if len(self._prefetched) > 4 * SHAPE_HISTORY_CAPACITY:
                    self._prefetched.clear()  # stale: evicted before use
                self._wake.notify_all()

    # Inspection ---------------------------------------------------------------------
    def drain(self, timeout: float | None = None) -> bool:
        """Block until no background compile is queued or running (for tests and tools).

        Returns:
            True when idle, False when ``timeout`` seconds passed first.

        Raises:
            InvalidArgument: ``timeout`` is not a number of seconds (any size) or None.
        """
        limit = wait_seconds(timeout, example="prefetcher.drain(timeout=5.0)")
        deadline = time.monotonic() + limit if math.isfinite(limit) else math.inf
        with self._lock:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 86_400.0))
            return True

    @property
    def predicted(self) -> ShapeFingerprint | None:
        """The fingerprint predicted for the next dispatch, or None."""
        return self._predicted

    def stats(self) -> PrefetchStats:
        """Return a snapshot of the counters."""
        with self._lock:
            run = self._steady_run  # the steady state's repeats, not folded in yet
            return PrefetchStats(
                dispatches=self._dispatches + run,
                predictions=self._predictions + run,
                hits=self._hits + run,
                hit_rate=self._window_hits / len(self._outcomes) if self._outcomes else None,
                window=self.window,
                compiles=self._compiles,
                failures=self._failures,
                dropped=self._dropped,
                prefetched_used=self._used,
            )

    def close(self) -> None:
        """Stop the worker after the compile it is running; drop queued jobs."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()

    def __repr__(self) -> str:
        s = self.stats()
        rate = "n/a" if s.hit_rate is None else f"{s.hit_rate:.0%}"
        return f"<Prefetcher {self.backend_id} hit rate {rate} over {s.window}>"
