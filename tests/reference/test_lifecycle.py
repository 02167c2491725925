"""Closing the reference backend stops runaway work; exit never waits for it.

0.1.0 joined its worker threads at close and at interpreter exit, however long
their dispatch ran: a runaway kernel without a timeout kept ``aclose()``,
``async with`` and the process itself alive forever. Each scenario runs in a
fresh interpreter bounded by a subprocess timeout, so a regression fails here
instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

#: A kernel that runs ~2**32 loop iterations (hours in the engine) unless stopped.
PRELUDE = textwrap.dedent(
    """
    import time, anyio, numpy as np
    from vyre_async import BackendClosed
    from vyre_async.ir import Access, Assign, BufferDecl, DType, Let, Load, Loop, Program
    from vyre_async.ir import Store, Var, u32
    from vyre_reference import ReferenceExecutor, reference_backend

    RUNAWAY = Program(
        [BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
         BufferDecl("out", 1, Access.WRITE, DType.U32, 1)],
        1,
        [Let("acc", u32(0)),
         Loop("i", u32(0), Load("n", u32(0)), [Assign("acc", Var("acc") + Var("i"))]),
         Store("out", u32(0), Var("acc"))],
        op_id="test.runaway",
    )
    N = [np.array([0xFFFF_FFFF], np.uint32)]
    """
)

#: Generous bound for a fresh interpreter plus the scenario on a loaded 2-core machine.
LIMIT_S = 60.0


def _run(body: str) -> tuple[str, float]:
    script = PRELUDE + textwrap.dedent(body)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
    except subprocess.TimeoutExpired as exc:  # pragma: no cover - the regression
        pytest.fail(f"the process was still running after {LIMIT_S} s: {exc.stdout!r}")
    assert done.returncode == 0, done.stderr
    return done.stdout, time.monotonic() - started


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_aclose_stops_a_runaway_dispatch_and_fails_it_with_backend_closed(library: str) -> None:
    out, _ = _run(
        f"""
        async def main():
            backend = reference_backend()
            pending = backend.dispatch(RUNAWAY, N)
            await anyio.sleep(0.2)
            started = time.monotonic()
            await backend.aclose()
            print("closed in", round(time.monotonic() - started, 3))
            try:
                await pending
            except BackendClosed as exc:
                print("pending:", type(exc).__name__, "Fix:" in str(exc))
            print("in flight:", backend.executor.in_flight)
        anyio.run(main, backend={library!r})
        """
    )
    assert "pending: BackendClosed True" in out
    assert "in flight: 0" in out
    closed_in = float(out.split("closed in ")[1].split()[0])
    assert closed_in < 5.0  # the engine stopped at a safe point, not after close_timeout


def test_async_with_exit_stops_a_runaway_dispatch() -> None:
    out, _ = _run(
        """
        async def main():
            async with reference_backend() as backend:
                pending = backend.dispatch(RUNAWAY, N)
                await anyio.sleep(0.2)
            try:
                await pending
            except BackendClosed:
                print("stopped")
        anyio.run(main)
        """
    )
    assert "stopped" in out


def test_interpreter_exit_with_a_runaway_dispatch_in_flight_ends() -> None:
    out, _ = _run(
        """
        backend = reference_backend()
        pending = backend.dispatch(RUNAWAY, N)
        time.sleep(0.2)
        print("leaving with", backend.executor.in_flight, "in flight", flush=True)
        """
    )
    assert "leaving with 1 in flight" in out


def test_close_gives_up_on_work_that_never_reaches_a_safe_point() -> None:
    """A dispatch stuck outside the engine's safe points is failed after close_timeout."""
    out, _ = _run(
        """
        import threading
        import vyre_reference.backend as module
        release = threading.Event()

        def stuck(*args, **kwargs):
            release.wait()  # never checks the cancel event
            raise RuntimeError("unreachable in this test")

        module.run_plan = stuck

        async def main():
            backend = reference_backend(close_timeout=0.3)
            pending = backend.dispatch(RUNAWAY, N)
            await anyio.sleep(0.1)
            await backend.aclose()
            try:
                await pending
            except BackendClosed:
                print("abandoned")
        anyio.run(main)
        """
    )
    assert "abandoned" in out


def test_exit_ends_while_a_thread_waits_on_a_runaway_dispatch() -> None:
    """The interpreter joins non-daemon threads before atexit hooks: stop runs before that."""
    out, _ = _run(
        """
        import threading
        backend = reference_backend()
        pending = backend.dispatch(RUNAWAY, N)

        def wait():
            try:
                pending.result()
            except BackendClosed:
                print("waiter released", flush=True)

        threading.Thread(target=wait).start()  # not a daemon: exit joins it
        time.sleep(0.2)
        """
    )
    assert "waiter released" in out
