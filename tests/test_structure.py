"""The layering of `vyre_async`: its modules import each other in one direction only.

Every import is read from the source with `ast` — module level, inside
functions, and under ``if TYPE_CHECKING:`` alike. The only cycle allowed is
the IR's ``program``/``wire`` pair (a program encodes itself; the wire format
builds programs). The engine modules reach the backend through the structural
types of `vyre_async.seams`, never by importing `vyre_async.backend`.
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
    "vyre_async.calibration",
    "vyre_async.execution",
    "vyre_async.frontend",
    "vyre_async.pending",
    "vyre_async.pipeline",
    "vyre_async.prefetch",
    "vyre_async.store",
    "vyre_async.telemetry",
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
    edges["vyre_async.pending"] = {*edges["vyre_async.pending"], "vyre_async.backend"}
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
    assert "vyre_async.backend" not in graph()[module]
