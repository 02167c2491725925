"""What mutation testing (issue 28) found unchecked in the policies, checked by behaviour.

Each test states a documented rule a user can observe: the whole text of an
argument error (the parameter it names and its Fix line), a threshold at its
boundary (limit - 1, limit, limit + 1), the conflicting slots and savings a
verdict reports, and the hit rate and payloads of the shape history compared
with a plain model. The surviving mutants each test kills are listed beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vyre_async.policies.arms import (
    ArmConflict,
    ArmPlan,
    ArmSummary,
    ArmVerdict,
    can_dispatch_concurrently,
    layer_dag,
    plan_arms,
)
from vyre_async.policies.concurrency import decide_arm_concurrency
from vyre_async.policies.launch import (
    CommandReuseVerdict,
    PersistentVerdict,
    select_primary_execution_mode,
)
from vyre_async.policies.overlap import can_overlap_copy_with_kernel
from vyre_async.policies.params import decide_param_inlining
from vyre_async.policies.residency import ResidencyVerdict, decide_residency
from vyre_async.policies.shapes import RollingHitRate, ShapeHistory


def _message(call: Callable[[], object], error: type[Exception]) -> str:
    with pytest.raises(error) as caught:
        call()
    return str(caught.value)


# --- Arms -------------------------------------------------------------------------

_SUMMARY_FIX = "Fix: build it with ArmSummary(reads={...}, writes={...})"


def test_a_non_summary_arm_is_refused_naming_the_argument_and_its_type() -> None:
    # arms._summary 3, 4; can_dispatch_concurrently 3, 6, 7, 9, 12, 13; plan_arms 3
    ok = ArmSummary(reads={0})
    assert _message(lambda: can_dispatch_concurrently(5, ok), TypeError) == (  # type: ignore[arg-type]
        f"a must be an ArmSummary, got int\n{_SUMMARY_FIX}"
    )
    assert _message(lambda: can_dispatch_concurrently(ok, "x"), TypeError) == (  # type: ignore[arg-type]
        f"b must be an ArmSummary, got str\n{_SUMMARY_FIX}"
    )
    assert _message(lambda: plan_arms([ok, ok, None]), TypeError) == (  # type: ignore[list-item]
        f"summaries[2] must be an ArmSummary, got NoneType\n{_SUMMARY_FIX}"
    )


def test_a_non_summary_kernel_is_refused_by_the_copy_overlap_policy() -> None:
    # overlap.can_overlap_copy_with_kernel 3, 4
    assert _message(lambda: can_overlap_copy_with_kernel(0, {0}), TypeError) == (  # type: ignore[arg-type]
        f"kernel must be an ArmSummary, got set\n{_SUMMARY_FIX}"
    )


@pytest.mark.parametrize(
    ("a", "b", "reason", "slots"),
    [
        (ArmSummary(writes={1, 2}), ArmSummary(writes={2, 3}), "write_write", {2}),
        (ArmSummary(writes={1, 2}), ArmSummary(reads={2, 3}), "read_after_write", {2}),
        (ArmSummary(reads={1, 2, 5}), ArmSummary(writes={2, 5, 7}), "write_after_read", {2, 5}),
        # only b writes: the write-after-read slots are still reported
        (
            ArmSummary(reads={"x"}),
            ArmSummary(reads={"x", "y"}, writes={"x"}),
            "write_after_read",
            {"x"},
        ),
    ],
)
def test_a_serialising_verdict_names_the_conflicting_slots(
    a: ArmSummary, b: ArmSummary, reason: str, slots: set[object]
) -> None:
    # can_dispatch_concurrently 42, 45; plan_arms 20
    verdict = can_dispatch_concurrently(a, b)
    assert (verdict.kind, verdict.reason, verdict.slots) == ("serialize", reason, frozenset(slots))
    plan = plan_arms([a, b])
    assert plan.conflicts == (
        ArmConflict(earlier=0, later=1, reason=reason, slots=frozenset(slots)),  # type: ignore[arg-type]
    )
    assert plan.waits_for(1) == plan.conflicts[0]


@pytest.mark.parametrize("count", [True, False, 2.0, "3", None])
def test_layer_dag_refuses_a_count_that_is_not_an_int(count: object) -> None:
    # layer_dag 1, 3
    assert _message(lambda: layer_dag(count, []), TypeError) == (  # type: ignore[arg-type]
        f"count must be an int, got {count!r}\nFix: pass the number of nodes"
    )


@pytest.mark.parametrize(
    ("count", "edge", "end"),
    [(1, (0, 1), 1), (3, (3, 0), 3), (3, (0, -1), -1), (5, (2, 7), 7)],
)
def test_layer_dag_names_the_range_of_nodes_when_an_edge_leaves_it(
    count: int, edge: tuple[int, int], end: int
) -> None:
    # layer_dag 22, 23, 24
    assert _message(lambda: layer_dag(count, [edge]), ValueError) == (
        f"edge {edge!r} names node {end}, outside 0..{count - 1}\nFix: only connect existing nodes"
    )


def test_layer_dag_names_the_nodes_of_a_cycle_and_how_to_fix_it() -> None:
    # layer_dag 60
    assert _message(lambda: layer_dag(4, [(0, 1), (1, 2), (2, 1), (2, 3)]), ValueError) == (
        "the edges form a cycle; nodes [1, 2, 3] can never run\n"
        "Fix: remove an edge of the cycle (dependencies must point forward)"
    )


def test_waits_for_fails_loudly_on_a_hand_built_plan_without_the_conflict() -> None:
    # ArmPlan.waits_for 9, 10, 11
    plan = ArmPlan(layers=((0,), (1,)), layer_of=(0, 1), conflicts=())
    assert plan.waits_for(0) is None
    assert _message(lambda: plan.waits_for(1), AssertionError) == (
        "unreachable: a layer > 0 always has a predecessor"
    )


def test_an_arm_verdict_is_built_independent_or_serialising_with_a_listed_reason() -> None:
    # ArmVerdict.__post_init__ 2, 3, 6, 12, 13, 14, 15, 17, 19
    verdict = ArmVerdict(kind="independent")
    assert (verdict.concurrent, verdict.reason, verdict.slots) == (True, None, frozenset())
    assert not ArmVerdict(kind="serialize", reason="write_write", slots=frozenset({1})).concurrent
    assert _message(lambda: ArmVerdict(kind="parallel"), ValueError) == (  # type: ignore[arg-type]
        "ArmVerdict.kind must be 'independent' or 'serialize', not 'parallel'"
    )
    mismatch = "ArmVerdict: a reason is given exactly when kind is 'serialize'"
    assert _message(lambda: ArmVerdict(kind="serialize"), ValueError) == mismatch
    assert _message(lambda: ArmVerdict(kind="independent", reason="write_write"), ValueError) == (
        mismatch
    )
    assert _message(lambda: ArmVerdict(kind="serialize", reason="racy"), ValueError) == (  # type: ignore[arg-type]
        "ArmVerdict.reason must be one of "
        "('write_write', 'read_after_write', 'write_after_read'), not 'racy'"
    )


# --- Arm concurrency ----------------------------------------------------------------


def test_arm_concurrency_argument_errors_name_the_argument_and_the_fix() -> None:
    # concurrency 2, 6, 7, 8, 11, 20, 25, 28
    assert _message(
        lambda: decide_arm_concurrency([1, 1], 5000, min_overlap_bps=-1), ValueError
    ) == ("min_overlap_bps must be >= 0, got -1\nFix: pass a non-negative min_overlap_bps")
    assert (
        _message(lambda: decide_arm_concurrency([1, 1], 5000, min_overlap_bps=10_001), ValueError)
        == "min_overlap_bps must lie in 0..10000, got 10001\nFix: pass basis points"
    )
    assert _message(lambda: decide_arm_concurrency([1, 2, -3], 5000), ValueError) == (
        "work_ns[2] must be >= 0, got -3\nFix: pass a non-negative work_ns[2]"
    )
    assert _message(lambda: decide_arm_concurrency([1, 2], 0.5), TypeError) == (  # type: ignore[arg-type]
        "overlap_bps must be an int of basis points or None, got 0.5\n"
        "Fix: pass Calibration.concurrent_overlap_bps"
    )
    for bad in (-10_001, 10_001):
        assert _message(partial(decide_arm_concurrency, [1, 2], bad), ValueError) == (
            f"overlap_bps must lie in -10000..10000, got {bad}\nFix: clamp the measured overlap"
        )


@pytest.mark.parametrize(
    ("work", "overlap", "minimum", "expected"),
    [
        # the ends of both ranges are accepted
        ([100, 300], -10_000, 1000, ("in_order", "no_overlap", -100)),
        ([100, 300], 10_000, 10_000, ("concurrent", "overlap_pays", 100)),
        ([100, 300], 9_999, 10_000, ("in_order", "low_overlap", 99)),
        ([100, 300], 0, 0, ("in_order", "no_overlap", 0)),
        # savings of exactly 1 ns pay; 0 is nothing to hide
        ([10_000, 1], 10_000, 1000, ("concurrent", "overlap_pays", 1)),
        ([10_000, 1], 9_999, 1000, ("in_order", "nothing_to_hide", 0)),
        ([10_000, 2], 5_000, 1000, ("concurrent", "overlap_pays", 1)),
        ([10_000, 0, 0], 10_000, 1000, ("in_order", "nothing_to_hide", 0)),
    ],
)
def test_arm_concurrency_at_the_ends_of_its_ranges(
    work: list[int], overlap: int, minimum: int, expected: tuple[str, str, int]
) -> None:
    # concurrency 8, 25, 80
    v = decide_arm_concurrency(work, overlap, min_overlap_bps=minimum)
    assert (v.kind, v.reason, v.savings_ns) == expected


# --- Launch and overlap --------------------------------------------------------------


def test_the_execution_mode_refuses_verdicts_of_the_wrong_type() -> None:
    # launch.select_primary_execution_mode 3, 4, 8, 9, 10, 11, 12
    persistent = PersistentVerdict(kind="standard", reason="single_launch")
    reuse = CommandReuseVerdict(kind="plain", reason="single_launch")
    assert _message(lambda: select_primary_execution_mode(reuse, reuse), TypeError) == (  # type: ignore[arg-type]
        "persistent must be a PersistentVerdict, got CommandReuseVerdict\n"
        "Fix: pass decide_persistent_kernel(...)"
    )
    assert _message(lambda: select_primary_execution_mode(persistent, persistent), TypeError) == (  # type: ignore[arg-type]
        "reuse must be a CommandReuseVerdict, got PersistentVerdict\n"
        "Fix: pass decide_command_reuse(...)"
    )


# --- Parameter inlining --------------------------------------------------------------


def test_param_inlining_names_a_bad_alignment() -> None:
    # params 17, 21, 22, 26
    assert _message(lambda: decide_param_inlining(8, align=-4), ValueError) == (
        "align must be >= 0, got -4\nFix: pass a non-negative align"
    )
    assert _message(lambda: decide_param_inlining(8, align=4.0), TypeError) == (  # type: ignore[arg-type]
        "align must be an integer, got float 4.0\n"
        "Fix: pass whole nanoseconds/bytes as an int, e.g. round(align)"
    )
    assert _message(lambda: decide_param_inlining(8, align=0), ValueError) == (
        "align must be >= 1, got 0\nFix: pass align=4 (the default)"
    )


@pytest.mark.parametrize(
    ("nbytes", "budget", "allow_padding", "expected"),
    [
        (17, 0, True, ("uniform_buffer", "inlining_disabled", 20)),
        (17, 3072, False, ("uniform_buffer", "unaligned", 20)),
        (3073, 3072, True, ("uniform_buffer", "over_budget", 3076)),
        (17, 3072, True, ("inline", None, 20)),
    ],
)
def test_a_uniform_buffer_verdict_reports_the_padded_size(
    nbytes: int, budget: int, allow_padding: bool, expected: tuple[str, str | None, int]
) -> None:
    # params 41, 54
    v = decide_param_inlining(nbytes, budget, allow_padding=allow_padding)
    assert (v.kind, v.reason, v.padded_bytes) == expected


# --- Residency -----------------------------------------------------------------------


def test_residency_argument_errors_name_the_argument_and_the_fix() -> None:
    # residency 6, 10, 11, 15, 19, 20, 29, 34, 41
    assert _message(lambda: decide_residency(0, min_gain_bps=-2), ValueError) == (
        "min_gain_bps must be >= 0, got -2\nFix: pass a non-negative min_gain_bps"
    )
    assert _message(lambda: decide_residency(0, work_ns=-5), ValueError) == (
        "work_ns must be >= 0, got -5\nFix: pass a non-negative work_ns"
    )
    assert _message(lambda: decide_residency(0, work_ns=1.5), TypeError) == (  # type: ignore[arg-type]
        "work_ns must be an integer, got float 1.5\n"
        "Fix: pass whole nanoseconds/bytes as an int, e.g. round(work_ns)"
    )
    assert _message(lambda: decide_residency(0, requested="device"), ValueError) == (  # type: ignore[arg-type]
        "requested must be 'auto', 'resident' or 'host', got 'device'\nFix: pass requested=\"auto\""
    )
    assert _message(lambda: decide_residency(0, resident_buffers=1), TypeError) == (  # type: ignore[arg-type]
        "resident_buffers must be a bool, got 1\nFix: pass whether the backend's upload() works"
    )
    assert _message(lambda: decide_residency(1.0), TypeError) == (  # type: ignore[arg-type]
        "gain_bps must be an int of basis points or None, got 1.0\n"
        "Fix: pass Calibration.resident_gain_bps"
    )


@pytest.mark.parametrize(
    ("gain", "minimum", "work", "expected"),
    [
        # the saving is floored, and stays an int
        (-4300, 0, 12_345, ("host", "resident_slower", -5309)),
        (3333, 0, 7, ("resident", "resident_pays", 2)),
        # below a positive minimum, 0 and +1 are a low gain, -1 is slower
        (-1, 100, 10_000, ("host", "resident_slower", -1)),
        (0, 100, 10_000, ("host", "low_gain", 0)),
        (1, 100, 10_000, ("host", "low_gain", 1)),
        (99, 100, 10_000, ("host", "low_gain", 99)),
        (100, 100, 10_000, ("resident", "resident_pays", 100)),
        (101, 100, 10_000, ("resident", "resident_pays", 101)),
    ],
)
def test_residency_at_its_thresholds(
    gain: int, minimum: int, work: int, expected: tuple[str, str, int]
) -> None:
    # residency 90, 98, 99
    v = decide_residency(gain, work_ns=work, min_gain_bps=minimum)
    assert (v.kind, v.reason, v.savings_ns) == expected
    assert type(v.savings_ns) is int


def test_a_residency_verdict_refuses_a_reason_of_the_other_kind() -> None:
    # ResidencyVerdict.__post_init__ 21
    assert _message(lambda: ResidencyVerdict(kind="resident", reason="low_gain"), ValueError) == (
        "ResidencyVerdict: reason 'low_gain' goes with kind 'host', not 'resident'"
    )


# --- Shapes --------------------------------------------------------------------------

# ShapeHistory.push 1, 2, 4, 15 and ShapeHistory.record 5, 6 showed two bugs, both
# fixed with the tests below: push at capacity 1 returned a repeat where record +
# predict_next give None, and a shape that left the window and came back without a
# payload got its old one back (payloads were pruned only past 2 x capacity).


@pytest.mark.parametrize(("make", "name"), [(ShapeHistory, "capacity"), (RollingHitRate, "window")])
def test_shape_windows_take_any_size_from_one(make: Callable[[Any], Any], name: str) -> None:
    # shapes._capacity 4, 5; ShapeHistory.__init__ 2, 6, 7; RollingHitRate.__init__ 2, 6, 7
    assert getattr(make(1), name) == 1
    assert getattr(make(2), name) == 2
    for bad in (0, -1, True, 1.0):
        assert _message(partial(make, bad), ValueError) == (
            f"{name} must be an int >= 1, got {bad!r}\nFix: pass e.g. {name}=16"
        )


def test_a_history_of_one_keeps_the_latest_shape_and_its_payload() -> None:
    # shapes._capacity 4, 5 (through the public class); at capacity 1 no pattern
    # exists, so a repeat predicts nothing (push said the repeat before its fix).
    history: ShapeHistory[str] = ShapeHistory(1)
    history.record("a", 1)
    history.record("b", 2)
    assert history.entries == ("b",)
    assert history.predict_next() is None
    assert (history.payload_for("a"), history.payload_for("b")) == (None, 2)
    assert history.push("b") is None
    assert history.push("b", 3) is None and history.payload_for("b") == 3


@settings(max_examples=60)
@given(
    capacity=st.integers(min_value=1, max_value=4),
    steps=st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([None, 1, 2])), max_size=12),
)
def test_push_is_record_then_predict_next(
    capacity: int, steps: list[tuple[str, int | None]]
) -> None:
    # The documented equivalence of the hot path, at every capacity (ShapeHistory.push 1,
    # 2, 4, 15 at capacity 1).
    pushed: ShapeHistory[str] = ShapeHistory(capacity)
    recorded: ShapeHistory[str] = ShapeHistory(capacity)
    for fp, payload in steps:
        recorded.record(fp, payload)
        assert pushed.push(fp, payload) == recorded.predict_next()
        assert pushed.entries == recorded.entries
        for known in "abc":
            assert pushed.payload_for(known) == recorded.payload_for(known)


@settings(max_examples=80)
@given(
    capacity=st.integers(min_value=1, max_value=3),
    steps=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([None, 1, 2])), max_size=16),
)
def test_a_payload_is_kept_only_while_its_shape_is_in_the_window(
    capacity: int, steps: list[tuple[str, int | None]]
) -> None:
    # ShapeHistory.record 5, 6: a model of the documented rule. A payload recorded
    # with a shape is served while that shape stays in the window; once the shape
    # has left, it comes back without its old payload.
    history: ShapeHistory[str] = ShapeHistory(capacity)
    ring: list[str] = []
    payloads: dict[str, int] = {}
    for fp, payload in steps:
        history.push(fp, payload) if payload is None else history.record(fp, payload)
        ring.append(fp)
        if payload is not None:
            payloads[fp] = payload
        del ring[:-capacity]
        payloads = {k: v for k, v in payloads.items() if k in ring}
        for known in "abcd":
            assert history.payload_for(known) == payloads.get(known), (known, steps)


def test_a_shape_back_in_the_window_has_no_payload_from_before() -> None:
    history: ShapeHistory[str] = ShapeHistory(2)
    for fp, payload in [("a", "pa"), ("b", "pb"), ("c", "pc")]:
        history.record(fp, payload)
    history.record("a")
    assert history.entries == ("c", "a")
    assert (history.payload_for("a"), history.payload_for("c")) == (None, "pc")


@settings(max_examples=60)
@given(
    window=st.integers(min_value=1, max_value=5),
    outcomes=st.lists(st.booleans(), max_size=20),
    clear_at=st.integers(min_value=0, max_value=20),
)
def test_the_rolling_hit_rate_matches_a_model_of_its_window(
    window: int, outcomes: list[bool], clear_at: int
) -> None:
    # RollingHitRate.record 4, 14; RollingHitRate.clear 1, 2
    rate = RollingHitRate(window)
    kept: list[bool] = []
    for index, hit in enumerate(outcomes):
        if index == clear_at:
            rate.clear()
            kept = []
            assert (rate.hits, rate.total, rate.rate, rate.bps) == (0, 0, None, None)
        kept = [*kept, hit][-window:]
        returned = rate.record(hit)
        assert returned == sum(kept) / len(kept)
        assert (rate.hits, rate.total, len(rate)) == (sum(kept), len(kept), len(kept))
        assert rate.rate == returned
        assert rate.bps == sum(kept) * 10_000 // len(kept)


def test_the_rolling_hit_rate_after_clear_counts_from_zero() -> None:
    # RollingHitRate.clear 1, 2
    rate = RollingHitRate(4)
    for hit in (True, True, False):
        rate.record(hit)
    rate.clear()
    assert rate.hits == 0
    assert rate.record(False) == 0.0
    assert rate.record(True) == 0.5
    assert (rate.hits, rate.bps) == (1, 5000)


def test_pushing_a_repeat_with_a_new_payload_keeps_the_new_payload() -> None:
    # ShapeHistory.push 9
    history: ShapeHistory[str] = ShapeHistory(4)
    assert history.push("a", "first") is None
    assert history.push("a", "second") == "a"
    assert history.payload_for("a") == "second"
    assert history.push("a") == "a"
    assert history.payload_for("a") == "second"
    assert history.entries == ("a", "a", "a")
