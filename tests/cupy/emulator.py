"""Run generated CUDA kernels on the CPU, and compile them with ``nvcc``: no GPU needed.

The emulation harness (``emulation/cuda_emu.h``) defines the CUDA built-ins
for host compilation: one OS thread per lane of a workgroup (so
``__syncthreads()`` is a real barrier), workgroups one after another, atomics
as compiler builtins, intrinsics by their documented semantics. A kernel with
grid-wide barriers (``KernelSource.grid_sync``) runs as a cooperative launch:
one thread per lane of the whole grid, workgroups taking turns phase by phase
(``emulation/cooperative_groups.h`` stands in for CUDA's header). Many kernels
are built into ONE binary with ONE ``g++`` invocation, and a batch of launches
runs in ONE process, so the whole conformance corpus costs one compile and one
run. Built binaries are cached under the temp dir, keyed by a hash of
everything that goes into them (the compiler flags included).

Both builds run under UndefinedBehaviorSanitizer (``-fsanitize=undefined`` plus
``float-cast-overflow``): a shift by 32 or more, signed overflow, an
out-of-range float-to-int conversion, an out-of-bounds array index... in a
generated kernel or the prelude is a test failure naming the UBSan message, the
prelude helper or kernel at that line, and the launch, even where x86 would
have produced the IR's answer by accident (it masks shift counts in hardware; a
GPU does not). The batch runner stops at the first report
(``-fno-sanitize-recover=all``) and `Emulator.run` turns it into an
``AssertionError`` (see `describe_ub`). The shared library of the fake device
is loaded into the test process, where an abort would kill pytest, so it is
built to report and go on (``-fsanitize-recover=all``) into a log file that
the fake device reads after every launch (``fake_cupy.py``).

``nvcc_command`` compiles the same kernels for ``sm_90`` with the options the
backend gives NVRTC; codegen that does not compile fails the suite.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vyre_async._plan import BindingPlan, normalize_inputs, plan_dispatch
from vyre_async.ir import Access, Program
from vyre_cupy.codegen import KernelSource, generate

__all__ = [
    "EMULATION_DIR",
    "Emulator",
    "Request",
    "Result",
    "build_emulator",
    "describe_ub",
    "gxx_command",
    "gxx_flags",
    "nvcc_command",
    "program_of",
    "request_for",
    "translation_unit",
]

EMULATION_DIR = Path(__file__).parent / "emulation"
GXX = shutil.which("g++") or "g++"
NVCC = shutil.which("nvcc")
#: Undefined behaviour is an error: UBSan (GCC's ``undefined`` group leaves out
#: ``float-cast-overflow``, so it is named too); ``VY_EMU_UBSAN`` tells the harness.
UBSAN_FLAGS = ("-fsanitize=undefined,float-cast-overflow", "-DVY_EMU_UBSAN=1")
GXX_FLAGS = ("-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", *UBSAN_FLAGS)
#: The batch runner stops at the first report (its exit status and stderr carry it) ...
HARNESS_FLAGS = ("-fno-sanitize-recover=all",)
#: ... the shared library, loaded into pytest, reports and goes on (a log the fake device reads).
LIBRARY_FLAGS = ("-shared", "-fPIC", "-fsanitize-recover=all")
#: UBSAN_OPTIONS of the batch runner: reports on stderr, however the test process is set up.
HARNESS_UBSAN_OPTIONS = "log_path=stderr:halt_on_error=1:print_stacktrace=0"
#: The options `vyre_cupy.compile` gives NVRTC (nvcc spells them the same way).
NVCC_FLAGS = (
    "--std=c++17",
    "--fmad=false",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-arch=sm_90",
)
#: How generated kernels with grid-wide barriers include cooperative groups: ``-I``
#: finds the emulator's stand-in (``emulation/cooperative_groups.h``) first.
COOPERATIVE_INCLUDE = "#include <cooperative_groups.h>"
_MAGIC = 0x554D4556
_CACHE = Path(tempfile.gettempdir()) / "vyre-cupy-emulator"


def kernels_for(programs: Sequence[Program]) -> list[KernelSource]:
    """Return the kernels of ``programs`` with distinct entry names ``k0, k1, ...``."""
    return [generate(p, entry=f"k{i}") for i, p in enumerate(programs)]


def translation_unit(kernels: Sequence[KernelSource], *, trailer: str = "harness.inc") -> str:
    """Return one C++ translation unit holding every kernel plus ``trailer``.

    ``harness.inc`` adds the batch-runner ``main``; ``library.inc`` the C entry
    point ``vy_emu_launch`` of the shared-library build (the fake device).
    """
    parts = ['#include "cuda_emu.h"']
    parts += [k.source for k in kernels]
    for i, k in enumerate(kernels):
        casts = [
            f"({'const ' if p.decl.access in (Access.READ, Access.UNIFORM) else ''}"
            f"{_ctype(p.decl.dtype.value)}*)a[{p.index}]"
            for p in k.params
        ]
        casts.append(f"(const unsigned*)a[{len(k.params)}]")
        parts.append(f"static void vy_call_{i}(void** a) {{ {k.entry}({', '.join(casts)}); }}")
        if k.batch_entry is not None:  # scalars travel in the pointer slots after vy_lens
            n = len(k.params)
            scalars = [
                f"(unsigned)(uintptr_t)a[{n + 1}]",
                f"(unsigned long long)(uintptr_t)a[{n + 2}]",
                *(f"(unsigned)(uintptr_t)a[{n + 3 + axis}]" for axis in range(3)),
            ]
            parts.append(
                f"static void vy_batch_{i}(void** a) "
                f"{{ {k.batch_entry}({', '.join(casts + scalars)}); }}"
            )
    table = ", ".join(f"vy_call_{i}" for i in range(len(kernels))) or "nullptr"
    batch = ", ".join(
        f"vy_batch_{i}" if k.batch_entry is not None else "nullptr" for i, k in enumerate(kernels)
    )
    parts.append(f"static const vy_emu::Kernel vy_kernels[] = {{{table}}};")
    parts.append(f"static const vy_emu::Kernel vy_batch_kernels[] = {{{batch or 'nullptr'}}};")
    parts.append(f"static const unsigned vy_kernel_count = {len(kernels)}u;")
    parts.append(f'#include "{trailer}"')
    return "\n".join(parts) + "\n"


def _ctype(dtype: str) -> str:
    return {"u32": "unsigned", "i32": "int", "f32": "float", "bool": "unsigned"}[dtype]


def gxx_flags(*, library: bool = False) -> tuple[str, ...]:
    """Return every ``g++`` option of the batch-runner (or shared-library) build."""
    return (*GXX_FLAGS, *(LIBRARY_FLAGS if library else HARNESS_FLAGS))


def gxx_command(source: Path, binary: Path, *, library: bool = False) -> list[str]:
    """Return the ``g++`` command building the harness (or the library) from ``source``."""
    flags = gxx_flags(library=library)
    return [GXX, *flags, "-I", str(EMULATION_DIR), str(source), "-o", str(binary)]


def nvcc_command(source: Path, output: Path) -> list[str]:
    """Return the ``nvcc`` command compiling ``source`` (CUDA C) to an sm_90 cubin."""
    assert NVCC is not None, "nvcc is not on PATH"
    return [NVCC, *NVCC_FLAGS, "-cubin", str(source), "-o", str(output)]


def _toolchain_id() -> str:
    version = subprocess.run([GXX, "--version"], capture_output=True, text=True, check=False)
    return version.stdout.splitlines()[0] if version.stdout else GXX


_UB_RE = re.compile(  # UBSan: "FILE:LINE[:COLUMN]: runtime error: MESSAGE" (location optional)
    r"^(?:(?P<file>[^\s:][^:\n]*):(?P<line>\d+)(?::(?P<col>\d+))?: |.*?)"
    r"runtime error: (?P<msg>.*)$",
    re.MULTILINE,
)
_LAUNCH_RE = re.compile(r"cuda_emu harness: undefined behaviour in launch (\d+) \(kernel \d+\)")
_HEADER_RE = re.compile(r"/\* vyre_cupy codegen \S+; program (\S+); workgroup")
#: Lines that open a function of a translation unit (the prelude's helpers, kernels, wrappers).
_FUNCTION_RES = (
    (re.compile(r"^VY_FN [\w ]+?\b(vy_\w+)\("), "prelude helper {}"),
    (re.compile(r'^extern "C" __global__ void (\w+)\('), "kernel {}"),
    (re.compile(r"^static void (vy_(?:call|batch)_\d+)\("), "launch wrapper {}"),
)


def program_of(kernel: KernelSource) -> str:
    """Return the (sanitized) ``op_id`` that ``kernel``'s header comment names."""
    found = _HEADER_RE.search(kernel.source)
    return found[1] if found else "?"


