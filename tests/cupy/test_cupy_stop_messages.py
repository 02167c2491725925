"""What a CUDA dispatch stopped before it ran, or whose result was discarded, tells its user.

The backend fails such a launch with ``launch.timeout_error`` when its stop flag
is set: past its deadline (the front end usually settles it first with its own
`DispatchTimeout`; the backend's shows when it gets there first), or before it,
through ``PendingDispatch.stop_requested``. Before this test, a stop asked by hand
read "was not started: past its timeout of None s", and an unnamed dispatch
"dispatch  was ..." (found while triaging the reference backend's same messages).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from vyre_async import DispatchConfig, DispatchTimeout
from vyre_cupy.launch import timeout_error

TIMEOUT_FIX = "\nFix: raise DispatchConfig.timeout or split the work into smaller dispatches"
STOP_FIX = (
    "\nFix: its PendingDispatch.stop_requested was set before it finished; dispatch it again "
    "if you need its outputs"
)


def _launch(config: DispatchConfig, *, age_s: float, op_id: str | None = "k.add") -> object:
    return SimpleNamespace(
        config=config,
        pending=SimpleNamespace(created=time.monotonic() - age_s),
        plan=SimpleNamespace(program=SimpleNamespace(op_id=op_id)),
    )


@pytest.mark.parametrize(
    ("started", "said"),
    [
        (False, "dispatch k.add was not started: past its timeout of 0.5 s"),
        (True, "dispatch k.add ended after its timeout of 0.5 s; its result was discarded"),
    ],
)
def test_past_its_deadline_a_dispatch_is_told_its_timeout(started: bool, said: str) -> None:
    error = timeout_error(_launch(DispatchConfig(timeout=0.5), age_s=1.5), started=started)  # type: ignore[arg-type]
    assert isinstance(error, DispatchTimeout)
    assert str(error) == said + TIMEOUT_FIX
    assert error.context["timeout"] == 0.5


@pytest.mark.parametrize(
    ("config", "started", "said"),
    [
        (DispatchConfig(), False, "dispatch k.add was stopped: its stop was requested"),
        (
            DispatchConfig(timeout=600.0),
            True,
            "dispatch k.add was stopped: its stop was requested; its result was discarded",
        ),
        (DispatchConfig(label="mine"), False, "dispatch mine was stopped: its stop was requested"),
    ],
)
def test_stopped_by_hand_before_any_deadline_a_dispatch_is_told_so(
    config: DispatchConfig, started: bool, said: str
) -> None:
    error = timeout_error(_launch(config, age_s=1.5), started=started)  # type: ignore[arg-type]
    assert str(error) == said + STOP_FIX
    assert error.context["timeout"] == config.timeout


def test_an_unnamed_dispatch_is_called_a_dispatch() -> None:
    # (and one the backend stops before it starts, as its callers ask: no `started`)
    error = timeout_error(_launch(DispatchConfig(), age_s=0.0, op_id=None))  # type: ignore[arg-type]
    assert str(error) == "a dispatch was stopped: its stop was requested" + STOP_FIX


def test_a_dispatch_stopped_exactly_at_its_deadline_is_past_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launch = _launch(DispatchConfig(timeout=0.5), age_s=0.0)
    launch.pending.created = 100.0  # type: ignore[attr-defined]
    monkeypatch.setattr("vyre_cupy.launch.time.monotonic", lambda: 100.5)  # (0.5 s exactly)
    error = timeout_error(launch)  # type: ignore[arg-type]
    assert str(error) == "dispatch k.add was not started: past its timeout of 0.5 s" + TIMEOUT_FIX
    monkeypatch.setattr("vyre_cupy.launch.time.monotonic", lambda: 100.25)
    assert "its stop was requested" in str(timeout_error(launch))  # type: ignore[arg-type]
