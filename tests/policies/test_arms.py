"""Arm independence and DAG layering: every rule, order, example and error of policies.md."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vyre_async.policies import (
    ArmSummary,
    ArmVerdict,
    can_dispatch_concurrently,
    layer_arms,
    layer_dag,
    plan_arms,
)


def arm(reads: set[object] | None = None, writes: set[object] | None = None) -> ArmSummary:
    return ArmSummary(frozenset(reads or ()), frozenset(writes or ()))


# can_dispatch_concurrently ------------------------------------------------------------


def test_disjoint_arms_are_independent() -> None:
    verdict = can_dispatch_concurrently(arm({0, 1}, {2}), arm({3, 4}, {5}))
    assert verdict.kind == "independent"
    assert verdict.reason is None
    assert verdict.concurrent


def test_shared_reads_never_conflict() -> None:
    assert can_dispatch_concurrently(arm({0, 1}, {2}), arm({0, 1}, {3})).kind == "independent"


def test_empty_summaries_are_independent_of_everything() -> None:
    busy = arm({0, 1, 2}, {0, 1, 2})
    assert can_dispatch_concurrently(arm(), busy).kind == "independent"
    assert can_dispatch_concurrently(busy, arm()).kind == "independent"
    assert can_dispatch_concurrently(arm(), arm()).kind == "independent"


def test_write_write() -> None:
    verdict = can_dispatch_concurrently(arm(writes={7}), arm(writes={7}))
    assert (verdict.kind, verdict.reason) == ("serialize", "write_write")
    assert verdict.slots == {7}
    assert not verdict.concurrent


def test_read_after_write() -> None:
    verdict = can_dispatch_concurrently(arm(writes={1}), arm(reads={1}))
    assert (verdict.kind, verdict.reason) == ("serialize", "read_after_write")


def test_write_after_read() -> None:
    verdict = can_dispatch_concurrently(arm(reads={1}), arm(writes={1}))
    assert (verdict.kind, verdict.reason) == ("serialize", "write_after_read")


def test_first_matching_rule_wins() -> None:
    # a writes 1 (read by b) and 2 (written by b): write_write is checked first.
    a = arm(reads={3}, writes={1, 2})
    b = arm(reads={1}, writes={2, 3})
    assert can_dispatch_concurrently(a, b).reason == "write_write"
    # Without the shared write, RAW comes before WAR.
    assert can_dispatch_concurrently(arm({3}, {1}), arm({1}, {3})).reason == "read_after_write"


def test_reason_is_not_symmetric_but_the_answer_is() -> None:
    w, r = arm(writes={1}), arm(reads={1})
    assert can_dispatch_concurrently(w, r).reason == "read_after_write"
    assert can_dispatch_concurrently(r, w).reason == "write_after_read"
    ww = arm(writes={1}), arm(writes={1})
    assert can_dispatch_concurrently(*ww).reason == can_dispatch_concurrently(*ww[::-1]).reason


def test_slot_ids_may_be_names() -> None:
    verdict = can_dispatch_concurrently(arm(writes={"hist"}), arm(reads={"hist", "data"}))
    assert verdict.reason == "read_after_write"
    assert verdict.slots == {"hist"}


def test_summary_converts_iterables_and_refuses_strings() -> None:
    s = ArmSummary([1, 2, 2], (3,))
    assert s.reads == frozenset({1, 2}) and s.writes == frozenset({3})
    assert s.slots == {1, 2, 3}
    assert ArmSummary() == ArmSummary(frozenset(), frozenset())
    with pytest.raises(TypeError, match="Fix:"):
        ArmSummary("abc", ())


def test_non_summary_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="Fix:"):
        can_dispatch_concurrently({1}, arm())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Fix:"):
        layer_arms([arm(), "x"])  # type: ignore[list-item]


def test_verdict_record_is_checked() -> None:
    with pytest.raises(ValueError):
        ArmVerdict(kind="serialize")
    with pytest.raises(ValueError):
        ArmVerdict(kind="independent", reason="write_write")
    with pytest.raises(ValueError):
        ArmVerdict(kind="parallel")  # type: ignore[arg-type]


# Layering: the worked examples ---------------------------------------------------------


def test_chain_of_four_needs_three_joins() -> None:
    chain = [arm(writes={0}), arm({0}, {1}), arm({1}, {2}), arm({2}, {3})]
    assert layer_arms(chain) == [[0], [1], [2], [3]]
    assert plan_arms(chain).joins == 3


def test_diamond_needs_two_joins_with_one_and_two_sharing_a_layer() -> None:
    diamond = [arm(writes={0}), arm({0}, {1}), arm({0}, {2}), arm({1, 2}, {3})]
    assert layer_arms(diamond) == [[0], [1, 2], [3]]
    plan = plan_arms(diamond)
    assert plan.joins == 2
    assert plan.layer_of == (0, 1, 1, 2)


def test_independent_arms_share_one_layer_without_joins() -> None:
    arms = [arm({0}, {i + 1}) for i in range(6)]
    assert layer_arms(arms) == [list(range(6))]
    assert plan_arms(arms).joins == 0


def test_empty_graph() -> None:
    assert layer_arms([]) == []
    assert plan_arms([]).joins == 0


def test_wide_fan_out_needs_one_join() -> None:
    arms = [arm(writes={"src"})] + [arm({"src"}, {i}) for i in range(1024)]
    layers = layer_arms(arms)
    assert layers == [[0], list(range(1, 1025))]


def test_layers_list_arms_in_submission_order() -> None:
    # 3 is discovered through an edge from 0 before 1 and 2 are (Kahn order), yet
    # each layer is listed ascending.
    arms = [arm(writes={"a"}), arm(writes={"b"}), arm(writes={"c"}), arm({"a"}), arm({"b", "c"})]
    assert layer_arms(arms) == [[0, 1, 2], [3, 4]]


def test_plan_keeps_every_conflict_and_the_one_that_placed_each_arm() -> None:
    arms = [arm({"x"}, {"p"}), arm({"y"}, {"q"}), arm({"p", "q"}, {"r"}), arm({"r"}, {"x"})]
    plan = plan_arms(arms)
    pairs = [(c.earlier, c.later, c.reason) for c in plan.conflicts]
    assert pairs == [
        (0, 2, "read_after_write"),
        (1, 2, "read_after_write"),
        (0, 3, "write_after_read"),
        (2, 3, "read_after_write"),
    ]
    assert plan.waits_for(0) is None and plan.waits_for(1) is None
    placed = plan.waits_for(2)
    assert placed is not None and (placed.earlier, placed.reason) == (0, "read_after_write")
    last = plan.waits_for(3)
    assert last is not None and (last.earlier, last.reason) == (2, "read_after_write")


# layer_dag: bad edges and cycles are errors ----------------------------------------------


def test_dag_layering_and_duplicate_edges() -> None:
    assert layer_dag(4, [(0, 1), (0, 2), (1, 3), (2, 3), (0, 1)]) == [[0], [1, 2], [3]]
    assert layer_dag(3, []) == [[0, 1, 2]]
    assert layer_dag(0, []) == []


@pytest.mark.parametrize(
    ("count", "edges", "error"),
    [
        (2, [(0, 2)], ValueError),
        (2, [(-1, 1)], ValueError),
        (0, [(0, 0)], ValueError),
        (3, [(1, 1)], ValueError),
        (3, [(0, 1), (1, 2), (2, 0)], ValueError),
        (2, [(0, 1), (1, 0)], ValueError),
        (2, [(0,)], ValueError),
        (2, [(0, "1")], TypeError),
        (-1, [], ValueError),
    ],
)
def test_bad_edges_and_cycles_are_errors(
    count: int, edges: list[tuple[int, int]], error: type[Exception]
) -> None:
    with pytest.raises(error, match="Fix:"):
        layer_dag(count, edges)


def test_cycle_error_names_the_stuck_nodes() -> None:
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        layer_dag(3, [(1, 2), (2, 1)])


# Properties ---------------------------------------------------------------------------

slots = st.frozensets(st.integers(0, 5), max_size=3)
summaries = st.lists(st.builds(ArmSummary, slots, slots), max_size=9)


def _longest_conflict_chain(arms: list[ArmSummary]) -> int:
    depth: list[int] = []
    for j, later in enumerate(arms):
        before = [
            depth[i]
            for i in range(j)
            if can_dispatch_concurrently(arms[i], later).kind == "serialize"
        ]
        depth.append(1 + max(before, default=0))
    return max(depth, default=0)


@settings(max_examples=300, deadline=None)
@given(summaries)
def test_layering_properties(arms: list[ArmSummary]) -> None:
    layers = layer_arms(arms)
    layer_of = {i: n for n, layer in enumerate(layers) for i in layer}
    # Every arm appears exactly once; each layer is in submission order.
    assert sorted(layer_of) == list(range(len(arms)))
    assert all(layer == sorted(layer) and layer for layer in layers)
    # Every conflicting pair ends in different layers, in submission order.
    for i, j in itertools.combinations(range(len(arms)), 2):
        if can_dispatch_concurrently(arms[i], arms[j]).kind == "serialize":
            assert layer_of[i] < layer_of[j]
    # The arms of one layer are mutually independent (both argument orders).
    for layer in layers:
        for i, j in itertools.permutations(layer, 2):
            assert can_dispatch_concurrently(arms[i], arms[j]).kind == "independent"
    # As few layers as possible: the longest chain of conflicts.
    assert len(layers) == _longest_conflict_chain(arms)
    assert plan_arms(arms).joins == max(0, len(layers) - 1)


@settings(max_examples=200, deadline=None)
@given(summaries, summaries)
def test_concurrency_answer_is_symmetric(a: list[ArmSummary], b: list[ArmSummary]) -> None:
    for x, y in zip(a, b, strict=False):
        assert (
            can_dispatch_concurrently(x, y).concurrent == can_dispatch_concurrently(y, x).concurrent
        )


# Arm concurrency: concurrent or in order, from the calibrated overlap ------------------------

MS = 1_000_000


def test_concurrency_pays_with_a_measured_overlap() -> None:
    from vyre_async.policies import decide_arm_concurrency

    verdict = decide_arm_concurrency([10 * MS, 4 * MS, 6 * MS], 5_000)
    assert (verdict.kind, verdict.reason, verdict.concurrent) == (
        "concurrent",
        "overlap_pays",
        True,
    )
    assert verdict.savings_ns == 5 * MS  # half of everything but the longest arm


def test_no_overlap_runs_in_order_with_the_estimated_loss() -> None:
    from vyre_async.policies import decide_arm_concurrency

    verdict = decide_arm_concurrency([10 * MS, 4 * MS], -2_500)
    assert (verdict.kind, verdict.reason, verdict.savings_ns) == ("in_order", "no_overlap", -MS)
    zero = decide_arm_concurrency([10 * MS, 4 * MS], 0)
    assert (zero.kind, zero.reason, zero.savings_ns) == ("in_order", "no_overlap", 0)


def test_overlap_within_noise_runs_in_order() -> None:
    from vyre_async.policies import MIN_ARM_OVERLAP_BPS, decide_arm_concurrency

    below = decide_arm_concurrency([MS, MS], MIN_ARM_OVERLAP_BPS - 1)
    assert (below.kind, below.reason) == ("in_order", "low_overlap")
    assert below.savings_ns == (MIN_ARM_OVERLAP_BPS - 1) * MS // 10_000
    at = decide_arm_concurrency([MS, MS], MIN_ARM_OVERLAP_BPS)
    assert (at.kind, at.reason) == ("concurrent", "overlap_pays")
    assert decide_arm_concurrency([MS, MS], 1, min_overlap_bps=0).concurrent


def test_edge_cases_single_arm_uncalibrated_nothing_to_hide() -> None:
    from vyre_async.policies import decide_arm_concurrency

    assert decide_arm_concurrency([], 9_000).reason == "single_arm"
    single = decide_arm_concurrency([MS], 9_000)
    assert (single.kind, single.reason, single.savings_ns) == ("in_order", "single_arm", 0)
    unknown = decide_arm_concurrency([MS, MS], None)
    assert (unknown.kind, unknown.reason) == ("concurrent", "uncalibrated")
    idle = decide_arm_concurrency([MS, 0, 0], 10_000)  # only the longest arm has work
    assert (idle.kind, idle.reason, idle.savings_ns) == ("in_order", "nothing_to_hide", 0)
    tiny = decide_arm_concurrency([1, 1], 5_000)  # floor(0.5 ns) = 0: a tie stays in order
    assert tiny.reason == "nothing_to_hide"
    assert decide_arm_concurrency([MS, MS], 10_000).savings_ns == MS


@pytest.mark.parametrize(
    ("work", "overlap", "kwargs", "error"),
    [
        ([MS, 1.5], 5_000, {}, TypeError),
        ([MS, -1], 5_000, {}, ValueError),
        ([MS, MS], 0.5, {}, TypeError),
        ([MS, MS], True, {}, TypeError),
        ([MS, MS], 10_001, {}, ValueError),
        ([MS, MS], -10_001, {}, ValueError),
        ([MS, MS], 5_000, {"min_overlap_bps": 10_001}, ValueError),
        ([MS, MS], 5_000, {"min_overlap_bps": -1}, ValueError),
    ],
)
def test_concurrency_inputs_are_checked(
    work: list[Any], overlap: Any, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    from vyre_async.policies import decide_arm_concurrency

    with pytest.raises(error, match="Fix:"):
        decide_arm_concurrency(work, overlap, **kwargs)


def test_concurrency_verdict_is_consistent() -> None:
    from vyre_async.policies import ARM_CONCURRENCY_REASONS, ArmConcurrencyVerdict

    assert ARM_CONCURRENCY_REASONS[0] == "single_arm"
    with pytest.raises(ValueError):
        ArmConcurrencyVerdict(kind="concurrent", reason="no_overlap")
    with pytest.raises(ValueError):
        ArmConcurrencyVerdict(kind="in_order", reason="bogus")  # type: ignore[arg-type]
