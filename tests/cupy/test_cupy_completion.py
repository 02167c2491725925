"""The completion bridge: one thread for every in-flight dispatch, ordered per stream, no spin."""

from __future__ import annotations

import threading
import time

import pytest

from vyre_cupy.completion import CompletionBridge


class FakeEvent:
    """A completion event the test sets by hand; ``ready`` counts how often it was polled."""

    def __init__(self, log: list[int] | None = None, tag: int = 0) -> None:
        self.done = threading.Event()
        self.polls = 0
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self.thread: str | None = None
        self.log = log
        self.tag = tag
        self.fail: BaseException | None = None

    def ready(self) -> bool:
        self.polls += 1
        if self.fail is not None and self.done.is_set():
            raise self.fail
        return self.done.is_set()

    def finish(self, error: BaseException | None) -> None:
        self.error = error
        self.thread = threading.current_thread().name
        if self.log is not None:
            self.log.append(self.tag)
        self.finished.set()


def test_thousands_in_flight_use_one_thread_and_finish_in_stream_order() -> None:
    def completion_threads() -> int:  # other tests' threads may come and go meanwhile
        return sum(t.name == "vyre-cupy-completion" for t in threading.enumerate())

    bridge = CompletionBridge()
    threads_before = completion_threads()
    log: list[int] = []
    events = [FakeEvent(log, i) for i in range(4000)]
    for i, event in enumerate(events):
        bridge.submit(event, queue=i % 8)
    assert completion_threads() == threads_before + 1
    assert bridge.in_flight == 4000
    # Complete in reverse submission order: each stream still finishes in its own order.
    for event in reversed(events):
        event.done.set()
    assert bridge.wait_idle(timeout=10)
    assert bridge.in_flight == 0
    assert sorted(log) == list(range(4000))
    for stream in range(8):
        mine = [t for t in log if t % 8 == stream]
        assert mine == sorted(mine)
    assert {e.thread for e in events} == {"vyre-cupy-completion"}
    bridge.close(timeout=5)
    assert not bridge.running


def test_only_stream_heads_are_polled() -> None:
    bridge = CompletionBridge()
    events = [FakeEvent() for _ in range(1000)]
    for event in events:
        bridge.submit(event, queue="stream")
    time.sleep(0.05)
    assert events[0].polls > 0
    assert sum(e.polls for e in events[1:]) == 0
    for event in events:
        event.done.set()
    assert bridge.wait_idle(timeout=10)
    bridge.close(timeout=5)


def test_waiting_on_a_long_kernel_is_not_a_busy_loop() -> None:
    bridge = CompletionBridge(max_sleep_s=2e-3)
    slow = FakeEvent()
    bridge.submit(slow, queue=0)
    start_cpu = time.process_time()
    time.sleep(0.5)
    polls = slow.polls
    # 0.5 s of a "running kernel": backoff caps polling near 1 / max_sleep_s = 500 per second.
    assert polls < 800, polls
    slow.done.set()
    assert slow.finished.wait(1)
    assert time.process_time() - start_cpu < 0.25
    bridge.close(timeout=5)


def test_idle_bridge_blocks_without_polling() -> None:
    bridge = CompletionBridge()
    event = FakeEvent()
    event.done.set()
    bridge.submit(event, queue=0)
    assert event.finished.wait(1)
    rounds = bridge.rounds
    time.sleep(0.2)
    assert bridge.rounds == rounds  # parked on a condition variable
    bridge.close(timeout=5)


def test_new_work_is_noticed_quickly_even_during_a_long_wait() -> None:
    bridge = CompletionBridge(max_sleep_s=0.05)
    slow = FakeEvent()
    bridge.submit(slow, queue=0)
    time.sleep(0.3)  # the bridge is in its longest sleeps now
    quick = FakeEvent()
    quick.done.set()
    start = time.monotonic()
    bridge.submit(quick, queue=1)
    assert quick.finished.wait(1)
    assert time.monotonic() - start < 0.03
    slow.done.set()
    assert bridge.wait_idle(1)
    bridge.close(timeout=5)


