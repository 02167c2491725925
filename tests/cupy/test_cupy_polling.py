"""Completion by polling: `CompletionBridge.poll`, quiet time, ``take_over``; inputs into staging.

The bridge tests use hand-made watches (no device). The backend tests run on the
fake CUDA device (``fake_cupy.py``), in its ``timed`` mode where a kernel
occupies the device timeline without a host thread, as on a GPU. No assertion
depends on how fast anything runs: quiet times and poll budgets are either a
minute (never reached) or zero, and "eventually" means within a generous bound.
"""

from __future__ import annotations

import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

import vyre_cupy.launch as cuda_launch
from tests.cupy.fake_cupy import FakeDevice
from vyre_async import DispatchConfig, VyreBackend
from vyre_async._pending import DispatchCompleter
from vyre_async.programs import elementwise_xor
from vyre_cupy import create_backend
from vyre_cupy.completion import CompletionBridge

pytestmark = pytest.mark.anyio

#: A quiet time (or poll budget) no test reaches.
NEVER_S = 60.0
#: How long "eventually" may take on a loaded machine.
EVENTUALLY_S = 5.0
BRIDGE_THREAD = "vyre-cupy-completion"

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


class Watch:
    """A unit of work whose ``ready`` the test controls; records every ``finish``."""

    def __init__(self, ready: bool = False, tag: int = 0) -> None:
        self.done = threading.Event()
        if ready:
            self.done.set()
        self.tag = tag
        self.finishes: list[str] = []  # the finishing threads' names
        self.finished = threading.Event()

    def ready(self) -> bool:
        return self.done.is_set()

    def finish(self, error: BaseException | None) -> None:
        self.finishes.append(threading.current_thread().name)
        self.finished.set()

    def abandon(self, error: BaseException) -> None:
        pass


@pytest.fixture
def bridge() -> Iterator[CompletionBridge]:
    bridge = CompletionBridge()
    yield bridge
    bridge.take_over()
    bridge.close(timeout=EVENTUALLY_S)
    assert not bridge.running


# CompletionBridge.poll --------------------------------------------------------------------


def test_poll_finishes_a_ready_head_once(bridge: CompletionBridge) -> None:
    watch = Watch(ready=True)
    bridge.submit(watch, queue=0, quiet_s=NEVER_S)  # the thread leaves it to the poller
    assert bridge.poll(watch, queue=0) is True
    assert watch.finishes == [threading.current_thread().name]  # finished by the caller
    assert bridge.polled == 1
    assert bridge.in_flight == 0
    assert bridge.poll(watch, queue=0) is False  # already finished
    assert watch.finishes == [threading.current_thread().name]
    assert bridge.polled == 1
    assert bridge.wait_idle(timeout=0)


def test_poll_leaves_a_watch_that_is_not_ready_or_not_the_head(bridge: CompletionBridge) -> None:
    first, second = Watch(), Watch(ready=True)
    bridge.submit(first, queue="s", quiet_s=NEVER_S)
    bridge.submit(second, queue="s", quiet_s=NEVER_S)
    assert bridge.poll(second, queue="s") is False  # ready, but behind `first`
    assert bridge.poll(first, queue="s") is False  # the head, not ready
    assert bridge.poll(second, queue="other") is False  # not on that queue
    assert bridge.poll(Watch(ready=True), queue="s") is False  # never submitted
    assert first.finishes == second.finishes == []
    assert (bridge.polled, bridge.in_flight) == (0, 2)
    first.done.set()
    assert bridge.poll(first, queue="s") is True
    assert bridge.poll(second, queue="s") is True  # the head now
    assert first.finishes == second.finishes == [threading.current_thread().name]
    assert (bridge.polled, bridge.in_flight) == (2, 0)


