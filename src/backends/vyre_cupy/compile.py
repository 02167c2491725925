"""NVRTC compilation of generated kernels, their on-disk form, and loading them on the device.

NVRTC is called through CuPy's thin bindings (``createProgram``,
``compileProgram``, ``getCUBIN``/``getPTX``), **not** through
``cupy.RawModule(code=...)``: CuPy's compile cache appends ``-ftz=true`` after
the caller's options (NVRTC honours the last occurrence), which would flush
subnormals and break the IR's "subnormals preserved" rule. Compiling directly
keeps the options exactly `NVRTC_OPTIONS` and gives the cubin bytes, which the
driver's `DiskPipelineCache` stores so a new process loads them with
``cuModuleLoadData`` (CuPy's ``Module.load``) and skips NVRTC.

Target: a cubin for the device's own ``sm_XY`` when NVRTC supports it;
otherwise PTX for the newest architecture NVRTC knows below it (the driver
JIT-compiles it once at load time).

A program with grid barriers compiles into several kernels (one per segment,
and the cooperative kernel that includes ``<cooperative_groups.h>``, for which
NVRTC is also given ``-I`` the CUDA headers: `cooperative_options`); the disk
cache stores them as one record (`encode_grid`).
"""

from __future__ import annotations

import importlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import KernelCompileFailed, UnsupportedFeature
from vyre_cupy.codegen import KernelSource

__all__ = [
    "NVRTC_OPTIONS",
    "CompiledKernel",
    "choose_target",
    "compile_failed",
    "compile_kernel",
    "cooperative_options",
    "decode_grid",
    "decode_kernel",
    "encode_grid",
    "encode_kernel",
    "load_function",
]
__dir__ = _public_dir(__name__)

#: NVRTC options: IEEE-exact f32 (no FMA contraction, subnormals kept, correctly
#: rounded division and square root), C++17. The architecture is added per device.
NVRTC_OPTIONS: tuple[str, ...] = (
    "--std=c++17",
    "--fmad=false",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
)
#: Name NVRTC uses for the generated translation unit (it appears in its log).
SOURCE_NAME = "vyre_kernel.cu"

_MAGIC = b"VYCU"
_FORMAT = 1
_GRID_MAGIC = b"VYCG"
_GRID_FORMAT = 1
_LOG_LINE = re.compile(re.escape(SOURCE_NAME) + r"\((\d+)\): (error|warning|catastrophic error)")


@dataclass(frozen=True, slots=True, kw_only=True)
class CompiledKernel:
    """The compiled form of one generated kernel (what the disk cache stores).

    Attributes:
        entry: The ``extern "C"`` kernel name.
        target: ``sm_XY`` (a cubin) or ``compute_XY`` (PTX).
        image: The cubin or PTX bytes ``cuModuleLoadData`` accepts.
        params: Number of buffer parameters (``vy_lens`` follows them).
        log: NVRTC's log (warnings), empty when clean.
    """

    entry: str
    target: str
    image: bytes
    params: int
    log: str = ""

    @property
    def is_ptx(self) -> bool:
        """True when ``image`` is PTX text (JIT-compiled by the driver at load time)."""
        return self.target.startswith("compute_")


def choose_target(compute_capability: int, supported: Sequence[int]) -> str:
    """Return the NVRTC ``-arch`` value for a device.

    Args:
        compute_capability: The device's ``major * 10 + minor``.
        supported: Architectures NVRTC supports (empty when it cannot list them).

    Returns:
        ``sm_XY`` when NVRTC can build a cubin for the device itself, else
        ``compute_XY`` for the newest older architecture it knows (PTX).

    Raises:
        UnsupportedFeature: NVRTC knows no architecture at or below the device's.
    """
    if not supported or compute_capability in supported:
        return f"sm_{compute_capability}"
    older = [arch for arch in supported if arch <= compute_capability]
    if not older:
        raise UnsupportedFeature(
            f"NVRTC supports architectures {sorted(supported)}, none at or below the "
            f"device's sm_{compute_capability}",
            fix="install the CuPy wheel and CUDA toolkit that support this GPU",
            feature="cuda",
        )
    return f"compute_{max(older)}"


