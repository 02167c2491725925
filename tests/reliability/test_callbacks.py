"""Issue 26, defect 1: a done-callback can neither hang the dispatch machinery nor its waiters.

The reported hang: on the reference backend with its two workers, two dispatches
whose done-callbacks download their own buffer, then two more dispatches on those
buffers: both workers sat in callbacks waiting for work queued behind them. Done-
callbacks now run on the callback thread, after the waiters woke; these tests run
that case and its siblings (a callback that dispatches and waits, takes a result,
closes the backend), on the reference backend and on a backend whose completions
all come from one thread, as the CUDA backend's do.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import Launch, PendingDispatch, VyreBackend
from vyre_async._pending import wait_for_callbacks
from vyre_async.ir import (
    Access,
    BufferDecl,
    DType,
    Load,
    Program,
    Store,
    gid,
    u32,
)
from vyre_async.programs import elementwise_xor
from vyre_reference import ReferenceExecutor, reference_backend

N = 64
#: x[i] += 1
INC = Program(
    [BufferDecl("x", 0, Access.READ_WRITE, DType.U32)],
    N,
    [Store("x", gid(), Load("x", gid()) + u32(1))],
    op_id="test.inc",
)
BOUND_S = 20.0  # far beyond what the work takes; a hang shows as this passing


class GatedReference(ReferenceExecutor):
    """The reference backend whose workers take no job until ``gate`` is set.

    So the callbacks are added and the next dispatches queued while the first
    ones are certainly unsettled, however fast or loaded this machine is.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = threading.Event()

    def run_job(self, job: Any) -> None:
        self.gate.wait(BOUND_S)
        super().run_job(job)


def _settles(pending: PendingDispatch) -> list[np.ndarray]:
    return pending.result(timeout=BOUND_S)


def test_callbacks_that_download_their_own_buffers_do_not_hang_the_workers() -> None:
    backend = backend_of(GatedReference, inline_ns=0)  # its default: two workers
    x = backend.upload(np.zeros(N, np.uint32))
    y = backend.upload(np.zeros(N, np.uint32))
    seen: dict[str, list[int]] = {}
    done = threading.Event()

    def download(name: str, buffer: Any) -> Callable[[PendingDispatch], None]:
        def callback(_: PendingDispatch) -> None:
            seen[name] = backend.download(buffer).tolist()
            if len(seen) == 2:
                done.set()

        return callback

    ax = backend.dispatch(INC, [x])
    ax.add_done_callback(download("x", x))
    ay = backend.dispatch(INC, [y])
    ay.add_done_callback(download("y", y))
    later = [backend.dispatch(INC, [x]), backend.dispatch(INC, [y])]
    assert not (ax.done() or ay.done())  # (else the callbacks ran here, proving nothing)
    backend.executor.gate.set()
    _settles(ax)  # the awaiters of ax and ay are woken whatever the callbacks do
    _settles(ay)
    for pending in later:
        _settles(pending)
    assert done.wait(BOUND_S), "the callbacks' downloads never returned"
    assert set(seen) == {"x", "y"} and all(v[0] in (1, 2) for v in seen.values())
    assert backend.download(x).tolist() == [2] * N and backend.download(y).tolist() == [2] * N


@pytest.mark.parametrize("how", ["dispatch_sync", "result"])
def test_a_callback_may_dispatch_on_its_own_backend_and_wait(how: str) -> None:
    backend = reference_backend(inline_ns=0, max_workers=1)  # one worker: the worst case
    a = np.arange(N, dtype=np.uint32)
    got: queue.SimpleQueue[list[int]] = queue.SimpleQueue()

    def callback(_: PendingDispatch) -> None:
        if how == "dispatch_sync":
            (out,) = backend.dispatch_sync(elementwise_xor(N), [a, a])
        else:
            (out,) = backend.dispatch(elementwise_xor(N), [a, a]).result()
        got.put(out.tolist())

    first = backend.dispatch(elementwise_xor(N), [a, a])
    first.add_done_callback(callback)
    assert _settles(first)[0].tolist() == [0] * N
    assert got.get(timeout=BOUND_S) == [0] * N


def test_a_callback_may_close_its_backend_promptly_and_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = reference_backend(inline_ns=0, close_timeout=30.0)
    a = np.arange(N, dtype=np.uint32)
    closed = threading.Event()

    def close(_: PendingDispatch) -> None:
        started = time.monotonic()
        anyio.run(backend.aclose)
        closed.took = time.monotonic() - started  # type: ignore[attr-defined]
        closed.set()

    pending = backend.dispatch(elementwise_xor(N), [a, a])
    with caplog.at_level(logging.WARNING):
        pending.add_done_callback(close)
        assert _settles(pending)[0].tolist() == [0] * N
        assert closed.wait(BOUND_S)
    assert closed.took < 5.0  # type: ignore[attr-defined]  # not close_timeout (30 s)
    assert backend.closed
    assert not [r for r in caplog.records if "abandon" in r.getMessage()]


