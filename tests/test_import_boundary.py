"""The core never imports a concrete backend, a GPU library or a distributed engine.

And listing backends imports only their registration records: no backend
internals, no numpy beyond what the core already loaded, no GPU library.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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


LISTING = """
import json, sys
import vyre_async

before = set(sys.modules)
ids = sorted(r.id for r in vyre_async.registered_backends())
print(json.dumps({"ids": ids, "new": sorted(set(sys.modules) - before)}))
"""

# What listing may load from the backend packages: the (lazy) package and its record.
REGISTRATION_ONLY = {
    "vyre_reference",
    "vyre_reference.registration",
    "vyre_cupy",
    "vyre_cupy.registration",
    "vyre_ray",
    "vyre_ray.registration",
    "vyre_wgpu",
    "vyre_wgpu.registration",
}


def test_listing_backends_imports_only_their_registrations() -> None:
    out = subprocess.run(
        [sys.executable, "-c", LISTING], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(out.stdout)
    assert {"reference", "cupy", "ray", "wgpu"} <= set(report["ids"])
    new = set(report["new"])
    assert new >= REGISTRATION_ONLY
    backend_modules = {
        m
        for m in new
        if m.split(".")[0] in {"vyre_reference", "vyre_cupy", "vyre_ray", "vyre_wgpu"}
    }
    assert backend_modules == REGISTRATION_ONLY  # e.g. no vyre_reference.engine, vyre_cupy.codegen
    for internal in (
        "vyre_reference.backend",
        "vyre_reference.engine",
        "vyre_reference.compile",
        "vyre_cupy.backend",
        "vyre_cupy.codegen",
        "vyre_cupy.compile",
        "vyre_ray.backend",
        "vyre_ray.worker",
        "ray",
        "vyre_wgpu.backend",
        "vyre_wgpu.codegen",
        "wgpu",
    ):
        assert internal not in new, internal
    # Beyond those, only the core and the standard library (entry-point metadata).
    others = {
        m
        for m in new - backend_modules
        if m.split(".")[0] != "vyre_async" and m.split(".")[0] not in sys.stdlib_module_names
    }
    assert others == set(), sorted(others)  # no numpy.*, anyio, cupy*, opentelemetry.sdk
