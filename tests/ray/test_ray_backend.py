"""The ``ray`` backend on the session's local cluster: acquisition, the pool, faults, traces.

The contract tests and the conformance corpus run on ``ray`` too
(``tests/contract``); these cover what is particular to a pool of remote
workers. Every Ray process is ended with the session (``tests/ray_cluster.py``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import numpy as np
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed")

from opentelemetry import trace

from tests import orphan_guard, otel_sdk
from tests.otlp_receiver import Receiver
from vyre_async import (
    BackendClosed,
    DeviceLost,
    DispatchConfig,
    DispatchTimeout,
    InvalidProgram,
    UnsupportedFeature,
    acquire_backend,
    acquire_preferred_backend,
    registered_backends,
)
from vyre_async._backend import VyreBackend, poll_until
from vyre_async.ir import (
    Access,
    Assign,
    BufferDecl,
    DType,
    Let,
    Load,
    Loop,
    Program,
    Store,
    Var,
    u32,
)
from vyre_async.programs import elementwise_xor
from vyre_ray import RayExecutor, create_backend, local_backend
from vyre_ray.backend import cluster_target

pytestmark = pytest.mark.anyio
XOR = elementwise_xor(64)


@pytest.fixture
def pool() -> VyreBackend:
    backend = acquire_backend("ray")
    assert isinstance(backend, VyreBackend) and isinstance(backend.executor, RayExecutor)
    return backend


def spin() -> Program:
    """``out[0] = sum(range(n))``, ``n`` read at run time: as long as you like."""
    return Program(
        [
            BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 1),
        ],
        1,
        [
            Let("acc", u32(0)),
            Loop("i", u32(0), Load("n", u32(0)), [Assign("acc", Var("acc") + Var("i"))]),
            Store("out", u32(0), Var("acc")),
        ],
        op_id="test.ray.spin",
    )


# Acquisition ----------------------------------------------------------------------------


def test_listing_backends_imports_no_ray() -> None:
    code = (
        "import sys, vyre_async\n"
        "ids = [r.id for r in vyre_async.registered_backends()]\n"
        "assert 'ray' in ids, ids\n"
        "assert 'ray' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_ray_installed_the_fix_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from vyre_async import acquire_backend, UnsupportedFeature\n"
        "try:\n"
        "    acquire_backend('ray')\n"
        "except UnsupportedFeature as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=60, capture_output=True, text=True
    )
    assert "needs Ray, which is not installed" in out.stdout
    assert "Fix: pip install 'vyre-async[ray]'" in out.stdout


def test_the_cluster_is_named_or_asked_for() -> None:
    assert cluster_target(None, None, {"RAY_ADDRESS": "ray://h:10001"}) == (
        "address",
        "ray://h:10001",
    )
    both = {"RAY_ADDRESS": "auto", "VYRE_RAY_LOCAL_WORKERS": "3"}
    assert cluster_target(None, None, both) == ("address", "auto")  # RAY_ADDRESS wins
    assert cluster_target("ray://x:1", None, both) == ("address", "ray://x:1")
    assert cluster_target(None, None, {"VYRE_RAY_LOCAL_WORKERS": "3"}) == ("local", 3)
    assert cluster_target(None, 4, {}) == ("local", 4)
    with pytest.raises(UnsupportedFeature) as info:
        cluster_target(None, None, {})
    message = str(info.value)
    assert "RAY_ADDRESS" in message and "VYRE_RAY_LOCAL_WORKERS" in message
    assert message.rpartition("\n")[2].startswith("Fix: ")
    for bad in ("0", "-1", "two"):
        with pytest.raises(InvalidProgram, match="VYRE_RAY_LOCAL_WORKERS"):
            cluster_target(None, None, {"VYRE_RAY_LOCAL_WORKERS": bad})


def test_ray_is_never_preferred_only_asked_for_by_id() -> None:
    (registration,) = [r for r in registered_backends() if r.id == "ray"]
    assert registration.remote and registration.dispatches
    assert acquire_preferred_backend(allow_reference=True).id != "ray"


def test_a_pool_size_must_be_a_whole_number() -> None:
    with pytest.raises(InvalidProgram, match="workers must be"):
        create_backend(workers=0)


# The pool ------------------------------------------------------------------------------------


async def test_workers_describe_themselves_and_keep_programs(pool: VyreBackend) -> None:
    a = np.arange(64, dtype=np.uint32)
    for k in range(8):
        assert (await pool.dispatch(XOR, [a, a + k]))[0].tolist() == (a ^ (a + k)).tolist()
    workers = pool.executor.workers()
    assert [w.index for w in workers] == [0, 1]
    assert {w.inner for w in workers} == {"reference"}
    assert len({w.pid for w in workers}) == 2 and os.getpid() not in {w.pid for w in workers}
    assert all(w.in_flight == 0 for w in workers)
    assert sum(w.cached_programs for w in workers) >= 1
    assert pool.capabilities().distributed


class _Spy:
    """Stands in for a worker's actor handle and records whether each call sent the program."""

    def __init__(self, handle: Any, sent: list[bool]) -> None:
        self._handle = handle
        self._sent = sent
        spy = self

        class Run:
            @staticmethod
            def remote(digest: bytes, wire: bytes | None, *rest: Any) -> Any:
                spy._sent.append(wire is not None)
                return spy._handle.run.remote(digest, wire, *rest)

        self.run = Run()
        self.describe = handle.describe


