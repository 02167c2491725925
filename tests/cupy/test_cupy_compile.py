"""NVRTC options, targets, compile errors and the on-disk kernel record."""

from __future__ import annotations

import dataclasses

import pytest

from tests.cupy.nvrtc_shim import NVCC, NvccNvrtc
from vyre_async.errors import KernelCompileFailed, UnsupportedFeature
from vyre_async.programs import elementwise_xor, standard_workloads
from vyre_cupy.codegen import generate
from vyre_cupy.compile import (
    NVRTC_OPTIONS,
    CompiledKernel,
    choose_target,
    compile_failed,
    compile_kernel,
    decode_kernel,
    encode_kernel,
)

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def test_options_are_ieee_exact() -> None:
    assert "--fmad=false" in NVRTC_OPTIONS and "-ftz=false" in NVRTC_OPTIONS
    assert "-prec-div=true" in NVRTC_OPTIONS and "-prec-sqrt=true" in NVRTC_OPTIONS
    assert not any("fast" in option or "ftz=true" in option for option in NVRTC_OPTIONS)


@pytest.mark.parametrize(
    ("cc", "supported", "target"),
    [
        (90, (75, 80, 90), "sm_90"),
        (89, (75, 80, 86, 90), "compute_86"),  # NVRTC lacks sm_89: PTX for the newest below
        (120, (75, 80, 90), "compute_90"),  # a GPU newer than NVRTC: the driver JITs PTX
        (90, (), "sm_90"),  # old NVRTC that cannot list its archs
    ],
)
def test_choose_target(cc: int, supported: tuple[int, ...], target: str) -> None:
    assert choose_target(cc, supported) == target


def test_choose_target_refuses_a_gpu_older_than_nvrtc_knows() -> None:
    with pytest.raises(UnsupportedFeature) as info:
        choose_target(50, (75, 80, 90))
    assert "Fix:" in str(info.value)


def test_kernel_record_round_trip_and_rejects_junk() -> None:
    kernel = CompiledKernel(
        entry="vyre_main", target="sm_90", image=b"\x7fELF" + bytes(300), params=3, log="warning: x"
    )
    assert decode_kernel(encode_kernel(kernel)) == kernel
    payload = encode_kernel(kernel)
    for junk in (b"", b"XXXX" + payload[4:], payload[:-1], payload + b"\0", payload[:12]):
        with pytest.raises(ValueError):
            decode_kernel(junk)
    future = payload[:4] + b"\x09\x00" + payload[6:]
    with pytest.raises(ValueError, match="format"):
        decode_kernel(future)


@needs_nvcc
def test_compile_kernel_builds_a_cubin_with_the_exact_options() -> None:
    nvrtc = NvccNvrtc()
    source = generate(elementwise_xor(8))
    kernel = compile_kernel(source, nvrtc=nvrtc, target="sm_90")
    assert kernel.image[:4] == b"\x7fELF" and not kernel.is_ptx
    assert kernel.entry == "vyre_main" and kernel.params == 3
    assert nvrtc.options_seen == [(*NVRTC_OPTIONS, "-arch=sm_90")]
    assert all(p.destroyed for p in nvrtc.programs)
    ptx = compile_kernel(source, nvrtc=nvrtc, target="compute_90")
    assert ptx.is_ptx and b".entry vyre_main" in ptx.image and ptx.image.endswith(b"\0")


@needs_nvcc
def test_compile_errors_quote_the_log_the_line_and_the_ir_statement() -> None:
    nvrtc = NvccNvrtc()
    good = generate(next(w for w in standard_workloads() if w.name == "saxpy").program)
    lines = good.source.splitlines()
    broken_at = next(i for i, line in enumerate(lines) if "VY_STORE(&" in line)
    lines[broken_at] = lines[broken_at].replace("VY_STORE", "VY_STOR")
    broken = dataclasses.replace(good, source="\n".join(lines))
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(broken, nvrtc=nvrtc, target="sm_90")
    message = str(info.value)
    assert "VY_STOR" in message and f"line {broken_at + 1}" in message
    assert "generated from IR statement body[1].then[0]" in message
    assert message.rpartition("\n")[2].startswith("Fix: ")
    assert info.value.line == broken_at + 1
    assert all(p.destroyed for p in nvrtc.programs)


def test_compile_failed_without_a_line_number() -> None:
    error = compile_failed(generate(elementwise_xor(4)), "nvrtc: internal error", ["-x"])
    assert "internal error" in str(error) and error.line is None and "Fix:" in str(error)
