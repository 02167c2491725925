"""An NVRTC stand-in backed by the real ``nvcc``: same call shape as CuPy's NVRTC bindings.

``createProgram`` / ``compileProgram`` / ``getProgramLog`` / ``getCUBIN`` /
``getPTX`` / ``destroyProgram`` / ``getVersion`` / ``getSupportedArchs``, with
compile errors raised as ``NVRTCError`` (status 6, "compilation") and the
compiler's log kept for ``getProgramLog``. It lets the backend's compile path
run its real options through a real CUDA compiler on a machine without a GPU
or libnvrtc.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NVCC", "NVRTCError", "NvccNvrtc"]

NVCC = shutil.which("nvcc")


class NVRTCError(RuntimeError):
    """Same name and ``status`` attribute as CuPy's ``nvrtc.NVRTCError``."""

    def __init__(self, status: int) -> None:
        super().__init__(f"NVRTC_ERROR_COMPILATION ({status})")
        self.status = status


@dataclass
class _Program:
    source: str
    name: str
    log: str = ""
    cubin: bytes = b""
    ptx: bytes = b""
    destroyed: bool = False


@dataclass
class NvccNvrtc:
    """A fake ``cupy_backends.cuda.libs.nvrtc`` module that compiles with ``nvcc``."""

    programs: list[_Program] = field(default_factory=list)
    options_seen: list[tuple[str, ...]] = field(default_factory=list)
    NVRTCError: type[NVRTCError] = NVRTCError

    def createProgram(self, src: str, name: str, headers: object, names: object) -> int:
        self.programs.append(_Program(src, name))
        return len(self.programs) - 1

    def destroyProgram(self, prog: int) -> None:
        self.programs[prog].destroyed = True

    def compileProgram(self, prog: int, options: tuple[str, ...]) -> None:
        assert NVCC is not None
        program = self.programs[prog]
        self.options_seen.append(tuple(options))
        arch = next(o.split("=", 1)[1] for o in options if o.startswith("-arch="))
        kind = "-cubin" if arch.startswith("sm_") else "-ptx"
        rest = [o for o in options if not o.startswith("-arch=")]
        with tempfile.TemporaryDirectory(prefix="vyre-nvrtc-") as tmp:
            source = Path(tmp) / program.name
            source.write_text(program.source)
            output = Path(tmp) / "out.bin"
            arch_flag = f"-arch={arch}"
            done = subprocess.run(
                [NVCC, *rest, arch_flag, kind, program.name, "-o", str(output)],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
            program.log = done.stdout + done.stderr
            if done.returncode != 0:
                raise NVRTCError(6)
            data = output.read_bytes()
        if kind == "-cubin":
            program.cubin = data
        else:
            program.ptx = data

    def getProgramLog(self, prog: int) -> str:
        return self.programs[prog].log

    def getCUBIN(self, prog: int) -> bytes:
        return self.programs[prog].cubin

    def getPTX(self, prog: int) -> bytes:
        return self.programs[prog].ptx

    def getVersion(self) -> tuple[int, int]:
        return (13, 0)

    def getSupportedArchs(self) -> tuple[int, ...]:
        return (75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121)