class OneThreadBackend(BytesBackend):
    """Every completion from one thread, in order, as the CUDA backend's bridge does."""

    id = "one-thread-test"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.work: queue.SimpleQueue[Launch | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._complete, daemon=True)
        self.thread.start()

    def enqueue(self, launch: Launch) -> None:
        launch.completer.mark_started()
        self.work.put(launch)

    def _complete(self) -> None:
        while (launch := self.work.get()) is not None:
            a, b = (np.asarray(i) for i in launch.inputs)
            launch.completer.resolve([a ^ b])

    async def close(self, timeout: float) -> None:
        self.work.put(None)
        self.thread.join(5)


def test_on_a_backend_with_one_completion_thread_a_callback_may_wait_on_a_later_dispatch() -> None:
    backend: VyreBackend = backend_of(OneThreadBackend)
    a = np.arange(N, dtype=np.uint32)
    got: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
    first = backend.dispatch(elementwise_xor(N), [a, a])
    first.add_done_callback(
        lambda _: got.put(backend.dispatch_sync(elementwise_xor(N), [a, a ^ 1])[0].tolist())
    )
    assert _settles(first)[0].tolist() == [0] * N
    assert got.get(timeout=BOUND_S) == [1] * N
    anyio.run(backend.aclose)


def test_wait_for_callbacks_waits_for_those_queued_and_refuses_inside_one() -> None:
    backend = reference_backend(inline_ns=0)
    a = np.arange(N, dtype=np.uint32)
    gate = threading.Event()
    inside: list[bool] = []

    def slow(_: PendingDispatch) -> None:
        inside.append(wait_for_callbacks(0.1))  # a callback cannot wait for those after it
        gate.wait(BOUND_S)

    pending = backend.dispatch(elementwise_xor(N), [a, a])
    pending.add_done_callback(slow)
    _settles(pending)
    assert not wait_for_callbacks(0.2)  # the slow callback still runs
    gate.set()
    assert wait_for_callbacks(BOUND_S)
    assert inside == [False]
    anyio.run(backend.aclose)


@pytest.mark.anyio
async def test_a_callback_added_to_a_settled_dispatch_never_runs_on_the_event_loop() -> None:
    # Found by the soak: a dispatch small enough to run inline is settled when
    # dispatch() returns; its callback ran in the caller's thread, inside the event
    # loop, where blocking on the backend is refused.
    backend = reference_backend()
    a = np.arange(N, dtype=np.uint32)
    pending = backend.dispatch(elementwise_xor(N), [a, a])
    assert pending.done()  # ran inline
    got: queue.SimpleQueue[object] = queue.SimpleQueue()

    def callback(_: PendingDispatch) -> None:
        try:
            got.put(
                (
                    threading.current_thread().name,
                    backend.dispatch_sync(elementwise_xor(N), [a, a])[0].tolist(),
                )
            )
        except BaseException as exc:
            got.put(exc)

    pending.add_done_callback(callback)
    answer = await anyio.to_thread.run_sync(lambda: got.get(timeout=BOUND_S))
    assert answer == ("vyre-callbacks", [0] * N)
    await backend.aclose()


def test_a_raising_excepthook_falls_back_to_stderr_and_the_callbacks_go_on(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # A broken error reporter must not take the callback thread down with it:
    # the callback's exception goes to stderr and the next callbacks still run.
    def broken_hook(args: threading.ExceptHookArgs) -> None:
        raise RuntimeError("the reporter is broken")

    monkeypatch.setattr(threading, "excepthook", broken_hook)
    backend = reference_backend(inline_ns=0)
    a = np.arange(N, dtype=np.uint32)
    ran: queue.SimpleQueue[str] = queue.SimpleQueue()

    def fails(_: PendingDispatch) -> None:
        raise ValueError("this callback fails on purpose")

    for _ in range(2):  # the second dispatch's callbacks find the thread still there
        pending = backend.dispatch(elementwise_xor(N), [a, a])
        pending.add_done_callback(fails)
        pending.add_done_callback(lambda _: ran.put(threading.current_thread().name))
        _settles(pending)
        assert ran.get(timeout=BOUND_S) == "vyre-callbacks"
    assert wait_for_callbacks(BOUND_S)
    err = capfd.readouterr().err
    assert err.count("ValueError: this callback fails on purpose") == 2
    anyio.run(backend.aclose)
