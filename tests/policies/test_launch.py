"""Persistent kernel, command reuse and the primary mode: every threshold, tie and example."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vyre_async.policies import (
    CommandReuseVerdict,
    ExecutionModeVerdict,
    PersistentVerdict,
    decide_command_reuse,
    decide_persistent_kernel,
    select_primary_execution_mode,
)

US = 1_000
L, S, REC, REP = 5 * US, 50 * US, 25 * US, 500


# Persistent kernel ---------------------------------------------------------------------


def test_break_even_example() -> None:
    tie = decide_persistent_kernel(10, L, S)  # 10 x 5 us == 50 us: a tie stays standard
    assert (tie.kind, tie.reason, tie.savings_ns) == ("standard", "setup_not_amortized", 0)
    big = decide_persistent_kernel(100, L, S)
    assert (big.kind, big.reason, big.savings_ns) == ("persistent", None, 450 * US)


def test_one_past_break_even_is_persistent() -> None:
    assert decide_persistent_kernel(11, L, S).savings_ns == 5 * US
    assert decide_persistent_kernel(10, L, S - 1).savings_ns == 1


def test_portable_numbers() -> None:
    assert decide_persistent_kernel(10, 25 * US, 200 * US).savings_ns == 50 * US


@pytest.mark.parametrize("batch", [0, 1])
def test_single_launch_stays_standard(batch: int) -> None:
    verdict = decide_persistent_kernel(batch, L, 0)
    assert (verdict.kind, verdict.reason) == ("standard", "single_launch")


def test_zero_launch_overhead_stays_standard() -> None:
    verdict = decide_persistent_kernel(1000, 0, 0)
    assert (verdict.kind, verdict.reason) == ("standard", "no_launch_overhead")


def test_free_setup_is_profitable_from_two_launches() -> None:
    assert decide_persistent_kernel(2, 1, 0).savings_ns == 2


def test_huge_values_are_exact() -> None:
    big = 2**64
    assert decide_persistent_kernel(2**32, big, 0).savings_ns == 2**96


# Command reuse -------------------------------------------------------------------------


def test_reuse_examples() -> None:
    few = decide_command_reuse(5, L, REC, REP)  # 5 x 4.5 us = 22.5 us <= 25 us
    assert (few.kind, few.reason, few.savings_ns) == ("plain", "record_not_amortized", 0)
    many = decide_command_reuse(100, L, REC, REP)
    assert (many.kind, many.reason, many.savings_ns) == ("record_and_replay", None, 425 * US)


def test_reuse_tie_stays_plain() -> None:
    # 10 x (5 us - 2.5 us) == 25 us exactly.
    verdict = decide_command_reuse(10, L, REC, 2500)
    assert (verdict.kind, verdict.reason) == ("plain", "record_not_amortized")
    assert decide_command_reuse(10, L, REC - 1, 2500).savings_ns == 1


@pytest.mark.parametrize("repeats", [0, 1])
def test_single_repeat_stays_plain(repeats: int) -> None:
    verdict = decide_command_reuse(repeats, L, 0, 0)
    assert (verdict.kind, verdict.reason) == ("plain", "single_launch")


@pytest.mark.parametrize("replay", [L, L + 1])
def test_replay_not_cheaper_stays_plain(replay: int) -> None:
    verdict = decide_command_reuse(1000, L, 0, replay)
    assert (verdict.kind, verdict.reason) == ("plain", "replay_not_cheaper")


def test_replay_one_ns_cheaper_with_free_recording() -> None:
    assert decide_command_reuse(2, L, 0, L - 1).savings_ns == 2


# The bundle ----------------------------------------------------------------------------


def test_bundle_example_prefers_persistent() -> None:
    persistent = decide_persistent_kernel(500, L, S)
    reuse = decide_command_reuse(500, L, REC, REP)
    assert persistent.savings_ns == 2_450_000
    assert reuse.savings_ns == 2_225_000
    mode = select_primary_execution_mode(persistent, reuse)
    assert (mode.kind, mode.reason, mode.savings_ns) == (
        "persistent",
        "persistent_saves_more",
        2_450_000,
    )


def test_tie_goes_to_command_reuse() -> None:
    persistent = PersistentVerdict(kind="persistent", savings_ns=1000)
    reuse = CommandReuseVerdict(kind="record_and_replay", savings_ns=1000)
    mode = select_primary_execution_mode(persistent, reuse)
    assert (mode.kind, mode.reason, mode.savings_ns) == (
        "command_reuse",
        "tie_prefers_command_reuse",
        1000,
    )


def test_larger_reuse_savings_win() -> None:
    persistent = PersistentVerdict(kind="persistent", savings_ns=999)
    reuse = CommandReuseVerdict(kind="record_and_replay", savings_ns=1000)
    mode = select_primary_execution_mode(persistent, reuse)
    assert (mode.kind, mode.reason) == ("command_reuse", "command_reuse_saves_more")


def test_only_one_profitable() -> None:
    off_p = PersistentVerdict(kind="standard", reason="single_launch")
    off_r = CommandReuseVerdict(kind="plain", reason="single_launch")
    on_p = PersistentVerdict(kind="persistent", savings_ns=7)
    on_r = CommandReuseVerdict(kind="record_and_replay", savings_ns=9)
    assert select_primary_execution_mode(on_p, off_r) == ExecutionModeVerdict(
        kind="persistent", savings_ns=7
    )
    assert select_primary_execution_mode(off_p, on_r) == ExecutionModeVerdict(
        kind="command_reuse", savings_ns=9
    )
    neither = select_primary_execution_mode(off_p, off_r)
    assert (neither.kind, neither.reason, neither.savings_ns) == ("plain", "neither_profitable", 0)


def test_cold_workload_is_plain_everywhere() -> None:
    mode = select_primary_execution_mode(
        decide_persistent_kernel(1, L, S), decide_command_reuse(1, L, REC, REP)
    )
    assert mode.kind == "plain"


def test_bundle_rejects_swapped_arguments() -> None:
    persistent = decide_persistent_kernel(500, L, S)
    reuse = decide_command_reuse(500, L, REC, REP)
    with pytest.raises(TypeError, match="Fix:"):
        select_primary_execution_mode(reuse, persistent)  # type: ignore[arg-type]


@given(st.integers(0, 10_000), st.integers(0, 10**7), st.integers(0, 10**9), st.integers(0, 10**9))
def test_savings_match_the_cost_model(b: int, lat: int, rec: int, rep: int) -> None:
    p = decide_persistent_kernel(b, lat, rec)
    assert p.savings_ns == (max(0, b * lat - rec) if b > 1 and lat > 0 else 0)
    r = decide_command_reuse(b, lat, rec, rep)
    expected = b * (lat - rep) - rec if b > 1 and lat > rep else 0
    assert r.savings_ns == max(0, expected)
    mode = select_primary_execution_mode(p, r)
    assert mode.savings_ns == max(p.savings_ns, r.savings_ns)


# Input validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ((-1, L, S), ValueError),
        ((10, -5, S), ValueError),
        ((10, L, -1), ValueError),
        ((10, 5.0, S), TypeError),
        ((True, L, S), TypeError),
        ((10, "5", S), TypeError),
    ],
)
def test_persistent_inputs_are_validated(args: tuple[object, ...], error: type[Exception]) -> None:
    with pytest.raises(error, match="Fix:"):
        decide_persistent_kernel(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [(-1, L, REC, REP), (2, L, -1, REP), (2, L, REC, -REP)])
def test_reuse_inputs_are_validated(bad: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="Fix:"):
        decide_command_reuse(*bad)


def test_numpy_integers_are_accepted() -> None:
    verdict = decide_persistent_kernel(np.int64(100), np.uint32(L), np.int32(S))  # type: ignore[arg-type]
    assert verdict.savings_ns == 450 * US


def test_verdicts_are_frozen_slotted_and_checked() -> None:
    verdict = decide_persistent_kernel(100, L, S)
    with pytest.raises(dataclasses.FrozenInstanceError):
        verdict.kind = "standard"  # type: ignore[misc]
    assert not hasattr(verdict, "__dict__")
    with pytest.raises(ValueError):
        PersistentVerdict(kind="standard", savings_ns=5)
    with pytest.raises(ValueError):
        CommandReuseVerdict(kind="replay")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ExecutionModeVerdict(kind="plain", savings_ns=1)
    with pytest.raises(TypeError):
        PersistentVerdict("standard")  # type: ignore[call-arg]
