"""Without Sybil the docs' Python blocks fail, never silently skip (the root conftest.py).

The GPU machine's image has no Sybil: there a run of the docs must say what is
missing and how to get it, rather than pass with nothing checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_fail_with_a_fix_when_sybil_cannot_be_imported(tmp_path: Path) -> None:
    # A module named sybil ahead of site-packages that fails to import, as an
    # absent one does: the installed Sybil stays untouched for the rest of the run.
    (tmp_path / "sybil.py").write_text('raise ImportError("sybil is blocked by this test")\n')
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rf",
         "README.md", "docs/guide.md"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]  # tests failed (not 0, nor 5: none collected)
    for doc in ("README.md", "guide.md"):
        assert f"running the Python blocks of {doc} needs Sybil" in out, out[-3000:]
    assert "Fix: pip install sybil (it is in vyre-async[dev])" in out
    assert "2 failed" in out and "passed" not in out and "skipped" not in out, out[-3000:]
