"""Every numeric limit of `DispatchConfig` and the shared checks, at limit-1, limit, limit+1.

A refused value must say which field, which bound, and a Fix whose example is
itself a valid call: each Fix below is executed. (Issue 28: a mutation run
found off-by-ones at these limits, and Fix examples that could have been any
text, that no test noticed.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from vyre_async import DispatchConfig, InvalidProgram
from vyre_async._arguments import duration, to_seconds, whole_number
from vyre_async._config import MAX_OUTPUT_BYTES_ENV, default_max_output_bytes
from vyre_async.ir.limits import MAX_WORKGROUP_LANES


def _parts(err: InvalidProgram) -> tuple[str, str]:
    """An error's message and its Fix (the last line, ``Fix: ...``)."""
    message, _, fix = str(err).rpartition("\nFix: ")
    return message, fix


def _refusal(**fields: Any) -> InvalidProgram:
    with pytest.raises(InvalidProgram) as info:
        DispatchConfig(**fields)
    return info.value


def _assert_fix_runs(err: InvalidProgram) -> DispatchConfig:
    """The Fix reads ``pass e.g. DispatchConfig(...)`` and that call is valid."""
    fix = _parts(err)[1]
    assert fix.startswith("pass e.g. DispatchConfig("), fix
    example = fix.removeprefix("pass e.g. ")
    made = eval(example, {"DispatchConfig": DispatchConfig})  # a documented, literal example
    assert isinstance(made, DispatchConfig)
    return made


# (field, below the lowest accepted, lowest, highest or None, above the highest or None, bound text)
COUNTS = [
    ("ulp_budget", -1, 0, 255, 256, "in 0..255"),
    ("max_output_bytes", -1, 0, None, None, ">= 0"),
    ("fixpoint_iterations", 0, 1, None, None, ">= 1"),
]


@pytest.mark.parametrize(("name", "below", "low", "high", "above", "bound"), COUNTS)
def test_count_fields_at_their_limits(
    name: str, below: int, low: int, high: int | None, above: int | None, bound: str
) -> None:
    assert getattr(DispatchConfig(**{name: low}), name) == low
    assert getattr(DispatchConfig(**{name: low + 1}), name) == low + 1
    assert type(getattr(DispatchConfig(**{name: np.int64(low)}), name)) is int
    refused = [below] if high is None else [below, above]
    if high is not None:
        assert getattr(DispatchConfig(**{name: high}), name) == high
        assert getattr(DispatchConfig(**{name: high - 1}), name) == high - 1
    for value in refused:
        err = _refusal(**{name: value})
        assert _parts(err)[0].startswith(
            f"DispatchConfig: {name} must be an int {bound}, got {value}"
        )
        made = _assert_fix_runs(err)
        assert getattr(made, name) is not None


@pytest.mark.parametrize("name", ["ulp_budget", "max_output_bytes", "fixpoint_iterations"])
@pytest.mark.parametrize("value", [True, 1.0, "2"])
def test_count_fields_take_only_integers(name: str, value: object) -> None:
    err = _refusal(**{name: value})
    assert f"DispatchConfig: {name} must be an int" in str(err)
    _assert_fix_runs(err)


def test_fixpoint_iterations_none_is_one_launch() -> None:
    assert DispatchConfig().iterations == 1
    assert DispatchConfig(fixpoint_iterations=3).iterations == 3
    assert DispatchConfig(fixpoint_iterations=1).same_launch_shape(DispatchConfig())
    assert not DispatchConfig(fixpoint_iterations=2).same_launch_shape(DispatchConfig())


def test_launch_shape_ignores_only_timeout_and_label() -> None:
    base = DispatchConfig()
    assert base.same_launch_shape(DispatchConfig(timeout=3.0, label="x"))
    for changed in [
        DispatchConfig(profile="p"),
        DispatchConfig(ulp_budget=3),
        DispatchConfig(max_output_bytes=10),
        DispatchConfig(workgroup_override=(32, 1, 1)),
        DispatchConfig(grid_override=(2, 1, 1)),
        DispatchConfig(speculation="disable"),
        DispatchConfig(persistent_thread="force"),
        DispatchConfig(cooperative=True),
    ]:
        assert not base.same_launch_shape(changed), changed


@pytest.mark.parametrize(
    ("shape", "lanes"),
    [((MAX_WORKGROUP_LANES, 1, 1), None), ((1, 1, MAX_WORKGROUP_LANES), None),
     ((32, 32, 1), None), ((MAX_WORKGROUP_LANES + 1, 1, 1), 1025), ((1, 1025, 1), 1025),
     ((4, 16, 17), 1088), ((3, 7, 50), 1050)],
)  # fmt: skip
def test_workgroup_override_lane_limit(shape: tuple[int, int, int], lanes: int | None) -> None:
    if lanes is None:
        assert DispatchConfig(workgroup_override=shape).workgroup_override == shape
        return
    err = _refusal(workgroup_override=shape)
    assert _parts(err)[0] == (
        f"DispatchConfig: workgroup_override {shape} has {lanes} lanes per workgroup, over the "
        f"IR's limit of {MAX_WORKGROUP_LANES} (a backend may allow fewer: "
        "backend.capabilities().max_workgroup_size)"
    )
    assert _assert_fix_runs(err).workgroup_override == (256, 1, 1)


@pytest.mark.parametrize("shape", [(0, 1, 1), (1, 0, 1), (4, 4, 0)])
def test_workgroup_override_axes_start_at_one(shape: tuple[int, int, int]) -> None:
    err = _refusal(workgroup_override=shape)
    assert _parts(err)[0] == f"DispatchConfig: workgroup_override axes must be >= 1, got {shape}"
    assert _assert_fix_runs(err).workgroup_override == (64, 1, 1)


