"""Builds a session started and no test waited for are finished and cached, not thrown away.

The toolchain fixture starts every emulator build and ``nvcc`` at once. They
were killed at the end of a session that did not wait for them, so they never
reached the cache: every mutant of the CUDA host side's mutation run paid the
corpus's g++ build and ``nvcc`` again. With ``VYRE_BUILD_GRACE_S`` (which
scripts/mutation.py sets) they get that long to finish.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cupy.conftest import NvccJob
from tests.cupy.emulator import BuildJob


def _compiler(output: Path, seconds: float) -> subprocess.Popen[bytes]:
    """A stand-in compiler: writes ``output`` after ``seconds``."""
    script = (
        f"import pathlib, time; time.sleep({seconds}); "
        f"pathlib.Path({str(output)!r}).write_bytes(b'bin')"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def test_a_build_no_test_waited_for_is_finished_and_cached(tmp_path: Path) -> None:
    job = BuildJob(tmp_path / "emu", tmp_path / "unit.cpp", None, ())
    job.process = _compiler(job.partial, 0.3)
    job.stop(grace=30)
    assert (tmp_path / "emu").read_bytes() == b"bin"
    assert not job.partial.exists() and job.process is None


def test_a_build_past_its_grace_is_killed_and_not_cached(tmp_path: Path) -> None:
    job = BuildJob(tmp_path / "emu", tmp_path / "unit.cpp", None, ())
    job.process = _compiler(job.partial, 30)
    job.stop(grace=0.1)
    assert not (tmp_path / "emu").exists() and not job.partial.exists()


def test_nvcc_no_test_waited_for_is_finished_and_marked_done(tmp_path: Path) -> None:
    marker = tmp_path / "ok"
    job = NvccJob([], tmp_path / "kernels.cu", marker, _compiler(tmp_path / "kernels.cubin", 0.3))
    job.stop(grace=30)
    assert marker.exists()
    killed = NvccJob([], tmp_path / "k.cu", tmp_path / "ok2", _compiler(tmp_path / "k.cubin", 30))
    killed.stop(grace=0.1)
    assert not (tmp_path / "ok2").exists()
