"""The ``ray`` backend's driver side without a cluster, written for mutation testing.

`RayExecutor` takes Ray from ``vyre_ray.backend._import_ray``; here that returns
a `FakeRay`, whose actors hold real `vyre_ray.worker.Worker`s in this process.
Each actor serves its calls on an event loop thread of its own, as an async Ray
actor does. Arguments, results and a worker's exceptions cross a pickle round
trip; results arrive read-only, as views of Ray's object store do; a worker's
exception arrives wrapped as Ray wraps it. Cancelling a call ends it with
``TaskCancelledError`` before ``ray.cancel`` returns (the quickest Ray can be),
and killing an actor ends its calls with ``ActorDiedError``. A test can hold an
actor's calls, restart its worker, have Ray refuse a call, or stop the threads
that send calls at a gate. So connecting, starting the pool, placement, sending
and sending again, results and errors, deadlines, flushing, closing, the
runtime watchdog and the trace context a call carries run in a few seconds, and
no Ray process starts. The workers themselves (`Worker`) are driven directly
too: the programs they keep, their counts, their spans' parents.

Why: every test that builds a real pool (``test_ray_backend.py``, the contract
suite on ``ray``) starts a local cluster, about 9 s per mutant under mutmut.
``scripts/mutation.py`` runs these tests on every mutant of ``vyre_ray``, and
the cluster's tests afterwards on the mutants left open (``--check``). What a
fake cannot show is theirs: Ray's own serialisation (its read-only views of
large outputs), restarts and retries, the spans a worker exports from its own
process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pickle
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

import ray.exceptions as rex
from opentelemetry import propagate, trace

import ray as real_ray
import vyre_async.abc
import vyre_ray
import vyre_ray.backend as rb
import vyre_ray.worker
from tests import otel_sdk
from tests.ray.fake_ray import (  # the fake ray and its fixtures
    ACTOR_OPTIONS,
    CLOSED,
    GONE,
    NODE,
    OWN_FIX,
    QUIET,
    WAIT_S,
    WORKERS_FIX,
    XOR,
    A,
    Failing,
    FakeRay,
    _ray_log_level,
    _RuntimeContext,
    close,
    closing,
    fake,
    holder_takes,
    xor_of,
)
from vyre_async import (
    BackendClosed,
    BackendError,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchConfig,
    DispatchFailed,
    DispatchTimeout,
    InvalidProgram,
    PendingDispatch,
    UnsupportedFeature,
    __version__,
    acquire_backend,
    telemetry,
)
from vyre_async._backend import VyreBackend
from vyre_async._capabilities import BackendCapabilities
from vyre_async._pending import wait_for_callbacks
from vyre_async._registry import BackendProbe, probe_backend
from vyre_async.programs import elementwise_xor
from vyre_ray.backend import (
    AFFINITY_SLACK,
    OFF_THREAD_BYTES,
    START_TIMEOUT_S,
    WorkerInfo,
    create_backend,
    local_backend,
)
from vyre_ray.errors import UnknownProgram
from vyre_ray.registration import REGISTRATION
from vyre_ray.worker import Worker

__all__ = ["_ray_log_level", "closing", "fake"]  # (fixtures: pytest finds them here)


# Connecting and starting the pool --------------------------------------------------------------


def test_a_local_cluster_is_started_quiet_and_the_pool_has_its_size(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(inner="reference"))
    assert fake.inits == [(None, {**QUIET, "num_cpus": 2})]
    # (the cluster says 3 CPUs: a pool on a cluster this process started has its size)
    assert [a.created_with for a in fake.actors] == [("reference", 0, None), ("reference", 1, None)]
    assert fake.options == [ACTOR_OPTIONS]
    assert fake.gets == [START_TIMEOUT_S]
    reference = acquire_backend("reference")
    assert backend.device_fingerprint() == (
        f"ray pool of 2 (reference): {reference.device_fingerprint()}"
    )
    assert backend.compiler_fingerprint() == (
        f"vyre_ray {__version__}: wire bytes, compiled on each worker"
    )
    assert backend.capabilities() == dataclasses.replace(
        reference.capabilities(), distributed=True, ordered_resident_buffers=False
    )


def test_a_second_pool_shares_the_connection_and_the_local_size(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    closing(create_backend())
    closing(create_backend())
    assert len(fake.inits) == 1 and len(fake.actors) == 4


def test_a_connection_made_before_is_used_and_the_pool_sized_by_the_cluster(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    fake.initialized = True  # the application called ray.init() itself
    closing(create_backend())
    # (VYRE_RAY_LOCAL_WORKERS=2 sizes a pool only on a cluster this process started)
    assert fake.inits == [] and len(fake.actors) == 3


@pytest.mark.parametrize(
    ("resources", "size", "gpus"),
    [({"CPU": 3.0}, 3, 0), ({"CPU": 8.0, "GPU": 2.0}, 2, 1), ({"CPU": 0.0}, 1, 0), ({}, 1, 0)],
    ids=["3 CPUs", "8 CPUs 2 GPUs", "0 CPUs", "none"],
)
def test_a_named_cluster_is_joined_with_a_worker_per_gpu_else_per_cpu(
    fake: FakeRay,
    closing: Callable[[VyreBackend], VyreBackend],
    monkeypatch: pytest.MonkeyPatch,
    resources: dict[str, float],
    size: int,
    gpus: int,
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://h:1")  # (wins over VYRE_RAY_LOCAL_WORKERS=2)
    fake.resources = resources
    closing(create_backend())
    assert fake.inits == [("ray://h:1", QUIET)]
    assert len(fake.actors) == size
    assert fake.options == [{**ACTOR_OPTIONS, "num_gpus": gpus}]


def test_an_address_passed_wins_over_RAY_ADDRESS_and_workers_passed_size_the_pool(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://env:1")
    closing(create_backend(address="ray://arg:2", workers=1))
    assert fake.inits == [("ray://arg:2", QUIET)] and len(fake.actors) == 1


@pytest.mark.parametrize(
    ("options", "created", "actor_options"),
    [
        (
            {
                "inner": "reference",
                "num_gpus_per_worker": 0.5,
                "trace": "otlp",
                "worker_env": {"OTEL_X": "1"},
            },
            ("reference", 0, "otlp"),
            {"num_gpus": 0.5, "runtime_env": {"env_vars": {"OTEL_X": "1"}}},
        ),
        ({"num_gpus_per_worker": 2, "worker_env": {}}, (None, 0, None), {"num_gpus": 2}),
        ({"num_gpus_per_worker": 0}, (None, 0, None), {"num_gpus": 0}),
    ],
    ids=["half a GPU, env, trace", "2 GPUs, empty env", "no GPU"],
)
def test_worker_options_reach_ray(
    fake: FakeRay,
    closing: Callable[[VyreBackend], VyreBackend],
    options: dict[str, Any],
    created: tuple[str | None, int, str | None],
    actor_options: dict[str, Any],
) -> None:
    closing(create_backend(workers=1, **options))
    assert fake.inits == [(None, {**QUIET, "num_cpus": 1})]
    assert [a.created_with for a in fake.actors] == [created]
    assert fake.options == [{**ACTOR_OPTIONS, **actor_options}]


def test_local_starts_a_pool_of_reference_workers(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    closing(local_backend())
    closing(local_backend(workers=1, inner=None, num_gpus_per_worker=0.5))
    assert fake.inits == [(None, {**QUIET, "num_cpus": 2})]
    assert [a.created_with for a in fake.actors] == [
        ("reference", 0, None),
        ("reference", 1, None),
        (None, 0, None),
    ]
    assert fake.options == [ACTOR_OPTIONS, {**ACTOR_OPTIONS, "num_gpus": 0.5}]


_GPUS = (
    "num_gpus_per_worker must be a number >= 0, got {}\n"
    "Fix: pass num_gpus_per_worker=1 for one GPU per worker, or leave it out"
)
_ENV = (
    "worker_env must map str to str, got {}\n"
    'Fix: pass strings, e.g. worker_env={{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://..."}}'
)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param(
            {"workers": 0},
            "workers must be an int >= 1, got 0\nFix: pass e.g. workers=2",
            id="workers 0",
        ),
        pytest.param(
            {"workers": True},
            "workers must be an int >= 1, got True\nFix: pass e.g. workers=2",
            id="workers True",
        ),
        pytest.param({"num_gpus_per_worker": True}, _GPUS.format("True"), id="GPUs True"),
        pytest.param({"num_gpus_per_worker": math.nan}, _GPUS.format("nan"), id="GPUs nan"),
        pytest.param({"num_gpus_per_worker": -0.5}, _GPUS.format("-0.5"), id="GPUs -0.5"),
        pytest.param({"num_gpus_per_worker": "1"}, _GPUS.format("'1'"), id="GPUs '1'"),
        pytest.param({"worker_env": {"A": 1}}, _ENV.format("{'A': 1}"), id="env value 1"),
        pytest.param({"worker_env": {1: "a"}}, _ENV.format("{1: 'a'}"), id="env key 1"),
        pytest.param({"worker_env": ["A=1"]}, _ENV.format("['A=1']"), id="env list"),
    ],
)
def test_pool_options_ray_would_refuse_are_refused_before_anything_starts(
    fake: FakeRay, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidProgram) as info:
        create_backend(**options)
    assert str(info.value) == message
    assert fake.inits == [] and fake.actors == []


@pytest.mark.parametrize(
    "said",
    ["refused", "refused\nFix: start it\n(see the GCS log)"],
    ids=["one line", "a Fix line of its own inside"],
)
def test_an_unreachable_cluster_is_refused_with_its_own_fix(
    fake: FakeRay, monkeypatch: pytest.MonkeyPatch, said: str
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://nowhere:1")
    fake.init_error = ConnectionError(said)
    with pytest.raises(UnsupportedFeature) as info:
        create_backend()
    # (what the cluster said is kept whole; only the Fix line translate() added is replaced)
    assert str(info.value) == (
        "the 'ray' backend cannot reach its cluster: connecting to the Ray cluster at "
        f"'ray://nowhere:1' failed: ConnectionError: {said}\n"
        "Fix: check RAY_ADDRESS and that the cluster is up (ray status)"
    )
    assert info.value.context == {"backend_id": "ray", "cause": "unreachable"}
    assert info.value.__cause__ is fake.init_error
    assert fake.actors == []


def test_the_backends_own_fix_is_last_whatever_the_cluster_said(
    fake: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "ray://nowhere:1")
    fake.init_error = ConnectionError("refused\nFix:start the head node")
    with pytest.raises(UnsupportedFeature) as info:
        create_backend()
    # (the cluster's words keep their place, less their last line: the chained
    # exception has them whole)
    assert str(info.value) == (
        "the 'ray' backend cannot reach its cluster: connecting to the Ray cluster at "
        "'ray://nowhere:1' failed: ConnectionError: refused\n"
        "Fix: check RAY_ADDRESS and that the cluster is up (ray status)"
    )


@pytest.mark.parametrize("kill_fails", [False, True])
def test_workers_that_cannot_start_are_killed_and_refused_with_their_own_fix(
    fake: FakeRay, kill_fails: bool
) -> None:
    if kill_fails:  # (a worker gone already: the error that matters is the start's)
        fake.kill_error = rex.ActorDiedError()
    with pytest.raises(UnsupportedFeature) as info:
        create_backend(inner="no-such-backend")  # each worker's constructor fails
    assert str(info.value) == (
        "the 'ray' backend's workers could not start: a Ray worker died or did not answer while "
        "starting the pool's workers: ActorDiedError" + WORKERS_FIX
    )
    assert info.value.context == {"backend_id": "ray", "cause": "workers"}
    assert isinstance(info.value.__cause__, rex.ActorDiedError)
    assert fake.killed == [(actor, {}) for actor in fake.actors] and len(fake.actors) == 2


def test_workers_whose_backend_refuses_to_start_are_refused_with_the_workers_fix(
    fake: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Worker) -> dict[str, Any]:
        raise UnsupportedFeature("the worker's cupy backend found no GPU", fix="give it one")

    monkeypatch.setattr(Worker, "describe", refuse)
    with pytest.raises(UnsupportedFeature) as info:
        create_backend()
    # (the worker's own error knows best what to do; the cluster's resources are fine)
    assert str(info.value) == (
        "the 'ray' backend's workers could not start: the worker's cupy backend found no GPU\n"
        "Fix: give it one"
    )
    assert info.value.context == {"backend_id": "ray", "cause": "workers"}
    assert fake.killed == [(actor, {}) for actor in fake.actors] and len(fake.actors) == 2


def test_a_workers_refusal_that_is_all_fix_line_is_kept_whole(
    fake: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: Worker) -> dict[str, Any]:
        raise UnsupportedFeature("Fix: give the worker a GPU")

    monkeypatch.setattr(Worker, "describe", refuse)
    with pytest.raises(UnsupportedFeature) as info:
        create_backend()
    # (no words but a Fix line: they are what happened, and the pool's own Fix follows)
    assert str(info.value) == (
        "the 'ray' backend's workers could not start: Fix: give the worker a GPU" + WORKERS_FIX
    )


# What the pool reports ----------------------------------------------------------------------


def test_the_pool_is_as_capable_as_its_weakest_worker(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    a = BackendCapabilities(
        f16=True, bf16=True, max_workgroup_size=(256, 64, 8), max_workgroup_lanes=256,
        max_storage_buffer_bytes=10, max_workgroup_memory_bytes=7, subgroup_size=32,
        device_name="b", ordered_resident_buffers=True,
    )  # fmt: skip
    b = BackendCapabilities(
        f16=True, max_workgroup_size=(128, 128, 4), max_workgroup_lanes=512,
        max_storage_buffer_bytes=20, max_workgroup_memory_bytes=3, subgroup_size=64,
        device_name="a",
    )  # fmt: skip
    fake.capabilities = [a, b]
    assert closing(create_backend()).capabilities() == BackendCapabilities(
        f16=True, distributed=True, max_workgroup_size=(128, 64, 4), max_workgroup_lanes=256,
        max_storage_buffer_bytes=10, max_workgroup_memory_bytes=3, subgroup_size=None,
        device_name="a, b",
    )  # fmt: skip
    fake.capabilities = [a, a]
    assert closing(create_backend()).capabilities() == dataclasses.replace(
        a, distributed=True, ordered_resident_buffers=False
    )


def test_a_pool_of_unlike_workers_names_each_backend_and_device_once(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VYRE_RAY_LOCAL_WORKERS", "3")
    fake.devices = [("reference", "cpu b"), ("cupy", "gpu a"), ("reference", "cpu b")]
    assert closing(create_backend()).device_fingerprint() == (
        "ray pool of 3 (cupy, reference): cpu b; gpu a"
    )


def test_the_workers_are_described_as_they_report(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    xor_of(backend.dispatch(XOR, [A, A + 1]), A, A + 1)
    infos = backend.executor.workers()
    assert fake.gets[-1] == 30
    device = acquire_backend("reference").device_fingerprint()
    assert infos == [
        WorkerInfo(
            index=i,
            node=NODE,
            pid=os.getpid(),
            inner="reference",
            device=device,
            cached_programs=info.cached_programs,
            in_flight=0,
        )
        for i, info in enumerate(infos)
    ]
    assert sorted(info.cached_programs for info in infos) == [0, 1]  # one worker ran XOR


def test_workers_that_do_not_answer_in_time_are_device_lost(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    fake.get_error = rex.GetTimeoutError("Get timed out: some object(s) not ready.")
    with pytest.raises(DeviceLost) as info:
        backend.executor.workers()
    assert str(info.value) == (
        "a Ray worker died or did not answer while describing the workers: GetTimeoutError\n"
        "Fix: retry: the pool replaces dead workers; check the cluster (ray status) and the "
        "workers' logs (ray logs) for why"
    )
    assert info.value.__cause__ is fake.get_error


# Placement and sending ----------------------------------------------------------------------


def test_a_call_goes_to_the_worker_holding_its_program_unless_it_is_much_busier(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    holder = fake.sent[0].worker
    other = 1 - holder
    fake.actors[holder].hold()
    held = [backend.dispatch(XOR, [A, A + k]) for k in range(AFFINITY_SLACK + 2)]
    # The holder is chosen while at most AFFINITY_SLACK calls busier than the idle worker;
    # the other worker is sent the program with its first call.
    to_holder = [(holder, False)] * (AFFINITY_SLACK + 1)
    assert [(s.worker, s.wire) for s in fake.sent[1:]] == [*to_holder, (other, True)]
    xor_of(held[-1], A, A + AFFINITY_SLACK + 1)  # (the other worker is not held)
    # Both hold it now: the less busy one gets it, without the bytes.
    xor_of(backend.dispatch(XOR, [A, A + 99]), A, A + 99)
    assert (fake.sent[-1].worker, fake.sent[-1].wire) == (other, False)
    fake.actors[holder].release()
    for k, pending in enumerate(held[:-1]):
        xor_of(pending, A, A + k)


def test_calls_spread_over_idle_workers_with_the_program_until_one_of_it_finished(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    for start in (0, 4):  # the second time, both workers hold it and nothing is in flight
        for actor in fake.actors:
            actor.hold()
        calls = [backend.dispatch(XOR, [A, A + k]) for k in range(4)]
        sent = fake.sent[start:]
        assert Counter(s.worker for s in sent) == {0: 2, 1: 2}
        # (a worker that received the bytes may not have decoded them yet: every call of a
        # program carries them until one of its calls finished on that worker)
        assert [s.wire for s in sent] == [start == 0] * 4
        for actor in fake.actors:
            actor.release()
        for k, pending in enumerate(calls):
            xor_of(pending, A, A + k)


def test_the_pool_forgets_the_least_recently_used_program_beyond_PROGRAMS_KEPT(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rb, "PROGRAMS_KEPT", 2)  # (the pool's count: the workers keep 256 here)
    backend = closing(create_backend(workers=1))
    for n in (16, 17, 16, 18, 16, 17):
        a = np.arange(n, dtype=np.uint32)
        xor_of(backend.dispatch(elementwise_xor(n), [a, a + 3]), a, a + 3)
    # 18 makes three: the least recently used, 17, is forgotten and sent again.
    assert [s.wire for s in fake.sent] == [True, True, False, True, False, True]


def test_a_restarted_worker_is_sent_the_program_again(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    xor_of(backend.dispatch(XOR, [A, A + 1]), A, A + 1)
    holder = fake.sent[0].worker
    fake.actors[holder].restart()  # (its process died: Ray started it again, empty)
    xor_of(backend.dispatch(XOR, [A, A + 2]), A, A + 2)
    # Sent without the bytes, refused as unknown, and sent again with them from the
    # submission thread (not Ray's callback thread).
    assert [(s.worker, s.wire) for s in fake.sent] == [
        (holder, True),
        (holder, False),
        (holder, True),
    ]
    assert fake.sent[-1].thread.startswith("vyre-ray-submit")
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


def test_calls_a_restarted_worker_did_not_know_are_each_sent_again(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    holder = fake.actors[fake.sent[0].worker]
    holder.restart()
    holder.hold()
    calls = [backend.dispatch(XOR, [A, A + k]) for k in (1, 2)]
    holder.release()  # both are refused as unknown before either is sent again
    for k, pending in zip((1, 2), calls, strict=True):
        xor_of(pending, A, A + k)
    assert [(s.worker, s.wire) for s in fake.sent] == [
        (holder.index, True),
        (holder.index, False),
        (holder.index, False),
        (holder.index, True),
        (holder.index, True),
    ]
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


def test_a_worker_found_without_the_program_is_sent_it_with_the_next_call(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    actor = fake.actors[0]
    actor.restart()
    actor.hold()
    lost = backend.dispatch(XOR, [A, A + 1])  # sent without the bytes, refused as unknown
    actor.refuse = TypeError("cannot pickle 'generator' object")  # ... and sending it again fails
    actor.release()
    with pytest.raises(DispatchFailed, match="sending the dispatch to a worker failed"):
        lost.result(timeout=WAIT_S)
    actor.refuse = None
    xor_of(backend.dispatch(XOR, [A, A + 2]), A, A + 2)
    # (not counted as held there any more: the next call carries the bytes, no round trip)
    assert [s.wire for s in fake.sent] == [True, False, True]


def test_a_call_sent_again_carries_its_inputs_as_they_were_at_dispatch(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    actor = fake.actors[0]
    actor.restart()
    actor.hold()
    a = A.copy()
    pending = backend.dispatch(XOR, [a, A + 1])
    a[:] = 0  # the caller may reuse its arrays once dispatch() returned
    actor.release()  # refused as unknown: sent again, from the pool's own copy
    xor_of(pending, A, A + 1)
    assert [s.wire for s in fake.sent] == [True, False, True]


def test_a_call_to_send_again_without_a_thread_to_send_it_fails_and_frees_its_worker(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoThreads:  # the submission thread cannot start (the process is out of threads)
        def __init__(self, **options: Any) -> None:
            pass

        def submit(self, *args: Any) -> None:
            raise RuntimeError("can't start new thread")

        def shutdown(self, **options: Any) -> None:
            pass

    executors = types.SimpleNamespace(ThreadPoolExecutor=NoThreads)
    monkeypatch.setattr(rb, "concurrent", types.SimpleNamespace(futures=executors))
    backend = closing(create_backend())
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    holder = fake.actors[fake.sent[0].worker]
    holder.restart()
    holder.hold()
    pending = backend.dispatch(XOR, [A, A])
    holder.release()  # refused as unknown: it cannot be sent again
    with pytest.raises(BackendError):
        pending.result(timeout=WAIT_S)
    assert [s.wire for s in fake.sent] == [True, False]
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


def test_inputs_above_OFF_THREAD_BYTES_are_sent_from_the_submission_thread(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    n = OFF_THREAD_BYTES // 8  # two u32 inputs of n: OFF_THREAD_BYTES in all
    for size, thread in ((n, threading.current_thread().name), (n + 1, "vyre-ray-submit")):
        a = np.arange(size, dtype=np.uint32)
        b = np.full(size, 7, np.uint32)
        if size > n:
            fake.gate.clear()  # (the submission thread sends it after the caller's change)
        pending = backend.dispatch(elementwise_xor(size), [a, b])
        a[:] = 0  # the caller may reuse its arrays once dispatch() returned
        fake.gate.set()
        xor_of(pending, np.arange(size, dtype=np.uint32), b)
        assert fake.sent[-1].thread.startswith(thread)


def test_at_most_two_threads_send_large_inputs(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    size = OFF_THREAD_BYTES // 8 + 1
    program, a = elementwise_xor(size), np.arange(size, dtype=np.uint32)
    fake.gate.clear()
    calls = [backend.dispatch(program, [a, a + k]) for k in range(2)]
    fake.wait_at_gate(2)  # two threads are sending
    calls.append(backend.dispatch(program, [a, a + 2]))  # waits for one of them
    fake.gate.set()
    for k, pending in enumerate(calls):
        xor_of(pending, a, a + k)
    senders = {s.sender for s in fake.sent}
    assert len(senders) == 2 and all(t.name.startswith("vyre-ray-submit") for t in senders)


def test_a_dispatch_that_races_close_fails_closed_and_sends_nothing(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = closing(create_backend(workers=1))
    inside, go = threading.Event(), threading.Event()

    def inject(carrier: dict[str, str], context: Any = None) -> None:
        inside.set()  # (the dispatch is past the open check: close starts now)
        assert go.wait(WAIT_S)

    monkeypatch.setattr(rb, "propagate", types.SimpleNamespace(inject=inject))
    size = OFF_THREAD_BYTES // 8 + 1  # large: it would go through the submission thread
    a = np.arange(size, dtype=np.uint32)
    racing: list[PendingDispatch] = []
    thread = threading.Thread(
        target=lambda: racing.append(backend.dispatch(elementwise_xor(size), [a, a]))
    )
    thread.start()
    assert inside.wait(WAIT_S)
    close(backend)
    go.set()
    thread.join(WAIT_S)
    with pytest.raises(BackendClosed) as info:
        racing[0].result(timeout=WAIT_S)
    assert str(info.value) == CLOSED
    assert fake.sent == []  # (its worker was killed by the close)


def test_a_workers_error_arrives_as_itself_and_any_other_as_dispatch_failed(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = closing(create_backend())
    workers = [actor.worker for actor in fake.actors]
    own = DeviceOutOfMemory("the worker's device is full", fix="free it")
    for worker in workers:
        monkeypatch.setattr(worker, "backend", Failing(own))
    with pytest.raises(DeviceOutOfMemory) as info:
        backend.dispatch(XOR, [A, A]).result(timeout=WAIT_S)
    assert str(info.value) == "the worker's device is full\nFix: free it"
    for worker in workers:
        monkeypatch.setattr(worker, "backend", Failing(ValueError("boom")))
    with pytest.raises(DispatchFailed) as failed:
        backend.dispatch(XOR, [A, A]).result(timeout=WAIT_S)
    assert str(failed.value) == (
        "the Ray worker failed while running the dispatch on a worker: ValueError: boom" + OWN_FIX
    )
    assert isinstance(failed.value.__cause__, rex.RayTaskError)
    for worker in workers:
        monkeypatch.setattr(worker, "backend", acquire_backend("reference"))
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


def test_ray_out_of_object_store_memory_is_device_out_of_memory(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    full = rex.ObjectStoreFullError("the object store is full")
    fake.actors[0].refuse = full
    with pytest.raises(DeviceOutOfMemory) as info:
        backend.dispatch(XOR, [A, A]).result(timeout=WAIT_S)
    assert str(info.value) == (
        "the Ray cluster ran out of memory while sending the dispatch to a worker: "
        "ObjectStoreFullError\nFix: send smaller inputs per dispatch, or give the cluster more "
        "object store memory (ray start --object-store-memory) or disk"
    )
    assert info.value.__cause__ is full


def test_outputs_the_pool_cannot_take_fail_the_dispatch_and_free_the_worker(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Odd:  # a worker's local backend (a user's own, say) whose outputs are not arrays
        def dispatch(self, *args: Any) -> Any:
            async def outputs() -> list[bytes]:
                return [b"not an array"]

            return outputs()

    backend = closing(create_backend())
    for actor in fake.actors:
        monkeypatch.setattr(actor.worker, "backend", Odd())
    with pytest.raises(DispatchFailed) as info:
        backend.dispatch(XOR, [A, A]).result(timeout=WAIT_S)
    assert str(info.value) == (
        "settling the dispatch failed: AttributeError: 'bytes' object has "
        "no attribute 'flags'" + OWN_FIX
    )
    assert isinstance(info.value.__cause__, AttributeError)
    for actor in fake.actors:
        monkeypatch.setattr(actor.worker, "backend", acquire_backend("reference"))
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


def test_a_dispatch_reports_the_compile_time_it_waited_for(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    first, again = (backend.dispatch(XOR, [A, A]) for _ in range(2))
    for pending in (first, again):
        xor_of(pending, A, A)
    timings = [pending.timing for pending in (first, again)]
    assert timings[0] is not None and isinstance(timings[0].compile_s, float)
    assert timings[1] is not None and timings[1].compile_s == 0.0  # compiled already


def test_a_call_ray_refuses_to_send_fails_and_leaves_its_worker_free(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    refused = TypeError("cannot pickle 'generator' object")
    for actor in fake.actors:
        actor.refuse = refused
    with pytest.raises(DispatchFailed) as info:
        backend.dispatch(XOR, [A, A]).result(timeout=WAIT_S)
    assert str(info.value) == (
        "sending the dispatch to a worker failed: TypeError: cannot pickle "
        "'generator' object" + OWN_FIX
    )
    assert info.value.__cause__ is refused
    for actor in fake.actors:
        actor.refuse = None
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


# Deadlines ------------------------------------------------------------------------------------


def test_the_worker_is_given_what_is_left_of_the_deadline(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    timed = DispatchConfig(timeout=30.0, label="t")
    plain = DispatchConfig(label="u")
    short = DispatchConfig(timeout=0.5)
    for config in (timed, plain, short):
        xor_of(backend.dispatch(XOR, [A, A], config), A, A)
    first, second, third = (s.config for s in fake.sent)
    assert first.timeout is not None and 20.0 < first.timeout < 30.0
    assert dataclasses.replace(first, timeout=None) == dataclasses.replace(timed, timeout=None)
    assert second == plain
    assert third.timeout is not None and 0.0 < third.timeout <= 0.5


def test_a_dispatch_past_its_deadline_before_it_is_sent_is_not_sent(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    pending = backend.dispatch(XOR, [A, A], DispatchConfig(timeout=1e-9))
    with pytest.raises(DispatchTimeout):
        pending.result(timeout=WAIT_S)
    assert fake.sent == []


def test_a_late_dispatch_times_out_and_its_task_is_cancelled(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    fake.actors[0].hold()
    pending = backend.dispatch(XOR, [A, A], DispatchConfig(timeout=0.3))
    with pytest.raises(DispatchTimeout):
        pending.result(timeout=WAIT_S)
    assert fake.cancelling.wait(WAIT_S)
    assert fake.cancelled == [(fake.sent[-1].ref, {})]


def test_a_late_call_ray_cannot_cancel_is_logged_at_debug(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], caplog: pytest.LogCaptureFixture
) -> None:
    backend = closing(create_backend(workers=1))
    fake.actors[0].hold()
    fake.cancel_error = RuntimeError("the task is gone")
    with caplog.at_level(logging.DEBUG, logger="vyre_async.ray"):
        with pytest.raises(DispatchTimeout):
            backend.dispatch(XOR, [A, A], DispatchConfig(timeout=0.2)).result(timeout=WAIT_S)
        assert fake.cancelling.wait(WAIT_S) and wait_for_callbacks(WAIT_S)
        logged = [
            (r.levelno, r.getMessage(), r.exc_info[1] if r.exc_info else None)
            for r in caplog.records
            if r.name == "vyre_async.ray"
        ]
    assert logged == [(logging.DEBUG, "cancelling a late Ray task failed", fake.cancel_error)]


def test_a_timed_dispatch_that_failed_on_its_worker_is_not_cancelled(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = closing(create_backend(workers=1))
    own = DeviceOutOfMemory("the worker's device is full", fix="free it")
    monkeypatch.setattr(fake.actors[0].worker, "backend", Failing(own))
    with pytest.raises(DeviceOutOfMemory):
        backend.dispatch(XOR, [A, A], DispatchConfig(timeout=30.0)).result(timeout=WAIT_S)
    assert wait_for_callbacks(WAIT_S)
    assert fake.cancelled == []  # (it ended: no Ray call to cancel it)


def test_a_call_to_send_again_after_its_deadline_is_not_sent_and_frees_its_worker(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    holder = fake.actors[fake.sent[0].worker]
    holder.restart()
    holder.hold()
    pending = backend.dispatch(XOR, [A, A], DispatchConfig(timeout=0.1))
    settled = threading.Event()
    pending.add_done_callback(lambda _: settled.set())
    while time.monotonic() < pending.created + 0.1:  # its deadline passes while it is held
        time.sleep(0.01)
    holder.release()  # refused as unknown; too late to send it again
    assert settled.wait(WAIT_S)
    with pytest.raises(DispatchTimeout):
        pending.result(timeout=WAIT_S)
    assert [s.wire for s in fake.sent] == [True, False] and fake.cancelled == []
    assert holder_takes(fake, backend, 20) == AFFINITY_SLACK + 1


# Flushing and closing -------------------------------------------------------------------------


def test_flush_waits_for_earlier_dispatches_only(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    for actor in fake.actors:
        actor.hold()
    earlier = backend.dispatch(XOR, [A, A + 1])
    later: list[PendingDispatch] = []

    async def main() -> None:
        flushed = anyio.Event()

        async def flush() -> None:
            await backend.flush()
            flushed.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(flush)
            await anyio.wait_all_tasks_blocked()
            assert not flushed.is_set()  # (the earlier dispatch is held)
            later.append(backend.dispatch(XOR, [A, A + 2]))  # goes to the other worker
            fake.actors[fake.sent[0].worker].release()
            with anyio.fail_after(WAIT_S):
                await flushed.wait()

    anyio.run(main)
    assert earlier.done() and not later[0].done()
    fake.actors[fake.sent[1].worker].release()
    xor_of(earlier, A, A + 1)
    xor_of(later[0], A, A + 2)


def test_closing_waits_for_calls_in_flight_then_ends_the_workers(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    actor = fake.actors[0]
    actor.restart()  # the call below is refused as unknown and sent again, during close
    actor.hold()
    pending = backend.dispatch(XOR, [A, A + 5])
    backend.close_timeout = WAIT_S

    async def main() -> None:
        closed = anyio.Event()

        async def aclose() -> None:
            await backend.aclose()
            closed.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(aclose)
            with anyio.move_on_after(0.2):  # (it cannot end while the call is held)
                await closed.wait()
            assert not closed.is_set()
            actor.release()

    anyio.run(main)
    xor_of(pending, A, A + 5)
    assert [s.wire for s in fake.sent] == [True, False, True]
    assert fake.cancelled == []
    assert fake.flushes == 1 and fake.gets[-1] == 2.0  # the workers export their spans
    assert fake.killed == [(actor, {"no_restart": True})]
    with pytest.raises(BackendClosed):
        backend.dispatch(XOR, [A, A])
    with pytest.raises(BackendClosed):
        backend.executor.workers()


def test_closing_fails_what_still_runs_after_close_timeout(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend())
    for actor in fake.actors:
        actor.hold()
    pending = backend.dispatch(XOR, [A, A])
    backend.close_timeout = 0.2
    close(backend)
    with pytest.raises(BackendClosed) as info:
        pending.result(timeout=WAIT_S)
    assert str(info.value) == CLOSED
    assert fake.cancelled == [(fake.sent[-1].ref, {"force": False})]
    assert fake.flushes == 2 and fake.gets[-1] == 2.0
    assert fake.killed == [(actor, {"no_restart": True}) for actor in fake.actors]


def test_after_ray_shutdown_everything_fails_with_device_lost_and_ray_is_left_alone(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    fake.actors[0].hold()
    running = backend.dispatch(XOR, [A, A])
    fake.initialized = False  # ray.shutdown() elsewhere in this process
    with pytest.raises(DeviceLost) as info:
        running.result(timeout=WAIT_S)  # failed by the pool's watchdog
    assert str(info.value) == GONE
    assert info.value.context == {"backend_id": "ray", "cause": "runtime-gone"}
    with pytest.raises(DeviceLost, match="was shut down"):
        backend.dispatch(XOR, [A, A])
    with pytest.raises(DeviceLost, match="was shut down"):
        backend.executor.workers()
    gets = len(fake.gets)
    close(backend)
    # No Ray call after the runtime went (one would start a fresh local cluster).
    assert len(fake.sent) == 1 and len(fake.gets) == gets
    assert fake.cancelled == [] and fake.killed == [] and fake.flushes == 0


def test_a_pool_whose_runtime_went_stays_lost_after_ray_init_again(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    fake.actors[0].hold()
    running = backend.dispatch(XOR, [A, A])
    fake.initialized = False  # ray.shutdown() elsewhere in this process
    with pytest.raises(DeviceLost):
        running.result(timeout=WAIT_S)
    fake.initialized = True  # ray.init() again: another runtime, without this pool's workers
    with pytest.raises(DeviceLost, match="was shut down"):
        backend.dispatch(XOR, [A, A])
    with pytest.raises(DeviceLost, match="was shut down"):
        backend.executor.workers()
    close(backend)
    assert len(fake.sent) == 1 and fake.cancelled == [] and fake.killed == []


def test_a_call_to_send_again_after_ray_shutdown_fails_device_lost(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rb, "_watch_runtime", lambda backend_ref: None)  # (the send sees it first)
    backend = closing(create_backend(workers=1))
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    actor = fake.actors[0]
    actor.restart()
    actor.hold()
    pending = backend.dispatch(XOR, [A, A + 1])
    fake.initialized = False  # ray.shutdown() elsewhere in this process
    actor.release()  # refused as unknown: there is no runtime to send it again on
    with pytest.raises(DeviceLost) as info:
        pending.result(timeout=WAIT_S)
    assert str(info.value) == GONE
    assert [s.wire for s in fake.sent] == [True, False]


def test_an_open_pool_never_keeps_the_interpreter_from_exiting(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    backend = closing(create_backend(workers=1))
    before = set(threading.enumerate())
    xor_of(backend.dispatch(XOR, [A, A]), A, A)
    started = set(threading.enumerate()) - before  # the pool's watchdog (while it is open)
    assert started and all(thread.daemon for thread in started)


# Traces -----------------------------------------------------------------------------------------


def test_a_workers_span_is_a_child_of_the_callers_dispatch_span(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    exporter, _ = otel_sdk.install()  # (the workers run in this process: one SDK sees both)
    backend = closing(create_backend(workers=1))
    exporter.clear()
    with trace.get_tracer("tests").start_as_current_span("request"):
        xor_of(backend.dispatch(XOR, [A, A + 1]), A, A + 1)
    spans = exporter.get_finished_spans()
    exporter.clear()
    by_backend = {
        span.attributes["vyre.backend.id"]: span
        for span in spans
        if span.name == "vyre.dispatch" and span.attributes is not None
    }
    caller, worker = by_backend["ray"], by_backend["reference"]
    assert worker.parent is not None and worker.parent.span_id == caller.context.span_id
    assert worker.context.trace_id == caller.context.trace_id


def test_with_telemetry_off_a_call_carries_the_callers_own_span(
    fake: FakeRay, closing: Callable[[VyreBackend], VyreBackend]
) -> None:
    otel_sdk.install()
    backend = closing(create_backend(workers=1))
    was = telemetry.is_enabled()
    telemetry.set_enabled(False)  # no vyre.dispatch span: the caller's own is the parent
    try:
        with trace.get_tracer("tests").start_as_current_span("request") as request:
            xor_of(backend.dispatch(XOR, [A, A + 1]), A, A + 1)
    finally:
        telemetry.set_enabled(was)
    (sent,) = fake.sent
    assert sent.carrier
    carried = trace.get_current_span(propagate.extract(sent.carrier)).get_span_context()
    assert carried.span_id == request.get_span_context().span_id


# Without a pool ---------------------------------------------------------------------------


def test_without_ray_a_pool_is_refused_with_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", None)  # as Python reports a package not installed
        with pytest.raises(UnsupportedFeature) as info:
            create_backend(workers=0)  # (Ray is looked for first)
    assert str(info.value) == (
        "the 'ray' backend needs Ray, which is not installed (ModuleNotFoundError: import of ray "
        "halted; None in sys.modules)\nFix: pip install 'vyre-async[ray]'"
    )
    assert info.value.context == {"backend_id": "ray", "cause": "no-ray"}
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


_NO_CLUSTER = BackendProbe(
    id="ray",
    usable=False,
    reason="the 'ray' backend needs a Ray cluster: none is named and none was asked to start",
    fix="set RAY_ADDRESS to a running cluster (ray start --head prints it), or set "
    "VYRE_RAY_LOCAL_WORKERS=2 to start a local one, or use vyre_ray.local_backend(workers=2)",
)


@pytest.mark.parametrize(
    ("ray_state", "environ", "verdict"),
    [
        ("installed", {"RAY_ADDRESS": "auto"}, BackendProbe(id="ray", usable=True)),
        ("installed", {"VYRE_RAY_LOCAL_WORKERS": "2"}, BackendProbe(id="ray", usable=True)),
        ("installed", {"VYRE_RAY_LOCAL_WORKERS": "1"}, BackendProbe(id="ray", usable=True)),
        ("connected", {}, BackendProbe(id="ray", usable=True)),
        ("installed", {}, _NO_CLUSTER),
        ("installed", {"VYRE_RAY_LOCAL_WORKERS": " "}, _NO_CLUSTER),
        (
            "installed",
            {"VYRE_RAY_LOCAL_WORKERS": "1.5"},
            BackendProbe(
                id="ray",
                usable=False,
                reason="VYRE_RAY_LOCAL_WORKERS must be a whole number >= 1, got '1.5'",
                fix="set VYRE_RAY_LOCAL_WORKERS=2 (or unset it and set RAY_ADDRESS)",
            ),
        ),
        (
            "missing",
            {"RAY_ADDRESS": "auto"},
            BackendProbe(
                id="ray",
                usable=False,
                reason="the 'ray' backend needs Ray, which is not installed "
                "(ModuleNotFoundError: No module named 'ray')",
                fix="pip install 'vyre-async[ray]'",
            ),
        ),
    ],
    ids=[
        "RAY_ADDRESS",
        "VYRE_RAY_LOCAL_WORKERS",
        "one local worker",
        "connected",
        "no cluster",
        "blank",
        "1.5",
        "no ray",
    ],
)
def test_the_probe_says_whether_ray_is_installed_and_a_cluster_named(
    monkeypatch: pytest.MonkeyPatch, ray_state: str, environ: dict[str, str], verdict: BackendProbe
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("VYRE_RAY_LOCAL_WORKERS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    # Ray as the probe finds it (the real module is left alone: its state is the session's)
    ray = None
    if ray_state != "missing":
        connected = ray_state == "connected"
        ray = types.SimpleNamespace(is_initialized=lambda: connected, __spec__=real_ray.__spec__)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", ray)
        assert probe_backend(REGISTRATION) == verdict


def test_the_probe_judges_the_environment_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("VYRE_RAY_LOCAL_WORKERS", raising=False)
    installed = types.SimpleNamespace(is_initialized=lambda: False, __spec__=real_ray.__spec__)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "ray", installed)
        rb.probe({"VYRE_RAY_LOCAL_WORKERS": "2"})  # usable: no error
        with pytest.raises(UnsupportedFeature, match="none is named"):
            rb.probe()  # (this process's environment names none)
        patch.setitem(sys.modules, "ray", None)  # as Python reports a package not installed
        with pytest.raises(UnsupportedFeature) as info:
            rb.probe({"RAY_ADDRESS": "auto"})
    assert str(info.value).startswith("the 'ray' backend needs Ray, which is not installed")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_the_package_gives_the_backend_by_name() -> None:
    assert (vyre_ray.RayExecutor, vyre_ray.WorkerInfo) == (rb.RayExecutor, WorkerInfo)
    assert vyre_ray.create_backend is rb.create_backend
    assert vyre_ray.local_backend is rb.local_backend
    with pytest.raises(AttributeError, match=r"^module 'vyre_ray' has no attribute 'nope'$"):
        vyre_ray.nope  # noqa: B018


def test_a_worker_describes_itself_and_without_tracing_has_no_spans_to_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(real_ray, "get_runtime_context", _RuntimeContext)
    worker = Worker("reference", 4)
    outputs = anyio.run(
        worker.run, XOR.fingerprint(), XOR.to_wire(), [A, A + 1], DispatchConfig(), None
    )
    assert np.array_equal(outputs[0], A ^ (A + 1))
    reference = acquire_backend("reference")
    assert worker.describe() == {
        "index": 4,
        "node": NODE,
        "pid": os.getpid(),
        "inner": "reference",
        "device": reference.device_fingerprint(),
        "capabilities": reference.capabilities(),
        "cached_programs": 1,
        "in_flight": 0,
        "finished": 1,
    }
    assert worker.flush_telemetry() is True


def test_unknown_program_crosses_processes_as_itself() -> None:
    error = pickle.loads(pickle.dumps(UnknownProgram(b"\x01\x02")))
    assert type(error) is UnknownProgram and error.digest == b"\x01\x02" and str(error) == "0102"


# A worker, driven directly ------------------------------------------------------------------


def test_a_worker_keeps_the_programs_it_used_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(real_ray, "get_runtime_context", _RuntimeContext)
    monkeypatch.setattr(vyre_ray.worker, "PROGRAMS_KEPT", 2)
    worker = Worker("reference", 0)

    def run(n: int, *, wire: bool) -> None:
        program, a = elementwise_xor(n), np.arange(n, dtype=np.uint32)
        sent = program.to_wire() if wire else None
        args = (program.fingerprint(), sent, [a, a + 1], DispatchConfig(), None)
        (out,) = anyio.run(worker.run, *args)
        assert np.array_equal(out, a ^ (a + 1))

    run(16, wire=True)
    run(17, wire=True)
    run(16, wire=False)
    run(18, wire=True)  # a third: the least recently used, 17, is forgotten
    run(16, wire=False)
    run(18, wire=False)
    with pytest.raises(UnknownProgram):
        run(17, wire=False)
    assert worker.describe()["cached_programs"] == 2


def test_a_worker_counts_its_calls_in_flight_and_finished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(real_ray, "get_runtime_context", _RuntimeContext)
    worker = Worker("reference", 0)
    reference = worker.backend

    class Held:  # the local backend, whose dispatches end when the test says
        def __init__(self) -> None:
            self.go = anyio.Event()

        def __getattr__(self, name: str) -> Any:
            return getattr(reference, name)

        def dispatch(self, program: Any, inputs: list[np.ndarray], config: Any) -> Any:
            async def outputs() -> list[np.ndarray]:
                await self.go.wait()
                return [inputs[0]]

            return outputs()

    async def main() -> None:
        held = Held()
        monkeypatch.setattr(worker, "backend", held)
        async with anyio.create_task_group() as tasks:
            for _ in range(2):
                args = (XOR.fingerprint(), XOR.to_wire(), [A, A], DispatchConfig(), None)
                tasks.start_soon(worker.run, *args)
            await anyio.wait_all_tasks_blocked()
            assert worker.describe()["in_flight"] == 2
            held.go.set()

    anyio.run(main)
    described = worker.describe()
    assert (described["in_flight"], described["finished"]) == (0, 2)


def test_a_worker_leaves_the_callers_context_as_it_found_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = Worker("reference", 0)
    remote = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}

    async def main() -> None:
        for carrier in (remote, None, {}):
            args = (XOR.fingerprint(), XOR.to_wire(), [A, A + 1], DispatchConfig(), carrier)
            (out,) = await worker.run(*args)
            assert np.array_equal(out, A ^ (A + 1))
            assert not trace.get_current_span().get_span_context().is_valid  # detached again

    with caplog.at_level(logging.WARNING):
        anyio.run(main)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_traced_worker_flushes_its_own_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[str, str]] = []

    class Provider:  # configure_tracing's provider: force_flush says if everything went out
        def __init__(self, flushed: bool) -> None:
            self.flushed = flushed

        def force_flush(self) -> bool:
            return self.flushed

    def configure_tracing(spec: str, *, service_name: str) -> Provider:
        made.append((spec, service_name))
        return Provider(flushed=len(made) == 1)

    # (where the worker looks it up: `vyre_async.abc` keeps what it loaded, so a patch of
    # `vyre_async.tracing` would not reach the worker, and one made before abc loaded it
    # would stay there for every later test)
    monkeypatch.setattr(vyre_async.abc, "configure_tracing", configure_tracing)
    assert Worker("reference", 3, trace="otlp").flush_telemetry() is True
    assert Worker("reference", 4, trace="file:spans.jsonl").flush_telemetry() is False
    assert made == [("otlp", "vyre-ray-worker-3"), ("file:spans.jsonl", "vyre-ray-worker-4")]
