"""Arm concurrency: run a layer's independent arms together, or one after another?

Independent arms *may* run concurrently (`vyre_async.policies.arms`); whether
that is faster depends on the backend. On a GPU, arms on separate streams
overlap; on a CPU backend whose workers share one interpreter lock (and a
couple of cores), concurrent arms can take longer than the same arms in order.
The backend's calibration measures how much of the shorter of two concurrent
dispatches was hidden by running them together (``concurrent_overlap_bps``, basis
points of that dispatch's time, negative when running them together was
slower); this policy applies it to a layer's estimated work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies._checks import non_negative_int

__all__ = [
    "ARM_CONCURRENCY_REASONS",
    "MIN_ARM_OVERLAP_BPS",
    "ArmConcurrencyVerdict",
    "decide_arm_concurrency",
]
__dir__ = _public_dir(__name__)

ArmConcurrencyKind = Literal["concurrent", "in_order"]
ArmConcurrencyReason = Literal[
    "single_arm", "uncalibrated", "no_overlap", "low_overlap", "nothing_to_hide", "overlap_pays"
]
#: Every reason the verdict can carry, in the order the rules are checked.
ARM_CONCURRENCY_REASONS: tuple[ArmConcurrencyReason, ...] = (
    "single_arm",
    "uncalibrated",
    "no_overlap",
    "low_overlap",
    "nothing_to_hide",
    "overlap_pays",
)
_IN_ORDER_REASONS = frozenset({"single_arm", "no_overlap", "low_overlap", "nothing_to_hide"})
_BPS = 10_000
#: Below this calibrated overlap (10 %), concurrency's measured gain is within the
#: noise of the measurement on a shared machine, and its cost when cores are busy
#: (contention) is not: such a backend runs layers in order.
MIN_ARM_OVERLAP_BPS = 1_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmConcurrencyVerdict:
    """How one layer's arms run, and why.

    Attributes:
        kind: ``"concurrent"`` (every arm of the layer in flight together) or
            ``"in_order"`` (each arm finishes before the next is dispatched).
        reason: ``single_arm``, ``no_overlap``, ``low_overlap`` or
            ``nothing_to_hide`` (in order);
            ``uncalibrated`` or ``overlap_pays`` (concurrent).
        savings_ns: Estimated time running the layer concurrently saves over
            running it in order (negative: what it would cost); 0 when not
            estimated (one arm, no calibration).
    """

    kind: ArmConcurrencyKind
    reason: ArmConcurrencyReason
    savings_ns: int = 0

    def __post_init__(self) -> None:
        if self.reason not in ARM_CONCURRENCY_REASONS:
            raise ValueError(
                f"ArmConcurrencyVerdict.reason must be one of {ARM_CONCURRENCY_REASONS}, "
                f"not {self.reason!r}"
            )
        expected = "in_order" if self.reason in _IN_ORDER_REASONS else "concurrent"
        if self.kind != expected:
            raise ValueError(
                f"ArmConcurrencyVerdict: reason {self.reason!r} goes with kind {expected!r}, "
                f"not {self.kind!r}"
            )

    @property
    def concurrent(self) -> bool:
        """True when the layer's arms are dispatched together."""
        return self.kind == "concurrent"


def decide_arm_concurrency(
    work_ns: Sequence[int],
    overlap_bps: int | None,
    *,
    min_overlap_bps: int = MIN_ARM_OVERLAP_BPS,
) -> ArmConcurrencyVerdict:
    """Decide whether a layer's independent arms run concurrently or in order.

    Running ``k`` arms together instead of one after another can at best hide
    all but the longest: ``hideable = sum(work) - max(work)``. The backend hides
    the fraction ``overlap_bps / 10000`` of it (measured on two concurrent
    dispatches by calibration), so the estimated saving is
    ``floor(overlap_bps * hideable / 10000)``. First match wins:

    1. fewer than two arms → ``in_order``, ``single_arm``;
    2. ``overlap_bps`` is None (not calibrated) → ``concurrent``,
       ``uncalibrated`` (the scheduler's default);
    3. ``overlap_bps <= 0`` → ``in_order``, ``no_overlap`` (savings ≤ 0);
    4. ``overlap_bps < min_overlap_bps`` → ``in_order``, ``low_overlap`` (a gain
       within measurement noise; savings as estimated);
    5. savings ``== 0`` (nothing but the longest arm has work) → ``in_order``,
       ``nothing_to_hide`` (a tie stays in order);
    6. otherwise ``concurrent``, ``overlap_pays``.

    Args:
        work_ns: Estimated time of each arm of the layer, alone (int ns >= 0).
        overlap_bps: The calibrated overlap, basis points in -10000..10000, or
            None when the backend is not calibrated for it.
        min_overlap_bps: The least overlap that counts as a gain (default
            `MIN_ARM_OVERLAP_BPS`, 10 %; an int in 0..10000).

    Returns:
        The verdict with the estimated savings.

    Raises:
        TypeError: a work estimate or ``overlap_bps`` is not an int.
        ValueError: a work estimate is negative, or ``overlap_bps`` or
            ``min_overlap_bps`` is out of range.
    """
    threshold = non_negative_int("min_overlap_bps", min_overlap_bps)
    if threshold > _BPS:
        raise ValueError(
            f"min_overlap_bps must lie in 0..10000, got {threshold}\nFix: pass basis points"
        )
    work = [non_negative_int(f"work_ns[{i}]", value) for i, value in enumerate(work_ns)]
    if overlap_bps is not None:
        if isinstance(overlap_bps, bool) or not isinstance(overlap_bps, int):
            raise TypeError(
                f"overlap_bps must be an int of basis points or None, got {overlap_bps!r}\n"
                "Fix: pass Calibration.concurrent_overlap_bps"
            )
        if not -_BPS <= overlap_bps <= _BPS:
            raise ValueError(
                f"overlap_bps must lie in -10000..10000, got {overlap_bps}\n"
                "Fix: clamp the measured overlap"
            )
    if len(work) < 2:
        return ArmConcurrencyVerdict(kind="in_order", reason="single_arm")
    if overlap_bps is None:
        return ArmConcurrencyVerdict(kind="concurrent", reason="uncalibrated")
    savings = overlap_bps * (sum(work) - max(work)) // _BPS
    if overlap_bps <= 0:
        return ArmConcurrencyVerdict(kind="in_order", reason="no_overlap", savings_ns=savings)
    if overlap_bps < threshold:
        return ArmConcurrencyVerdict(kind="in_order", reason="low_overlap", savings_ns=savings)
    if savings <= 0:
        return ArmConcurrencyVerdict(kind="in_order", reason="nothing_to_hide", savings_ns=0)
    return ArmConcurrencyVerdict(kind="concurrent", reason="overlap_pays", savings_ns=savings)
