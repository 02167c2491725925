"""Scripts run as ``python benchmarks/X.py`` put their own folder first on ``sys.path``.

A script named like a library module then replaces that library for every import
in the run: ``benchmarks/cuda.py`` once hid NVIDIA's ``cuda`` namespace package, so
``import cupy`` failed on the GPU machine ("No module named 'cuda.pathfinder'") and
every GPU benchmark reported "no GPU". No script may take a library's name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_FOLDERS = ("benchmarks", "scripts", "examples")
#: Top-level modules the GPU and runtime stack import by name, installed here or not:
#: CuPy's and NVIDIA's (``cuda`` is the namespace of cuda-bindings, cuda-pathfinder and
#: cuda-core, which ``import cupy`` loads), and the project's dependencies.
STACK = {
    "cuda",
    "cupy",
    "cupyx",
    "cupy_backends",
    "fastrlock",
    "numpy",
    "anyio",
    "blake3",
    "opentelemetry",
    "trio",
    "sniffio",
    "ray",
    "wgpu",
    "pytest",
    "hypothesis",
}


def scripts() -> list[Path]:
    found = []
    for folder in SCRIPT_FOLDERS:
        found += [p for p in sorted((ROOT / folder).iterdir()) if p.is_file()]
    return found


def module_name(path: Path) -> str:
    return path.stem if path.suffix == ".py" else path.name


def shadowed(name: str, folder: Path) -> bool:
    """Whether ``name`` is also importable from somewhere other than ``folder``."""
    loaded = sys.modules.get(name)
    if loaded is not None:  # (a test may have imported one of the scripts by its name)
        origin = getattr(loaded, "__file__", None)
        ours = {(ROOT / f).resolve() for f in SCRIPT_FOLDERS} | {folder.resolve()}
        return origin is None or Path(origin).resolve().parent not in ours
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if Path(p or ".").resolve() != folder.resolve()]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    return spec is not None


@pytest.mark.parametrize("path", scripts(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_script_takes_a_library_name(path: Path) -> None:
    name = module_name(path)
    assert name not in STACK, f"{path} hides the library module {name!r} when run"
    assert not shadowed(name, path.parent), (
        f"{path} hides the installed module {name!r} for every import in its run"
    )


def test_the_check_sees_a_shadowing_name(tmp_path: Path) -> None:
    # The generic check finds an installed module by the script's name.
    assert shadowed("numpy", tmp_path)
    assert shadowed("json", tmp_path)
    assert shadowed("sys", tmp_path)  # built in, already loaded
    assert not shadowed("vyre_no_such_module_here", tmp_path)


def test_a_script_imported_by_its_own_name_is_not_a_clash(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    folder = ROOT / "examples"
    module = types.ModuleType("service")
    module.__file__ = str(folder / "service.py")
    monkeypatch.setitem(sys.modules, "service", module)
    assert not shadowed("service", folder)
    assert not shadowed("service", ROOT / "benchmarks")  # benchmarks/service.py: ours too
    module.__file__ = "/usr/lib/python3/dist-packages/service.py"
    assert shadowed("service", folder)
