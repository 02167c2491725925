"""Issue 26, defect 8: hostile arguments that escaped as raw Python exceptions.

Each now raises a `BackendError` with a ``Fix:`` (or, on the command line, a
usage error), and the one rule for f32 constants matches u32/i32: real numbers
only, never strings or bools.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vyre_async import DiskPipelineCache, InvalidProgram, acquire_backend
from vyre_async.cli import main
from vyre_async.ir import Const, DType, f32, i32, u32


@pytest.mark.parametrize(
    "value",
    [
        None,
        [1],
        "x",
        "1.5",
        True,
        np.bool_(True),
        10**400,
        -(10**400),
        b"1",
        {},
        Decimal("NaN"),
        Decimal("-Infinity"),
        np.array([1.0]),
    ],
)
def test_f32_refuses_what_is_not_a_real_number_with_a_fix(value: Any) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        f32(value)
    with pytest.raises(InvalidProgram, match="Fix:"):
        Const(DType.F32, value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.5, 1.5),
        (2, 2.0),
        (np.float32(0.25), 0.25),
        (np.float64(-3.0), -3.0),
        (np.int64(7), 7.0),
        (Fraction(1, 4), 0.25),
        (Decimal("2.5"), 2.5),
        (np.array(0.75), 0.75),  # a 0-d array: its number
        (np.array(3, dtype=np.int32), 3.0),
        (1e300, float("inf")),  # a float beyond binary32 rounds to infinity, as documented
    ],
)
def test_f32_takes_any_real_number(value: Any, expected: float) -> None:
    assert f32(value).value == expected


@pytest.mark.parametrize("make", [u32, i32, f32])
def test_strings_are_refused_by_every_constant_maker(make: Any) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        make("1")


@pytest.mark.parametrize("root", ["a\0b", "", "/tmp/with\0nul"])
def test_a_disk_cache_root_no_file_system_accepts_is_refused_at_construction(root: str) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        DiskPipelineCache(root)


@pytest.mark.parametrize("backend_id", [["reference"], None, 3, b"reference"])
def test_a_backend_id_that_is_not_a_string_is_refused_with_a_fix(backend_id: Any) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        acquire_backend(backend_id)


@pytest.mark.parametrize("flag", ["--tasks", "--per-task"])
@pytest.mark.parametrize("value", ["0", "-3", "abc"])
def test_demo_sizes_below_one_are_usage_errors(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", flag, value])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "needs a whole number >= 1" in err
    assert "Traceback" not in err


def test_a_bad_batch_processor_setting_is_an_invalid_program(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from vyre_async.tracing import configure_tracing

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "-5")
    with pytest.raises(InvalidProgram, match="OTEL_BSP_MAX_QUEUE_SIZE") as info:
        configure_tracing(f"file:{tmp_path / 'spans.jsonl'}")
    assert "Fix: set each OTEL_BSP_* variable" in str(info.value)