def _function_at(lines: list[str], line: int) -> str:
    """Name the function of a generated unit that holds 1-based ``line`` (and its program)."""
    for at in range(min(line, len(lines)) - 1, -1, -1):
        for pattern, label in _FUNCTION_RES:
            found = pattern.match(lines[at])
            if found is None:
                continue
            where = label.format(found[1])
            if label.startswith("kernel"):
                for back in range(at, -1, -1):  # the codegen header above the kernel
                    header = _HEADER_RE.search(lines[back])
                    if header is not None:
                        return f"{where} (program {header[1]})"
            return where
    return "?"


def describe_ub(report: str, unit: Path | None) -> list[str]:
    """Return one line per UBSan report in ``report`` (a log or the harness's stderr).

    Each line has UBSan's message, then where: for a line of ``unit`` (the
    generated translation unit) the prelude helper or the kernel (with its
    program's ``op_id``) holding it, then ``file:line:column``.
    """
    text = unit.read_text().splitlines() if unit is not None and unit.exists() else []
    described = []
    for found in _UB_RE.finditer(report):
        if found["file"] is None:
            described.append(f"UBSan: {found['msg']} -- at an unknown place")
            continue
        name, line = Path(found["file"]).name, int(found["line"])
        where = f"{name}:{line}" + (f":{found['col']}" if found["col"] else "")
        if unit is not None and name == unit.name:
            where = f"{_function_at(text, line)} at {where}"
        described.append(f"UBSan: {found['msg']} -- in {where}")
    return described


