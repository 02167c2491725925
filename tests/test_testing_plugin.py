"""`vyre_async.testing`: a backend built outside this repository runs the shipped suite.

A tiny package is written to a temp dir and put on the path; pytest is run
the way a backend author would run it:
``python -m pytest --pyargs vyre_async.testing --vyre-backend=...``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

BACKEND = '''
import numpy as np

from vyre_reference import ReferenceExecutor


class TinyBackend(ReferenceExecutor):
    """A third party's executor (here it lends the reference engine); the registry
    wraps it in a VyreBackend."""

    id = "tiny"


class BrokenBackend(ReferenceExecutor):
    """Settles every dispatch with zeros: the suite must catch it."""

    id = "broken"

    def enqueue(self, launch):
        outputs = [
            np.zeros(launch.plan.count_of(d.name), d.dtype.numpy) for d in launch.plan.outputs
        ]
        launch.completer.resolve(outputs)
'''

REGISTRATION = """
from vyre_async import BackendRegistration

TINY = BackendRegistration(id="tiny", factory="thirdparty.backend:TinyBackend")
BROKEN = BackendRegistration(id="broken", factory="thirdparty.backend:BrokenBackend")
NOT_A_REGISTRATION = 42
"""


def _package(root: Path) -> None:
    package = root / "thirdparty"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "backend.py").write_text(BACKEND)
    (package / "registration.py").write_text(REGISTRATION)


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "vyre_async.testing", "-q",
         "-p", "no:cacheprovider", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _count(output: str, word: str) -> int:
    found = re.search(rf"(\d+) {word}", output)
    return int(found.group(1)) if found else 0


def test_an_out_of_tree_backend_passes_the_whole_suite(tmp_path: Path) -> None:
    _package(tmp_path)
    run = _pytest(tmp_path, "--vyre-backend=thirdparty.registration:TINY", "-rA")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    # The corpus and every contract test, under asyncio and trio, on this backend only.
    assert _count(run.stdout, "passed") >= 120 and _count(run.stdout, "failed") == 0
    ran = re.findall(r"test_a_result_is_taken_once\[([\w-]+)\]", run.stdout)
    assert sorted(ran) == ["asyncio-tiny", "trio-tiny"] or sorted(ran) == [
        "tiny-asyncio",
        "tiny-trio",
    ], ran
    assert "reference" not in " ".join(re.findall(r"\[[\w-]+\]", run.stdout))


def test_the_suite_catches_a_backend_that_returns_wrong_outputs(tmp_path: Path) -> None:
    _package(tmp_path)
    run = _pytest(tmp_path, "--vyre-backend=thirdparty.registration:BROKEN", "-x", "-k", "corpus")
    assert run.returncode == 1, run.stdout[-3000:]
    assert _count(run.stdout, "failed") == 1  # -x: the first corpus case already differs


def test_a_bad_backend_option_is_a_usage_error_with_a_fix(tmp_path: Path) -> None:
    _package(tmp_path)
    for spec, words in (
        ("thirdparty.registration:NOT_A_REGISTRATION", "not a BackendRegistration"),
        ("nosuchpackage.registration:TINY", "cannot import"),
    ):
        run = _pytest(tmp_path, f"--vyre-backend={spec}")
        assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]  # usage error
        assert words in run.stderr and "Fix:" in run.stderr
    run = _pytest(tmp_path, "--vyre-backend=nobackend", "-x", "-k", "result_is_taken_once")
    assert run.returncode == 1  # named but not installed: a failure, never a skip
    assert "named by --vyre-backend cannot start" in run.stdout


def test_the_plugin_leaves_other_projects_vyre_backend_fixtures_alone(tmp_path: Path) -> None:
    """Loaded in every pytest session: a project's own fixture of that name is its own."""
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n"
        "@pytest.fixture(params=['a', 'b'])\n"
        "def vyre_backend(request):\n"
        "    return request.param\n"
    )
    (tmp_path / "test_theirs.py").write_text(
        "import pytest\n\n"
        "def test_fixture(vyre_backend):\n"
        "    assert vyre_backend in ('a', 'b')\n\n"
        "@pytest.mark.parametrize('vyre_backend', ['x'])\n"
        "def test_parametrized(vyre_backend):\n"
        "    assert vyre_backend == 'x'\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    assert _count(run.stdout, "passed") == 3  # a, b, and x: not once per vyre-async backend
