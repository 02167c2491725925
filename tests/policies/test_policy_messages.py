"""Every policy entry point's argument errors and every verdict's invariants, by table.

Mutation testing (issue 28) found the error texts unchecked: a parameter's name
in its message could be dropped or changed, and a verdict could accept a kind
or a reason it documents as refused. These tables call each public policy
function with one argument wrong at a time, and build each verdict record with
one field wrong at a time, and compare the whole message.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

from vyre_async.policies.arms import ARM_REASONS, ArmVerdict
from vyre_async.policies.concurrency import ARM_CONCURRENCY_REASONS, ArmConcurrencyVerdict
from vyre_async.policies.launch import (
    CommandReuseVerdict,
    ExecutionModeVerdict,
    PersistentVerdict,
    decide_command_reuse,
    decide_persistent_kernel,
)
from vyre_async.policies.overlap import COPY_REASONS, CopyVerdict
from vyre_async.policies.params import ParamInliningVerdict, decide_param_inlining
from vyre_async.policies.residency import RESIDENCY_REASONS, ResidencyVerdict
from vyre_async.policies.speculation import SpeculationVerdict, decide_speculation

# A valid call of each policy function that takes whole numbers, and those numbers' names.
CALLS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "decide_persistent_kernel": (
        decide_persistent_kernel,
        {"batch_size": 8, "launch_ns": 5_000, "setup_ns": 10_000},
    ),
    "decide_command_reuse": (
        decide_command_reuse,
        {"repeats": 8, "launch_ns": 5_000, "record_ns": 20_000, "replay_ns": 1_000},
    ),
    "decide_speculation": (
        decide_speculation,
        {"hit_count": 10, "confidence_bps": 9_000, "compile_ns": 1_000, "miss_ns": 50_000},
    ),
    "decide_param_inlining": (
        decide_param_inlining,
        {"nbytes": 64, "budget_bytes": 3072},
    ),
}


def _int_cases() -> list[tuple[str, str]]:
    return [(fn, name) for fn, (_, kwargs) in CALLS.items() for name in kwargs]


def test_the_table_names_every_int_parameter_of_those_functions() -> None:
    for fn, (func, kwargs) in CALLS.items():
        ints = {
            name
            for name, p in inspect.signature(func).parameters.items()
            if p.annotation in ("int", int) and name not in ("align",)
        }
        assert ints == set(kwargs), fn
        func(**kwargs)  # the base call is valid


@pytest.mark.parametrize(("fn", "name"), _int_cases())
def test_a_negative_number_is_refused_naming_its_parameter(fn: str, name: str) -> None:
    func, kwargs = CALLS[fn]
    with pytest.raises(ValueError) as caught:
        func(**{**kwargs, name: -1})
    assert str(caught.value) == f"{name} must be >= 0, got -1\nFix: pass a non-negative {name}"


@pytest.mark.parametrize(("fn", "name"), _int_cases())
def test_a_fraction_is_refused_naming_its_parameter(fn: str, name: str) -> None:
    func, kwargs = CALLS[fn]
    with pytest.raises(TypeError) as caught:
        func(**{**kwargs, name: 2.5})
    assert str(caught.value) == (
        f"{name} must be an integer, got float 2.5\n"
        f"Fix: pass whole nanoseconds/bytes as an int, e.g. round({name})"
    )
    with pytest.raises(TypeError) as caught:
        func(**{**kwargs, name: True})
    assert str(caught.value) == f"{name} must be an integer, got the bool True\nFix: pass an int"


# Verdicts: (record, a valid kind without a reason, a valid kind with one, a reason,
# the refusal of a reason given or missing).
REASONED: list[tuple[type[Any], str, str, str, str]] = [
    (
        CopyVerdict,
        "overlap",
        "serialize",
        "kernel_writes_slot",
        "CopyVerdict: a reason is given exactly when kind is 'serialize'",
    ),
    (
        ParamInliningVerdict,
        "inline",
        "uniform_buffer",
        "over_budget",
        "ParamInliningVerdict: a reason is given exactly for uniform_buffer",
    ),
    (
        SpeculationVerdict,
        "speculate",
        "hold",
        "too_few_hits",
        "SpeculationVerdict: a reason is given exactly when kind is 'hold'",
    ),
]


@pytest.mark.parametrize(("record", "plain", "reasoned", "reason", "message"), REASONED)
def test_a_verdict_has_a_reason_exactly_when_its_kind_needs_one(
    record: type[Any], plain: str, reasoned: str, reason: str, message: str
) -> None:
    assert record(kind=plain).reason is None
    assert record(kind=reasoned, reason=reason).reason == reason
    for bad in ({"kind": plain, "reason": reason}, {"kind": reasoned}):
        with pytest.raises(ValueError) as caught:
            record(**bad)
        assert str(caught.value) == message


KINDS: list[tuple[type[Any], str, dict[str, Any]]] = [
    (CopyVerdict, "CopyVerdict.kind must be 'overlap' or 'serialize', not {!r}", {}),
    (
        ParamInliningVerdict,
        "ParamInliningVerdict.kind must be 'inline' or 'uniform_buffer', not {!r}",
        {},
    ),
    (SpeculationVerdict, "SpeculationVerdict.kind must be 'hold' or 'speculate', not {!r}", {}),
    (
        PersistentVerdict,
        "PersistentVerdict.kind must be one of ('standard', 'persistent'), not {!r}",
        {},
    ),
    (
        CommandReuseVerdict,
        "CommandReuseVerdict.kind must be one of ('plain', 'record_and_replay'), not {!r}",
        {},
    ),
    (
        ExecutionModeVerdict,
        "ExecutionModeVerdict.kind must be one of ('plain', 'persistent', 'command_reuse'), "
        "not {!r}",
        {},
    ),
    (
        ResidencyVerdict,
        "ResidencyVerdict.kind must be 'resident' or 'host', not {!r}",
        {"reason": "requested"},
    ),
]


@pytest.mark.parametrize(("record", "message", "extra"), KINDS)
@pytest.mark.parametrize("kind", ["", "OVERLAP", "Serialize", "plain ", None])
def test_a_verdict_refuses_an_unknown_kind(
    record: type[Any], message: str, extra: dict[str, Any], kind: object
) -> None:
    with pytest.raises(ValueError) as caught:
        record(kind=kind, **extra)
    assert str(caught.value) == message.format(kind)


@pytest.mark.parametrize(
    ("record", "first", "second"),
    [
        (PersistentVerdict, "standard", "persistent"),
        (CommandReuseVerdict, "plain", "record_and_replay"),
        (ExecutionModeVerdict, "plain", "persistent"),
    ],
)
def test_a_launch_verdict_saves_nothing_in_its_first_kind(
    record: type[Any], first: str, second: str
) -> None:
    name = record.__name__
    assert record(kind=second, savings_ns=0).savings_ns == 0
    assert record(kind=second, savings_ns=5).savings_ns == 5
    with pytest.raises(ValueError) as caught:
        record(kind=first, savings_ns=1)
    assert str(caught.value) == f"{name}: savings_ns must be 0 when kind is {first!r}"
    with pytest.raises(ValueError) as caught:
        record(kind=second, savings_ns=-1)
    assert str(caught.value) == (
        f"{name}.savings_ns must be >= 0, got -1\nFix: pass a non-negative {name}.savings_ns"
    )


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (SpeculationVerdict, "savings_ns"),
        (ParamInliningVerdict, "padded_bytes"),
    ],
)
def test_a_verdicts_counts_are_whole_and_not_negative(record: type[Any], field: str) -> None:
    kind = "speculate" if record is SpeculationVerdict else "inline"
    name = f"{record.__name__}.{field}"
    with pytest.raises(ValueError, match=re.escape(f"{name} must be >= 0, got -1")):
        record(kind=kind, **{field: -1})


@pytest.mark.parametrize(
    ("record", "kind", "known"),
    [
        (CopyVerdict, "serialize", COPY_REASONS),
        (ArmVerdict, "serialize", ARM_REASONS),
    ],
)
def test_a_verdict_refuses_a_reason_it_does_not_list(
    record: type[Any], kind: str, known: tuple[str, ...]
) -> None:
    for reason in known:
        assert record(kind=kind, reason=reason).reason == reason
    for bad in ("kernel_writes_destination", "", "WRITE_WRITE"):
        with pytest.raises(ValueError) as caught:
            record(kind=kind, reason=bad)
        assert str(caught.value) == (
            f"{record.__name__}.reason must be one of {known}, not {bad!r}"
        )


def test_reasoned_verdicts_check_the_reason_against_the_kind() -> None:
    with pytest.raises(ValueError) as caught:
        ArmConcurrencyVerdict(kind="concurrent", reason="single_arm")
    assert str(caught.value) == (
        "ArmConcurrencyVerdict: reason 'single_arm' goes with kind 'in_order', not 'concurrent'"
    )
    with pytest.raises(ValueError) as caught:
        ArmConcurrencyVerdict(kind="in_order", reason="nope")  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"ArmConcurrencyVerdict.reason must be one of {ARM_CONCURRENCY_REASONS}, not 'nope'"
    )
    with pytest.raises(ValueError) as caught:
        ResidencyVerdict(kind="nope", reason="nope")  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"ResidencyVerdict.reason must be one of {RESIDENCY_REASONS}, not 'nope'"
    )
