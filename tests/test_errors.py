"""The error hierarchy: codes, builtin bases, Fix lines, pickling, and the docs catalog."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

import vyre_async
from vyre_async.errors import BackendError, ErrorCode, error_for_code

DOC = Path(__file__).resolve().parents[1] / "docs" / "error-codes.md"
ALL_CLASSES = [error_for_code(code) for code in ErrorCode]


def test_codes_are_the_contract_values() -> None:
    assert {c.name: int(c) for c in ErrorCode} == {
        "DeviceOutOfMemory": 1001,
        "UnsupportedFeature": 1002,
        "PoisonedLock": 1003,
        "KernelCompileFailed": 1004,
        "DispatchFailed": 1005,
        "InvalidProgram": 1006,
        "CooperativeResidencyExceeded": 1007,
        "DeviceLost": 1008,
        "DispatchTimeout": 1009,
        "BackendNotFound": 1010,
        "BackendClosed": 1011,
        "Unknown": 1999,
    }
    assert ErrorCode.INVALID_PROGRAM is ErrorCode.InvalidProgram


def test_one_subclass_per_code() -> None:
    assert len(set(ALL_CLASSES)) == len(ErrorCode)
    for cls in ALL_CLASSES:
        assert issubclass(cls, BackendError)
        assert cls.code.name in {cls.__name__, cls.__name__.removesuffix("Error")}
        assert getattr(vyre_async, cls.__name__) is cls


@pytest.mark.parametrize(
    ("cls", "base"),
    [
        (vyre_async.InvalidProgram, ValueError),
        (vyre_async.DispatchTimeout, TimeoutError),
        (vyre_async.BackendNotFound, LookupError),
        (vyre_async.DeviceOutOfMemory, MemoryError),
    ],
)
def test_builtin_bases(cls: type[BackendError], base: type[Exception]) -> None:
    assert issubclass(cls, base)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_message_ends_with_fix_and_pickles(cls: type[BackendError]) -> None:
    err = cls("something went wrong with 3 items", backend_id="reference")
    assert "\nFix: " in str(err)
    assert err.code == cls.code
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is cls
    assert str(clone) == str(err)
    assert clone.backend_id == "reference"  # type: ignore[attr-defined]


def test_explicit_fix_is_used_once() -> None:
    err = vyre_async.InvalidProgram("bad size", fix="pass 4 elements")
    assert str(err) == "bad size\nFix: pass 4 elements"
    already = vyre_async.InvalidProgram("bad size\nFix: do this")
    assert str(already).count("Fix:") == 1


def test_unknown_code_is_rejected() -> None:
    with pytest.raises(ValueError):
        error_for_code(4242)


def test_docs_catalog_matches_the_enum() -> None:
    rows = re.findall(r"^\|\s*(\d{4})\s*\|\s*(\w+)\s*\|", DOC.read_text(), re.MULTILINE)
    assert {name: int(code) for code, name in rows} == {c.name: int(c) for c in ErrorCode}
