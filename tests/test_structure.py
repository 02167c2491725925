"""The layering of `vyre_async`: its modules import each other in one direction only.

Every import is read from the source with `ast` — module level, inside
functions, and under ``if TYPE_CHECKING:`` alike. The only cycle allowed is
the IR's ``program``/``wire`` pair (a program encodes itself; the wire format
builds programs). The engine modules reach the backend through the structural
types of `vyre_async._seams`, never by importing `vyre_async._backend`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vyre_async
from tests.cupy.test_cupy_structure import find_cycle

ROOT = Path(vyre_async.__file__).parent
ALLOWED_CYCLE = {"vyre_async.ir.program", "vyre_async.ir.wire"}
#: Modules below the backend base class: they must not import it.
ENGINE = (
    "vyre_async._calibration.probes",
    "vyre_async._calibration.record",
    "vyre_async._calibration.store",
    "vyre_async._execution",
    "vyre_async._frontend",
    "vyre_async._pending",
    "vyre_async._pipeline",
    "vyre_async._prefetch",
    "vyre_async._store",
    "vyre_async.telemetry._metrics",
    "vyre_async.telemetry._otel_compat",
    "vyre_async.telemetry._prometheus",
    "vyre_async.telemetry._spans",
    "vyre_async.telemetry._state",
)


def module_names() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("vyre_async", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = module_names()


def imports_in(module: str, source: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (with this source) imports, anywhere."""
    is_package = MODULES.get(module, Path()).name == "__init__.py"
    package = module if is_package else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import module` names the module
                full = f"{base}.{alias.name}"
                targets.append(full if full in known else base)
        for target in targets:
            while target and target not in known:  # `import vyre_async.ir.walk` etc.
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = set(MODULES)
    edges = {name: imports_in(name, path.read_text(), known) for name, path in MODULES.items()}
    # The package and subpackage __init__s re-export their modules: importing them is
    # not a dependency of a module on its siblings, so they stay out of the graph.
    inits = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    return {k: v - inits for k, v in edges.items() if k not in inits}


def test_the_reader_sees_every_kind_of_import() -> None:
    known = {"vyre_async.a", "vyre_async.b", "vyre_async.c", "vyre_async.d"}
    source = """
from typing import TYPE_CHECKING
from vyre_async import b
if TYPE_CHECKING:
    from vyre_async.c import Thing
def later():
    import vyre_async.d
"""
    assert imports_in("vyre_async.a", source, known) == {
        "vyre_async.b",
        "vyre_async.c",
        "vyre_async.d",
    }


def test_a_planted_cycle_is_found() -> None:
    edges = graph()
    assert find_cycle({k: v - {"vyre_async.ir.wire"} for k, v in edges.items()}) is None
    edges["vyre_async._pending"] = {*edges["vyre_async._pending"], "vyre_async._backend"}
    assert find_cycle({k: v - {"vyre_async.ir.wire"} for k, v in edges.items()}) is not None


def test_no_import_cycle_beyond_the_program_wire_pair() -> None:
    edges = graph()
    assert edges["vyre_async.ir.program"] >= {"vyre_async.ir.wire"}  # the known pair
    assert "vyre_async.ir.program" in edges["vyre_async.ir.wire"]
    without = {
        k: v - {"vyre_async.ir.wire"} if k == "vyre_async.ir.program" else v
        for k, v in edges.items()
    }
    assert find_cycle(without) is None


@pytest.mark.parametrize("module", ENGINE)
def test_engine_modules_do_not_import_the_backend_base_class(module: str) -> None:
    assert "vyre_async._backend" not in graph()[module]


# The backend authors' seam -------------------------------------------------------------------

BACKENDS = Path(__file__).resolve().parents[1] / "src" / "backends"
#: What a backend package may import of vyre-async (vyre_async.ir with its submodules).
SEAM = ("vyre_async.abc", "vyre_async.errors", "vyre_async.ir")


def vyre_imports(source: str) -> set[str]:
    """Every ``vyre_async...`` module a source imports, anywhere (functions, TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "vyre_async"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vyre_async":
            assert node.module is not None
            found |= {
                f"{node.module}.{a.name}" if node.module == "vyre_async" else node.module
                for a in node.names
            }
    return found


def within_the_seam(module: str) -> bool:
    return any(module == allowed or module.startswith(allowed + ".") for allowed in SEAM)


@pytest.mark.parametrize(
    "path", sorted(BACKENDS.rglob("*.py")), ids=lambda p: str(p.relative_to(BACKENDS))
)
def test_backends_import_only_the_seam(path: Path) -> None:
    outside = sorted(m for m in vyre_imports(path.read_text()) if not within_the_seam(m))
    assert outside == [], f"{path.name} imports {outside}: import them from vyre_async.abc"


def test_the_seam_reader_sees_every_kind_of_import() -> None:
    source = """
import vyre_async._pending
from vyre_async import VyreBackend
from vyre_async.abc import Executor
from vyre_async.ir.walk import ops_used
def later():
    from vyre_async._frontend import Launch
"""
    found = vyre_imports(source)
    assert found == {
        "vyre_async._pending",
        "vyre_async.VyreBackend",
        "vyre_async.abc",
        "vyre_async.ir.walk",
        "vyre_async._frontend",
    }
    assert [m for m in sorted(found) if not within_the_seam(m)] == [
        "vyre_async.VyreBackend",
        "vyre_async._frontend",
        "vyre_async._pending",
    ]


def test_nothing_in_the_core_imports_the_authors_kit() -> None:
    # `vyre_async.abc` re-exports the engine's records for backend authors; the engine
    # itself imports them from `vyre_async._executor` and the modules below it.
    importers = sorted(name for name, edges in graph().items() if "vyre_async.abc" in edges)
    assert importers == []
