"""Each public package exports exactly its `__all__`, and nothing heavy loads at import."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types

import pytest

PACKAGES = ["vyre_async", "vyre_async.ir", "vyre_async.policies", "vyre_reference", "vyre_cupy"]


def _submodules(module: types.ModuleType) -> set[str]:
    """Names bound to submodules (a function may shadow its module's name, e.g. ir.validate)."""
    path = getattr(module, "__path__", None)
    if path is None:
        return set()
    names = {info.name for info in pkgutil.iter_modules(path)}
    return {n for n in names if isinstance(getattr(module, n, None), types.ModuleType)}


@pytest.mark.parametrize("name", PACKAGES)
def test_public_names_are_exactly_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), "duplicate names in __all__"
    # dir() lists a lazy package's (PEP 562) names before they load; accessing
    # every exported name then binds it, so vars() must hold exactly the API too.
    # (pytest rewrites the asserts of every module of a distribution that has a pytest
    # plugin, as vyre-async does, and leaves "@py_builtins" and "@pytest_ar" in their
    # globals: not identifiers, not API.)
    listed = {n for n in dir(module) if not n.startswith(("_", "@"))} - _submodules(module)
    assert listed == exported - {"__version__"}
    for item in exported:
        assert hasattr(module, item), item
    public = {n for n in vars(module) if not n.startswith(("_", "@"))} - _submodules(module)
    assert public == exported - {"__version__"}


def test_import_is_light() -> None:
    code = (
        "import sys, vyre_async, vyre_async.ir, vyre_async.registry, vyre_async.cli;"
        "heavy = {'cupy', 'cupyx', 'vyre_cupy', 'vyre_reference', 'opentelemetry.sdk', 'torch'};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
