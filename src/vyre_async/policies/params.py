"""Parameter inlining: pass launch parameters as kernel arguments or in a uniform buffer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vyre_async._exports import public_dir as _public_dir
from vyre_async.policies._checks import non_negative_int

__all__ = [
    "INLINE_ALIGN",
    "INLINE_BUDGET_DISABLED",
    "INLINE_BUDGET_LARGE",
    "INLINE_BUDGET_SMALL",
    "ParamInliningVerdict",
    "decide_param_inlining",
]
__dir__ = _public_dir(__name__)

#: Budget presets in bytes: large (CUDA's parameter space is at least 4 KiB), small, disabled.
INLINE_BUDGET_LARGE = 3072
INLINE_BUDGET_SMALL = 128
INLINE_BUDGET_DISABLED = 0
#: Parameters are padded to this many bytes.
INLINE_ALIGN = 4

ParamKind = Literal["inline", "uniform_buffer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamInliningVerdict:
    """How launch parameters reach the kernel.

    Attributes:
        kind: ``"inline"`` (kernel arguments) or ``"uniform_buffer"`` (one pooled
            device buffer uploaded before the launch).
        reason: ``None`` when inline; ``"inlining_disabled"`` (budget 0),
            ``"over_budget"`` (the padded size exceeds the budget) or
            ``"unaligned"`` (padding not allowed and the size is unaligned).
        padded_bytes: The size rounded up to the alignment (also reported for a
            uniform buffer).
    """

    kind: ParamKind
    reason: str | None = None
    padded_bytes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("inline", "uniform_buffer"):
            raise ValueError(
                f"ParamInliningVerdict.kind must be 'inline' or 'uniform_buffer', not {self.kind!r}"
            )
        if (self.kind == "uniform_buffer") != (self.reason is not None):
            raise ValueError("ParamInliningVerdict: a reason is given exactly for uniform_buffer")
        non_negative_int("ParamInliningVerdict.padded_bytes", self.padded_bytes)


def decide_param_inlining(
    nbytes: int,
    budget_bytes: int = INLINE_BUDGET_LARGE,
    align: int = INLINE_ALIGN,
    *,
    allow_padding: bool = True,
) -> ParamInliningVerdict:
    """Return whether ``nbytes`` of launch parameters fit inline as kernel arguments.

    Pad to ``align``; a padded size ≤ ``budget_bytes`` is inlined, anything larger
    goes to a uniform buffer; a budget of 0 disables inlining. Examples with the
    large preset: 0 bytes → inline 0; 17 → inline 20; 3072 → inline; 3073 (pads to
    3076) → uniform buffer.

    Args:
        nbytes: Size of the parameters.
        budget_bytes: Largest inline size (presets `INLINE_BUDGET_LARGE` 3072,
            `INLINE_BUDGET_SMALL` 128, `INLINE_BUDGET_DISABLED` 0).
        align: Alignment in bytes (>= 1).
        allow_padding: When False an unaligned size is not padded but sent in a
            uniform buffer.

    Returns:
        The verdict with the padded size.

    Raises:
        TypeError: an argument is not an integer.
        ValueError: an argument is negative or ``align`` is 0.
    """
    size = non_negative_int("nbytes", nbytes)
    budget = non_negative_int("budget_bytes", budget_bytes)
    step = non_negative_int("align", align)
    if step == 0:
        raise ValueError("align must be >= 1, got 0\nFix: pass align=4 (the default)")
    padded = -(-size // step) * step
    if budget == 0:
        return ParamInliningVerdict(
            kind="uniform_buffer", reason="inlining_disabled", padded_bytes=padded
        )
    if padded != size and not allow_padding:
        return ParamInliningVerdict(kind="uniform_buffer", reason="unaligned", padded_bytes=padded)
    if padded > budget:
        return ParamInliningVerdict(
            kind="uniform_buffer", reason="over_budget", padded_bytes=padded
        )
    return ParamInliningVerdict(kind="inline", padded_bytes=padded)