@pytest.mark.parametrize("name", ["workgroup_override", "grid_override"])
@pytest.mark.parametrize("bad", ["x", (1, -1), (1, 1, 1, 1), ()])
def test_axes_named_in_their_own_errors(name: str, bad: object) -> None:
    err = _refusal(**{name: bad})
    assert _parts(err) == (
        f"{name} must be an int or 1 to 3 non-negative ints, got {bad!r}",
        f"pass {name} like 64 or (8, 8, 1)",
    )
    assert getattr(DispatchConfig(**{name: (2, 3)}), name) == (2, 3, 1)
    assert getattr(DispatchConfig(**{name: 5}), name) == (5, 1, 1)


@pytest.mark.parametrize("good", [1e-9, 0.5, 1, 10**400])
def test_timeout_accepts_any_positive_number(good: float) -> None:
    assert DispatchConfig(timeout=good).timeout == to_seconds(good)


@pytest.mark.parametrize("bad", [0, 0.0, -1e-9, math.nan, True])
def test_timeout_refuses_zero_negative_nan_and_bool(bad: object) -> None:
    err = _refusal(timeout=bad)
    assert (
        _parts(err)[0]
        == f"DispatchConfig: timeout must be a positive number of seconds, got {bad!r}"
    )
    assert _assert_fix_runs(err).timeout == 1.0


@pytest.mark.parametrize("name", ["speculation", "persistent_thread"])
@pytest.mark.parametrize("bad", ["Auto", "", 1, None])
def test_modes_are_one_of_three(name: str, bad: object) -> None:
    err = _refusal(**{name: bad})
    assert _parts(err)[0] == (
        f"DispatchConfig: {name} must be one of ('auto', 'force', 'disable'), got {bad!r}"
    )
    assert getattr(_assert_fix_runs(err), name) == "auto"
    for good in ("auto", "force", "disable"):
        assert getattr(DispatchConfig(**{name: good}), name) == good


@pytest.mark.parametrize("bad", [1, 0, "yes", None])
def test_cooperative_is_a_bool(bad: object) -> None:
    err = _refusal(cooperative=bad)
    assert _parts(err)[0] == f"DispatchConfig: cooperative must be a bool, got {bad!r}"
    assert _assert_fix_runs(err).cooperative is False


@pytest.mark.parametrize("name", ["profile", "label"])
def test_profile_and_label_are_text(name: str) -> None:
    err = _refusal(**{name: 3})
    assert _parts(err)[0] == f"DispatchConfig: {name} must be a str or None, got 3"
    assert getattr(_assert_fix_runs(err), name) == "..."


# --- the environment variable's limit --------------------------------------------------------


@pytest.mark.parametrize(("raw", "value"), [("0", 0), ("1", 1), (" 4096 ", 4096)])
def test_max_output_bytes_env_at_its_limit(
    monkeypatch: pytest.MonkeyPatch, raw: str, value: int
) -> None:
    monkeypatch.setenv(MAX_OUTPUT_BYTES_ENV, raw)
    assert default_max_output_bytes() == value


@pytest.mark.parametrize("raw", ["-1", "abc", "1.5"])
def test_max_output_bytes_env_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(MAX_OUTPUT_BYTES_ENV, raw)
    with pytest.raises(InvalidProgram) as info:
        default_max_output_bytes()
    assert _parts(info.value)[0] == (
        f"{MAX_OUTPUT_BYTES_ENV} must be a whole number of bytes >= 0, got {raw!r}"
    )
    assert (
        _parts(info.value)[1] == f"set {MAX_OUTPUT_BYTES_ENV}=17179869184 (16 GiB, say) or unset it"
    )


def test_max_output_bytes_env_blank_means_the_host_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAX_OUTPUT_BYTES_ENV, raising=False)
    host = default_max_output_bytes()
    monkeypatch.setenv(MAX_OUTPUT_BYTES_ENV, "   ")
    assert default_max_output_bytes() == host > 0


# --- the shared checks ---------------------------------------------------------------------


def test_whole_number_bounds_are_inclusive_and_named() -> None:
    assert whole_number("n", 3, example="n=3", minimum=3, maximum=5) == 3
    assert whole_number("n", 5, example="n=3", minimum=3, maximum=5) == 5
    for bad in (2, 6):
        with pytest.raises(InvalidProgram) as info:
            whole_number("n", bad, example="n=3", minimum=3, maximum=5)
        assert _parts(info.value)[0] == f"n must be an int in 3..5, got {bad}"
        assert _parts(info.value)[1] == "pass e.g. n=3"
    with pytest.raises(InvalidProgram) as info:
        whole_number("n", -1, example="n=0")
    assert _parts(info.value)[0] == "n must be an int >= 0, got -1"
    assert whole_number("n", 0, example="n=0") == 0


def test_duration_bounds() -> None:
    assert duration("d", 0, example="d=1") == 0.0
    assert duration("d", 0.5, example="d=1", positive=True) == 0.5
    assert duration("d", 1e-9, example="d=1", positive=True) == 1e-9
    for value, positive, bound in [
        (0, True, "above 0"),
        (-1e-9, False, ">= 0"),
        (math.inf, False, ">= 0"),
        (math.nan, True, "above 0"),
        (True, False, ">= 0"),
    ]:
        with pytest.raises(InvalidProgram) as info:
            duration("d", value, example="d=2.0", positive=positive)
        assert (
            _parts(info.value)[0] == f"d must be a finite number of seconds {bound}, got {value!r}"
        )
        assert _parts(info.value)[1] == "pass e.g. d=2.0"


def test_to_seconds_of_numbers_beyond_a_float() -> None:
    assert to_seconds(10**400) == math.inf
    assert to_seconds(-(10**400)) == -math.inf
    assert to_seconds(3) == 3.0
