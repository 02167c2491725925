"""The public surface of the policies package and the dispatch-attribute hook."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import anyio
import pytest

import vyre_async.policies as policies
from vyre_async.telemetry import current_dispatch_attributes, dispatch_attributes

SPEC_NAMES = {
    "ArmSummary",
    "can_dispatch_concurrently",
    "layer_arms",
    "can_overlap_copy_with_kernel",
    "decide_persistent_kernel",
    "decide_command_reuse",
    "select_primary_execution_mode",
    "decide_param_inlining",
    "ShapeHistory",
}


def test_every_specified_name_is_exported() -> None:
    assert set(policies.__all__) >= SPEC_NAMES
    assert {"RollingHitRate", "decide_speculation"} <= set(policies.__all__)


def test_public_names_are_exactly_all() -> None:
    # The package loads its names on first use (PEP 562): dir() lists them all
    # before, and once each is used vars() holds exactly them.
    submodules = {info.name for info in pkgutil.iter_modules(policies.__path__)}
    listed = {n for n in dir(policies) if not n.startswith("_")} - submodules
    assert listed == set(policies.__all__)
    for name in policies.__all__:
        getattr(policies, name)
    public = {
        name
        for name, value in vars(policies).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(policies.__all__)
    assert len(policies.__all__) == len(set(policies.__all__))


def test_verdicts_are_frozen_slotted_keyword_only_records() -> None:
    verdicts = [getattr(policies, n) for n in policies.__all__ if n.endswith("Verdict")]
    assert len(verdicts) == 9
    for kind in [*verdicts, policies.ArmConflict, policies.ArmPlan]:
        params = dataclasses.fields(kind)
        assert kind.__dataclass_params__.frozen
        assert "__slots__" in vars(kind)
        assert all(f.kw_only for f in params), kind
        assert "kind" in {f.name for f in params} or kind in (
            policies.ArmConflict,
            policies.ArmPlan,
        )


def test_policies_import_nothing_from_the_driver_core() -> None:
    for module in (
        "arms",
        "concurrency",
        "overlap",
        "launch",
        "params",
        "residency",
        "shapes",
        "speculation",
    ):
        source = inspect.getsource(importlib.import_module(f"vyre_async.policies.{module}"))
        assert "vyre_async._backend" not in source and "numpy" not in source


# dispatch_attributes --------------------------------------------------------------------


def test_attributes_nest_and_reset() -> None:
    assert current_dispatch_attributes() is None
    with dispatch_attributes({"vyre.a": 1, "vyre.b": "x"}):
        with dispatch_attributes({"vyre.b": "y", "vyre.c": True}):
            assert current_dispatch_attributes() == {"vyre.a": 1, "vyre.b": "y", "vyre.c": True}
        assert current_dispatch_attributes() == {"vyre.a": 1, "vyre.b": "x"}
    assert current_dispatch_attributes() is None


@pytest.mark.parametrize("bad", [{"other.key": 1}, {"vyre.k": None}, {"vyre.k": [1]}])
def test_attribute_keys_and_values_are_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="Fix:"), dispatch_attributes(bad):  # type: ignore[arg-type]
        pass


@pytest.mark.anyio
async def test_concurrent_tasks_do_not_share_attributes() -> None:
    seen: dict[str, object] = {}

    async def task(name: str) -> None:
        with dispatch_attributes({"vyre.task": name}):
            await anyio.sleep(0.01)
            attrs = current_dispatch_attributes()
            assert attrs is not None
            seen[name] = attrs["vyre.task"]

    async with anyio.create_task_group() as tg:
        for name in ("a", "b", "c"):
            tg.start_soon(task, name)
    assert seen == {"a": "a", "b": "b", "c": "c"}
