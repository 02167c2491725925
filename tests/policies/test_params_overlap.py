"""Parameter inlining and copy/compute overlap."""

from __future__ import annotations

import pytest

from vyre_async.policies import (
    INLINE_ALIGN,
    INLINE_BUDGET_DISABLED,
    INLINE_BUDGET_LARGE,
    INLINE_BUDGET_SMALL,
    ArmSummary,
    CopyVerdict,
    ParamInliningVerdict,
    can_overlap_copy_with_kernel,
    decide_param_inlining,
)


def test_presets() -> None:
    assert (INLINE_BUDGET_LARGE, INLINE_BUDGET_SMALL, INLINE_BUDGET_DISABLED) == (3072, 128, 0)
    assert INLINE_ALIGN == 4


@pytest.mark.parametrize(
    ("nbytes", "kind", "padded"),
    [
        (0, "inline", 0),
        (1, "inline", 4),
        (4, "inline", 4),
        (17, "inline", 20),
        (3069, "inline", 3072),
        (3072, "inline", 3072),
        (3073, "uniform_buffer", 3076),
        (4096, "uniform_buffer", 4096),
    ],
)
def test_large_budget(nbytes: int, kind: str, padded: int) -> None:
    verdict = decide_param_inlining(nbytes)
    assert (verdict.kind, verdict.padded_bytes) == (kind, padded)
    assert verdict.reason == (None if kind == "inline" else "over_budget")


def test_small_budget_boundary() -> None:
    assert decide_param_inlining(128, INLINE_BUDGET_SMALL).kind == "inline"
    assert decide_param_inlining(125, INLINE_BUDGET_SMALL).padded_bytes == 128
    over = decide_param_inlining(129, INLINE_BUDGET_SMALL)
    assert (over.kind, over.reason, over.padded_bytes) == ("uniform_buffer", "over_budget", 132)


def test_disabled_budget_never_inlines() -> None:
    for nbytes in (0, 4, 17):
        verdict = decide_param_inlining(nbytes, INLINE_BUDGET_DISABLED)
        assert (verdict.kind, verdict.reason) == ("uniform_buffer", "inlining_disabled")


def test_other_alignments_and_no_padding() -> None:
    assert decide_param_inlining(17, 3072, 8).padded_bytes == 24
    assert decide_param_inlining(17, 3072, 1).padded_bytes == 17
    unaligned = decide_param_inlining(17, 3072, allow_padding=False)
    assert (unaligned.kind, unaligned.reason) == ("uniform_buffer", "unaligned")
    assert decide_param_inlining(16, 3072, allow_padding=False).kind == "inline"


@pytest.mark.parametrize(
    ("args", "error"),
    [((-1,), ValueError), ((4, -1), ValueError), ((4, 3072, 0), ValueError), ((4.0,), TypeError)],
)
def test_inlining_inputs_are_validated(args: tuple[object, ...], error: type[Exception]) -> None:
    with pytest.raises(error, match="Fix:"):
        decide_param_inlining(*args)  # type: ignore[arg-type]


def test_inlining_verdict_is_checked() -> None:
    with pytest.raises(ValueError):
        ParamInliningVerdict(kind="inline", reason="over_budget")
    with pytest.raises(ValueError):
        ParamInliningVerdict(kind="uniform_buffer")


# Copy overlap --------------------------------------------------------------------------


def test_copy_into_an_untouched_slot_overlaps() -> None:
    verdict = can_overlap_copy_with_kernel(7, ArmSummary({0, 1}, {2}))
    assert (verdict.kind, verdict.reason) == ("overlap", None)


def test_copy_into_a_slot_the_kernel_reads_serializes() -> None:
    verdict = can_overlap_copy_with_kernel(0, ArmSummary({0, 1}, {2}))
    assert (verdict.kind, verdict.reason) == ("serialize", "kernel_reads_slot")


def test_copy_into_a_slot_the_kernel_writes_serializes() -> None:
    verdict = can_overlap_copy_with_kernel(2, ArmSummary({0, 1}, {2}))
    assert (verdict.kind, verdict.reason) == ("serialize", "kernel_writes_slot")


def test_reads_are_reported_before_writes() -> None:
    verdict = can_overlap_copy_with_kernel("buf", ArmSummary({"buf"}, {"buf"}))
    assert verdict.reason == "kernel_reads_slot"


def test_empty_kernel_always_overlaps() -> None:
    assert can_overlap_copy_with_kernel(0, ArmSummary()).kind == "overlap"


def test_copy_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="Fix:"):
        can_overlap_copy_with_kernel(0, {0})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CopyVerdict(kind="serialize")