_BUILD_NUMBERS = itertools.count()


#: How long a build no test waited for may still run when its session ends (see
#: `BuildJob.stop`; the corpus's takes about 20 s of CPU on two cores). None by default:
#: a run of a few tests, and each planted bug of scripts/mutants.py, would wait for
#: builds it does not use; scripts/mutation.py sets it for mutmut, whose every mutant
#: otherwise paid the same unfinished builds again.
BUILD_GRACE_S = float(os.environ.get("VYRE_BUILD_GRACE_S", "0"))


@dataclass
class BuildJob:
    """A ``g++`` build of the harness, possibly still running (see `build_emulator`)."""

    binary: Path
    source: Path
    process: subprocess.Popen[bytes] | None
    kernels: tuple[KernelSource, ...]

    #: Where ``g++`` writes before the build is moved into place: one name per build,
    #: so two builds of one key (two processes, or two fixtures) never collide.
    partial: Path = field(init=False)

    def __post_init__(self) -> None:
        self.partial = self.binary.with_name(
            f"{self.binary.name}.{os.getpid()}.{next(_BUILD_NUMBERS)}.tmp"
        )

    def wait(self) -> Emulator:
        """Wait for the compiler and return the emulator.

        Raises:
            AssertionError: ``g++`` rejected the generated code (its log is in the message).
        """
        if self.process is not None:
            _, err = self.process.communicate(timeout=600)
            if self.process.returncode != 0:
                raise AssertionError(
                    f"g++ failed on {self.source}:\n{err.decode(errors='replace')[-6000:]}"
                )
            os.replace(self.partial, self.binary)
            self.process = None
        return Emulator(self.binary, self.kernels)

    def stop(self, grace: float = BUILD_GRACE_S) -> None:
        """Reap the compiler; a build that finished is cached.

        The compiler gets ``grace`` seconds to finish before it is killed (see
        `BUILD_GRACE_S`): a session that waits for no build of its own (each mutant
        of a mutation run) would otherwise start, kill and pay every build again
        the next time, and never find one cached.
        """
        if self.process is None:
            return
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process.communicate()
        if self.process.returncode == 0 and self.partial.exists():
            os.replace(self.partial, self.binary)
        self.partial.unlink(missing_ok=True)
        self.process = None

    def discard(self) -> None:
        """Delete the build's folder (for one-off kernel sets); stops the compiler first."""
        self.stop(grace=0)  # (thrown away: no need to let it finish)
        shutil.rmtree(self.binary.parent, ignore_errors=True)


