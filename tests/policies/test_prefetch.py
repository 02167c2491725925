"""Shape-prediction prefetch on the reference backend, with a slow compiler injected."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from tests import otel_sdk
from tests.helpers import backend_of
from tests.policies.kernels import binop
from vyre_async import DispatchConfig, KernelCompileFailed, VyreBackend
from vyre_async._pending import PendingDispatch
from vyre_async._prefetch import Prefetcher, PrefetchJob
from vyre_async.ir import Program
from vyre_reference import ReferenceExecutor, reference_backend

N = 64
A, B, C, D = (binop(name, N) for name in ("xor", "or", "and", "add"))
INPUTS = [np.arange(N, dtype=np.uint32), np.full(N, 5, np.uint32)]


class SlowBackend(ReferenceExecutor):
    """The reference backend with a compiler the test can slow down or hold.

    Every dispatch runs on the worker pool (no inline runs). Every compile
    records the thread it ran on and sleeps ``compile_s``; a compile of a
    program in ``held`` also sets ``entered`` and waits for ``gate``. Tests that
    assert an ordering drive it with these events, never with sleeps.
    """

    def __init__(self, *, compile_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(inline_ns=0, **kwargs)
        self.compile_s = compile_s
        self.builds: list[tuple[str, str]] = []
        self.fail_on: set[str] = set()
        self.held: set[str] = set()  # op ids whose builds wait for ``gate``
        self.entered = threading.Event()
        self.gate = threading.Event()

    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        self.builds.append((program.op_id, threading.current_thread().name))
        if program.op_id in self.held:
            self.entered.set()
            if not self.gate.wait(30):
                raise AssertionError("the test never opened the compile gate")
        if self.compile_s:
            time.sleep(self.compile_s)
        if program.op_id in self.fail_on:
            raise KernelCompileFailed(f"{program.op_id} rejected", fix="test double")
        return super().build_pipeline(program, config)


@pytest.fixture(autouse=True)
def _recording() -> None:
    """Record prediction outcomes on spans: the in-memory SDK listens.

    Without a recording span the prefetcher puts no attributes on a dispatch's
    record (tests/telemetry/test_no_sdk.py covers that side); these tests read
    the outcomes there.
    """
    otel_sdk.install()


def _attrs(pending: PendingDispatch) -> dict[str, Any]:
    """The attributes the dispatch's span gets from the record (the prediction's too)."""
    attributes = dict(pending.record.attributes or {})
    if pending.record.prefetch is not None:
        hit, rate = pending.record.prefetch
        attributes["vyre.prefetch.hit"], attributes["vyre.prefetch.hit_rate"] = hit, rate
    return attributes


@pytest.mark.anyio
async def test_cyclic_workload_prefetches_every_pipeline_after_warm_up() -> None:
    """Acceptance: cycle A,B,C; hit rate >= 90 % after warm-up, no post-warm-up compile wait.

    The memory cache holds 2 pipelines, so in a cycle of 3 every pipeline has
    been evicted by the time it comes round again: without prefetching, *every*
    dispatch would compile (the control test below). Warm-up is the first 4
    dispatches (A, B, C compile cold; then A again compiles because it was
    evicted, and only then does the history A,B,C,A show the cycle). From then
    on, right after each dispatch is enqueued the prefetcher predicts the next
    program, sees it is not cached and compiles it on its worker thread.

    No timing margins: the test stands for a device busy longer than a compile
    by waiting for the prefetcher (``drain``) before it awaits each result, so
    the next dispatch finds its pipeline built or the prefetcher did not do its
    job. (It used to sleep 150 ms per dispatch against a 50 ms compile, and
    failed once on a loaded machine.)
    """
    backend = backend_of(SlowBackend, pipeline_cache_capacity=2)
    prefetcher = backend.prefetcher
    assert prefetcher is not None
    loop_thread = threading.current_thread().name
    cycle = [A, B, C]
    warm_up, measured = 4, 12
    pendings: list[PendingDispatch] = []
    for k in range(warm_up + measured):
        pending = backend.dispatch(cycle[k % 3], INPUTS)
        assert await anyio.to_thread.run_sync(prefetcher.drain, 30)
        outputs = await pending
        assert outputs[0].shape == (N,)
        pendings.append(pending)
    after = pendings[warm_up:]
    for pending in after:
        assert pending.record.cache_hit is True
        assert pending.timing is not None and pending.timing.compile_s == 0.0
        assert _attrs(pending)["vyre.prefetch.hit"] is True
    stats = prefetcher.stats()
    assert stats.hit_rate is not None and stats.hit_rate >= 0.9
    assert stats.hits == stats.predictions == measured
    # The pipelines were ready *because of* the predictions: the prefetcher built them.
    assert stats.prefetched_used == measured
    # One background build per measured dispatch, plus the one predicted by the
    # last warm-up dispatch (A,B,C,A predicts B); everything before was cold.
    builds = backend.executor.builds
    assert [op for op, _ in builds[:warm_up]] == [A.op_id, B.op_id, C.op_id, A.op_id]
    background = [thread for _, thread in builds[warm_up:]]
    assert len(background) == measured + 1
    assert all(t.startswith("vyre-prefetch") and t != loop_thread for t in background)
    assert _attrs(after[-1])["vyre.prefetch.hit_rate"] == pytest.approx(stats.hit_rate)
    await backend.shutdown()


@pytest.mark.anyio
async def test_without_prefetch_every_cycled_dispatch_waits_for_a_compile() -> None:
    """The control experiment: same cycle and cache, ``prefetch=False``."""
    backend = backend_of(SlowBackend, compile_s=0.01, pipeline_cache_capacity=2, prefetch=False)
    assert backend.prefetcher is None
    pendings = []
    for k in range(9):
        pending = backend.dispatch([A, B, C][k % 3], INPUTS)
        await pending
        pendings.append(pending)
    assert all(p.record.cache_hit is False for p in pendings)
    assert len(backend.executor.builds) == 9
    await backend.shutdown()


# Histories: repeat, cycle, partial cycle, no pattern -------------------------------------


def _fp_program(backend: VyreBackend, program: Program) -> bytes:
    return backend.pipeline_identity(program).digest


def test_repeat_history_hits_without_compiling() -> None:
    backend = reference_backend()
    pendings = [backend.dispatch(A, INPUTS) for _ in range(10)]
    for p in pendings:
        p.result()
    # Nothing is predicted from fewer than two entries: the first two are not scored.
    assert all("vyre.prefetch.hit" not in _attrs(p) for p in pendings[:2])
    assert all(_attrs(p)["vyre.prefetch.hit"] is True for p in pendings[2:])
    prefetcher = backend.prefetcher
    assert prefetcher is not None
    stats = prefetcher.stats()
    assert (stats.dispatches, stats.predictions, stats.hits, stats.compiles) == (10, 8, 8, 0)
    assert stats.hit_rate == 1.0
    predicted = prefetcher.predicted
    assert predicted is not None and predicted[0] == _fp_program(backend, A)


@pytest.mark.parametrize(("capacity", "window"), [(16, 64), (128, 8)])
def test_steady_repeats_count_and_predict_exactly_as_one_by_one_bookkeeping(
    capacity: int, window: int
) -> None:
    """The steady state's short cut (a repeat only counted) loses nothing.

    Beside a backend whose prefetcher never takes the short cut (no kept
    fingerprint), after every dispatch: the same counters, hit rate,
    prediction, history and span attributes, through long runs of one shape
    (beyond the prediction window and the history) broken by others. With a
    history longer than the window, the repeats a steady run skipped show in
    the history (and in later predictions) once another shape comes.
    """
    fast, slow = reference_backend(), reference_backend()
    for backend in (fast, slow):
        backend.prefetcher = backend.front.prefetcher = Prefetcher(
            backend.store, capacity=capacity, window=window
        )
    model = slow.prefetcher
    assert fast.prefetcher is not None and model is not None
    observe = model.observe

    def one_by_one(pipeline: Any, geometry: Any, hit: bool, pending: Any, *rest: Any) -> Any:
        return observe(pipeline, geometry, hit, pending, None, *rest[1:])

    model.observe = one_by_one  # type: ignore[method-assign]
    sequence = [A] * 70 + [B] + [A] * 5 + [B, C] * 3 + [A] * 100 + [C] + [A] * 20 + [B]
    for program in sequence:
        got, want = fast.dispatch(program, INPUTS), slow.dispatch(program, INPUTS)
        got.result(), want.result()
        assert fast.prefetcher.stats() == model.stats()
        assert _attrs(got) == _attrs(want)
        assert fast.prefetcher.predicted == model.predicted
        if not fast.prefetcher._steady_run:  # a steady run's repeats join it when it ends
            assert fast.prefetcher._history.entries == model._history.entries
    stats = fast.prefetcher.stats()
    assert stats.dispatches == len(sequence) and stats.hits > 150  # the runs were steady


def test_cycle_history_predicts_the_next_program() -> None:
    backend = reference_backend()
    prefetcher = backend.prefetcher
    assert prefetcher is not None
    for program in (A, B, C, A, B, C, A):
        backend.dispatch_sync(program, INPUTS)
    predicted = prefetcher.predicted
    assert predicted is not None and predicted[0] == _fp_program(backend, B)
    stats = prefetcher.stats()
    # A,B,C,A predicts B, and every prediction from there on is right.
    assert (stats.predictions, stats.hits) == (3, 3)
    assert stats.compiles == 0  # everything was still cached


def test_partial_cycle_history_predicts_the_missing_program() -> None:
    backend = reference_backend()
    for program in (A, B, C, A, B):
        backend.dispatch_sync(program, INPUTS)
    assert backend.prefetcher is not None
    predicted = backend.prefetcher.predicted
    assert predicted is not None and predicted[0] == _fp_program(backend, C)


def test_no_pattern_history_predicts_nothing_and_scores_nothing() -> None:
    backend = reference_backend()
    pendings = [backend.dispatch(p, INPUTS) for p in (A, B, C, D)]
    for p in pendings:
        p.result()
    assert backend.prefetcher is not None
    assert backend.prefetcher.predicted is None
    stats = backend.prefetcher.stats()
    assert (stats.predictions, stats.hit_rate) == (0, None)
    assert all("vyre.prefetch.hit" not in _attrs(p) for p in pendings)


def test_a_wrong_prediction_is_a_miss() -> None:
    backend = reference_backend()
    for program in (A, B, A, B):
        backend.dispatch_sync(program, INPUTS)
    pending = backend.dispatch(C, INPUTS)  # A was predicted
    pending.result()
    assert _attrs(pending)["vyre.prefetch.hit"] is False
    assert backend.prefetcher is not None
    stats = backend.prefetcher.stats()
    assert (stats.predictions, stats.hits) == (2, 1)  # B after A,B,A was right


def test_launch_geometry_is_part_of_the_shape() -> None:
    backend = reference_backend()
    wide = DispatchConfig(grid_override=(2, 1, 1))
    pendings = [
        backend.dispatch(A, INPUTS),
        backend.dispatch(A, INPUTS, wide),
        backend.dispatch(A, INPUTS),
        backend.dispatch(A, INPUTS, wide),
    ]
    for p in pendings:
        p.result()
    assert backend.prefetcher is not None
    predicted = backend.prefetcher.predicted
    assert predicted is not None and predicted[1] == (1, 1, 1)  # alternation: default grid next


def test_metric_is_recorded_per_scored_prediction() -> None:
    _, reader = otel_sdk.install()

    def counts() -> dict[tuple[str, str], int]:
        found: dict[tuple[str, str], int] = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name in ("vyre.prefetch.hits", "vyre.prefetch.misses"):
                        for point in m.data.data_points:
                            if point.attributes.get("vyre.backend.id") == "reference":
                                key = (m.name, str(point.attributes["vyre.program.op_id"]))
                                found[key] = found.get(key, 0) + int(point.value)
        return found

    before = counts()
    backend = reference_backend()
    for program in (A, A, A, B):
        backend.dispatch_sync(program, INPUTS)
    after = counts()
    added = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    # A, A (no prediction from fewer than two entries), A (predicted: a hit), B (a miss).
    assert added == {("vyre.prefetch.hits", "test.xor"): 1, ("vyre.prefetch.misses", "test.or"): 1}


def test_prefetch_can_be_turned_off() -> None:
    backend = reference_backend(prefetch=False)
    pending = backend.dispatch(A, INPUTS)
    pending.result()
    assert backend.prefetcher is None
    assert "vyre.prefetch.hit" not in _attrs(pending)


def test_pipeline_dispatch_is_recorded_too() -> None:
    backend = reference_backend()
    pipeline = backend.compile(A)
    for _ in range(4):
        pipeline.dispatch(INPUTS).result()
    assert backend.prefetcher is not None
    assert backend.prefetcher.stats().hits == 2


# One compile per identity ----------------------------------------------------------------


def _count_compile_entries(backend: VyreBackend) -> Callable[[int], bool]:
    """Count callers reaching the shared-compile check; return ``wait_for(n, ...)``.

    `PipelineStore.compile_once` peeks at the memory cache under its compile lock
    just before a caller joins (or starts) the running compile, so ``n`` peeks
    mean ``n`` callers are past the cache miss and will share one build.
    """
    peeked = threading.Condition()
    count = 0
    peek = backend.pipelines.peek

    def counting_peek(identity: Any) -> Any:
        nonlocal count
        with peeked:
            count += 1
            peeked.notify_all()
        return peek(identity)

    backend.pipelines.peek = counting_peek  # type: ignore[method-assign]

    def wait_for(n: int) -> bool:
        with peeked:
            return peeked.wait_for(lambda: count >= n, 30)

    return wait_for


def test_concurrent_compiles_of_one_identity_share_one_build() -> None:
    backend = backend_of(SlowBackend)
    backend.executor.held.add(A.op_id)  # the build waits until all four callers are in
    arrived = _count_compile_entries(backend)
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(backend.compile(A))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    assert arrived(4), "four compile() calls never reached the shared compile"
    backend.executor.gate.set()
    for t in threads:
        t.join()
    assert len(backend.executor.builds) == 1
    assert len(results) == 4 and len({id(r) for r in results}) == 1


def test_concurrent_compile_errors_reach_every_waiter() -> None:
    backend = backend_of(SlowBackend)
    backend.executor.held.add(A.op_id)
    backend.executor.fail_on.add(A.op_id)
    arrived = _count_compile_entries(backend)
    errors: list[BaseException] = []

    def compile_a() -> None:
        try:
            backend.compile(A)
        except KernelCompileFailed as exc:
            errors.append(exc)

    threads = [threading.Thread(target=compile_a) for _ in range(3)]
    for t in threads:
        t.start()
    assert arrived(3), "three compile() calls never reached the shared compile"
    backend.executor.gate.set()
    for t in threads:
        t.join()
    assert len(errors) == 3
    assert len(backend.executor.builds) == 1
    backend.executor.fail_on.clear()
    assert backend.compile(A).program == A  # not cached as failed: a later compile retries


@pytest.mark.anyio
async def test_a_dispatch_racing_the_prefetcher_waits_for_its_compile() -> None:
    """The prefetcher is compiling B when B is dispatched: B is built once.

    The background build of B is held at the compile gate until the racing
    dispatch has missed the cache and reached the shared compile, so the two
    overlap on every run.
    """
    backend = backend_of(SlowBackend, pipeline_cache_capacity=2)
    for program in (A, B, C):
        await backend.dispatch(program, INPUTS)
    backend.executor.held.add(B.op_id)
    await backend.dispatch(A, INPUTS)  # compiles A; predicts B (evicted) -> background compile
    assert await anyio.to_thread.run_sync(backend.executor.entered.wait, 30)
    arrived = _count_compile_entries(backend)  # counts from here: the racing dispatch only
    racing: list[PendingDispatch] = []
    thread = threading.Thread(target=lambda: racing.append(backend.dispatch(B, INPUTS)))
    thread.start()  # joins the compile of B that the prefetcher is running
    assert await anyio.to_thread.run_sync(arrived, 1), "the dispatch never reached the compile"
    assert not racing  # still waiting for the held build
    backend.executor.gate.set()
    await anyio.to_thread.run_sync(thread.join, 30)
    (pending,) = racing
    await pending
    b_builds = [thread for op, thread in backend.executor.builds if op == B.op_id]
    assert len(b_builds) == 2  # cold + one prefetch, not 3
    assert b_builds[-1].startswith("vyre-prefetch")
    assert pending.record.cache_hit is False  # it missed and waited for the running build
    await backend.shutdown()


# Background worker -------------------------------------------------------------------------


def test_background_failures_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    backend = backend_of(SlowBackend, compile_s=0.0, pipeline_cache_capacity=2)
    for program in (A, B, C):
        backend.dispatch_sync(program, INPUTS)
    backend.executor.fail_on.add(B.op_id)
    with caplog.at_level(logging.WARNING, logger="vyre_async.prefetch"):
        backend.dispatch_sync(A, INPUTS)  # predicts B; its background build fails
        assert backend.prefetcher is not None
        assert backend.prefetcher.drain(5)
    assert backend.prefetcher.stats().failures == 1
    assert any("background compile" in r.getMessage() for r in caplog.records)
    backend.executor.fail_on.clear()
    assert backend.dispatch_sync(B, INPUTS)[0].shape == (N,)  # compiles it itself


def test_queue_is_bounded_and_deduplicated() -> None:
    backend = backend_of(SlowBackend)
    backend.executor.held.add(A.op_id)  # A's build holds the worker until every job was offered
    prefetcher = backend.prefetcher
    assert prefetcher is not None
    prefetcher.max_queue = 2
    jobs = [
        PrefetchJob(program=p, config=DispatchConfig(), identity=backend.pipeline_identity(p))
        for p in (A, B, C)
    ]
    prefetcher.schedule(jobs[0])
    prefetcher.schedule(jobs[0])  # in flight already: ignored
    prefetcher.schedule(jobs[1])
    prefetcher.schedule(jobs[2])  # queue full: dropped
    backend.executor.gate.set()
    assert prefetcher.drain(5)
    stats = prefetcher.stats()
    assert (stats.compiles, stats.dropped) == (2, 1)
    assert sorted(op for op, _ in backend.executor.builds) == sorted([A.op_id, B.op_id])


def test_worker_thread_exits_when_idle_and_on_close() -> None:
    backend = backend_of(SlowBackend, compile_s=0.0)
    prefetcher = backend.prefetcher
    assert prefetcher is not None
    prefetcher.idle_s = 0.05
    job = PrefetchJob(program=A, config=DispatchConfig(), identity=backend.pipeline_identity(A))
    prefetcher.schedule(job)
    assert prefetcher.drain(5)
    deadline = time.monotonic() + 5
    while prefetcher._worker is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetcher._worker is None
    prefetcher.close()
    prefetcher.schedule(job)  # closed: nothing starts
    assert prefetcher._worker is None
    assert "hit rate" in repr(prefetcher)


@pytest.mark.anyio
async def test_hit_rate_is_a_span_attribute_on_every_scored_dispatch() -> None:
    backend = reference_backend()
    pendings = []
    for program in (A, B) * 3:
        pending = backend.dispatch(program, INPUTS)
        await pending
        pendings.append(pending)
    rates = [_attrs(p).get("vyre.prefetch.hit_rate") for p in pendings]
    assert rates == [None, None, None, 1.0, 1.0, 1.0]  # A,B,A predicts B: the first score