def test_pollers_racing_the_bridge_thread_finish_every_watch_exactly_once(
    bridge: CompletionBridge,
) -> None:
    watches = [Watch(tag=i) for i in range(2000)]
    queues = 8
    for i, watch in enumerate(watches):
        bridge.submit(watch, queue=i % queues)  # no quiet time: the thread polls too
    stop = threading.Event()
    start = threading.Barrier(5)

    def poller(offset: int) -> None:
        start.wait()
        order = watches[offset:] + watches[:offset]
        while not stop.is_set():
            for watch in order:
                bridge.poll(watch, queue=watch.tag % queues)

    def release() -> None:  # works end out of order; each queue still finishes in order
        start.wait()
        rng = np.random.default_rng(7)
        for n, i in enumerate(rng.permutation(len(watches))):
            watches[int(i)].done.set()
            if n % 50 == 0:
                threading.Event().wait(0)  # let the others run

    threads = [threading.Thread(target=poller, args=(k * 500,)) for k in range(4)]
    threads.append(threading.Thread(target=release))
    for thread in threads:
        thread.start()
    try:
        assert bridge.wait_idle(timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert [len(w.finishes) for w in watches] == [1] * len(watches)
    by_thread = sum(w.finishes == [BRIDGE_THREAD] for w in watches)
    assert bridge.polled + by_thread == len(watches)
    assert bridge.in_flight == 0


class SlowWatch(Watch):
    """A ready watch whose ``finish`` blocks until the test lets it go; logs its tag."""

    def __init__(self, log: list[int], tag: int) -> None:
        super().__init__(ready=True, tag=tag)
        self.log = log
        self.entered = threading.Event()
        self.release = threading.Event()

    def finish(self, error: BaseException | None) -> None:
        self.entered.set()
        assert self.release.wait(EVENTUALLY_S)
        self.log.append(self.tag)
        super().finish(error)


class LoggedWatch(Watch):
    """A ready watch that logs its tag when finished."""

    def __init__(self, log: list[int], tag: int) -> None:
        super().__init__(ready=True, tag=tag)
        self.log = log

    def finish(self, error: BaseException | None) -> None:
        self.log.append(self.tag)
        super().finish(error)


def _stream_of_two() -> tuple[list[int], SlowWatch, LoggedWatch]:
    """Two ready watches for one stream, the first slow to finish, and their finishing log."""
    log: list[int] = []
    return log, SlowWatch(log, 1), LoggedWatch(log, 2)


def test_a_poll_does_not_finish_a_watch_while_the_thread_finishes_the_one_before(
    bridge: CompletionBridge,
) -> None:
    log, first, second = _stream_of_two()
    bridge.submit(first, queue="s")  # no quiet time: the thread takes `first` at once
    bridge.submit(second, queue="s")
    assert first.entered.wait(EVENTUALLY_S)  # the thread is inside first.finish
    assert bridge.poll(second, queue="s") is False  # not before `first` has finished
    assert bridge.poll(first, queue="s") is False  # claimed already
    assert second.finishes == []
    first.release.set()
    assert bridge.wait_idle(EVENTUALLY_S)
    assert log == [1, 2]
    assert first.finishes == [BRIDGE_THREAD]
    assert len(second.finishes) == 1


def test_the_thread_does_not_finish_a_watch_while_a_poll_finishes_the_one_before() -> None:
    # A bridge that, once it found nothing to do, sleeps for a minute unless woken.
    bridge = CompletionBridge(spin_s=0.0, min_sleep_s=NEVER_S, max_sleep_s=NEVER_S)
    try:
        log, first, second = _stream_of_two()
        bridge.submit(first, queue="s", quiet_s=NEVER_S)  # left to the poller
        bridge.submit(second, queue="s", quiet_s=NEVER_S)
        polled: list[bool] = []
        poller = threading.Thread(target=lambda: polled.append(bridge.poll(first, queue="s")))
        poller.start()
        assert first.entered.wait(EVENTUALLY_S)  # the poller is inside first.finish
        assert bridge.abandon(RuntimeError("lost")) == 1  # `first` is left to its finish
        rounds = bridge.rounds
        bridge.take_over()  # the loop gave up on `second`: the thread polls what it may take
        deadline = time.monotonic() + EVENTUALLY_S
        while bridge.rounds == rounds and time.monotonic() < deadline:
            time.sleep(0.001)
        assert bridge.rounds > rounds  # it looked, and kept off `second` behind the claim
        assert second.finishes == []
        first.release.set()
        poller.join(EVENTUALLY_S)
        assert polled == [True]
        # Letting go of the claim wakes the thread (else it would sleep its minute).
        assert second.finished.wait(EVENTUALLY_S)
        assert log == [1, 2]
        assert first.finishes == [poller.name]
        assert second.finishes == [BRIDGE_THREAD]
        assert bridge.wait_idle(EVENTUALLY_S)
    finally:
        bridge.close(timeout=EVENTUALLY_S)
    assert not bridge.running


class ExitingWatch(Watch):
    """A ready watch whose ``finish`` (a done-callback, say) raises SystemExit."""

    def __init__(self) -> None:
        super().__init__(ready=True)

    def finish(self, error: BaseException | None) -> None:
        super().finish(error)
        raise SystemExit(3)


def test_a_poll_whose_finish_raises_systemexit_lets_its_stream_move_on(
    bridge: CompletionBridge,
) -> None:
    first, second = ExitingWatch(), Watch(ready=True)
    bridge.submit(first, queue="s", quiet_s=NEVER_S)
    bridge.submit(second, queue="s", quiet_s=NEVER_S)
    with pytest.raises(SystemExit):  # the loop's own: it reaches the caller
        bridge.poll(first, queue="s")
    assert bridge.in_flight == 1
    assert bridge.poll(second, queue="s") is True  # not stuck behind a claim
    assert bridge.in_flight == 0


def test_a_finish_raising_systemexit_on_the_thread_is_reported_and_the_bridge_goes_on(
    bridge: CompletionBridge, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports: list[type[BaseException] | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reports.append(args.exc_type))
    first, second = ExitingWatch(), Watch(ready=True)
    bridge.submit(first, queue="s")
    bridge.submit(second, queue="s")
    assert second.finished.wait(EVENTUALLY_S)
    assert first.finishes == second.finishes == [BRIDGE_THREAD]
    assert reports == [SystemExit]
    assert bridge.running
    assert bridge.wait_idle(EVENTUALLY_S)


# Quiet time and take_over -----------------------------------------------------------------


def _lingering(bridge: CompletionBridge) -> None:
    """Let the bridge thread finish a watch, so that it now lingers (not parked, not busy)."""
    warm = Watch(ready=True)
    bridge.submit(warm, queue=0)
    assert warm.finished.wait(EVENTUALLY_S)
    assert bridge.wait_idle(EVENTUALLY_S)
    assert bridge.running


def test_quiet_work_is_left_to_the_poller(bridge: CompletionBridge) -> None:
    _lingering(bridge)
    watch = Watch(ready=True)  # done at once: only the quiet time keeps the thread off it
    bridge.submit(watch, queue=1, quiet_s=NEVER_S)
    threading.Event().wait(0.05)  # the lingering thread looks every IDLE_SLICE_S meanwhile
    assert watch.finishes == []
    assert bridge.poll(watch, queue=1) is True
    assert watch.finishes == [threading.current_thread().name]
    assert bridge.polled == 1


def test_quiet_work_nobody_polls_is_finished_by_the_thread(bridge: CompletionBridge) -> None:
    _lingering(bridge)
    watch = Watch(ready=True)
    bridge.submit(watch, queue=1, quiet_s=0.05)
    assert watch.finished.wait(EVENTUALLY_S)
    assert watch.finishes == [BRIDGE_THREAD]
    assert bridge.polled == 0


@pytest.mark.parametrize("state", ["fresh", "lingering"])
def test_take_over_ends_the_quiet_time(bridge: CompletionBridge, state: str) -> None:
    if state == "lingering":
        _lingering(bridge)
    watch = Watch(ready=True)
    bridge.submit(watch, queue=1, quiet_s=NEVER_S)
    bridge.take_over()  # the poller gave up: the thread must not wait out the minute
    assert watch.finished.wait(EVENTUALLY_S)
    assert watch.finishes == [BRIDGE_THREAD]
    assert bridge.polled == 0


# On the fake CUDA device ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(fake: FakeDevice) -> Iterator[VyreBackend]:
    backend = create_backend(disk_cache=None)
    yield backend
    anyio.run(backend.shutdown)


@pytest.fixture
def timed(fake: FakeDevice, backend: VyreBackend) -> Iterator[FakeDevice]:
    """The device in timed mode: each kernel occupies 2 ms of the device timeline."""
    assert backend.executor.device_context.bridge.wait_idle(EVENTUALLY_S)
    fake.timed, fake.kernel_s = True, 0.002
    try:
        yield fake
    finally:
        fake.timed, fake.kernel_s = False, 0.0
        bridge = backend.executor.device_context.bridge
        bridge.take_over()  # no quiet time left over for the next test
        assert bridge.wait_idle(EVENTUALLY_S)


def xor_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(n, dtype=np.uint32) * np.uint32(2654435761)
    return a, np.arange(n, dtype=np.uint32) + np.uint32(12345)


async def idle(backend: VyreBackend) -> None:
    """Wait (off the loop) until nothing is in flight on the bridge."""
    bridge = backend.executor.device_context.bridge
    assert await anyio.to_thread.run_sync(bridge.wait_idle, EVENTUALLY_S)


@asyncio_only
async def test_an_awaited_dispatch_is_finished_by_the_awaiting_loops_poll(
    backend: VyreBackend, timed: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget far longer than the 2 ms kernel: the loop polls until the event fires
    # (the default 200 us would be spent before a 2 ms kernel ends).
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", NEVER_S)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    bridge = backend.executor.device_context.bridge
    await backend.dispatch(program, [a, b])  # compiled and warm
    await idle(backend)
    polled, launches = bridge.polled, timed.launches
    with anyio.fail_after(EVENTUALLY_S):  # the bridge would wait out its minute
        outputs = await backend.dispatch(program, [a, b])
    assert timed.launches == launches + 1
    assert bridge.polled == polled + 1
    assert outputs[0].tolist() == (a ^ b).tolist()


async def test_without_a_poll_budget_the_bridge_finishes_the_dispatch(
    backend: VyreBackend, timed: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", 0.0)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    bridge = backend.executor.device_context.bridge
    await backend.dispatch(program, [a, b])
    await idle(backend)
    polled, launches = bridge.polled, timed.launches
    with anyio.fail_after(EVENTUALLY_S):
        outputs = await backend.dispatch(program, [a, b])
    assert timed.launches == launches + 1
    assert bridge.polled == polled  # the completion thread finished it
    assert outputs[0].tolist() == (a ^ b).tolist()


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_dispatch_awaited_from_trio_goes_to_the_bridge_at_once(
    backend: VyreBackend, timed: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trio tasks do not poll: their launches must not be left to a poll that never comes."""
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", NEVER_S)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    bridge = backend.executor.device_context.bridge
    await backend.dispatch(program, [a, b])
    await idle(backend)
    polled = bridge.polled
    with anyio.fail_after(EVENTUALLY_S):  # a quiet minute would outlast this
        outputs = await backend.dispatch(program, [a, b])
    assert bridge.polled == polled
    assert outputs[0].tolist() == (a ^ b).tolist()


def test_a_dispatch_from_a_plain_thread_goes_to_the_bridge_at_once(
    backend: VyreBackend, timed: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", NEVER_S)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    backend.dispatch(program, [a, b]).result(timeout=EVENTUALLY_S)
    assert backend.executor.device_context.bridge.wait_idle(EVENTUALLY_S)
    pending = backend.dispatch(program, [a, b])
    # Finished by the bridge, not left quiet for a minute (done() alone never waits).
    assert backend.executor.device_context.bridge.wait_idle(EVENTUALLY_S)
    assert pending.done()
    assert pending.result(timeout=0)[0].tolist() == (a ^ b).tolist()


async def test_dispatches_under_the_default_budget_are_correct_whoever_finishes_them(
    backend: VyreBackend, timed: FakeDevice
) -> None:
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    for _ in range(5):
        with anyio.fail_after(EVENTUALLY_S):
            outputs = await backend.dispatch(program, [a, b])
        assert outputs[0].tolist() == (a ^ b).tolist()


class Handoffs:
    """Each launch's handoff: what the bridge was given and what the awaiting loop may poll."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, bridge: CompletionBridge) -> None:
        self.submits: list[dict[str, Any]] = []
        self.polls: list[dict[str, Any]] = []
        submit, poll_with = bridge.submit, DispatchCompleter.poll_with

        def spy_submit(watch: Any, *, queue: int, quiet_s: float = 0.0) -> None:
            self.submits.append(
                {"stream": watch.stream, "queue": queue, "quiet_s": quiet_s, "ends": watch.ends}
            )
            submit(watch, queue=queue, quiet_s=quiet_s)

        def spy_poll_with(completer: DispatchCompleter, check: Any, **kwargs: Any) -> None:
            self.polls.append(kwargs)
            poll_with(completer, check, **kwargs)

        monkeypatch.setattr(bridge, "submit", spy_submit)
        monkeypatch.setattr(DispatchCompleter, "poll_with", spy_poll_with)


@asyncio_only
async def test_an_asyncio_dispatch_is_left_to_its_loop_for_the_poll_budget(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop polls for the budget (then hands over to the bridge), the bridge stays quiet
    as long, and the launch learns its shape's end (any budget, however short)."""
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", 0.25)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    await backend.dispatch(program, [a, b])
    bridge = backend.executor.device_context.bridge
    handoffs = Handoffs(monkeypatch, bridge)
    with anyio.fail_after(EVENTUALLY_S):
        outputs = await backend.dispatch(program, [a, b])
    assert outputs[0].tolist() == (a ^ b).tolist()
    (submit,) = handoffs.submits
    assert submit["quiet_s"] == 0.25 and submit["queue"] == submit["stream"]
    assert submit["ends"] is not None  # the shape's KernelLayout.ends: it learns
    assert handoffs.polls == [{"budget_s": 0.25, "give_up": bridge.take_over}]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_trio_dispatch_is_handed_to_the_bridge_with_no_quiet_time(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", NEVER_S)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    await backend.dispatch(program, [a, b])
    handoffs = Handoffs(monkeypatch, backend.executor.device_context.bridge)
    with anyio.fail_after(EVENTUALLY_S):
        await backend.dispatch(program, [a, b])
    assert [(h["quiet_s"], h["ends"]) for h in handoffs.submits] == [(0.0, None)]
    assert handoffs.polls == []  # nobody would poll: nothing to give up either


def test_a_thread_dispatch_is_handed_to_the_bridge_with_no_quiet_time(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work dispatched from a thread and not waited on (callbacks, ``done()``) is the bridge's
    at once: a quiet window would hold its callbacks back for nobody's poll."""
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", NEVER_S)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    backend.dispatch(program, [a, b]).result(timeout=EVENTUALLY_S)
    handoffs = Handoffs(monkeypatch, backend.executor.device_context.bridge)
    settled = threading.Event()
    pending = backend.dispatch(program, [a, b])
    pending.add_done_callback(lambda _: settled.set())
    assert settled.wait(EVENTUALLY_S)
    assert [(h["quiet_s"], h["ends"]) for h in handoffs.submits] == [(0.0, None)]
    assert handoffs.polls == []


# Inputs of any shape go straight into pinned staging ---------------------------------------


def strided(a: np.ndarray) -> np.ndarray:
    """``a``'s values as a view with a stride of two elements."""
    wide = np.zeros(2 * a.size, dtype=a.dtype)
    wide[::2] = a
    return wide[::2]


@pytest.mark.parametrize(
    "shape",
    ["2-d", "strided", "fortran-order", "strided-2-d"],
)
async def test_inputs_of_any_shape_and_strides_give_the_flat_result(
    backend: VyreBackend, shape: str
) -> None:
    assert backend.executor.copies_inputs  # the driver hands over the caller's arrays
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    expected = await backend.dispatch(program, [a, b])
    assert expected[0].tolist() == (a ^ b).tolist()
    if shape == "2-d":
        x, y = a.reshape(8, 8), b.reshape(8, 8)
    elif shape == "strided":
        x, y = strided(a), strided(b)
        assert not x.flags.c_contiguous
    elif shape == "fortran-order":  # the same values in C order, laid out by columns
        x, y = np.asfortranarray(a.reshape(8, 8)), np.asfortranarray(b.reshape(8, 8))
        assert not x.flags.c_contiguous
    else:
        x, y = strided(a).reshape(8, 8), strided(b).reshape(8, 8)
    outputs = await backend.dispatch(program, [x, y])
    assert outputs[0].tolist() == expected[0].tolist()


async def test_a_strided_and_a_reversed_view_match_their_flat_copies(backend: VyreBackend) -> None:
    program = elementwise_xor(64)
    view = np.arange(128, dtype=np.uint32)[::2]
    other = np.arange(64, dtype=np.uint32)[::-1]  # negative stride
    flat = await backend.dispatch(program, [np.ascontiguousarray(view), other.copy()])
    outputs = await backend.dispatch(program, [view, other])
    assert outputs[0].tolist() == flat[0].tolist() == (view ^ other).tolist()


@pytest.mark.parametrize("shape", ["flat", "2-d", "strided"])
async def test_mutating_the_inputs_after_dispatch_does_not_change_the_result(
    backend: VyreBackend, shape: str
) -> None:
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    expected = (a ^ b).tolist()
    if shape == "2-d":
        x, y = a.reshape(8, 8).copy(), b.reshape(8, 8).copy()
    elif shape == "strided":
        x, y = strided(a), strided(b)
    else:
        x, y = a.copy(), b.copy()
    pending = backend.dispatch(program, [x, y])
    x[...] = 0  # the caller reuses its arrays at once
    y[...] = 0xFFFFFFFF
    outputs = await pending
    assert outputs[0].tolist() == expected


class _TimedWatch:
    """Ready at a given time; records when it was finished."""

    def __init__(self, ready_in_s: float) -> None:
        self.ready_at = time.monotonic() + ready_in_s
        self.finished_at: float | None = None

    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def finish(self, error: BaseException | None) -> None:
        self.finished_at = time.monotonic()

    def abandon(self, error: BaseException) -> None:
        pass


def test_quiet_work_nobody_polls_is_not_starved_by_polled_work_coming_after_it(
    bridge: CompletionBridge,
) -> None:
    """A stream of polled submissions must not keep postponing a quiet window forever."""
    warm = _TimedWatch(0.0)
    bridge.submit(warm, queue="warm")
    assert bridge.wait_idle(EVENTUALLY_S)
    quiet_s = 0.05
    nobody_polls = _TimedWatch(0.0)
    started = time.monotonic()
    bridge.submit(nobody_polls, queue=0, quiet_s=quiet_s)
    while nobody_polls.finished_at is None and time.monotonic() - started < 1.0:
        polled = _TimedWatch(0.0)  # awaited and polled by its own loop, every ~1 ms
        bridge.submit(polled, queue=1, quiet_s=quiet_s)
        while polled.finished_at is None and not bridge.poll(polled, queue=1):
            time.sleep(0)
        time.sleep(0.001)
    # Finished by the thread while the polled submissions still came (one window
    # plus the thread's idle slice, far under the second they kept coming for).
    assert nobody_polls.finished_at is not None
    assert nobody_polls.finished_at - started < 0.5


async def test_a_small_shape_reuses_its_staging_and_never_mixes_inputs(
    backend: VyreBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finished launches hand their arena and pinned staging to the next of the shape."""
    ctx = backend.executor.device_context
    allocations: list[int] = []
    alloc = ctx.alloc

    def counted(nbytes: int, stream: object) -> object:
        allocations.append(nbytes)
        return alloc(nbytes, stream)

    monkeypatch.setattr(ctx, "alloc", counted)
    program = elementwise_xor(96)
    rng = np.random.default_rng(7)
    for _ in range(20):  # awaited one by one: each finds the last one's staging free
        a = rng.integers(0, 2**32, 96, dtype=np.uint32)
        b = rng.integers(0, 2**32, 96, dtype=np.uint32)
        outputs = await backend.dispatch(program, [a, b])
        assert outputs[0].tolist() == (a ^ b).tolist()  # no input of an earlier launch
    assert len(allocations) <= cuda_launch.SPARE_PER_SHAPE + 1
    big = cuda_launch.SPARE_ARENA_BYTES // 4 + 1024  # over the limit: never kept
    program = elementwise_xor(big)
    a, b = np.ones(big, dtype=np.uint32), np.arange(big, dtype=np.uint32)
    before = len(allocations)
    for _ in range(3):
        outputs = await backend.dispatch(program, [a, b])
        assert outputs[0].tolist() == (a ^ b).tolist()
    assert len(allocations) - before == 3


# Hybrid polling: spin when the shape's previous launch ended about now -----------------------


class Countdown:
    """A completion event that fires on its ``after + 1``-th query (or raises ``error``)."""

    def __init__(self, after: int, error: BaseException | None = None) -> None:
        self.after = after
        self.queries = 0
        self.error = error

    @property
    def done(self) -> bool:
        self.queries += 1
        if self.error is not None:
            raise self.error
        return self.queries > self.after


class ClaimingBridge:
    """Stands in for the completion bridge: records each claim (its ``ready`` flag)."""

    def __init__(self, in_flight: int = 1) -> None:
        self.in_flight = in_flight
        self.claims: list[bool] = []
        self.queues: list[int] = []

    def poll(self, watch: object, *, queue: int, ready: bool = False) -> bool:
        self.claims.append(ready)
        self.queues.append(queue)
        return True


def spin_flight(
    event: Countdown, ends: list[float] | None, bridge: ClaimingBridge, stream: int = 0
) -> cuda_launch.Flight:
    ctx: Any = types.SimpleNamespace(bridge=bridge)
    return cuda_launch.Flight(
        ctx, (), (), stream=stream, keep=(), readback=None, events=[None] * 3 + [event], ends=ends
    )


def test_a_poll_spins_until_the_end_when_the_shapes_last_launch_ended_about_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cuda_launch, "SPIN_MAX_S", NEVER_S)  # bounded by the event, not time
    ends = [0.0, NEVER_S]  # the last launch ended within a minute of its enqueue
    event, bridge = Countdown(after=50), ClaimingBridge()
    flight = spin_flight(event, ends, bridge)
    assert flight.poll() is True  # one poll saw the end: it kept querying
    assert event.queries == 51
    assert bridge.claims == [True]  # claimed as ready, without asking the event again
    assert 0.0 < ends[0] <= ends[1] < NEVER_S  # learnt: when this launch was seen to end


@pytest.mark.parametrize(
    ("ends", "in_flight"),
    [
        ([0.0, 0.0], 1),  # no launch of the shape seen yet
        ([30.0, 31.0], 1),  # the last one ended half a minute in: not now
        ([0.0, NEVER_S], 2),  # other work in flight: the loop has better to do
    ],
    ids=["no-history", "not-due", "others-in-flight"],
)
def test_a_poll_does_not_spin_otherwise(
    monkeypatch: pytest.MonkeyPatch, ends: list[float], in_flight: int
) -> None:
    monkeypatch.setattr(cuda_launch, "SPIN_MAX_S", NEVER_S)
    event, bridge = Countdown(after=50), ClaimingBridge(in_flight)
    before = list(ends)
    flight = spin_flight(event, ends, bridge)
    assert flight.poll() is False
    assert event.queries == 1
    assert bridge.claims == []
    assert ends == before
    assert flight.waited > 0.0  # its "not yet", for what it learns when it ends


def test_a_spin_is_bounded_by_spin_max() -> None:
    ends = [0.0, NEVER_S]
    event, bridge = Countdown(after=10**12), ClaimingBridge()
    flight = spin_flight(event, ends, bridge)
    started = time.perf_counter()
    assert flight.poll() is False
    assert time.perf_counter() - started < EVENTUALLY_S  # (SPIN_MAX_S is 10 us)
    assert event.queries > 1
    assert ends == [0.0, NEVER_S] and bridge.claims == []


def test_a_plain_ready_poll_learns_when_the_launch_ended() -> None:
    ends = [0.0, 0.0]
    event, bridge = Countdown(after=0), ClaimingBridge()
    flight = spin_flight(event, ends, bridge)
    assert flight.poll() is True
    assert event.queries == 1 and bridge.claims == [True]
    assert ends[0] == 0.0 and 0.0 < ends[1] < EVENTUALLY_S


def test_a_flight_nobody_polls_neither_spins_nor_learns() -> None:
    event, bridge = Countdown(after=0), ClaimingBridge()
    flight = spin_flight(event, None, bridge)
    assert flight.poll() is True
    assert flight.launched == 0.0 and flight.waited == 0.0


def test_a_device_error_in_the_poll_goes_to_the_bridge_to_settle() -> None:
    event, bridge = Countdown(after=0, error=RuntimeError("sticky")), ClaimingBridge()
    flight = spin_flight(event, [0.0, NEVER_S], bridge, stream=3)
    assert flight.poll() is True
    assert bridge.claims == [False]  # the bridge asks the event again and settles with it
    assert bridge.queues == [3]  # on the flight's own stream, behind its earlier work


class Clock:
    """``time.perf_counter`` for the hybrid poll: each reading moves on by ``step`` seconds.

    Every value is a binary fraction, so the poll's window edges are met exactly.
    """

    def __init__(self, now: float, step: float = 0.125) -> None:
        self.now, self.step = now, step

    def perf_counter(self) -> float:
        now = self.now
        self.now += self.step
        return now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The launch module's clock, and a window of lo - 0.25 s to hi + 0.25 s, spins up to 8 s."""
    clock = Clock(10.0)
    fake_time = types.SimpleNamespace(
        perf_counter=clock.perf_counter, monotonic=time.monotonic, time_ns=time.time_ns
    )
    monkeypatch.setattr(cuda_launch, "time", fake_time)
    monkeypatch.setattr(cuda_launch, "SPIN_MARGIN_S", 0.25)
    monkeypatch.setattr(cuda_launch, "SPIN_MAX_S", 8.0)
    return clock


# (seconds since the launch at the first "not yet", the shape's last end) -> queries made
SPIN_WINDOW = [
    pytest.param(0.5, [1.0, 2.0], 1, id="before-the-window"),
    pytest.param(0.75, [1.0, 2.0], 13, id="at-its-start"),  # 0.75 .. 2.25 by 0.125: 12 more
    pytest.param(1.5, [1.0, 2.0], 7, id="inside"),
    pytest.param(2.25, [1.0, 2.0], 1, id="at-its-end"),  # due, but the spin ends there
    pytest.param(2.375, [1.0, 2.0], 1, id="after-it"),
    pytest.param(0.125, [0.0, 0.0], 1, id="no-end-seen-yet"),
    pytest.param(0.125, [0.0, 0.125], 3, id="a-short-end"),  # to 0.375: 2 more
]


@pytest.mark.parametrize(("since", "ends", "queries"), SPIN_WINDOW)
def test_a_poll_spins_exactly_within_the_window_of_the_shapes_last_end(
    clock: Clock, since: float, ends: list[float], queries: int
) -> None:
    """A "not yet" spins only from ``lo - margin`` to ``hi + margin`` after the launch, and
    stops at ``launched + hi + margin``: an event that never fires costs the window, no more."""
    event, bridge = Countdown(after=10**6), ClaimingBridge()
    flight = spin_flight(event, list(ends), bridge)  # launched at 10.0
    clock.now = 10.0 + since
    assert flight.poll() is False
    assert event.queries == queries
    assert bridge.claims == []
    spun_to = since + 0.125 * (queries - 1)
    assert flight.waited == spun_to  # what it learns from, when it ends


def test_an_end_seen_while_spinning_is_claimed_and_taught(clock: Clock) -> None:
    event, bridge = Countdown(after=4), ClaimingBridge()
    ends = [1.0, 2.0]
    flight = spin_flight(event, ends, bridge)
    clock.now = 11.5
    assert flight.poll() is True
    assert event.queries == 5 and bridge.claims == [True]
    # last "not yet" at 1.875 s; the end seen at the next reading, 2.0 s
    assert ends == [1.875, 2.0]


def test_a_spin_stops_at_spin_max(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_launch, "SPIN_MAX_S", 0.5)
    event, bridge = Countdown(after=10**6), ClaimingBridge()
    flight = spin_flight(event, [1.0, 2.0], bridge)
    clock.now = 10.75
    assert flight.poll() is False
    assert event.queries == 5  # 0.75 .. 1.25 by 0.125


@asyncio_only
async def test_awaited_launches_teach_their_shape_when_they_end(
    backend: VyreBackend, timed: FakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cuda_launch, "POLL_BUDGET_S", NEVER_S)
    program = elementwise_xor(64)
    a, b = xor_inputs(64)
    await backend.dispatch(program, [a, b])
    await idle(backend)
    pipeline, _ = backend.store.lookup(program, DispatchConfig())
    (template,) = [t for t in pipeline.native.templates.values() if set(t.counts) == {64}]
    for _ in range(3):
        with anyio.fail_after(EVENTUALLY_S):
            outputs = await backend.dispatch(program, [a, b])
        assert outputs[0].tolist() == (a ^ b).tolist()
        lo, hi = template.ends
        # A 2 ms kernel (its time counts from its launch, just before the flight's
        # enqueue time is taken): seen ended after most of it. (When it was last seen
        # running depends on how often a loaded machine let the loop poll.)
        assert 0.0 <= lo <= hi and hi >= 0.5 * timed.kernel_s
