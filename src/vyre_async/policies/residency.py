"""Graph residency: keep an arm graph's resources in resident buffers, or as host arrays?

Resident buffers let the arm scheduler join layers on the device (no host sync
between layers) and, on a GPU, save the host-to-device copy of every input. On
a backend whose "resident" buffers are host memory (the reference backend) they
save nothing and cost extra copies: the engine copies resident inputs, writes
READ_WRITE results back, and the graph gives every WRITE output a fresh zeroed
resident buffer. The backend's calibration measures how much faster a dispatch
runs the way the graph runs it on resident buffers than the same dispatch on
host arrays (``resident_gain_bps``, basis points of the host-array time,
negative when resident was slower); this policy applies it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies._checks import non_negative_int

__all__ = [
    "MIN_RESIDENT_GAIN_BPS",
    "RESIDENCY_REASONS",
    "ResidencyVerdict",
    "decide_residency",
]
__dir__ = _public_dir(__name__)

ResidencyKind = Literal["resident", "host"]
ResidencyRequest = Literal["auto", "resident", "host"]
ResidencyReason = Literal[
    "requested",
    "no_resident_buffers",
    "uncalibrated",
    "resident_slower",
    "low_gain",
    "resident_pays",
]
#: Every reason the verdict can carry, in the order the rules are checked.
RESIDENCY_REASONS: tuple[ResidencyReason, ...] = (
    "requested",
    "no_resident_buffers",
    "uncalibrated",
    "resident_slower",
    "low_gain",
    "resident_pays",
)
_HOST_REASONS = frozenset({"no_resident_buffers", "resident_slower", "low_gain"})
_BPS = 10_000
#: The least calibrated gain that keeps resources resident (0: resident unless
#: measured slower; a tie stays resident, since resident resources also let the
#: layers join on the device, which the measurement does not count).
MIN_RESIDENT_GAIN_BPS = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidencyVerdict:
    """Where a graph's resources live for one run, and why.

    Attributes:
        kind: ``"resident"`` (resources the arms read are uploaded once and passed
            as resident buffers; outputs stay resident) or ``"host"`` (graph-owned
            host arrays; layers join on the host).
        reason: ``requested`` (the caller chose, either kind);
            ``no_resident_buffers``, ``resident_slower`` or ``low_gain`` (host);
            ``uncalibrated`` or ``resident_pays`` (resident).
        savings_ns: Estimated time resident buffers save over host arrays for
            the estimated work (negative: what they would cost); 0 when not
            estimated (requested, no resident buffers, not calibrated).
    """

    kind: ResidencyKind
    reason: ResidencyReason
    savings_ns: int = 0

    def __post_init__(self) -> None:
        if self.reason not in RESIDENCY_REASONS:
            raise ValueError(
                f"ResidencyVerdict.reason must be one of {RESIDENCY_REASONS}, not {self.reason!r}"
            )
        if self.kind not in ("resident", "host"):
            raise ValueError(
                f"ResidencyVerdict.kind must be 'resident' or 'host', not {self.kind!r}"
            )
        if self.reason != "requested":
            expected = "host" if self.reason in _HOST_REASONS else "resident"
            if self.kind != expected:
                raise ValueError(
                    f"ResidencyVerdict: reason {self.reason!r} goes with kind {expected!r}, "
                    f"not {self.kind!r}"
                )

    @property
    def resident(self) -> bool:
        """True when the resources are passed as resident buffers."""
        return self.kind == "resident"


def decide_residency(
    gain_bps: int | None,
    *,
    requested: ResidencyRequest = "auto",
    resident_buffers: bool = True,
    work_ns: int = 0,
    min_gain_bps: int = MIN_RESIDENT_GAIN_BPS,
) -> ResidencyVerdict:
    """Decide whether an arm graph's resources are resident buffers or host arrays.

    With ``savings = floor(gain_bps * work_ns / 10000)``, first match wins:

    1. ``requested == "host"`` → ``host``, ``requested``;
    2. the backend has no resident buffers → ``host``, ``no_resident_buffers``
       (with ``requested == "resident"`` too: the caller raises);
    3. ``requested == "resident"`` → ``resident``, ``requested``;
    4. ``gain_bps`` is None (not calibrated) → ``resident``, ``uncalibrated``
       (the scheduler's default);
    5. ``gain_bps < min_gain_bps`` and ``gain_bps < 0`` → ``host``,
       ``resident_slower`` (savings < 0);
    6. ``gain_bps < min_gain_bps`` → ``host``, ``low_gain``;
    7. otherwise ``resident``, ``resident_pays`` (a tie stays resident).

    Args:
        gain_bps: The calibrated resident gain (`Calibration.resident_gain_bps`),
            basis points in -10000..10000, or None when not calibrated.
        requested: The caller's choice: ``"auto"`` (this policy decides),
            ``"resident"`` or ``"host"``.
        resident_buffers: Whether the backend has resident buffers (False once
            its ``upload`` raised `UnsupportedFeature`).
        work_ns: Estimated dispatch time of the run (int ns >= 0), for the
            savings estimate only.
        min_gain_bps: The least gain that keeps resources resident (default
            `MIN_RESIDENT_GAIN_BPS`, 0; an int in 0..10000).

    Returns:
        The verdict with the estimated savings.

    Raises:
        TypeError: ``gain_bps`` is not an int or None, or ``work_ns`` or
            ``min_gain_bps`` is not an int, or ``resident_buffers`` not a bool.
        ValueError: ``gain_bps``, ``work_ns`` or ``min_gain_bps`` is out of
            range, or ``requested`` is not one of the three choices.
    """
    threshold = non_negative_int("min_gain_bps", min_gain_bps)
    if threshold > _BPS:
        raise ValueError(
            f"min_gain_bps must lie in 0..10000, got {threshold}\nFix: pass basis points"
        )
    work = non_negative_int("work_ns", work_ns)
    if requested not in ("auto", "resident", "host"):
        raise ValueError(
            f"requested must be 'auto', 'resident' or 'host', got {requested!r}\n"
            'Fix: pass requested="auto"'
        )
    if not isinstance(resident_buffers, bool):
        raise TypeError(
            f"resident_buffers must be a bool, got {resident_buffers!r}\n"
            "Fix: pass whether the backend's upload() works"
        )
    if gain_bps is not None:
        if isinstance(gain_bps, bool) or not isinstance(gain_bps, int):
            raise TypeError(
                f"gain_bps must be an int of basis points or None, got {gain_bps!r}\n"
                "Fix: pass Calibration.resident_gain_bps"
            )
        if not -_BPS <= gain_bps <= _BPS:
            raise ValueError(
                f"gain_bps must lie in -10000..10000, got {gain_bps}\nFix: clamp the measured gain"
            )
    if requested == "host":
        return ResidencyVerdict(kind="host", reason="requested")
    if not resident_buffers:
        return ResidencyVerdict(kind="host", reason="no_resident_buffers")
    if requested == "resident":
        return ResidencyVerdict(kind="resident", reason="requested")
    if gain_bps is None:
        return ResidencyVerdict(kind="resident", reason="uncalibrated")
    savings = gain_bps * work // _BPS
    if gain_bps < threshold:
        reason: ResidencyReason = "resident_slower" if gain_bps < 0 else "low_gain"
        return ResidencyVerdict(kind="host", reason=reason, savings_ns=savings)
    return ResidencyVerdict(kind="resident", reason="resident_pays", savings_ns=savings)