def build_emulator(programs: Sequence[Program], *, library: bool = False) -> BuildJob:
    """Start building one emulator binary holding the kernels of ``programs``.

    Returns at once; ``.wait()`` gives the `Emulator`. A binary built before from
    the same sources, header and compiler is reused from the temp-dir cache.

    Args:
        programs: The programs; kernel ``i`` is ``programs[i]``.
        library: Build a shared library exporting ``vy_emu_launch`` (see
            ``emulation/library.inc``) instead of the batch-runner executable.
    """
    kernels = tuple(kernels_for(programs))
    trailer = "library.inc" if library else "harness.inc"
    unit = translation_unit(kernels, trailer=trailer)
    digest = hashlib.sha256()
    headers = ["cuda_emu.h", trailer]
    if COOPERATIVE_INCLUDE in unit:  # (only then: other builds keep their cache keys)
        headers.append("cooperative_groups.h")
    for part in (
        unit,
        *((EMULATION_DIR / name).read_text() for name in headers),
        " ".join(gxx_flags(library=library)),  # GXX_FLAGS and the build's own
        _toolchain_id(),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    folder = _CACHE / digest.hexdigest()[:32]
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / ("libemu.so" if library else "emu")
    source = folder / "unit.cpp"
    if binary.exists():
        return BuildJob(binary, source, None, kernels)
    job = BuildJob(binary, source, None, kernels)
    staged = job.partial.with_suffix(".cpp")  # replaced whole: a reader never sees it cut
    staged.write_text(unit)
    os.replace(staged, source)
    command = gxx_command(source, job.partial, library=library)
    job.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return job


@dataclass(frozen=True)
class Request:
    """One launch for the emulator: which kernel, its plan, its inputs."""

    kernel: int
    plan: BindingPlan
    inputs: tuple[np.ndarray[Any, Any], ...]
    iterations: int = 1
    trace: bool = False


@dataclass(frozen=True)
class Result:
    """What one launch produced: the outputs (as a backend returns them) and the race flag."""

    outputs: list[np.ndarray[Any, Any]]
    racy: bool


def request_for(
    kernel: int,
    program: Program,
    inputs: Sequence[Any],
    *,
    grid: tuple[int, int, int] | None = None,
    workgroup: tuple[int, int, int] | None = None,
    iterations: int = 1,
    trace: bool = False,
) -> Request:
    """Return the `Request` launching ``program`` (kernel index ``kernel``) like the backend.

    The launch is planned with the driver's own `plan_dispatch`, exactly as a
    backend receives it.

    Raises:
        InvalidProgram: the inputs do not fit, or the grid cannot be inferred.
    """
    arrays = normalize_inputs(program, inputs)
    plan = plan_dispatch(
        program, [a.size for a in arrays], grid_override=grid, workgroup_override=workgroup
    )
    return Request(kernel, plan, tuple(arrays), iterations, trace)


class Emulator:
    """A built harness binary; `run` executes a batch of launches in one process."""

    def __init__(self, binary: Path, kernels: tuple[KernelSource, ...]) -> None:
        self.binary = binary
        self.kernels = kernels

    def run(self, requests: Sequence[Request], *, timeout: float = 300.0) -> list[Result]:
        """Run every request (in order, one process) and return their results.

        Raises:
            AssertionError: UBSan found undefined behaviour (the message names it, the
                helper or kernel, and the launch), or the harness crashed or timed out.
        """
        job = bytearray(struct.pack("<2I", _MAGIC, len(requests)))
        for request in requests:
            job += self._encode(request)
        with tempfile.TemporaryDirectory(prefix="vyre-emu-") as tmp:
            jobs, results = Path(tmp) / "jobs.bin", Path(tmp) / "results.bin"
            jobs.write_bytes(job)
            done = subprocess.run(
                [str(self.binary), str(jobs), str(results)],
                capture_output=True,
                timeout=timeout,
                check=False,
                env={**os.environ, "UBSAN_OPTIONS": HARNESS_UBSAN_OPTIONS},
            )
            stderr = done.stderr.decode(errors="replace")
            found = describe_ub(stderr, self.binary.parent / "unit.cpp")
            if found:
                raise AssertionError(self._ub_failure(requests, found, stderr))
            if done.returncode != 0:
                raise AssertionError(f"emulator exited with {done.returncode}: {stderr[-4000:]}")
            data = np.frombuffer(results.read_bytes(), dtype="<u4")
        return self._decode(requests, data)

    def _ub_failure(self, requests: Sequence[Request], found: list[str], stderr: str) -> str:
        lines = ["undefined behaviour (UBSan) in the emulated kernels:", *found]
        launch = _LAUNCH_RE.search(stderr)
        if launch is not None and int(launch[1]) < len(requests):
            index = requests[int(launch[1])].kernel
            lines.append(
                f"while running launch {launch[1]} of {len(requests)}: kernel k{index} "
                f"(program {program_of(self.kernels[index])})"
            )
        lines.append(f"emulator stderr (last 2000 chars):\n{stderr[-2000:]}")
        return "\n".join(lines)

    def _encode(self, request: Request) -> bytes:
        kernel = self.kernels[request.kernel]
        plan = request.plan
        given = dict(zip((d.name for d in plan.inputs), request.inputs, strict=True))
        counts = dict(zip((d.name for d in plan.program.buffers), plan.counts, strict=True))
        geometry = plan.geometry
        words = [
            request.kernel,
            *geometry.grid,
            *geometry.workgroup,
            request.iterations,
            int(request.trace) | (2 if kernel.grid_sync else 0),  # bit 1: cooperative launch
            len(kernel.params),
        ]
        out = bytearray(struct.pack(f"<{len(words)}I", *words))
        for param in kernel.params:
            count = counts[param.name]
            data = given.get(param.name)
            if data is None:  # WRITE buffers start zero-filled
                data = np.zeros(count, np.uint32)
            raw = np.ascontiguousarray(data).view("<u4").reshape(-1)
            assert raw.size == count, (param.name, raw.size, count)
            out += struct.pack("<I", count) + raw.tobytes()
        return bytes(out)

    def _decode(self, requests: Sequence[Request], data: np.ndarray[Any, Any]) -> list[Result]:
        results = []
        at = 0
        for request in requests:
            kernel = self.kernels[request.kernel]
            status, params = int(data[at]), int(data[at + 1])
            at += 2
            assert params == len(kernel.params)
            final: dict[str, np.ndarray[Any, Any]] = {}
            for param in kernel.params:
                count = int(data[at])
                words = data[at + 1 : at + 1 + count]
                at += 1 + count
                final[param.name] = words.copy().view(param.decl.dtype.numpy)
            outputs = [final[d.name] for d in request.plan.outputs]
            results.append(Result(outputs, bool(status & 1)))
        assert at == data.size, "trailing data in the emulator's results"
        return results