def cooperative_options(include_dir: str | None) -> tuple[str, ...]:
    """The options a cooperative kernel adds to `NVRTC_OPTIONS`: ``-I`` the CUDA headers.

    ``<cooperative_groups.h>`` is a header of the CUDA toolkit, not built into
    NVRTC; ``include_dir`` is where it was found (`vyre_cupy.device.cuda_include_dir`),
    None to leave the search to NVRTC. Grid synchronisation needs no relocatable
    device code since CUDA 11.
    """
    return (f"-I{include_dir}",) if include_dir else ()


def compile_kernel(
    kernel: KernelSource, *, nvrtc: Any, target: str, options: Sequence[str] = ()
) -> CompiledKernel:
    """Compile ``kernel`` with NVRTC for ``target`` (see `choose_target`).

    Args:
        kernel: The generated source.
        nvrtc: CuPy's NVRTC bindings (`vyre_cupy.device.nvrtc_module`).
        target: ``sm_XY`` or ``compute_XY``.
        options: More options after `NVRTC_OPTIONS` and ``-arch`` (`cooperative_options`).

    Raises:
        KernelCompileFailed: NVRTC rejected the source; the message quotes its
            log, the generated line and the IR statement it came from.
    """
    options = (*NVRTC_OPTIONS, f"-arch={target}", *options)
    program = nvrtc.createProgram(kernel.source, SOURCE_NAME, (), ())
    try:
        try:
            nvrtc.compileProgram(program, options)
        except Exception as exc:
            try:
                log = str(nvrtc.getProgramLog(program))
            except Exception:
                log = ""
            raise compile_failed(kernel, log or str(exc), options) from exc
        log = str(nvrtc.getProgramLog(program)).strip()
        if target.startswith("sm_"):
            image = bytes(nvrtc.getCUBIN(program))
        else:
            image = bytes(nvrtc.getPTX(program)) + b"\0"
    finally:
        nvrtc.destroyProgram(program)
    return CompiledKernel(
        entry=kernel.entry, target=target, image=image, params=len(kernel.params), log=log
    )


def compile_failed(kernel: KernelSource, log: str, options: Sequence[str]) -> KernelCompileFailed:
    """Return the `KernelCompileFailed` for an NVRTC ``log`` about ``kernel``'s source."""
    lines = kernel.source.splitlines()
    where = ""
    match = _LOG_LINE.search(log)
    if match:
        number = int(match.group(1))
        text = lines[number - 1].strip() if 1 <= number <= len(lines) else ""
        path = kernel.path_of_line(number)
        where = f"\nat {SOURCE_NAME} line {number}: {text}"
        if path:
            where += f"\n(generated from IR statement {path})"
    excerpt = "\n".join(log.strip().splitlines()[:20])
    return KernelCompileFailed(
        f"NVRTC rejected the generated CUDA kernel {kernel.entry!r} "
        f"(options: {' '.join(options)}):\n{excerpt}{where}",
        fix="this is a vyre_cupy code-generation bug for a valid program: report it with "
        "program.to_wire(); meanwhile dispatch it on the 'reference' backend",
        log=log,
        line=int(match.group(1)) if match else None,
    )


def encode_kernel(kernel: CompiledKernel) -> bytes:
    """Return the disk-cache payload of ``kernel`` (a small versioned binary record, no pickle)."""
    fields = [kernel.entry.encode(), kernel.target.encode(), kernel.log.encode(), kernel.image]
    out = bytearray(_MAGIC + struct.pack("<HI", _FORMAT, kernel.params))
    for item in fields:
        out += struct.pack("<I", len(item)) + item
    return bytes(out)


