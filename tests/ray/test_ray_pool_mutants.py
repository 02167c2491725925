"""The ``ray`` pool's start, refusals and close, and a worker's own set-up, without a cluster.

Written for mutation testing (issue 28), with the fake ``ray`` of
``fake_ray.py`` (its actors hold real `vyre_ray.worker.Worker`s
in this process). What is checked is what a user sees: the errors a pool is
refused or a dispatch fails with, their ``context``; which actor options Ray is
given; that closing neither waits for a submission stuck in Ray nor sends
anything once it gave up, nor calls Ray after ``ray.shutdown()``; the debug log
lines a failing Ray call at start or close leaves; that workers whose workgroup
limits do not pair up axis by axis are refused; and what a worker sets up when
it starts: Ray's log level, its backend, its own tracing.

Why: these paths were left untested by the other files (mutmut's survivors of
``_closed_error``, ``cluster_target``, ``_connect``, ``_intersect``,
``RayExecutor.__init__``, ``close``, ``_stop_workers`` and
``Worker.__init__``), and a real cluster costs seconds per test.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

import ray.exceptions as rex
from opentelemetry import trace as otel_trace

import vyre_async._registry as registry
import vyre_ray.backend as rb
from tests.ray.fake_ray import (  # the fake ray and its fixtures
    ACTOR_OPTIONS,
    CLOSED,
    WAIT_S,
    XOR,
    A,
    FakeRay,
    FakeRef,
    _ray_log_level,
    close,
    closing,
    fake,
    xor_of,
)
from vyre_async import BackendClosed, UnsupportedFeature, acquire_backend
from vyre_async._backend import VyreBackend
from vyre_async._capabilities import BackendCapabilities
from vyre_ray.backend import create_backend
from vyre_ray.worker import Worker

__all__ = ["_ray_log_level", "closing", "fake"]  # (fixtures: pytest finds them here)

#: How long a Ray call the test holds may stay held (only a wrong close waits that long).
HELD_S = 5.0


def ray_debug_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, BaseException | None]]:
    """The pool's debug lines: each message with the exception it shows (``exc_info``)."""
    return [
        (record.getMessage(), record.exc_info[1] if record.exc_info else None)
        for record in caplog.records
        if record.name == "vyre_async.ray" and record.levelno == logging.DEBUG
    ]


def submit_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("vyre-ray-submit")]


# Refusals ---------------------------------------------------------------------------------


