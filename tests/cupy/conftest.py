"""Shared fixtures of the CUDA backend tests: one batch build per kernel set, started together.

The conformance corpus and the operator table are each compiled ONCE for the
CPU emulator (``g++``), and both are compiled ONCE together by ``nvcc`` for
sm_90. The three compilers start at the same time on first use (the machine
has two cores) and their results are cached across runs by content hash.

The emulator runs under UBSan (see ``emulator.py``). The fake device's library
only logs what it finds (it runs inside pytest); hooks in ``tests/conftest.py``
fail the test phase during which a report arrived, in any test folder.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conformance.corpus import Case, cases
from tests.cupy.emulator import (
    BUILD_GRACE_S,
    NVCC,
    NVCC_FLAGS,
    BuildJob,
    build_emulator,
    nvcc_command,
)
from tests.cupy.op_table import OpCase, op_cases
from tests.cupy.unit_programs import race_probes, unit_cases
from vyre_async.ir import Program, split_at_grid_barriers
from vyre_async.programs import elementwise_xor
from vyre_cupy.codegen import KernelSource, generate, has_grid_barrier

if TYPE_CHECKING:
    from tests.cupy.fake_cupy import FakeDevice


@dataclass
class NvccJob:
    """An ``nvcc`` batch compile of many kernels (possibly still running)."""

    kernels: list[KernelSource]
    source: Path
    marker: Path
    process: subprocess.Popen[bytes] | None

    def wait(self) -> tuple[int, str]:
        """Return ``(returncode, log)``; a cached success returns ``(0, "")``."""
        if self.process is None:
            return 0, ""
        _, err = self.process.communicate(timeout=600)
        if self.process.returncode == 0:
            self.marker.touch()
        return self.process.returncode, err.decode(errors="replace")

    def stop(self, grace: float = BUILD_GRACE_S) -> None:
        """Give ``nvcc`` ``grace`` seconds to finish (then it is cached), else kill it.

        As for the emulator builds (`BuildJob.stop`): killed every time no test
        waited for it, it was never cached and ran again in every session.
        """
        if self.process is None or self.process.returncode is not None:
            return
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process.communicate()
        if self.process.returncode == 0:
            self.marker.touch()


def start_nvcc(programs: list[Program]) -> NvccJob:
    """Start one ``nvcc -cubin -arch=sm_90`` over every program's kernel (entries k0, k1...)."""
    kernels = [generate(p, entry=f"k{i}") for i, p in enumerate(programs)]
    unit = "\n".join(k.source for k in kernels)
    digest = hashlib.sha256((unit + " ".join(NVCC_FLAGS) + str(NVCC)).encode()).hexdigest()
    folder = Path(tempfile.gettempdir()) / "vyre-cupy-nvcc" / digest[:32]
    folder.mkdir(parents=True, exist_ok=True)
    source, marker = folder / "kernels.cu", folder / "ok"
    if marker.exists():
        return NvccJob(kernels, source, marker, None)
    source.write_text(unit)
    process = subprocess.Popen(
        [*nvcc_command(source, folder / "kernels.cubin"), "-Xptxas", "-warn-spills"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return NvccJob(kernels, source, marker, process)


@dataclass
class Toolchain:
    """The batch builds every emulation and compile test shares."""

    corpus: list[Case]
    ops: list[OpCase]  # operator table, then the unit programs: compared with the reference
    probes: list[tuple[str, Program, bool]]  # race-detector probes, after them in the build
    segments: list[Program]  # the segments of the corpus's grid-barrier programs (nvcc only)
    corpus_build: BuildJob
    ops_build: BuildJob
    nvcc: NvccJob | None
    device_programs: list[Program]  # kernels of the fake device (emulator shared library)
    device_build: BuildJob


@pytest.fixture(scope="session")
def toolchain() -> Iterator[Toolchain]:
    """Start every batch build; at the end, stop the ones no test waited for.

    Running a few tests (``pytest tests/cupy/test_x.py``) waits for only the
    builds they use; the others are killed and reaped here, not left running
    with open pipes when the session ends.
    """
    if shutil.which("g++") is None:  # required in CI: the emulation is how CUDA is checked there
        pytest.fail("the CUDA emulation tests need g++ (C++20, e.g. Debian's build-essential)")
    corpus = [c for c in cases() if c.error is None]
    ops = op_cases() + unit_cases()
    probes = race_probes()
    corpus_build = build_emulator([c.program for c in corpus])
    ops_build = build_emulator([o.program for o in ops] + [p for _, p, _ in probes])
    segments = grid_segments([c.program for c in corpus])
    programs = [c.program for c in corpus] + [o.program for o in ops] + [p for _, p, _ in probes]
    nvcc = start_nvcc(programs + segments) if NVCC else None
    device_programs = fake_device_programs()
    device_build = build_emulator(device_programs, library=True)
    yield Toolchain(
        corpus,
        ops,
        probes,
        segments,
        corpus_build,
        ops_build,
        nvcc,
        device_programs,
        device_build,
    )
    for job in (corpus_build, ops_build, device_build, nvcc):
        if job is not None:
            job.stop()


def fake_device_programs() -> list[Program]:
    """Programs the fake-device tests dispatch: the corpus, the contract's, and their own."""
    from benchmarks.cuda_policies import benchmark_programs

    from tests.contract.test_contract import lane_ids, resident_order_programs, spin
    from tests.cupy.device_programs import extra_programs
    from vyre_async._calibration import (
        RESIDENT_GAIN_PROBE_ELEMENTS,
        launch_probe_program,
        resident_gain_probe_program,
    )

    programs = [c.program for c in cases() if c.error is None]
    programs += [spin(), elementwise_xor(64), *resident_order_programs()]
    programs += [lane_ids((1024, 1, 1)), lane_ids((1, 1024, 1)), lane_ids((1, 1, 64))]
    programs += benchmark_programs()
    programs += [launch_probe_program(), elementwise_xor(1024)]  # CupyExecutor.calibrate
    programs += [  # its resident-gain probe
        elementwise_xor(RESIDENT_GAIN_PROBE_ELEMENTS),
        resident_gain_probe_program(),
    ]
    programs += [o.program for o in op_cases() + unit_cases()]
    programs += extra_programs()
    return programs + grid_segments(programs)


def grid_segments(programs: list[Program]) -> list[Program]:
    """The segments of those of ``programs`` with grid barriers (the split path's kernels)."""
    return [
        segment
        for program in programs
        if has_grid_barrier(program)
        for segment in split_at_grid_barriers(program)
    ]


@contextmanager
def fake_device(library: Path, programs: list[Program]) -> Iterator[FakeDevice]:
    """A new fake CUDA device running ``programs`` from the emulator ``library``,
    reachable as ``import cupy`` while the block runs."""
    from tests.cupy.fake_cupy import FakeDevice

    device = FakeDevice(library, programs)
    with pytest.MonkeyPatch.context() as patch:
        for name, module in device.modules().items():
            patch.setitem(sys.modules, name, module)
        yield device


@contextmanager
def installed(toolchain: Toolchain) -> Iterator[FakeDevice]:
    """A new fake CUDA device with the session's kernels (`fake_device_programs`)."""
    with fake_device(toolchain.device_build.wait().binary, toolchain.device_programs) as device:
        yield device


@pytest.fixture(scope="module")
def fake(toolchain: Toolchain) -> Iterator[FakeDevice]:
    """The fake CUDA device of one test module."""
    with installed(toolchain) as device:
        yield device
