"""What the reference backend tells a user, and does, on its dispatch paths.

Found by mutation testing (issue 28): no test read these messages or pinned
these behaviours. An engine failure that is not the engine's own error settles
the dispatch with `DispatchFailed` (or `DeviceOutOfMemory` for a `MemoryError`)
naming the program, with the original exception as its cause, on both of the
backend's paths (a tiny dispatch run inline on the caller's thread, a larger
one on the worker pool); so does a failure while settling it. A close that
gives up on a dispatch stuck outside the engine's safe points fails it with
`BackendClosed` and logs one warning saying how many and after how long (a
close that stops everything logs nothing: test_lifecycle_mutants).

The dispatch paths: which thread runs a dispatch (``inline_ns``, 0 included),
fixpoint iterations, a `Launch` without a template, the lane limit and its
message, the device and compile times and the ``vyre.wait``/``vyre.launch``
phases a recorded dispatch shows (none when nothing records it), a timeout
stopping a dispatch inline or on a worker (which is then free), a close
stopping a dispatch that waits for an earlier one or is still queued, a close
landing while a dispatch is planned, and a worker thread that cannot start.
Resident buffers: dispatches sharing one wait for exactly the earlier users
they must (a tiny one that need not wait runs inline at once; one bound twice,
written once, is a writer), a dispatch's buffers are final before it settles,
`download` waits for the last writer (and ends when the backend closes) and
returns a copy, `download`/`free` refuse what is not a buffer, labels, an
allocation the host cannot hold, and freeing a buffer keeping nothing of it.
Programs named ``test.slow*`` can be held at the engine's door
(`_gate_slow_programs`) to order these deterministically.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import vyre_reference.backend as backend_module
from tests import otel_sdk
from tests.helpers import backend_of
from vyre_async import (
    BackendClosed,
    DeviceOutOfMemory,
    DispatchConfig,
    DispatchFailed,
    DispatchTimeout,
    InvalidProgram,
    Launch,
    PendingDispatch,
    telemetry,
)
from vyre_async._pending import settle_hook
from vyre_async._plan import BindingPlan
from vyre_async._resident import ResidentBuffer
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
    gid,
    u32,
)
from vyre_reference import ReferenceExecutor, reference_backend
from vyre_reference.engine import run_plan

pytestmark = pytest.mark.anyio


def _copy(op_id: str, n: int) -> Program:
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, n),
        ],
        (64, 1, 1),
        [Store("out", gid(0), Load("a", gid(0)))],
        op_id=op_id,
    )


def _stick_the_engine(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make the engine block, outside its safe points, until ``release`` (30 s at most).

    Returns ``(started, release)``: set when a dispatch entered it, and to let it
    end (it then raises).
    """
    started, release = threading.Event(), threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> Any:
        started.set()
        release.wait(30)  # never checks the cancel event
        raise RuntimeError("released")

    monkeypatch.setattr(backend_module, "run_plan", stuck)
    return started, release


# 4 elements run inline (tiny), 1 << 16 on the worker pool
SIZES = [pytest.param(4, id="inline"), pytest.param(1 << 16, id="pool")]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(("op_id", "named"), [("test.copy", "test.copy"), ("", "a program")])
async def test_an_engine_failure_names_the_program_and_keeps_its_cause(
    monkeypatch: pytest.MonkeyPatch, n: int, op_id: str, named: str
) -> None:
    boom = ValueError("boom")

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise boom

    monkeypatch.setattr(backend_module, "run_plan", failing)
    async with reference_backend() as backend:
        with pytest.raises(DispatchFailed) as info:
            await backend.dispatch(_copy(op_id, n), [np.arange(n, dtype=np.uint32)])
    error = info.value
    assert str(error).startswith(f"the reference engine failed on {named}: ValueError: boom")
    assert str(error).endswith(
        "\nFix: this is a bug in vyre_reference; report it with the program's wire bytes"
    )
    assert error.__cause__ is boom


