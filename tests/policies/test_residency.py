"""The graph residency policy: every rule, tie and error of `decide_residency`."""

from __future__ import annotations

from typing import Any

import pytest

from vyre_async.policies import (
    MIN_RESIDENT_GAIN_BPS,
    RESIDENCY_REASONS,
    ResidencyVerdict,
    decide_residency,
)

MS = 1_000_000


def test_resident_buffers_that_pay_stay_resident() -> None:
    verdict = decide_residency(6_000, work_ns=10 * MS)
    assert (verdict.kind, verdict.reason, verdict.resident) == ("resident", "resident_pays", True)
    assert verdict.savings_ns == 6 * MS


def test_resident_buffers_measured_slower_give_host_arrays_with_the_estimated_loss() -> None:
    verdict = decide_residency(-1_500, work_ns=10 * MS)
    assert (verdict.kind, verdict.reason, verdict.resident) == ("host", "resident_slower", False)
    assert verdict.savings_ns == -(3 * MS) // 2
    assert decide_residency(-10_000).savings_ns == 0  # no work estimated


def test_a_tie_stays_resident_and_a_threshold_makes_small_gains_host() -> None:
    assert MIN_RESIDENT_GAIN_BPS == 0
    tie = decide_residency(0, work_ns=MS)
    assert (tie.kind, tie.reason, tie.savings_ns) == ("resident", "resident_pays", 0)
    low = decide_residency(499, work_ns=10 * MS, min_gain_bps=500)
    assert (low.kind, low.reason, low.savings_ns) == ("host", "low_gain", 499_000)
    at = decide_residency(500, min_gain_bps=500)
    assert (at.kind, at.reason) == ("resident", "resident_pays")
    slower = decide_residency(-1, min_gain_bps=500)
    assert slower.reason == "resident_slower"
    assert decide_residency(10_000, min_gain_bps=10_000).resident


def test_uncalibrated_keeps_todays_default() -> None:
    verdict = decide_residency(None, work_ns=10 * MS)
    assert (verdict.kind, verdict.reason, verdict.savings_ns) == ("resident", "uncalibrated", 0)


@pytest.mark.parametrize("gain", [None, -5_000, 5_000])
def test_the_callers_choice_wins(gain: int | None) -> None:
    host = decide_residency(gain, requested="host", work_ns=MS)
    assert (host.kind, host.reason, host.savings_ns) == ("host", "requested", 0)
    resident = decide_residency(gain, requested="resident", work_ns=MS)
    assert (resident.kind, resident.reason, resident.savings_ns) == ("resident", "requested", 0)


@pytest.mark.parametrize("requested", ["auto", "resident"])
def test_a_backend_without_resident_buffers_gets_host_arrays(requested: Any) -> None:
    verdict = decide_residency(9_000, requested=requested, resident_buffers=False)
    assert (verdict.kind, verdict.reason) == ("host", "no_resident_buffers")
    assert decide_residency(None, requested="host", resident_buffers=False).reason == "requested"


@pytest.mark.parametrize(
    ("gain", "kwargs", "error"),
    [
        (1.5, {}, TypeError),
        (True, {}, TypeError),
        ("100", {}, TypeError),
        (10_001, {}, ValueError),
        (-10_001, {}, ValueError),
        (0, {"work_ns": -1}, ValueError),
        (0, {"work_ns": 1.5}, TypeError),
        (0, {"min_gain_bps": -1}, ValueError),
        (0, {"min_gain_bps": 10_001}, ValueError),
        (0, {"requested": "device"}, ValueError),
        (0, {"resident_buffers": 1}, TypeError),
    ],
)
def test_inputs_are_checked(gain: Any, kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match="Fix:"):
        decide_residency(gain, **kwargs)


def test_verdict_is_consistent() -> None:
    assert RESIDENCY_REASONS[0] == "requested"
    assert ResidencyVerdict(kind="host", reason="requested").reason == "requested"
    assert ResidencyVerdict(kind="resident", reason="requested").resident
    with pytest.raises(ValueError):
        ResidencyVerdict(kind="resident", reason="resident_slower")
    with pytest.raises(ValueError):
        ResidencyVerdict(kind="host", reason="uncalibrated")
    with pytest.raises(ValueError):
        ResidencyVerdict(kind="host", reason="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ResidencyVerdict(kind="device", reason="requested")  # type: ignore[arg-type]
