"""What the reference backend tells a user when the engine fails or a close gives up.

Found by mutation testing (issue 28): no test read these messages. An engine
failure that is not the engine's own error settles the dispatch with
`DispatchFailed` (or `DeviceOutOfMemory` for a `MemoryError`) naming the
program, with the original exception as its cause, on both of the backend's
paths (a tiny dispatch run inline on the caller's thread, a larger one on the
worker pool). A close that gives up on a dispatch stuck outside the engine's
safe points fails it with `BackendClosed` and logs one warning saying how many
and after how long. (That a close which stops everything logs nothing is not
tested here: it rests on idle workers ending within the close's 50 ms join,
which a loaded machine need not give.)
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest

import vyre_reference.backend as backend_module
from vyre_async import (
    BackendClosed,
    DeviceOutOfMemory,
    DispatchConfig,
    DispatchFailed,
    DispatchTimeout,
)
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
from vyre_reference import ReferenceBackend

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
    async with ReferenceBackend() as backend:
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
    async with ReferenceBackend() as backend:
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
    backend = ReferenceBackend(close_timeout=0.2)
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
    backend = ReferenceBackend(close_timeout=0.2)
    stopped = backend._stopped

    def stop_and_release(launch: Any) -> Any:
        release.set()  # the engine returns as soon as the close has given up on it
        return stopped(launch)

    monkeypatch.setattr(backend, "_stopped", stop_and_release)
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
    backend = ReferenceBackend()
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