@pytest.mark.parametrize("n", SIZES)
async def test_the_engine_running_out_of_memory_is_device_out_of_memory(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    def short(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(backend_module, "run_plan", short)
    async with reference_backend() as backend:
        with pytest.raises(DeviceOutOfMemory) as info:
            await backend.dispatch(_copy("test.copy", n), [np.arange(n, dtype=np.uint32)])
    assert str(info.value).startswith(
        f"the host ran out of memory running test.copy over {max(n, 64)} lanes (more memory needed)"
    )
    assert isinstance(info.value.__cause__, MemoryError)


async def test_a_close_that_gives_up_fails_the_dispatch_and_logs_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    started, release = _stick_the_engine(monkeypatch)
    caplog.set_level(logging.WARNING, logger="vyre_reference")
    backend = reference_backend(close_timeout=0.2)
    try:
        pending = backend.dispatch(
            _copy("test.stuck", 1 << 16), [np.arange(1 << 16, dtype=np.uint32)]
        )
        assert started.wait(10)
        await backend.aclose()
        with pytest.raises(BackendClosed) as info:
            await pending
        assert str(info.value).startswith("dispatch test.stuck was stopped: ")
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            "reference backend closed with 1 dispatch(es) still running after 0.2 s; "
            "they were failed with BackendClosed and their daemon threads abandoned"
        ]
    finally:
        release.set()


async def test_a_dispatch_that_ends_just_after_the_close_gave_up_still_gets_the_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The close fails the stuck dispatch first, then warns: the warning is owed to
    # every dispatch it gave up on, even one whose thread ends right after.
    started, release = _stick_the_engine(monkeypatch)
    caplog.set_level(logging.WARNING, logger="vyre_reference")
    backend = reference_backend(close_timeout=0.2)
    stopped = backend.executor._stopped

    def stop_and_release(launch: Any) -> Any:
        release.set()  # the engine returns as soon as the close has given up on it
        return stopped(launch)

    monkeypatch.setattr(backend.executor, "_stopped", stop_and_release)
    try:
        pending = backend.dispatch(
            _copy("test.stuck", 1 << 16), [np.arange(1 << 16, dtype=np.uint32)]
        )
        assert started.wait(10)
        await backend.aclose()
        with pytest.raises(BackendClosed):
            await pending
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert warnings[0].startswith("reference backend closed with 1 dispatch(es) still running")
    finally:
        release.set()


@pytest.mark.parametrize("stop", ["timeout", "close"])
async def test_a_runaway_dispatch_stopped_at_a_safe_point_says_why(stop: str) -> None:
    runaway = Program(
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
        op_id="test.runaway",
    )
    n = [np.array([0xFFFF_FFFF], np.uint32)]
    backend = reference_backend()
    try:
        if stop == "timeout":
            with pytest.raises(DispatchTimeout):
                await backend.dispatch(runaway, n, DispatchConfig(timeout=0.2))
        else:
            pending = backend.dispatch(runaway, n)
            await backend.aclose()
            with pytest.raises(BackendClosed) as info:
                await pending
            assert str(info.value).startswith(
                "dispatch test.runaway was stopped: the reference backend was closed"
            )
    finally:
        await backend.aclose()


# Dispatch paths, resident buffers and their order ---------------------------------

U = np.uint32
N1 = np.array([1], U)  # one trip of the slow programs' loop


def _inc() -> Program:
    """x[i] += 1 (x is READ_WRITE): tiny for 4 elements."""
    return Program(
        [BufferDecl("x", 0, Access.READ_WRITE, DType.U32)],
        64,
        [Store("x", gid(0), Load("x", gid(0)) + u32(1))],
        op_id="test.inc",
    )


def _slow(op_id: str, buffers: list[BufferDecl], body: list[Any]) -> Program:
    """``body`` looped ``n[0]`` times: a runtime trip count, so it never runs inline."""
    n = BufferDecl("n", len(buffers), Access.UNIFORM, DType.U32, 1)
    return Program([*buffers, n], 64, [Loop("t", u32(0), Load("n", u32(0)), body)], op_id=op_id)


def _slow_add() -> Program:
    """x[i] += 1, n times (x is READ_WRITE)."""
    x = BufferDecl("x", 0, Access.READ_WRITE, DType.U32)
    return _slow("test.slow_add", [x], [Store("x", gid(0), Load("x", gid(0)) + u32(1))])


def _slow_read() -> Program:
    """out[i] = x[i] (x is READ)."""
    x = BufferDecl("x", 0, Access.READ, DType.U32)
    out = BufferDecl("out", 1, Access.WRITE, DType.U32, 4)
    return _slow("test.slow_read", [x, out], [Store("out", gid(0), Load("x", gid(0)))])


def _slow_double() -> Program:
    """acc[i] += x[i], n times: bound to one buffer twice (written, read), it doubles it."""
    acc = BufferDecl("acc", 0, Access.READ_WRITE, DType.U32)
    x = BufferDecl("x", 1, Access.READ, DType.U32)
    return _slow(
        "test.slow_double",
        [acc, x],
        [Store("acc", gid(0), Load("acc", gid(0)) + Load("x", gid(0)))],
    )


def _gate_slow_programs(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold every ``test.slow*`` program at the engine's door until ``release`` (10 s at most).

    Returns ``(entered, release)``. The engine then runs it (it stops at once
    if its dispatch was asked to stop meanwhile); other programs run at once.
    """
    entered, release = threading.Event(), threading.Event()

    def gated(plan: Any, arrays: Any, **kwargs: Any) -> Any:
        if plan.program.op_id.startswith("test.slow"):
            entered.set()
            release.wait(10)
        return run_plan(plan, arrays, **kwargs)

    monkeypatch.setattr(backend_module, "run_plan", gated)
    return entered, release


def _engine_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Return the list of the names of the threads the engine runs on, one per launch."""
    names: list[str] = []

    def noted(*args: Any, **kwargs: Any) -> Any:
        names.append(threading.current_thread().name)
        return run_plan(*args, **kwargs)

    monkeypatch.setattr(backend_module, "run_plan", noted)
    return names


class _NotingBackend(ReferenceExecutor):
    """Sets ``taken[op_id]`` when a worker takes a dispatch of that program off the queue."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.taken: defaultdict[str, threading.Event] = defaultdict(threading.Event)

    def run_job(self, job: Any) -> None:
        self.taken[job.launch.plan.program.op_id].set()
        super().run_job(job)


def _release_once_stopped(release: threading.Event, *pendings: PendingDispatch) -> None:
    """Set ``release`` (in a thread) once every one of ``pendings`` was asked to stop (10 s)."""

    def wait() -> None:
        for pending in pendings:
            pending.stop_requested.wait(10)
        release.set()

    threading.Thread(target=wait, daemon=True).start()


def test_a_tiny_dispatch_runs_inline_on_the_callers_thread_and_a_larger_one_on_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = _engine_threads(monkeypatch)
    backend = reference_backend()
    x = backend.upload(np.arange(4, dtype=U))
    tiny = backend.dispatch(_copy("test.copy", 4), [np.arange(4, dtype=U)])
    resident = backend.dispatch(_copy("test.copy", 4), [x])  # nothing to wait for: inline too
    assert tiny.done() and resident.done()
    assert tiny.result()[0][:4].tolist() == resident.result()[0][:4].tolist() == [0, 1, 2, 3]
    large = backend.dispatch(_copy("test.copy", 1 << 16), [np.arange(1 << 16, dtype=U)])
    assert large.result(timeout=10)[0][-1] == (1 << 16) - 1
    here = threading.current_thread().name
    assert threads[:2] == [here, here]
    assert threads[2].startswith("vyre-reference-")


def test_inline_ns_0_runs_even_a_dispatch_estimated_free_on_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An empty READ_WRITE input: no lanes and no bytes, an estimate of exactly 0 ns.
    threads = _engine_threads(monkeypatch)
    empty = np.zeros(0, U)
    assert reference_backend(inline_ns=1).dispatch(_inc(), [empty]).done()
    backend = reference_backend(inline_ns=0)
    assert backend.dispatch(_inc(), [empty]).result(timeout=10)[0].size == 0
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("vyre-reference-")


@pytest.mark.parametrize("n", SIZES)
def test_fixpoint_iterations_launch_the_program_that_many_times(n: int) -> None:
    pending = reference_backend().dispatch(
        _inc(), [np.zeros(n, U)], DispatchConfig(fixpoint_iterations=3)
    )
    assert pending.result(timeout=10)[0].tolist() == [3] * n


@pytest.mark.parametrize("n", SIZES)
def test_a_launch_without_a_template_runs_as_one_with_it(n: int) -> None:
    # A launch built by hand has no template and no shape: the executor plans its shape itself.
    backend = reference_backend(prefetch=False)
    pipeline = backend.compile(_copy("test.copy", n))
    launch = backend.front.plan(pipeline, [np.arange(n, dtype=U)], None)
    bare = Launch(
        launch.pipeline,
        launch.plan,
        launch.inputs,
        launch.config,
        launch.pending,
        launch.completer,
        launch.compile_s,
        None,
    )
    assert bare.shape is None and launch.shape is not None
    backend.executor.enqueue(bare)
    assert launch.pending.result(timeout=10)[0][:n].tolist() == list(range(n))


def test_a_launch_of_more_lanes_than_the_engine_holds_is_refused_before_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[int] = []

    def counted(plan: Any, arrays: Any, **kwargs: Any) -> list[np.ndarray]:
        ran.append(plan.geometry.lanes)  # (not run: 2**30 lanes take gigabytes)
        return [np.zeros(1, U)]

    monkeypatch.setattr(backend_module, "run_plan", counted)
    backend = reference_backend()
    program = _copy("test.copy", 1)
    most = backend_module.MAX_LANES // 64  # workgroups of 64 lanes
    at_most = backend.dispatch(
        program, [np.zeros(1, U)], DispatchConfig(grid_override=(most, 1, 1))
    )
    at_most.result(timeout=10)
    assert ran == [1 << 30]
    with pytest.raises(InvalidProgram) as info:
        backend.dispatch(program, [np.zeros(1, U)], DispatchConfig(grid_override=(most + 1, 1, 1)))
    assert str(info.value) == (
        "the launch has 1073741888 lanes (grid (16777217, 1, 1) x workgroup (64, 1, 1)); the "
        "reference engine holds one value per lane in host memory and takes at most 1073741824"
        "\nFix: use a smaller grid_override, or split the work into several dispatches"
    )
    assert ran == [1 << 30]


# (a slow first use, then tiny ones: (program, done at once?)); a tiny dispatch that
# need not wait runs inline, done when dispatch() returns; one that waits is not.
ORDER_CASES = [
    pytest.param("read", [("read", True)], id="readers-share"),
    pytest.param("read", [("write", False)], id="writer-waits-for-reader"),
    pytest.param("read", [("read", True), ("write", False)], id="writer-waits-for-all-readers"),
    pytest.param("write", [("read", False)], id="reader-waits-for-writer"),
    pytest.param("write", [("write", False)], id="writer-waits-for-writer"),
    pytest.param("double", [("read", False)], id="bound-twice-is-a-writer"),
]


@pytest.mark.parametrize(("first", "then"), ORDER_CASES)
def test_dispatches_sharing_a_resident_buffer_wait_for_exactly_the_earlier_ones_they_must(
    monkeypatch: pytest.MonkeyPatch, first: str, then: list[tuple[str, bool]]
) -> None:
    entered, release = _gate_slow_programs(monkeypatch)
    backend = reference_backend()
    start = [1, 2, 3, 4]
    x = backend.upload(np.array(start, U))
    value = start
    expected: list[list[int]] = []  # what each dispatch returns, in submission order
    try:
        if first == "read":
            slow = backend.dispatch(_slow_read(), [x, N1])
            expected.append(value)
        elif first == "write":
            slow = backend.dispatch(_slow_add(), [x, N1])
            value = [v + 1 for v in value]
            expected.append(value)
        else:
            slow = backend.dispatch(_slow_double(), [x, x, N1])
            value = [2 * v for v in value]
            expected.append(value)
        assert entered.wait(10)
        later = []
        for what, at_once in then:
            if what == "read":
                pending = backend.dispatch(_copy("test.read", 4), [x])
            else:
                pending = backend.dispatch(_inc(), [x])
                value = [v + 1 for v in value]
            expected.append(value)
            assert pending.done() is at_once, what
            later.append(pending)
    finally:
        release.set()
    got = [p.result(timeout=10)[0][:4].tolist() for p in [slow, *later]]
    assert got == expected
    assert backend.download(x).tolist() == value


def test_a_dispatchs_buffers_are_final_for_later_users_before_it_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A dispatch settling hands its buffers on first: one dispatched from its
    # settle hook (in the settling thread) need not wait, and runs inline at once.
    entered, release = _gate_slow_programs(monkeypatch)
    backend = reference_backend()
    x = backend.upload(np.array([1, 2, 3, 4], U))
    seen: list[tuple[bool, PendingDispatch]] = []

    def at_settle(_pending: PendingDispatch) -> None:
        reader = backend.dispatch(_copy("test.read", 4), [x])
        seen.append((reader.done(), reader))

    try:
        writer = backend.dispatch(_slow_add(), [x, N1])
        assert entered.wait(10)
        settle_hook(writer, at_settle)
    finally:
        release.set()
    assert writer.result(timeout=10)[0].tolist() == [2, 3, 4, 5]
    ((at_once, reader),) = seen
    assert at_once
    assert reader.result(timeout=10)[0][:4].tolist() == [2, 3, 4, 5]


class _RaisingCompleter:
    """A dispatch's completer whose ``resolve`` raises (settling broke); else the real one."""

    def __init__(self, completer: Any, error: Exception) -> None:
        self._completer = completer
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._completer, name)

    def resolve(self, outputs: Any, **timing: Any) -> bool:
        raise self._error


class _SettlingBreaks(ReferenceExecutor):
    """Each dispatch's settling raises ``error``."""

    def __init__(self, error: Exception, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def enqueue(self, launch: Launch) -> PendingDispatch:
        completer: Any = _RaisingCompleter(launch.completer, self.error)
        return super().enqueue(
            Launch(
                launch.pipeline,
                launch.plan,
                launch.inputs,
                launch.config,
                launch.pending,
                completer,
                launch.compile_s,
                launch.template,
                launch.resident,
            )
        )


@pytest.mark.parametrize("where", ["pool", "resident-inline"])
def test_a_failure_while_settling_fails_the_dispatch_naming_the_program(where: str) -> None:
    boom = ValueError("settling broke")
    backend = backend_of(_SettlingBreaks, boom)
    if where == "pool":
        pending = backend.dispatch(_copy("test.copy", 1 << 16), [np.arange(1 << 16, dtype=U)])
    else:
        x = backend.upload(np.arange(4, dtype=U))
        pending = backend.dispatch(_copy("test.copy", 4), [x])
        assert pending.done()
    with pytest.raises(DispatchFailed) as info:
        pending.result(timeout=5)
    assert str(info.value).startswith(
        "the reference engine failed on test.copy: ValueError: settling broke\n"
    )
    assert info.value.__cause__ is boom


async def test_a_dispatch_waiting_for_an_earlier_one_is_stopped_by_a_close_before_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = _gate_slow_programs(monkeypatch)
    backend = backend_of(_NotingBackend, close_timeout=5)
    x = backend.upload(np.array([1, 2, 3, 4], U))
    try:
        writer = backend.dispatch(_slow_add(), [x, N1])
        assert entered.wait(10)
        reader = backend.dispatch(_copy("test.read", 4), [x])  # waits for the writer
        assert backend.executor.taken["test.read"].wait(10)  # on a worker, waiting
        _release_once_stopped(release, writer, reader)  # the writer ends once both were stopped
        await backend.aclose()
    finally:
        release.set()
    for pending in (writer, reader):
        with pytest.raises(BackendClosed) as info:
            await pending
    assert str(info.value).startswith(
        "dispatch test.read was stopped: "
        "the reference backend was closed while it was queued or running\n"
    )


async def test_a_dispatch_still_queued_when_the_backend_closes_fails_with_backend_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = _gate_slow_programs(monkeypatch)
    backend = reference_backend(max_workers=1, close_timeout=5)
    try:
        running = backend.dispatch(_slow_add(), [np.zeros(4, U), N1])
        assert entered.wait(10)
        queued = backend.dispatch(_copy("test.queued", 1 << 16), [np.zeros(1 << 16, U)])
        _release_once_stopped(release, running)
        await backend.aclose()
    finally:
        release.set()
    with pytest.raises(BackendClosed):
        await running
    with pytest.raises(BackendClosed) as info:
        await queued
    assert str(info.value).startswith(
        "dispatch test.queued was stopped: "
        "the reference backend was closed while it was queued or running\n"
    )


class _ClosedWhilePlanning(ReferenceExecutor):
    """Closed by another thread while ``dispatch()`` plans, after its check that it is open."""

    def _estimate_ns(self, plan: BindingPlan, config: DispatchConfig, lanes: int) -> float:
        self.stop_at_exit()  # (stops everything as aclose does)
        return super()._estimate_ns(plan, config, lanes)


def test_a_close_landing_while_a_dispatch_is_planned_refuses_it() -> None:
    backend = backend_of(_ClosedWhilePlanning)
    with pytest.raises(BackendClosed) as info:
        backend.dispatch(_copy("test.copy", 1 << 16), [np.arange(1 << 16, dtype=U)])
    assert str(info.value).startswith("backend 'reference' was closed; it runs nothing more\n")
    assert info.value.backend_id == "reference"  # type: ignore[attr-defined]
    assert backend.executor.in_flight == 0


def test_a_worker_thread_that_cannot_start_fails_the_dispatch_with_a_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = reference_backend(inline_ns=0)
    refused = RuntimeError("can't start new thread")

    def refuse(self: threading.Thread) -> None:
        raise refused

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", refuse)
        with pytest.raises(DispatchFailed) as info:
            backend.dispatch(_copy("test.copy", 4), [np.arange(4, dtype=U)])
    assert str(info.value) == (
        "the reference backend could not start a worker thread (can't start new thread)\n"
        "Fix: lower the number of threads in the process, or free memory"
    )
    assert info.value.__cause__ is refused


@pytest.mark.parametrize("n", SIZES)
def test_a_dispatch_reports_its_device_and_compile_time(n: int) -> None:
    backend = reference_backend()
    x = backend.upload(np.arange(4, dtype=U))
    cases: list[tuple[Program, list[Any]]] = [
        (_copy("test.copy", n), [np.arange(n, dtype=U)]),
        (_copy("test.copy", 4), [x]),  # inline, with a resident buffer
    ]
    for program, inputs in cases:
        for _ in range(2):  # compiles, then a cache hit
            pending = backend.dispatch(program, inputs)
            pending.result(timeout=10)
            timing = pending.timing
            assert timing is not None and timing.wall_s is not None
            assert timing.device_s is not None and 0.0 <= timing.device_s <= timing.wall_s
            assert isinstance(timing.compile_s, float) and timing.compile_s >= 0.0
        assert pending.timing is not None and pending.timing.compile_s == 0.0  # (a cache hit)


@pytest.fixture
def recorded() -> Iterator[None]:
    """Dispatches are recorded by an (in-memory) OpenTelemetry SDK: backends time phases."""
    otel_sdk.install()
    was = telemetry.is_enabled()
    telemetry.set_enabled(True)
    try:
        yield
    finally:
        telemetry.set_enabled(was)


@pytest.mark.parametrize("where", ["inline", "resident-inline", "pool"])
def test_a_recorded_dispatch_shows_its_wait_and_launch_phases(recorded: None, where: str) -> None:
    backend = reference_backend()
    n = 1 << 16 if where == "pool" else 4
    inputs: list[Any] = [np.arange(n, dtype=U)]
    if where == "resident-inline":
        inputs = [backend.upload(inputs[0])]
    before = time.time_ns()
    pending = backend.dispatch(_copy("test.copy", n), inputs)
    pending.result(timeout=10)
    after = time.time_ns()
    phases = [p for p in pending.record.phases or [] if p[0] != "vyre.compile"]
    if where == "pool":  # queued, then run
        assert [name for name, _, _ in phases] == ["vyre.wait", "vyre.launch"]
        assert phases[0][2] == phases[1][1]
    else:
        assert [name for name, _, _ in phases] == ["vyre.launch"]
    for _, start, end in phases:
        assert isinstance(start, int) and isinstance(end, int)
        assert before <= start <= end <= after


@pytest.mark.parametrize("where", ["inline", "resident-inline", "pool"])
def test_an_unrecorded_dispatch_takes_no_phase_times(where: str) -> None:
    was = telemetry.is_enabled()
    telemetry.set_enabled(False)
    try:
        backend = reference_backend()
        n = 1 << 16 if where == "pool" else 4
        inputs: list[Any] = [np.arange(n, dtype=U)]
        if where == "resident-inline":
            inputs = [backend.upload(inputs[0])]
        pending = backend.dispatch(_copy("test.copy", n), inputs)
        pending.result(timeout=10)
    finally:
        telemetry.set_enabled(was)
    assert pending.record.phases is None


def _counting_loop(trips: int, *, runtime: bool) -> tuple[Program, list[np.ndarray]]:
    """Sum 0..trips-1 on one lane; the trip count a literal, or read at run time (never inline)."""
    buffers = [BufferDecl("out", 0, Access.WRITE, DType.U32, 1)]
    bound: Any = u32(trips)
    inputs: list[np.ndarray] = []
    if runtime:
        buffers.append(BufferDecl("n", 1, Access.UNIFORM, DType.U32, 1))
        bound, inputs = Load("n", u32(0)), [np.array([trips], U)]
    body = [
        Let("acc", u32(0)),
        Loop("i", u32(0), bound, [Assign("acc", Var("acc") + Var("i"))]),
        Store("out", u32(0), Var("acc")),
    ]
    return Program(buffers, 1, body, op_id="test.counting"), inputs


def test_an_inline_dispatch_stops_at_its_timeout() -> None:
    # Bounded loops run inline below inline_ns, however long: 4M trips take ~30 s
    # to finish; past its deadline the engine stops at the next iteration.
    backend = reference_backend(inline_ns=10**12)
    started = time.monotonic()
    counting, inputs = _counting_loop(4_000_000, runtime=False)
    pending = backend.dispatch(counting, inputs, DispatchConfig(timeout=0.05))
    took = time.monotonic() - started
    assert pending.done()
    with pytest.raises(DispatchTimeout):
        pending.result()
    assert took < 5


def test_a_dispatch_past_its_timeout_stops_and_frees_its_worker() -> None:
    backend = reference_backend(max_workers=1)
    runaway, inputs = _counting_loop(4_000_000, runtime=True)
    with pytest.raises(DispatchTimeout):  # 4M trips: ~30 s if never stopped
        backend.dispatch(runaway, inputs, DispatchConfig(timeout=0.1)).result()
    after = backend.dispatch(_copy("test.copy", 1 << 16), [np.arange(1 << 16, dtype=U)])
    assert after.result(timeout=5)[0][-1] == (1 << 16) - 1


def test_download_waits_for_the_last_dispatch_that_writes_the_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = _gate_slow_programs(monkeypatch)
    backend = reference_backend()
    x = backend.upload(np.array([1, 2, 3, 4], U))
    assert backend.download(x).tolist() == [1, 2, 3, 4]  # nothing used it yet
    checks = 0
    check_open = backend.executor._check_open

    def counted() -> None:  # download checks once, then again each time it waits
        nonlocal checks
        checks += 1
        if checks == 2:
            release.set()  # the writer runs only while download waits for it
        check_open()

    try:
        writer = backend.dispatch(_slow_add(), [x, N1])
        assert entered.wait(10)
        monkeypatch.setattr(backend.executor, "_check_open", counted)
        assert backend.download(x).tolist() == [2, 3, 4, 5]
    finally:
        release.set()
    assert writer.done()


def test_download_returns_a_copy() -> None:
    backend = reference_backend()
    x = backend.upload(np.array([1, 2, 3, 4], U))
    backend.dispatch(_inc(), [x]).result(timeout=10)
    copy = backend.download(x)
    copy[:] = 0
    assert backend.download(x).tolist() == [2, 3, 4, 5]


async def test_a_download_waiting_for_a_writer_ends_when_the_backend_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = _gate_slow_programs(monkeypatch)
    backend = reference_backend(close_timeout=0.2)
    x = backend.upload(np.array([1, 2, 3, 4], U))
    waiting = threading.Event()
    checks = 0
    check_open = backend.executor._check_open

    def counted() -> None:
        nonlocal checks
        checks += 1
        if checks == 2:
            waiting.set()
        check_open()

    outcome: list[object] = []

    def download() -> None:
        try:
            outcome.append(backend.download(x))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=download, daemon=True)
    try:
        writer = backend.dispatch(_slow_add(), [x, N1])
        assert entered.wait(10)
        monkeypatch.setattr(backend.executor, "_check_open", counted)
        thread.start()
        assert waiting.wait(10)
        await backend.aclose()  # the writer never reaches a safe point: given up after 0.2 s
        thread.join(10)
    finally:
        release.set()
    with pytest.raises(BackendClosed):
        await writer
    (error,) = outcome
    assert isinstance(error, BackendClosed)
    assert str(error).startswith("backend 'reference' was closed; it runs nothing more\n")


@pytest.mark.parametrize("operation", ["download", "free"])
def test_download_and_free_take_only_a_resident_buffer(operation: str) -> None:
    backend = reference_backend()
    with pytest.raises(InvalidProgram) as info:
        getattr(backend, operation)(np.zeros(4, U))
    assert str(info.value) == (
        f"{operation} takes a ResidentBuffer (from backend.upload or backend.alloc), "
        f"got a ndarray\nFix: pass the buffer upload() or alloc() returned to {operation}()"
    )


def test_a_buffer_no_dispatch_used_can_be_freed() -> None:
    backend = reference_backend()
    x = backend.alloc("u32", 4)
    backend.free(x)
    assert backend.executor.resident_count == 0 and x.freed


def test_freeing_buffers_releases_what_the_backend_kept_for_their_order() -> None:
    # The events ordering a buffer's users go with it: a process making and freeing
    # buffers keeps no more of them over time.
    backend = reference_backend()

    def events() -> int:
        gc.collect()
        return sum(isinstance(o, threading.Event) for o in gc.get_objects())

    def cycle() -> None:
        x = backend.upload(np.arange(4, dtype=U))
        backend.dispatch(_inc(), [x]).result(timeout=10)
        backend.free(x)

    cycle()
    before = events()
    for _ in range(200):
        cycle()
    assert events() - before < 50


@pytest.mark.parametrize("make", ["upload", "alloc"])
def test_a_resident_buffer_keeps_its_label_and_refuses_one_that_is_not_a_str(make: str) -> None:
    backend = reference_backend()

    def new(label: Any) -> ResidentBuffer:
        if make == "upload":
            return backend.upload(np.zeros(4, U), label=label)
        return backend.alloc("u32", 4, label=label)

    assert new("weights").label == "weights"
    with pytest.raises(InvalidProgram) as info:
        new(5)
    assert str(info.value).startswith(f"{make} label must be a str or None, got 5\n")


def test_a_resident_buffer_the_host_cannot_hold_is_device_out_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = reference_backend()

    class NoMemory:
        """numpy, except that zeros() finds no memory."""

        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

        @staticmethod
        def zeros(*args: Any, **kwargs: Any) -> np.ndarray:
            raise MemoryError

    monkeypatch.setattr(backend_module, "np", NoMemory())
    with pytest.raises(DeviceOutOfMemory) as info:
        backend.alloc("u32", 1 << 28)
    assert str(info.value) == (
        "the host ran out of memory allocating a resident buffer (about 1.00 GiB needed)\n"
        "Fix: dispatch smaller inputs, free resident buffers, or free host memory"
    )
    assert info.value.nbytes == 1 << 30  # type: ignore[attr-defined]
    assert isinstance(info.value.__cause__, MemoryError)