def test_without_a_cluster_named_the_pool_is_refused_naming_backend_and_cause(
    fake: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VYRE_RAY_LOCAL_WORKERS")  # (and RAY_ADDRESS is unset)
    with pytest.raises(UnsupportedFeature) as info:
        create_backend()
    assert str(info.value) == (
        "the 'ray' backend needs a Ray cluster: none is named and none was asked to start\n"
        "Fix: set RAY_ADDRESS to a running cluster (ray start --head prints it), or set "
        "VYRE_RAY_LOCAL_WORKERS=2 to start a local one, or use vyre_ray.local_backend(workers=2)"
    )
    assert info.value.context == {"backend_id": "ray", "cause": "no-cluster"}
    assert fake.inits == [] and fake.actors == []


def test_workers_that_cannot_start_and_cannot_be_killed_leave_a_debug_line_each(
    fake: FakeRay, caplog: pytest.LogCaptureFixture
) -> None:
    fake.kill_error = rex.ActorDiedError()  # (gone already)
    with (
        caplog.at_level(logging.DEBUG, logger="vyre_async.ray"),
        pytest.raises(UnsupportedFeature, match="workers could not start"),
    ):
        create_backend(inner="no-such-backend")  # each worker's constructor fails
    assert (
        ray_debug_lines(caplog)
        == [("killing a worker that did not start failed", fake.kill_error)] * 2
    )


def test_a_worker_reporting_another_number_of_workgroup_axes_is_refused(
    fake: FakeRay,
) -> None:
    """The pool's limits are taken axis by axis: axes that do not pair up are an error,
    never a silently shorter ``max_workgroup_size``."""
    three = BackendCapabilities(max_workgroup_size=(64, 8, 2))
    two = BackendCapabilities(max_workgroup_size=(32, 4))  # type: ignore[arg-type]
    for capabilities in ([three, two], [two, three]):
        fake.capabilities = capabilities
        with pytest.raises(ValueError, match=r"^zip\(\) argument 2 is (shorter|longer) than"):
            create_backend()


@pytest.mark.parametrize(
    ("limits", "pooled"),
    [
        ([None, None], None),  # nobody reports one: none checked on the pool
        ([(2**31 - 1, 65535, 65535), None], (2**31 - 1, 65535, 65535)),
        ([None, (65535, 65535, 65535)], (65535, 65535, 65535)),
        ([(100, 7, 9), (50, 8, 3)], (50, 7, 3)),  # axis by axis, the smaller
    ],
)
def test_the_pools_grid_limit_is_its_workers_smallest_per_axis(
    fake: FakeRay,
    closing: Callable[[VyreBackend], VyreBackend],
    limits: list[tuple[int, int, int] | None],
    pooled: tuple[int, int, int] | None,
) -> None:
    fake.capabilities = [BackendCapabilities(max_grid_size=limit) for limit in limits]
    assert closing(create_backend()).capabilities().max_grid_size == pooled


# Starting ---------------------------------------------------------------------------------


def test_workers_passed_on_a_gpu_cluster_ask_for_no_gpu(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker per GPU (and a GPU each) only when the cluster sized the pool."""
    monkeypatch.setenv("RAY_ADDRESS", "ray://h:1")
    fake.resources = {"CPU": 8.0, "GPU": 2.0}
    closing(create_backend(workers=3))
    assert len(fake.actors) == 3
    assert fake.options == [{**ACTOR_OPTIONS, "num_gpus": 0}]


# Closing ----------------------------------------------------------------------------------


def test_closing_an_idle_pool_does_not_wait_for_close_timeout(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    backend.close_timeout = HELD_S
    start = time.monotonic()
    close(backend)
    assert time.monotonic() - start < HELD_S - 1.0  # (it takes milliseconds)
    assert fake.killed == [(fake.actors[0], {"no_restart": True})]


def test_a_dispatch_still_running_at_close_fails_as_closed_and_a_failed_cancel_is_logged(
    fake: FakeRay,
    closing: Callable[[VyreBackend], VyreBackend],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = closing(create_backend(workers=1))
    fake.actors[0].hold()
    pending = backend.dispatch(XOR, [A, A])
    refused = RuntimeError("the task's worker is gone")

    def cancel(ref: FakeRef, **kwargs: Any) -> None:  # Ray cannot cancel it
        fake.cancelled.append((ref, kwargs))
        raise refused

    monkeypatch.setattr(fake, "cancel", cancel)
    backend.close_timeout = 0.2
    with caplog.at_level(logging.DEBUG, logger="vyre_async.ray"):
        close(backend)
    with pytest.raises(BackendClosed) as info:
        pending.result(timeout=WAIT_S)
    assert str(info.value) == CLOSED
    assert info.value.context == {"backend_id": "ray"}
    assert fake.cancelled == [(fake.sent[-1].ref, {"force": False})]
    assert ray_debug_lines(caplog) == [("cancelling a Ray task at close failed", refused)]
    assert fake.killed == [(fake.actors[0], {"no_restart": True})]


def test_workers_that_neither_flush_nor_die_at_close_leave_debug_lines_and_all_are_killed(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], caplog: pytest.LogCaptureFixture
) -> None:
    backend = closing(create_backend())
    fake.get_error = rex.GetTimeoutError("Get timed out: some object(s) not ready.")
    fake.kill_error = rex.ActorDiedError()
    with caplog.at_level(logging.DEBUG, logger="vyre_async.ray"):
        close(backend)
    assert fake.gets[-1] == 2.0
    assert ray_debug_lines(caplog) == [
        ("the workers did not flush their spans in time", fake.get_error),
        ("killing a Ray worker failed", fake.kill_error),
        ("killing a Ray worker failed", fake.kill_error),
    ]
    assert fake.killed == [(actor, {"no_restart": True}) for actor in fake.actors]


def test_closing_neither_waits_for_submissions_stuck_in_ray_nor_sends_those_queued(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rb, "OFF_THREAD_BYTES", 0)  # every call goes from the submission thread
    backend = closing(create_backend(workers=1))
    actor = fake.actors[0]
    sending = threading.Semaphore(0)
    stuck = threading.Event()
    ended: list[bool] = []  # per stuck call: whether the test let it go on
    run = actor.run

    class Stuck:  # ``run.remote`` stuck in Ray (a slow upload) until the test lets it go on
        def remote(self, *args: Any) -> FakeRef:
            sending.release()
            ended.append(stuck.wait(HELD_S))
            return run.remote(*args)

    monkeypatch.setattr(actor, "run", Stuck())
    calls = [backend.dispatch(XOR, [A, A + k]) for k in range(3)]
    for _ in range(2):  # both submission threads are stuck; the third call waits its turn
        assert sending.acquire(timeout=WAIT_S)
    backend.close_timeout = 0.2
    close(backend)
    assert ended == []  # closed while both were still stuck
    stuck.set()
    for thread in submit_threads():
        thread.join(WAIT_S)
    assert ended == [True, True]
    assert len(fake.sent) == 2  # the queued call was never sent
    for pending in calls:
        with pytest.raises(BackendClosed) as info:
            pending.result(timeout=WAIT_S)
        assert str(info.value) == CLOSED


def test_a_call_refused_as_unknown_after_close_gave_up_is_not_sent_again(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = set(submit_threads())  # (other tests' pools may still be ending theirs)
    backend = closing(create_backend(workers=1))
    actor = fake.actors[0]
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    actor.restart()  # the worker lost the program: the next call is refused as unknown
    actor.hold()
    pending = backend.dispatch(XOR, [A, A + 1])
    settled = threading.Event()  # (after the pool's own callback: added later)
    fake.sent[-1].ref.future().add_done_callback(lambda _: settled.set())
    monkeypatch.setattr(fake, "cancel", lambda ref, **kwargs: None)  # it does not reach the call
    get = fake.get

    def flushing(refs: list[FakeRef], timeout: float | None = None) -> list[Any]:
        if timeout == 2.0:  # the close's flush: meanwhile the held call is refused
            actor.release()
            assert settled.wait(WAIT_S)
        return get(refs, timeout)

    monkeypatch.setattr(fake, "get", flushing)
    backend.close_timeout = 0.2
    close(backend)
    assert settled.is_set()
    with pytest.raises(BackendClosed) as info:
        pending.result(timeout=WAIT_S)
    assert str(info.value) == CLOSED
    started = [t for t in submit_threads() if t not in earlier]
    assert started == []  # no submission thread was started for a resend
    assert [s.wire for s in fake.sent] == [True, False]


def test_closing_after_ray_shutdown_makes_no_ray_call_before_the_watchdog_looked(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rb, "_watch_runtime", lambda backend: None)  # its next look not due yet
    backend = closing(create_backend(workers=1))
    fake.actors[0].hold()
    pending = backend.dispatch(XOR, [A, A])
    fake.initialized = False  # ray.shutdown() elsewhere in this process
    backend.close_timeout = 0.2
    close(backend)
    with pytest.raises(BackendClosed):
        pending.result(timeout=WAIT_S)
    # (a Ray call now would start a fresh local cluster)
    assert fake.cancelled == [] and fake.killed == [] and fake.flushes == 0


# A worker's own set-up ----------------------------------------------------------------------


def test_a_worker_quiets_rays_own_log_and_no_other() -> None:
    root = logging.getLogger()
    level = root.level
    logging.getLogger("ray").setLevel(logging.NOTSET)
    try:
        Worker("reference", 0)
        assert logging.getLogger("ray").level == logging.ERROR
        assert root.level == level
    finally:
        root.setLevel(level)


def test_a_worker_without_inner_falls_back_to_the_reference_backend_on_a_cpu_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    references = [r for r in registry.registered_backends() if r.is_reference]
    monkeypatch.setattr(registry, "registered_backends", lambda: references)  # no GPU backend
    assert Worker(None, 0).backend is acquire_backend("reference")


def test_a_traced_worker_exports_its_spans_as_its_own_service_when_flushed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    installed: list[Any] = []  # (the process's global provider stays the session's)
    monkeypatch.setattr(otel_trace, "set_tracer_provider", installed.append)
    path = tmp_path / "spans.jsonl"
    worker = Worker("reference", 3, trace=f"file:{path}")
    (provider,) = installed
    try:
        provider.get_tracer("test").start_span("work").end()
        assert worker.flush_telemetry() is True
        (line,) = path.read_text(encoding="utf-8").splitlines()
        (resource_spans,) = json.loads(line)["resourceSpans"]
        attributes = {
            a["key"]: a["value"].get("stringValue")
            for a in resource_spans["resource"]["attributes"]
        }
        assert attributes["service.name"] == "vyre-ray-worker-3"
        (scope,) = resource_spans["scopeSpans"]
        assert [span["name"] for span in scope["spans"]] == ["work"]
    finally:
        provider.shutdown()
