"""The package check (scripts/package_check.py) refuses wheels users could not use.

``make package-check`` builds and installs the real wheel; these tests feed its
layout checks wheels that are wrong in one way each, among them a wheel really
built by hatchling with the layout that once shipped (the backends under
``backends/``), and check that the real metadata and version agree.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

import vyre_async

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "package_check", ROOT / "scripts/package_check.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["package_check"] = module
    spec.loader.exec_module(module)
    return module


package_check = _load()

MARKER = '; extra == "dev"'
GOOD_ENTRY_POINTS = """\
[console_scripts]
vyre-async = vyre_async.cli:main

[pytest11]
vyre_async = vyre_async.testing.plugin

[vyre_async.backends]
cupy = vyre_cupy.registration:REGISTRATION
ray = vyre_ray.registration:REGISTRATION
reference = vyre_reference.registration:REGISTRATION
wgpu = vyre_wgpu.registration:REGISTRATION
"""


def _wheel(
    tmp_path: Path, *, drop: str = "", version: str = "0.1.0", prefix: str = "", extra: str = ""
) -> Path:
    """A small wheel with the right layout, minus ``drop``, with packages under ``prefix``."""
    files = {
        "vyre_async/__init__.py": "",
        "vyre_async/py.typed": "",
        "vyre_async/_version.py": f'__version__ = "{version}"\n',
        "vyre_async/cli.py": "",
        "vyre_async/testing/__init__.py": "",
        "vyre_async/testing/plugin.py": "",
    }
    for package in ("vyre_reference", "vyre_cupy", "vyre_ray", "vyre_wgpu"):
        files[f"{prefix}{package}/__init__.py"] = ""
        files[f"{prefix}{package}/py.typed"] = ""
        files[f"{prefix}{package}/registration.py"] = ""
    files["vyre_async-0.1.0.dist-info/entry_points.txt"] = GOOD_ENTRY_POINTS
    files["vyre_async-0.1.0.dist-info/METADATA"] = (
        "Metadata-Version: 2.4\nName: vyre-async\nVersion: 0.1.0\n"
        + "".join(
            f"Requires-Dist: {r}>=1{MARKER if r == extra else ''}\n" for r in package_check.REQUIRES
        )
    )
    path = tmp_path / "vyre_async-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            if name != drop:
                archive.writestr(name, text)
    return path


def test_a_right_wheel_has_no_problems(tmp_path: Path) -> None:
    assert package_check.wheel_problems(_wheel(tmp_path)) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"prefix": "backends/"}, "unexpected top-level entries ['backends']"),
        ({"drop": "vyre_cupy/py.typed"}, "vyre_cupy/py.typed is missing"),
        ({"drop": "vyre_ray/registration.py"}, "names module 'vyre_ray.registration'"),
        ({"drop": "vyre_async/testing/plugin.py"}, "pytest11:vyre_async"),
        ({"version": "0.2.0"}, "vyre_async.__version__ is '0.2.0'"),
        ({"extra": "anyio"}, "Requires-Dist lacks anyio (outside any extra)"),
    ],
)
def test_each_kind_of_broken_wheel_is_refused(
    tmp_path: Path, change: dict[str, str], expected: str
) -> None:
    problems = package_check.wheel_problems(_wheel(tmp_path, **change))
    assert any(expected in p for p in problems), problems


def _project_copy(tmp_path: Path, pyproject: str) -> Path:
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "README.md", copy / "README.md")
    (copy / "pyproject.toml").write_text(pyproject)
    return copy


def _build_wheel(project: Path) -> Path:
    out = project / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, project],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def _check(wheel: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, ROOT / "scripts/package_check.py", "--wheel-only", wheel],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_layout_that_once_shipped_fails_the_check_and_ours_passes(tmp_path: Path) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = re.search(
        r"\[tool\.hatch\.build\.targets\.wheel\]\n.*?(?=\n\[tool\.hatch\.build\.targets\.sdist\])",
        pyproject,
        re.S,
    )
    assert section is not None
    old = (
        "[tool.hatch.build.targets.wheel]\npackages = [\n"
        '    "src/vyre_async",\n    "src/backends/vyre_reference",\n'
        '    "src/backends/vyre_cupy",\n    "src/backends/vyre_ray",\n]\n'
    )
    broken = _build_wheel(_project_copy(tmp_path / "broken", pyproject.replace(section[0], old)))
    refused = _check(broken)
    assert refused.returncode == 1
    assert "backends" in refused.stderr and "FAILED" in refused.stdout
    good = _check(_build_wheel(_project_copy(tmp_path / "good", pyproject)))
    assert good.returncode == 0, good.stderr


def test_the_version_is_written_once_and_the_metadata_agrees() -> None:
    assert vyre_async.__version__ == importlib.metadata.version("vyre-async"), (
        "the installed metadata is older than src/vyre_async/_version.py: reinstall the "
        "project (make clean test)"
    )


def _refused_cleanly(wheel: Path, expected: str) -> None:
    """``--wheel-only`` fails ``wheel`` as a check, with ``expected`` and a Fix, no traceback."""
    problems = package_check.wheel_problems(wheel)
    assert len(problems) == 1 and expected in problems[0] and "Fix:" in problems[0], problems
    refused = _check(wheel)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr
    assert f"package-check: {problems[0]}" in refused.stderr
    assert f"{wheel}: FAILED" in refused.stdout


def test_a_wheel_without_metadata_is_refused_as_a_check(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, drop="vyre_async-0.1.0.dist-info/METADATA")
    _refused_cleanly(wheel, "vyre_async-0.1.0.dist-info/METADATA is missing")


def test_a_missing_path_is_refused_as_a_check(tmp_path: Path) -> None:
    _refused_cleanly(tmp_path / "nothing-0.1.0-py3-none-any.whl", "no such file")
    _refused_cleanly(tmp_path, "is not a file")


def test_a_file_that_is_not_a_zip_is_refused_as_a_check(tmp_path: Path) -> None:
    wheel = tmp_path / "vyre_async-0.1.0-py3-none-any.whl"
    wheel.write_text("not a zip archive")
    _refused_cleanly(wheel, "is not a wheel: not a zip archive")


SDIST_FILES = (
    "PKG-INFO",
    "pyproject.toml",
    "README.md",
    "src/vyre_async/__init__.py",
    "src/vyre_async/py.typed",
    "src/backends/vyre_reference/__init__.py",
    "src/backends/vyre_cupy/__init__.py",
    "src/backends/vyre_ray/__init__.py",
    "src/backends/vyre_wgpu/__init__.py",
    "tests/conftest.py",
)


def _sdist(tmp_path: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """An sdist (one top folder, as ``python -m build`` writes it) with all but ``drop``."""
    path = tmp_path / "vyre_async-0.1.0.tar.gz"
    source = tmp_path / "vyre_async-0.1.0"
    for name in SDIST_FILES:
        if name not in drop:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_text("")
    with tarfile.open(path, "w:gz") as archive:
        archive.add(source, arcname=source.name)
    return path


def test_a_right_sdist_has_no_problems(tmp_path: Path) -> None:
    assert package_check.sdist_problems(_sdist(tmp_path)) == []


def test_an_sdist_missing_what_it_needs_is_refused(tmp_path: Path) -> None:
    drop = ("src/backends/vyre_cupy/__init__.py", "tests/conftest.py", "src/vyre_async/py.typed")
    assert package_check.sdist_problems(_sdist(tmp_path, drop=drop)) == [
        "the sdist lacks src/vyre_async/py.typed",
        "the sdist lacks src/backends/vyre_cupy/__init__.py",
        "the sdist lacks tests/conftest.py",
    ]


def test_an_sdist_that_is_missing_or_not_a_tar_is_refused(tmp_path: Path) -> None:
    (missing,) = package_check.sdist_problems(tmp_path / "vyre_async-0.1.0.tar.gz")
    assert "no such file" in missing and "Fix:" in missing
    broken = tmp_path / "broken.tar.gz"
    broken.write_text("not a tar archive")
    (problem,) = package_check.sdist_problems(broken)
    assert "is not an sdist: not a tar archive" in problem and "Fix:" in problem


def _fake_python(tmp_path: Path, printed: str) -> Path:
    """A "python" that prints ``printed`` whatever it is asked (for `_imported_from`)."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\necho '{printed}'\n")
    python.chmod(0o755)
    return python