async def test_a_program_is_sent_once_per_worker() -> None:
    backend = local_backend(workers=2)
    handles = [member.handle for member in backend.executor._members]
    try:
        sent: list[bool] = []
        for member in backend.executor._members:
            member.handle = _Spy(member.handle, sent)
        program = elementwise_xor(48)
        a = np.arange(48, dtype=np.uint32)
        for k in range(12):  # one at a time: the first call to each worker carries it
            assert (await backend.dispatch(program, [a, a + k]))[0].tolist() == (
                a ^ (a + k)
            ).tolist()
        assert len(sent) == 12 and 1 <= sum(sent) <= 2
        assert sent[0] is True
    finally:
        for member, handle in zip(backend.executor._members, handles, strict=True):
            member.handle = handle  # the real handles, so closing kills the workers
        await backend.aclose()


async def test_large_inputs_go_through_the_object_store_and_outputs_are_writable(
    pool: VyreBackend,
) -> None:
    n = 300_000  # 2 x 1.2 MB: copied, then submitted off the calling thread
    program = elementwise_xor(n)
    a = np.arange(n, dtype=np.uint32)
    b = np.full(n, 7, np.uint32)
    pending = pool.dispatch(program, [a, b])
    a[:] = 0  # the caller may reuse its arrays once dispatch() returned
    (out,) = await pending
    assert out.flags.writeable and out.flags.owndata
    assert np.array_equal(out, np.arange(n, dtype=np.uint32) ^ np.uint32(7))


def test_a_worker_error_arrives_as_the_same_vyre_error(pool: VyreBackend) -> None:
    """An error raised on the worker crosses Ray and comes back as itself, with its Fix."""
    from vyre_ray.errors import translate

    handle = pool.executor._members[0].handle
    ref = handle.run.remote(b"\0" * 32, b"not a program", [], DispatchConfig(), None)
    with pytest.raises(Exception) as raw:  # what Ray's future raises: its wrapper class
        ref.future().result(timeout=60)
    error = translate(raw.value, doing="running the dispatch on a worker")
    assert type(error) is InvalidProgram  # the worker's own error, unwrapped
    assert str(error).rpartition("\n")[2].startswith("Fix: ")
    assert "ray" not in type(error).__module__


def test_workers_that_cannot_start_are_refused_with_a_fix() -> None:
    with pytest.raises(UnsupportedFeature) as info:
        local_backend(workers=1, inner="cupy")  # no CuPy on the workers here
    text = str(info.value)
    assert text.startswith("the 'ray' backend's workers could not start: ")
    # one Fix, this error's own (the worker's error it wraps lost its Fix line until
    # mutation testing found it: the user read the wrapped error's Fix instead)
    assert text.count("Fix:") == 1
    assert text.endswith(
        "\nFix: check the cluster's resources (ray status) and the workers' logs; "
        "with num_gpus_per_worker, the cluster needs that many GPUs per worker"
    )


def test_an_unreachable_cluster_is_refused_with_its_own_fix() -> None:
    import vyre_ray.backend as rb

    class Unreachable:  # Ray, not yet connected, whose init finds no cluster
        def is_initialized(self) -> bool:
            return False

        def init(self, **options: object) -> None:
            raise ConnectionError("no GCS at 127.0.0.1:1")

    with pytest.raises(UnsupportedFeature) as info:
        rb._connect(Unreachable(), "127.0.0.1:1", None)
    text = str(info.value)
    assert text.startswith(
        "the 'ray' backend cannot reach its cluster: connecting to the Ray cluster at "
        "'127.0.0.1:1' failed: ConnectionError: no GCS at 127.0.0.1:1\n"
    )
    assert text.count("Fix:") == 1
    assert text.endswith("\nFix: check RAY_ADDRESS and that the cluster is up (ray status)")
    assert info.value.context["cause"] == "unreachable"
    assert isinstance(info.value.__cause__, ConnectionError)


