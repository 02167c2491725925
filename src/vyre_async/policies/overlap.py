"""Copy/compute overlap: may an upload run on a side stream while a kernel runs?"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies.arms import ArmSummary

__all__ = ["COPY_REASONS", "CopyVerdict", "can_overlap_copy_with_kernel"]
__dir__ = _public_dir(__name__)

CopyKind = Literal["overlap", "serialize"]
CopyReason = Literal["kernel_reads_slot", "kernel_writes_slot"]
#: Why a copy cannot overlap the running kernel.
COPY_REASONS: tuple[CopyReason, ...] = ("kernel_reads_slot", "kernel_writes_slot")


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyVerdict:
    """Whether an upload may overlap the running kernel.

    On ``overlap`` the copy goes on the copy stream, an event is recorded after
    it and the *next consumer* of the slot waits on that event (device-side). On
    ``serialize`` the copy is ordered before the kernel on its stream.

    Attributes:
        kind: ``"overlap"`` or ``"serialize"``.
        reason: ``None`` on overlap; ``"kernel_reads_slot"`` (the kernel must see
            the copied data) or ``"kernel_writes_slot"`` (never copy into a
            kernel's output while it runs).
    """

    kind: CopyKind
    reason: CopyReason | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("overlap", "serialize"):
            raise ValueError(
                f"CopyVerdict.kind must be 'overlap' or 'serialize', not {self.kind!r}"
            )
        if (self.kind == "serialize") != (self.reason is not None):
            raise ValueError("CopyVerdict: a reason is given exactly when kind is 'serialize'")
        if self.reason is not None and self.reason not in COPY_REASONS:
            raise ValueError(
                f"CopyVerdict.reason must be one of {COPY_REASONS}, not {self.reason!r}"
            )


_OVERLAP = CopyVerdict(kind="overlap")


def can_overlap_copy_with_kernel(dst_slot: Hashable, kernel: ArmSummary) -> CopyVerdict:
    """Return whether a copy into ``dst_slot`` may run beside the ``kernel`` arm.

    ``serialize`` when the kernel reads ``dst_slot`` (checked first) or writes it;
    otherwise ``overlap``. An empty kernel summary always overlaps.

    Args:
        dst_slot: The slot the copy writes.
        kernel: The summary of the kernel running meanwhile.

    Returns:
        The verdict.

    Raises:
        TypeError: ``kernel`` is not an `ArmSummary`.
    """
    if not isinstance(kernel, ArmSummary):
        raise TypeError(
            f"kernel must be an ArmSummary, got {type(kernel).__name__}\n"
            "Fix: build it with ArmSummary(reads={...}, writes={...})"
        )
    if dst_slot in kernel.reads:
        return CopyVerdict(kind="serialize", reason="kernel_reads_slot")
    if dst_slot in kernel.writes:
        return CopyVerdict(kind="serialize", reason="kernel_writes_slot")
    return _OVERLAP
