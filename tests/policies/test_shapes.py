"""Shape prediction (repeat, cycle, partial cycle, no pattern) and the rolling hit rate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vyre_async.policies import (
    HIT_RATE_WINDOW,
    SHAPE_HISTORY_CAPACITY,
    SPECULATION_MIN_CONFIDENCE_BPS,
    SPECULATION_MIN_HITS,
    RollingHitRate,
    ShapeHistory,
    SpeculationVerdict,
    decide_speculation,
)


def history(*fps: object, capacity: int = 16) -> ShapeHistory[object]:
    h: ShapeHistory[object] = ShapeHistory(capacity)
    for fp in fps:
        h.record(fp)
    return h


def test_defaults() -> None:
    assert SHAPE_HISTORY_CAPACITY == 16 and ShapeHistory().capacity == 16
    assert HIT_RATE_WINDOW == 64 and RollingHitRate().window == 64


def test_fewer_than_two_entries_predict_nothing() -> None:
    assert history().predict_next() is None
    assert history("A").predict_next() is None


def test_repeat_predicts_the_last() -> None:
    assert history("A", "A").predict_next() == "A"
    assert history("A", "B", "C", "C").predict_next() == "C"


def test_two_distinct_entries_predict_nothing() -> None:
    assert history("A", "B").predict_next() is None


@pytest.mark.parametrize(
    ("seq", "expected"),
    [
        ("ABA", "B"),
        ("ABAB", "A"),
        ("ABCABC", "A"),
        ("ABCABCA", "B"),
        ("ABCAB", "C"),  # partial cycle (policies.md example)
        ("ABCDA", "B"),  # a single recurrence at lag n-1 already predicts
        ("AABAAB", "A"),
        ("AABAA", "A"),  # the repeat rule comes before the cycle rule
    ],
)
def test_cycles(seq: str, expected: str) -> None:
    assert history(*seq).predict_next() == expected


def test_partial_cycle_of_four_numbers() -> None:
    assert history(10, 20, 30, 40, 10, 20, 30).predict_next() == 40


def test_smallest_cycle_wins() -> None:
    # Lags 2 and 4 both fit; lag 2 predicts h[n-2].
    assert history(*"ABABAB").predict_next() == "A"
    assert history(*"ABCABCAB").predict_next() == "C"


@pytest.mark.parametrize("seq", ["ABC", "ABCD", "AAB", "ABBA" + "C", "ABCBD"])
def test_no_pattern_predicts_nothing(seq: str) -> None:
    assert history(*seq).predict_next() is None


def test_window_keeps_the_last_sixteen() -> None:
    h = history(*range(20))
    assert h.entries == tuple(range(4, 20))
    assert len(h) == 16 and h.latest() == 19
    assert 3 not in h and 4 in h
    assert h.predict_next() is None  # all distinct
    h.record(4)  # 5..19, 4: the old 4 left the window, no recurrence
    assert h.predict_next() is None
    h.record(6)  # 6..19, 4, 6: lag 15 matches once (h[15] == h[0])
    assert h.predict_next() == 7


def test_cycle_survives_the_window_edge() -> None:
    h: ShapeHistory[str] = ShapeHistory()
    for _ in range(10):
        for fp in "ABC":
            h.record(fp)
    assert len(h) == 16
    assert h.predict_next() == "A"


def test_small_capacity() -> None:
    h = history("A", "B", "A", capacity=2)
    assert h.entries == ("B", "A")
    assert h.predict_next() is None  # n = 2, no lag in 2..1
    with pytest.raises(ValueError, match="Fix:"):
        ShapeHistory(0)
    with pytest.raises(ValueError):
        ShapeHistory(True)


def test_payloads_follow_the_window() -> None:
    h: ShapeHistory[int] = ShapeHistory(4)
    h.record(1, payload="program-1")
    h.record(2, payload="program-2")
    h.record(1)  # None keeps the earlier payload
    assert h.payload_for(1) == "program-1"
    h.record(1, payload="program-1b")  # a new payload refreshes it
    assert h.payload_for(1) == "program-1b"
    for fp in (3, 4, 5, 6):
        h.record(fp, payload=f"program-{fp}")
    assert h.payload_for(1) is None and h.payload_for(2) is None
    assert h.payload_for(6) == "program-6"
    assert h.payload_for(99) is None


def test_payload_store_stays_bounded() -> None:
    h: ShapeHistory[int] = ShapeHistory(4)
    for fp in range(1000):
        h.record(fp, payload=fp)
    assert len(h._payloads) <= 2 * h.capacity
    assert [h.payload_for(fp) for fp in h.entries] == list(h.entries)


def test_clear() -> None:
    h = history("A", "A")
    h.clear()
    assert len(h) == 0 and h.predict_next() is None and h.latest() is None


def _reference_predict(h: list[str]) -> str | None:
    """policies.md, word for word."""
    n = len(h)
    if n < 2:
        return None
    if h[-1] == h[-2]:
        return h[-1]
    for c in range(2, n):
        if all(h[i] == h[i - c] for i in range(c, n)):
            return h[n - c]
    return None


@given(st.lists(st.sampled_from("ABCD"), max_size=40))
def test_prediction_matches_the_specification(seq: list[str]) -> None:
    h: ShapeHistory[str] = ShapeHistory()
    for fp in seq:
        h.record(fp)
    assert h.predict_next() == _reference_predict(seq[-16:])


# Rolling hit rate ----------------------------------------------------------------------


def test_hit_rate_window() -> None:
    empty = RollingHitRate(4)
    assert empty.rate is None and empty.bps is None and len(empty) == 0
    rate = RollingHitRate(4)
    for hit in (True, False, True, True):
        rate.record(hit)
    assert (rate.hits, rate.total, rate.rate, rate.bps) == (3, 4, 0.75, 7500)
    rate.record(False)  # the oldest True leaves
    rate.record(False)  # the oldest False leaves
    assert (rate.hits, rate.total) == (2, 4)
    rate.clear()
    assert rate.rate is None
    with pytest.raises(ValueError, match="Fix:"):
        RollingHitRate(0)


def test_hit_rate_bps_floors() -> None:
    rate = RollingHitRate(3)
    rate.record(True)
    rate.record(False)
    rate.record(False)
    assert rate.bps == 3333


@given(st.lists(st.booleans(), max_size=200))
def test_hit_rate_counts_the_last_window(outcomes: list[bool]) -> None:
    rate = RollingHitRate()
    for hit in outcomes:
        rate.record(hit)
    tail = outcomes[-64:]
    assert rate.hits == sum(tail) and rate.total == len(tail)


# Speculative pre-specialisation --------------------------------------------------------

US = 1_000


def test_speculation_thresholds() -> None:
    assert (SPECULATION_MIN_HITS, SPECULATION_MIN_CONFIDENCE_BPS) == (8, 6000)


def test_speculation_examples() -> None:
    yes = decide_speculation(8, 6000, 50 * US, 100 * US)
    assert (yes.kind, yes.reason, yes.savings_ns) == ("speculate", None, 10 * US)
    tie = decide_speculation(8, 6000, 60 * US, 100 * US)
    assert (tie.kind, tie.reason) == ("hold", "not_worth_compile")


def test_speculation_conservative_branches() -> None:
    assert decide_speculation(7, 10_000, 0, 100 * US).reason == "cold_shape"
    assert decide_speculation(8, 5999, 0, 100 * US).reason == "low_confidence"
    assert decide_speculation(100, 9000, 0, 0).reason == "no_miss_cost"


def test_confidence_is_clamped_to_one_hundred_percent() -> None:
    capped = decide_speculation(100, 20_000, 10 * US, 100 * US)
    assert capped.savings_ns == 90 * US  # not 190 us


def test_weighted_cost_floors() -> None:
    # 3 ns x 66.67 % = 2.0001 -> 2 > 1.
    assert decide_speculation(8, 6667, 1, 3).savings_ns == 1


def test_speculation_inputs_are_validated() -> None:
    with pytest.raises(ValueError, match="Fix:"):
        decide_speculation(-1, 6000, 0, 0)
    with pytest.raises(TypeError, match="Fix:"):
        decide_speculation(8, 0.6, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SpeculationVerdict(kind="speculate", reason="cold_shape")
