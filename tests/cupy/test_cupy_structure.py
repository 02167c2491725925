"""The layering of `vyre_cupy`: its modules import each other in one direction only.

Every import is read from the source with `ast` — module level, inside
functions, and under ``if TYPE_CHECKING:`` alike — so a cycle cannot hide in a
lazy import or an annotation-only one. The package's ``__init__`` (lazy
exports of the public names) is left out of the graph, and no module may
import the package itself (that would go through those exports).
"""

from __future__ import annotations

import ast
from pathlib import Path

import vyre_cupy

PACKAGE = Path(vyre_cupy.__file__).parent
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def imports_of(module: str) -> set[str]:
    """The `vyre_cupy` modules ``module`` imports, anywhere in its source."""
    return imports_in((PACKAGE / f"{module}.py").read_text())


def imports_in(source: str) -> set[str]:
    """The `vyre_cupy` modules a module of the package with this source imports."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .x import y
                base = node.module or ""
                names = [f"vyre_cupy.{base}".rstrip(".")]
                if not base:
                    names = [f"vyre_cupy.{alias.name}" for alias in node.names]
            elif node.module is not None:
                names = [node.module]
                if node.module == "vyre_cupy":
                    names = [f"vyre_cupy.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "vyre_cupy":
                continue
            found.add(parts[1] if len(parts) > 1 else "__init__")
    return found


def graph() -> dict[str, set[str]]:
    return {module: imports_of(module) for module in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """Return one import cycle (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_import_graph_reader_sees_every_kind_of_import() -> None:
    source = """
from typing import TYPE_CHECKING
import vyre_cupy.layout
from vyre_cupy.context import DeviceContext
if TYPE_CHECKING:
    from vyre_cupy.backend import CupyExecutor
def late():
    from vyre_cupy import batch
    from . import streams
    from .kernel import CudaKernel
"""
    assert imports_in(source) == {"layout", "context", "backend", "batch", "streams", "kernel"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_vyre_cupy_modules_import_each_other_in_one_direction() -> None:
    edges = graph()
    assert {"backend", "batch", "grid", "launch", "context", "kernel"} <= set(edges)
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges) or [])}"


def test_no_module_imports_the_package_or_the_backend() -> None:
    edges = graph()
    for module, targets in edges.items():
        assert "__init__" not in targets, f"{module} imports the vyre_cupy package itself"
        if module != "backend":
            assert "backend" not in targets, f"{module} imports vyre_cupy.backend"


def test_the_layers_are_as_documented() -> None:
    edges = graph()
    assert edges["batch"] & {"backend", "grid"} == set()
    assert edges["grid"] & {"backend", "batch"} == set()
    assert edges["launch"] & {"backend", "batch", "grid"} == set()
    assert edges["context"] & {"backend", "batch", "launch", "kernel"} == set()
    assert edges["kernel"] & {"backend", "batch", "launch", "context"} == set()
