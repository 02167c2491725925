"""`decide_fusion`: every reason, the break-even, grouping within limits, checked inputs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vyre_async.ir import Access, BufferDecl, DType, GridBarrier, Program
from vyre_async.policies.pipeline_fusion import (
    FUSION_REASONS,
    FusionMember,
    FusionVerdict,
    decide_fusion,
    describe_member,
)
from vyre_async.programs import elementwise_xor, histogram, sum_reduction

M = FusionMember(workgroup=(64, 1, 1), workgroups=4, storage_buffers=3)
COSTS = {"launch_ns": 10_000, "compile_ns": 0, "fusion_gain_bps": 5_000}


def members(n: int, member: FusionMember = M) -> list[FusionMember]:
    return [member] * n


def test_a_calibrated_gain_fuses_all_members_into_one_launch() -> None:
    verdict = decide_fusion(members(4), **COSTS)
    assert (verdict.kind, verdict.reason, verdict.groups) == ("fuse", "cheaper", ((0, 1, 2, 3),))
    assert verdict.savings_ns == 4 * 10_000 // 2  # half of 4 launches
    assert verdict.span_attributes() == {
        "vyre.policy.fusion": "fuse",
        "vyre.policy.fusion.reason": "cheaper",
        "vyre.policy.fusion.members": 4,
        "vyre.policy.fusion.launches": 1,
        "vyre.policy.fusion.savings_ns": 20_000,
    }


def test_the_compile_is_weighed_and_a_break_even_stays_separate() -> None:
    assert decide_fusion(members(4), **{**COSTS, "compile_ns": 19_999}).kind == "fuse"
    even = decide_fusion(members(4), **{**COSTS, "compile_ns": 20_000})
    assert (even.kind, even.reason, even.savings_ns) == ("separate", "not_worth_it", 0)
    assert even.groups == ((0,), (1,), (2,), (3,))


def test_a_negative_or_zero_gain_never_fuses() -> None:
    for gain in (0, -1, -10_000):
        verdict = decide_fusion(members(16), **{**COSTS, "fusion_gain_bps": gain})
        assert (verdict.kind, verdict.reason) == ("separate", "not_worth_it")


@pytest.mark.parametrize("missing", ["launch_ns", "compile_ns", "fusion_gain_bps"])
def test_any_missing_cost_is_uncalibrated(missing: str) -> None:
    verdict = decide_fusion(members(4), **{**COSTS, missing: None})
    assert (verdict.kind, verdict.reason) == ("separate", "uncalibrated")


def test_force_fuses_whatever_the_costs_and_disable_never() -> None:
    forced = decide_fusion(members(3), launch_ns=None, compile_ns=None, mode="force")
    assert (forced.kind, forced.reason, forced.launches) == ("fuse", "requested", 1)
    off = decide_fusion(members(3), **COSTS, mode="disable")
    assert (off.kind, off.reason, off.launches) == ("separate", "disabled", 3)


@pytest.mark.parametrize(
    ("group", "reason"),
    [
        ([M], "single_member"),
        ([M, replace(M, has_grid_barrier=True)], "grid_barrier"),
        ([M, replace(M, workgroup=(32, 1, 1))], "workgroup_mismatch"),
        (
            [replace(M, writes=frozenset({"r1"})), replace(M, reads=frozenset({"r1"}))],
            "conflict",
        ),
        (
            [replace(M, writes=frozenset({"r1"})), replace(M, writes=frozenset({"r1"}))],
            "conflict",
        ),
    ],
)
def test_what_may_not_fuse_stays_separate_with_its_reason(
    group: list[FusionMember], reason: str
) -> None:
    verdict = decide_fusion(group, **COSTS, mode="force")
    assert (verdict.kind, verdict.reason) == ("separate", reason)
    assert verdict.groups == tuple((i,) for i in range(len(group)))


def test_shared_reads_do_not_conflict() -> None:
    shared = replace(M, reads=frozenset({"table"}))
    assert decide_fusion([shared, shared], **COSTS).kind == "fuse"


def test_blocked_reasons_from_the_caller_are_kept() -> None:
    verdict = decide_fusion(members(4), **COSTS, blocked="resident_inputs")
    assert (verdict.kind, verdict.reason) == ("separate", "resident_inputs")


def test_groups_respect_the_storage_bindings() -> None:
    # 3 buffers each plus the member table: 3 members fit 10 bindings, not 4.
    verdict = decide_fusion(members(7), **COSTS, max_storage_buffers=10)
    assert verdict.groups == ((0, 1, 2), (3, 4, 5), (6,))
    assert verdict.savings_ns == 7 * 10_000 * 5_000 * 4 // (10_000 * 6)
    alone = decide_fusion(members(3), **COSTS, max_storage_buffers=3)
    assert (alone.kind, alone.reason) == ("separate", "limits")


def test_groups_share_workgroup_memory_of_one_shape_and_add_up_others() -> None:
    a = replace(M, workgroup_slots=(("u32", 1024),))  # 4 KiB
    b = replace(M, workgroup_slots=(("f32", 1024),))
    assert decide_fusion([a] * 5, **COSTS, max_workgroup_bytes=4096).launches == 1
    assert decide_fusion([a, b, a, b], **COSTS, max_workgroup_bytes=8192).launches == 1
    assert decide_fusion([a, b, a, b], **COSTS, max_workgroup_bytes=8191).groups == (
        (0,),
        (1,),
        (2,),
        (3,),
    )


def test_one_member_with_barrier_and_return_per_group() -> None:
    both = replace(M, barrier_and_return=True)
    verdict = decide_fusion([both, M, both, M], **COSTS)
    assert verdict.groups == ((0, 1), (2, 3))


def test_describe_member_reads_the_program() -> None:
    sums = describe_member(sum_reduction(1000, workgroup=64), 16)
    assert (sums.workgroup, sums.workgroups, sums.storage_buffers) == ((64, 1, 1), 16, 2)
    assert sums.workgroup_slots == (("f32", 64),)
    assert not sums.has_grid_barrier and not sums.barrier_and_return
    assert describe_member(histogram(), 1).workgroup_slots == (("u32", 256),)
    grid = Program([BufferDecl("o", 0, Access.WRITE, DType.U32, 1)], 8, [GridBarrier()])
    assert describe_member(grid, 1).has_grid_barrier
    assert describe_member(elementwise_xor(8), 1).storage_buffers == 3


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"launch_ns": -1}, ValueError),
        ({"compile_ns": 1.5}, TypeError),
        ({"fusion_gain_bps": 10_001}, ValueError),
        ({"fusion_gain_bps": True}, TypeError),
        ({"max_storage_buffers": -1}, ValueError),
        ({"mode": "sometimes"}, ValueError),
        ({"blocked": "because"}, ValueError),
    ],
)
def test_bad_inputs_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        decide_fusion(members(2), **{**COSTS, **kwargs})  # type: ignore[arg-type]


def test_verdicts_check_themselves() -> None:
    assert set(FUSION_REASONS) >= {"cheaper", "requested", "uncalibrated", "limits"}
    with pytest.raises(ValueError, match="kind"):
        FusionVerdict(kind="maybe", reason="cheaper", groups=())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reason"):
        FusionVerdict(kind="fuse", reason="because", groups=())
    with pytest.raises(ValueError, match="savings_ns must be 0"):
        FusionVerdict(kind="separate", reason="disabled", groups=(), savings_ns=1)
