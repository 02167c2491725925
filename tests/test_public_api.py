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


#: What `import vyre_async` leaves for first use (docs/benchmarks/import.md): the
#: OpenTelemetry API, asyncio and anyio, the metadata lookup, logging, the disk cache.
DEFERRED = (
    "opentelemetry",
    "asyncio",
    "anyio",
    "importlib.metadata",
    "logging",
    "pathlib",
    "json",
    "statistics",
    "concurrent.futures",
    "vyre_async.policies.launch",
    "vyre_async._calibration",
    "vyre_async._shadow",
    "vyre_async._graph",
    "vyre_async._cache.disk",
    "decimal",
    "traceback",
)


def test_import_leaves_what_a_dispatch_does_not_need_for_first_use() -> None:
    code = f"import sys, vyre_async;print(sorted(m for m in {DEFERRED!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_sdk_installed_after_import_and_dispatch_still_records() -> None:
    # The API is imported on first need: a dispatch before any OpenTelemetry import
    # loads nothing of it; one after the application installed an SDK is a span.
    code = """
import sys
import numpy as np
from vyre_async import acquire_backend
from vyre_async.programs import elementwise_xor
backend = acquire_backend("reference")
a = np.arange(8, dtype=np.uint32)
backend.dispatch_sync(elementwise_xor(8), [a, a])
assert not any(m.startswith("opentelemetry") for m in sys.modules), "API loaded early"
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
backend.dispatch_sync(elementwise_xor(8), [a, a])
print([s.name for s in exporter.get_finished_spans()])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['vyre.dispatch']"


def test_import_is_light() -> None:
    code = (
        "import sys, vyre_async, vyre_async.ir, vyre_async._registry, vyre_async.cli;"
        "heavy = {'cupy', 'cupyx', 'vyre_cupy', 'vyre_reference', 'opentelemetry.sdk', 'torch'};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _public_modules() -> list[str]:
    """Every module of the four packages whose dotted name has no private part."""
    found = []
    for package in ("vyre_async", "vyre_reference", "vyre_cupy", "vyre_ray"):
        root = importlib.import_module(package)
        found.append(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            parts = info.name.split(".")
            if not any(p.startswith("_") for p in parts) and not parts[-1].startswith("test_"):
                found.append(info.name)
    return sorted(found)


PUBLIC_MODULES = _public_modules()


def test_every_package_module_is_checked() -> None:
    # (walk_packages found the modules: a broken walk must not pass vacuously)
    assert {"vyre_async.programs", "vyre_async.ir.wire", "vyre_cupy.launch"} <= set(PUBLIC_MODULES)


#: The public modules of `vyre_async` (docs/architecture.md): the top-level API, the
#: authors' seam, the IR, errors, programs, policies, testing and the tracing entry
#: points. Every engine module is private (``vyre_async._frontend`` ...).
PUBLIC_SURFACE = {
    "vyre_async",
    "vyre_async.abc",
    "vyre_async.errors",
    "vyre_async.ir",
    "vyre_async.programs",
    "vyre_async.testing",
    "vyre_async.tracing",
    "vyre_async.policies",
    # programs run from the command line (`vyre`, `make demo`)
    "vyre_async.cli",
    "vyre_async.demo",
    # the tracing entry points besides `tracing` (which needs the SDK): telemetry's
    # switches and metrics text (API only), and the trace-to-timeline converter
    "vyre_async.telemetry",
    "vyre_async.timeline",
}


def test_the_public_surface_is_curated() -> None:
    # A new public module is a decision: add it here (and to docs/architecture.md) or
    # name it with a leading underscore.
    top = {
        ".".join(name.split(".")[:2]) for name in PUBLIC_MODULES if name.startswith("vyre_async")
    }
    assert top == PUBLIC_SURFACE


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_dir_of_a_public_module_lists_only_its_api(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    for item in exported:
        assert hasattr(module, item), f"{name}.__all__ names {item!r}, which it lacks"
    listed = {n for n in dir(module) if not n.startswith(("_", "@"))}
    submodules = {n for n in listed if isinstance(getattr(module, n, None), types.ModuleType)} & {
        n for n, v in vars(module).items() if getattr(v, "__name__", "").startswith(name + ".")
    }
    # Imported helpers (np, math, dataclass, annotations...) are not the module's API.
    assert listed - submodules <= exported, sorted(listed - submodules - exported)


def test_submodules_are_attributes_even_when_loaded_lazily() -> None:
    # A public package that once imported every submodule eagerly still gives them as
    # attributes.
    eager_before = ("vyre_async.policies", "vyre_async.policies.arms")
    code = "import vyre_async;" + "".join(f"print({name}.__name__);" for name in eager_before)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == list(eager_before)


def test_a_missing_attribute_imports_nothing() -> None:
    # hasattr() on a package is an answer, not an import: not of a module that was
    # never an attribute (tracing needs the SDK), nor of names tools probe for.
    code = (
        "import sys, vyre_async, vyre_async._cache;"
        "before = set(sys.modules);"
        "print(hasattr(vyre_async, 'tracing'), hasattr(vyre_async, '_repr_html_'),"
        " hasattr(vyre_async._cache, 'no_such_thing'), sorted(set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False False []"
