"""Speculative pre-specialisation: compile a likely variant before it is requested."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies._checks import non_negative_int

__all__ = [
    "SPECULATION_MIN_CONFIDENCE_BPS",
    "SPECULATION_MIN_HITS",
    "SpeculationVerdict",
    "decide_speculation",
]
__dir__ = _public_dir(__name__)

#: A shape must have been seen at least this often in the window to be "hot".
SPECULATION_MIN_HITS = 8
#: Prediction confidence needed, in basis points (60 %).
SPECULATION_MIN_CONFIDENCE_BPS = 6000
_FULL_BPS = 10_000

SpeculationKind = Literal["hold", "speculate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculationVerdict:
    """Whether to compile a predicted variant speculatively.

    Attributes:
        kind: ``"hold"`` or ``"speculate"``.
        reason: ``None`` when speculating; else ``"cold_shape"`` (fewer than 8
            hits), ``"low_confidence"`` (below 60 %), ``"no_miss_cost"`` or
            ``"not_worth_compile"`` (expected gain ≤ compile cost, a tie included).
        savings_ns: Expected savings ``floor(miss·confidence) - compile`` when
            speculating, else 0.
    """

    kind: SpeculationKind
    reason: str | None = None
    savings_ns: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("hold", "speculate"):
            raise ValueError(
                f"SpeculationVerdict.kind must be 'hold' or 'speculate', not {self.kind!r}"
            )
        if (self.kind == "hold") != (self.reason is not None):
            raise ValueError("SpeculationVerdict: a reason is given exactly when kind is 'hold'")
        non_negative_int("SpeculationVerdict.savings_ns", self.savings_ns)


def decide_speculation(
    hit_count: int, confidence_bps: int, compile_ns: int, miss_ns: int
) -> SpeculationVerdict:
    """Return whether to pre-compile the predicted specialisation.

    Rule: ``hit_count < 8`` → hold; confidence (clamped to 10 000 bps) ``< 6000``
    → hold; ``miss_ns == 0`` → hold; ``weighted = floor(miss·confidence / 10 000)``;
    ``weighted ≤ compile_ns`` → hold (a tie holds); else speculate with
    ``savings = weighted - compile_ns``. Examples: 60 % x 100 µs against a 50 µs
    compile saves 10 µs; against a 60 µs compile it holds.

    Args:
        hit_count: How often the shape appeared in the recent window.
        confidence_bps: Prediction confidence in basis points (e.g. the rolling
            hit rate's ``bps``); values above 10 000 count as 10 000.
        compile_ns: Cost of one speculative compile.
        miss_ns: Cost of a cache miss (the compile a dispatch would wait for).

    Returns:
        The verdict.

    Raises:
        TypeError: an argument is not an integer.
        ValueError: an argument is negative.
    """
    hits = non_negative_int("hit_count", hit_count)
    confidence = min(non_negative_int("confidence_bps", confidence_bps), _FULL_BPS)
    spec = non_negative_int("compile_ns", compile_ns)
    miss = non_negative_int("miss_ns", miss_ns)
    if hits < SPECULATION_MIN_HITS:
        return SpeculationVerdict(kind="hold", reason="cold_shape")
    if confidence < SPECULATION_MIN_CONFIDENCE_BPS:
        return SpeculationVerdict(kind="hold", reason="low_confidence")
    if miss == 0:
        return SpeculationVerdict(kind="hold", reason="no_miss_cost")
    weighted = miss * confidence // _FULL_BPS
    if weighted <= spec:
        return SpeculationVerdict(kind="hold", reason="not_worth_compile")
    return SpeculationVerdict(kind="speculate", savings_ns=weighted - spec)
