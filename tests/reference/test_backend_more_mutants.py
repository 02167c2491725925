"""What a dispatch stopped by hand (``pending.stop_requested``) tells its user.

Found by mutation testing (issue 28). With the backend open, only two things
stop a running dispatch: its deadline, and a stop asked through
``stop_requested``. Past the deadline the front end settles the dispatch with
its own `DispatchTimeout` ("did not finish within its timeout"), so the
backend's error is seen only for a stop asked by hand: its message, its
``Fix:`` line and its ``timeout`` (the configured one, None without one).
A dispatch with a timeout stopped by hand before its deadline was told it
went "past its timeout", which it did not (fixed: ``_timeout`` looks at the
deadline, not at whether there is one).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from vyre_async import DispatchConfig, DispatchTimeout
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
from vyre_reference import reference_backend

pytestmark = pytest.mark.anyio

TIMEOUT_FIX = "\nFix: raise DispatchConfig.timeout or split the work into smaller dispatches"
STOP_FIX = (
    "\nFix: its PendingDispatch.stop_requested was set before it finished; dispatch it again "
    "if you need its outputs"
)
N = [np.array([0xFFFF_FFFF], np.uint32)]  # ~2**32 iterations: hours unless stopped


def _runaway() -> Program:
    """Sums 0..n-1 on one lane; the trip count is read at run time (it runs on a worker)."""
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
        op_id="test.runaway",
    )


async def _stopped_by_hand(config: DispatchConfig) -> DispatchTimeout:
    """Dispatch the runaway kernel, ask it to stop, and return the error it settles with."""
    async with reference_backend() as backend:
        pending = backend.dispatch(_runaway(), N, config)
        pending.stop_requested.set()
        with pytest.raises(DispatchTimeout) as info:
            await pending
    return info.value


async def test_a_dispatch_stopped_by_hand_says_its_stop_was_requested() -> None:
    error = await _stopped_by_hand(DispatchConfig())
    assert str(error) == "dispatch test.runaway was stopped: its stop was requested" + STOP_FIX
    assert error.timeout is None  # type: ignore[attr-defined]


async def test_a_dispatch_with_a_timeout_stopped_by_hand_keeps_its_timeout() -> None:
    error = await _stopped_by_hand(DispatchConfig(timeout=600.0))
    assert str(error) == "dispatch test.runaway was stopped: its stop was requested" + STOP_FIX
    assert error.timeout == 600.0  # type: ignore[attr-defined]


def test_a_launch_stopped_past_its_deadline_says_so() -> None:
    # The front end settles such a dispatch first with its own DispatchTimeout; the
    # backend's error shows when its worker reaches a safe point first (a race), so
    # the launch is built by hand here: one whose deadline passed 1 s ago.
    from vyre_reference.backend import _timeout

    launch = SimpleNamespace(
        config=DispatchConfig(timeout=0.5),
        pending=SimpleNamespace(created=time.monotonic() - 1.5),
        plan=SimpleNamespace(program=_runaway()),
    )
    error = _timeout(launch)  # type: ignore[arg-type]
    assert (
        str(error) == "dispatch test.runaway was stopped: past its timeout of 0.5 s" + TIMEOUT_FIX
    )
    assert error.timeout == 0.5  # type: ignore[attr-defined]
    launch.pending.created = time.monotonic()  # the same launch before its deadline
    assert str(_timeout(launch)).startswith(  # type: ignore[arg-type]
        "dispatch test.runaway was stopped: its stop was requested"
    )