async def test_a_timeout_cancels_the_remote_task(
    pool: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.exceptions as rex

    import ray

    # The worker is not told the deadline here: only the cancel can end its call early
    # (about 3 s of spinning on the reference engine otherwise, and a result).
    monkeypatch.setattr(pool.executor, "_config_for", lambda launch: DispatchConfig())
    pending = pool.dispatch(spin(), [np.array([2_000_000], np.uint32)], DispatchConfig(timeout=0.3))
    (ref,) = list(pool.executor._running)  # the call in flight
    with pytest.raises(DispatchTimeout) as info:
        await pending
    assert "Fix:" in str(info.value)
    with pytest.raises(rex.TaskCancelledError):  # cancelled, not left to finish
        await anyio.to_thread.run_sync(lambda: ray.get(ref, timeout=60))
    with anyio.fail_after(30):
        await poll_until(lambda: not any(w.in_flight for w in pool.executor.workers()))


# Faults -------------------------------------------------------------------------------------


async def test_a_worker_killed_under_load_costs_no_wrong_result_and_no_hang() -> None:
    """64 tasks dispatch continuously; one worker is SIGKILLed; the pool serves again."""
    backend = local_backend(workers=2)
    try:
        program = elementwise_xor(64)
        rng = np.random.default_rng(3)
        base = rng.integers(0, 2**32, 64, dtype=np.uint32)
        await backend.dispatch(program, [base, base])  # warm both paths
        stop = anyio.Event()
        wrong: list[int] = []
        ok = [0]
        lost: list[DeviceLost] = []
        other: list[BaseException] = []

        async def dispatcher(k: int) -> None:
            mine = base + np.uint32(k)
            while not stop.is_set():
                try:
                    (out,) = await backend.dispatch(program, [base, mine])
                except DeviceLost as exc:
                    lost.append(exc)
                    continue
                except Exception as exc:  # anything else is a failure of the test
                    other.append(exc)
                    return
                if not np.array_equal(out, base ^ mine):
                    wrong.append(k)
                ok[0] += 1

        victim = backend.executor.workers()[0]
        with anyio.fail_after(90):  # no await hangs
            async with anyio.create_task_group() as tasks:
                for k in range(64):
                    tasks.start_soon(dispatcher, k)
                await anyio.sleep(0.5)
                before = ok[0]
                os.kill(victim.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                await anyio.sleep(2.0)
                stop.set()
        assert not wrong and not other, (wrong, other[:3])
        assert ok[0] > before  # it kept serving
        assert all(str(e).rpartition("\n")[2].startswith("Fix: ") for e in lost)
        # The pool serves again: the killed worker was replaced within 10 s.
        deadline = killed_at + 10.0
        while True:
            workers = backend.executor.workers()
            if workers[0].pid != victim.pid:
                break
            assert time.monotonic() < deadline, "the killed worker was not replaced in 10 s"
            await anyio.sleep(0.1)
        for _ in range(8):
            (out,) = await backend.dispatch(program, [base, base + np.uint32(1)])
            assert np.array_equal(out, base ^ (base + np.uint32(1)))
    finally:
        await backend.aclose()


async def test_closing_the_pool_ends_its_workers() -> None:
    backend = local_backend(workers=1)
    pids = [w.pid for w in backend.executor.workers()]
    backend.close_timeout = 0.5
    pending = backend.dispatch(spin(), [np.array([0xFFFF_FFFF], np.uint32)])
    await anyio.sleep(0.2)
    with anyio.fail_after(30):
        await backend.aclose()
    with pytest.raises(BackendClosed) as info:
        await pending
    assert "Fix:" in str(info.value)
    with anyio.fail_after(15):
        await poll_until(lambda: not any(orphan_guard.alive(pid) for pid in pids))


async def test_closing_still_sends_again_a_call_a_worker_did_not_know() -> None:
    """A worker's answer during aclose()'s wait is handled as on an open pool."""
    backend = local_backend(workers=1)
    program = elementwise_xor(40)
    # The pool believes its worker holds the program; it does not: the call goes out
    # without the bytes, is answered "program unknown", and must be sent again.
    backend.executor._members[0].seen[program.fingerprint()] = None
    a = np.arange(40, dtype=np.uint32)
    pending = backend.dispatch(program, [a, a + 3])
    backend.close_timeout = 60
    with anyio.fail_after(60):
        await backend.aclose()  # closing began before the worker answered
    (out,) = await pending
    assert out.tolist() == (a ^ (a + 3)).tolist()


async def test_stopping_the_workers_runs_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = local_backend(workers=1)
    stop = backend.executor._stop_workers
    threads: list[threading.Thread] = []

    def watched() -> None:
        threads.append(threading.current_thread())
        stop()

    monkeypatch.setattr(backend.executor, "_stop_workers", watched)
    with anyio.fail_after(60):
        await backend.aclose()
    assert len(threads) == 1 and threads[0] is not threading.main_thread()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the same on trio; one is enough
async def test_flush_waits_for_earlier_dispatches_only() -> None:
    backend = local_backend(workers=1)
    backend.close_timeout = 0.5
    a = np.arange(64, dtype=np.uint32)
    earlier = backend.dispatch(XOR, [a, a])
    flushed = anyio.Event()

    async def flush() -> None:
        await backend.flush()
        flushed.set()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(flush)
            await anyio.lowlevel.checkpoint()
            # Enqueued after flush() was called, and endless: it ends with the pool.
            later = backend.dispatch(spin(), [np.array([0xFFFF_FFFF], np.uint32)])
            with anyio.fail_after(60):
                await flushed.wait()
            assert earlier.done()
            assert not later.done()  # flush() did not wait for it (it cannot end by itself)
    finally:
        with anyio.fail_after(60):
            await backend.aclose()  # kills the worker, which ends the endless dispatch
    with pytest.raises(BackendClosed):
        await later


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_gpus_per_worker": -1}, "num_gpus_per_worker must be"),
        ({"num_gpus_per_worker": "1"}, "num_gpus_per_worker must be"),
        ({"worker_env": {"A": 1}}, "worker_env must map str to str"),
        ({"worker_env": ["A=1"]}, "worker_env must map str to str"),
    ],
)
def test_worker_options_ray_would_refuse_are_refused_with_a_fix(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidProgram, match=message) as info:
        create_backend(workers=1, **options)
    assert str(info.value).rpartition("\n")[2].startswith("Fix: ")