def test_device_errors_settle_the_watch_and_bugs_do_not_stop_the_bridge() -> None:
    bridge = CompletionBridge()
    failing = FakeEvent()
    failing.fail = RuntimeError("illegal address")
    failing.done.set()
    bridge.submit(failing, queue=0)
    assert failing.finished.wait(1)
    assert isinstance(failing.error, RuntimeError)

    class Buggy(FakeEvent):
        def finish(self, error: BaseException | None) -> None:
            raise ZeroDivisionError("bug")

    hooked: list[BaseException | None] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: hooked.append(args.exc_value)
    try:
        buggy = Buggy()
        buggy.done.set()
        after = FakeEvent()
        after.done.set()
        bridge.submit(buggy, queue=0)
        bridge.submit(after, queue=0)
        assert after.finished.wait(1)
        assert bridge.wait_idle(1)
    finally:
        threading.excepthook = old_hook
    assert len(hooked) == 1 and isinstance(hooked[0], ZeroDivisionError)
    bridge.close(timeout=5)


def test_close_refuses_new_work_after_in_flight_work_finishes() -> None:
    bridge = CompletionBridge()
    pending = FakeEvent()
    bridge.submit(pending, queue=0)
    closer = threading.Thread(target=bridge.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive() and not pending.finished.is_set()
    pending.done.set()
    closer.join(2)
    assert not closer.is_alive() and pending.finished.is_set()
    with pytest.raises(RuntimeError):
        bridge.submit(FakeEvent(), queue=0)


def test_on_start_runs_on_the_bridge_thread() -> None:
    seen: list[str] = []
    bridge = CompletionBridge(on_start=lambda: seen.append(threading.current_thread().name))
    event = FakeEvent()
    event.done.set()
    bridge.submit(event, queue=0)
    assert event.finished.wait(1)
    assert seen == ["vyre-cupy-completion"]
    bridge.close(timeout=5)
    with pytest.raises(ValueError):
        CompletionBridge(min_sleep_s=1.0, max_sleep_s=0.1)


def test_a_close_that_leaves_work_running_does_not_spin() -> None:
    """After close() gave up waiting, the thread still sleeps between polls of what runs."""
    bridge = CompletionBridge()
    event = FakeEvent()
    bridge.submit(event, queue=0)
    time.sleep(0.05)
    bridge.close(timeout=0.05)  # like a shutdown past close_timeout: the kernel still runs
    assert bridge.running
    rounds = bridge.rounds
    time.sleep(0.3)
    # Sleeping up to max_sleep_s (2 ms) between rounds: about 150 in 0.3 s, not 100 000s.
    assert bridge.rounds - rounds < 2_000
    event.done.set()
    assert event.finished.wait(5)
    deadline = time.monotonic() + 5
    while bridge.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not bridge.running  # it exits once the work ended


def test_events_can_be_taken_from_several_threads_at_once() -> None:
    """upload/download on worker threads take events while dispatches on the loop do."""
    import sys
    import types

    from vyre_cupy.context import DeviceContext

    class Event:
        pass

    cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(), Event=Event, get_elapsed_time=None
    )
    info = types.SimpleNamespace(attribute=lambda key, default: default, name="x", ordinal=0)
    ctx = DeviceContext(types.SimpleNamespace(cuda=cuda), info, streams=2)
    ctx.recycle([Event() for _ in range(4)])
    errors: list[BaseException] = []

    def take(n: int) -> None:
        try:
            for _ in range(20_000):
                events = ctx.events(n)
                assert len(events) == n
                if n == 4:
                    ctx.recycle(events)  # a launch's events come back; a download's stay
        except BaseException as exc:
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=take, args=(n,)) for n in (4, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