def decode_kernel(payload: bytes) -> CompiledKernel:
    """Rebuild a `CompiledKernel` from `encode_kernel` bytes.

    Raises:
        ValueError: the payload is not a kernel record of this format version.
    """
    view = memoryview(payload)
    if len(view) < 10 or bytes(view[:4]) != _MAGIC:
        raise ValueError("not a vyre_cupy kernel record")
    version, params = struct.unpack_from("<HI", view, 4)
    if version != _FORMAT:
        raise ValueError(f"kernel record format {version}, expected {_FORMAT}")
    at = 10
    fields: list[bytes] = []
    for _ in range(4):
        if at + 4 > len(view):
            raise ValueError("truncated kernel record")
        (size,) = struct.unpack_from("<I", view, at)
        at += 4
        if at + size > len(view):
            raise ValueError("truncated kernel record")
        fields.append(bytes(view[at : at + size]))
        at += size
    if at != len(view):
        raise ValueError("trailing bytes after the kernel record")
    entry, target, log, image = fields
    return CompiledKernel(
        entry=entry.decode(),
        target=target.decode(),
        image=image,
        params=int(params),
        log=log.decode(errors="replace"),
    )


def encode_grid(
    segments: Sequence[CompiledKernel], cooperative: CompiledKernel | None, reason: str, note: str
) -> bytes:
    """Return the disk-cache payload of a grid-barrier program's kernels (one record).

    Args:
        segments: One kernel per segment, in order.
        cooperative: The cooperative kernel, or None.
        reason: Why there is no cooperative kernel (a short code, ``""`` if there is one).
        note: The same for people.
    """
    parts = [
        reason.encode(),
        note.encode(),
        b"" if cooperative is None else encode_kernel(cooperative),
        *(encode_kernel(kernel) for kernel in segments),
    ]
    out = bytearray(_GRID_MAGIC + struct.pack("<HI", _GRID_FORMAT, len(segments)))
    for part in parts:
        out += struct.pack("<I", len(part)) + part
    return bytes(out)


def decode_grid(
    payload: bytes,
) -> tuple[tuple[CompiledKernel, ...], CompiledKernel | None, str, str]:
    """Rebuild ``(segments, cooperative, reason, note)`` from `encode_grid` bytes.

    Raises:
        ValueError: the payload is not a grid record of this format version.
    """
    view = memoryview(payload)
    if len(view) < 10 or bytes(view[:4]) != _GRID_MAGIC:
        raise ValueError("not a vyre_cupy grid-barrier kernel record")
    version, count = struct.unpack_from("<HI", view, 4)
    if version != _GRID_FORMAT:
        raise ValueError(f"grid kernel record format {version}, expected {_GRID_FORMAT}")
    if count < 1 or count > len(view):
        raise ValueError(f"a grid kernel record of {count} segments")
    at = 10
    fields: list[bytes] = []
    for _ in range(3 + count):
        if at + 4 > len(view):
            raise ValueError("truncated grid kernel record")
        (size,) = struct.unpack_from("<I", view, at)
        at += 4
        if at + size > len(view):
            raise ValueError("truncated grid kernel record")
        fields.append(bytes(view[at : at + size]))
        at += size
    if at != len(view):
        raise ValueError("trailing bytes after the grid kernel record")
    reason, note, cooperative, *segments = fields
    return (
        tuple(decode_kernel(segment) for segment in segments),
        decode_kernel(cooperative) if cooperative else None,
        reason.decode(errors="replace"),
        note.decode(errors="replace"),
    )


def load_function(kernel: CompiledKernel, *, batch_entry: str | None = None) -> tuple[Any, Any]:
    """Load ``kernel`` into the current CUDA context and return its launchable functions.

    Uses CuPy's ``cupy.cuda.function.Module().load(image)`` (``cuModuleLoadData``);
    the returned functions keep their module loaded.

    Returns:
        ``(main, batch)``: the kernel ``kernel.entry`` and, when ``batch_entry`` is
        given, the batch kernel of the same module (else None).
    """
    function = importlib.import_module("cupy.cuda.function")
    module = function.Module()
    module.load(kernel.image)
    main = module.get_function(kernel.entry)
    return main, (module.get_function(batch_entry) if batch_entry is not None else None)
