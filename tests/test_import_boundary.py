"""The core never imports a concrete backend, a GPU library or a distributed engine."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "src" / "vyre_async"
FORBIDDEN = {
    "cupy",
    "cupyx",
    "cuda",
    "pycuda",
    "numba",
    "torch",
    "jax",
    "warp",
    "ray",
    "dask",
    "distributed",
    "vyre_cupy",
    "vyre_reference",
}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    roots.add(arg.value.split(".")[0])
    return roots


def test_core_imports_no_concrete_backend() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 5
    offenders = {
        str(path.relative_to(CORE)): sorted(_imported_roots(path) & FORBIDDEN) for path in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import cupy\nfrom vyre_reference import engine\n")
    assert _imported_roots(bad) >= {"cupy", "vyre_reference"}