# Traces ---------------------------------------------------------------------------------------


async def test_a_workers_span_is_a_child_of_the_callers_span(receiver: Receiver) -> None:
    exporter, _ = otel_sdk.install()  # the caller records its spans in memory
    backend = local_backend(
        workers=1,
        trace="otlp",
        worker_env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"},
    )
    try:
        exporter.clear()
        with trace.get_tracer("tests").start_as_current_span("request"):
            await backend.dispatch(XOR, [np.arange(64, dtype=np.uint32)] * 2)
        (caller,) = [s for s in exporter.get_finished_spans() if s.name == "vyre.dispatch"]
        import ray

        assert ray.get(backend.executor._members[0].handle.flush_telemetry.remote(), timeout=30)
        (remote,) = [span for span, _ in receiver.spans() if span.name == "vyre.dispatch"]
        assert remote.trace_id == caller.context.trace_id.to_bytes(16, "big")
        assert remote.parent_span_id == caller.context.span_id.to_bytes(8, "big")
    finally:
        await backend.aclose()


# Errors ---------------------------------------------------------------------------------------


def test_ray_errors_become_vyre_errors_with_a_fix() -> None:
    import ray.exceptions as rex

    from vyre_async import BackendError, DeviceOutOfMemory, DispatchFailed
    from vyre_ray.errors import translate

    own = InvalidProgram("bad input", fix="fix it")
    wrapped = rex.RayTaskError("run", "traceback", own)
    assert translate(wrapped, doing="x") is own  # a worker's own error: same class and code
    # What ref.future() really raises: a class derived from RayTaskError and the cause.
    dual = rex.RayTaskError("run", "traceback", own).as_instanceof_cause()
    assert isinstance(dual, InvalidProgram) and isinstance(dual, rex.RayTaskError)
    unwrapped = translate(dual, doing="x")
    assert type(unwrapped) is InvalidProgram and str(unwrapped).endswith("Fix: fix it")
    cases = [
        (rex.ObjectStoreFullError("store full"), DeviceOutOfMemory),
        (rex.ActorDiedError(), DeviceLost),
        (rex.GetTimeoutError("no answer"), DeviceLost),
        (rex.OutOfDiskError("disk full"), DeviceOutOfMemory),
        (rex.RayTaskError("run", "traceback", ValueError("boom")), DispatchFailed),
        (RuntimeError("anything else"), DispatchFailed),
    ]
    for exc, kind in cases:
        error = translate(exc, doing="running the dispatch")
        assert type(error) is kind, (exc, error)
        assert isinstance(error, BackendError) and error.__cause__ is exc
        assert "running the dispatch" in str(error)
        assert str(error).rpartition("\n")[2].startswith("Fix: ")