def test_imports_are_checked_against_their_prefix(tmp_path: Path) -> None:
    site = tmp_path / "site"
    inside = f'["{site}/vyre_async/__init__.py"]'
    python = _fake_python(tmp_path, inside)
    files = package_check._imported_from(python, ["vyre_async"], site, cwd=tmp_path, env={})
    assert files == [f"{site}/vyre_async/__init__.py"]
    for elsewhere in (f"{tmp_path}/site2/vyre_async/__init__.py", f"{ROOT}/src/x.py"):
        python = _fake_python(tmp_path, f'["{elsewhere}"]')
        with pytest.raises(package_check.CheckFailed, match="not from"):
            package_check._imported_from(python, ["vyre_async"], site, cwd=tmp_path, env={})


def test_run_expects_the_exit_status_it_is_given(tmp_path: Path) -> None:
    fail = [sys.executable, "-c", "import sys; print('probe'); sys.exit(1)"]
    assert "probe" in package_check._run(fail, cwd=tmp_path, timeout=60, expect_rc=1)
    with pytest.raises(package_check.CheckFailed, match=r"exited 1:\n"):
        package_check._run(fail, cwd=tmp_path, timeout=60)
    ok = [sys.executable, "-c", "pass"]
    with pytest.raises(package_check.CheckFailed, match=r"exited 0 \(expected 1\)"):
        package_check._run(ok, cwd=tmp_path, timeout=60, expect_rc=1)
