"""Issue 26, defect 2: outputs larger than the host are refused before anything is allocated.

Thirteen 4 GiB output buffers on a 23 GiB host used to be accepted (lazily zeroed
pages) and the first code to touch them had the process killed for memory. The
total of a dispatch's outputs, and of a batch's, is now checked against the
config's ``max_output_bytes`` or, when it sets none, the host's limit (half its
memory, or ``VYRE_MAX_OUTPUT_BYTES``).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from vyre_async import (
    DeviceOutOfMemory,
    DispatchConfig,
    InvalidProgram,
    acquire_backend,
    compile,
)
from vyre_async._config import default_max_output_bytes
from vyre_async.ir import Access, BufferDecl, DType, Program, Store, gid, u32
from vyre_async.programs import elementwise_xor

GIB = 1 << 30


def _outputs(buffers: int, elements: int) -> Program:
    return Program(
        [BufferDecl(f"o{i}", i, Access.WRITE, DType.U32, elements) for i in range(buffers)],
        64,
        [Store("o0", gid(), u32(1))],
        op_id="test.wide_outputs",
    )


def test_thirteen_4_gib_outputs_are_refused_at_once_without_allocating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reported host's limit (half of 23 GiB), whatever this host's memory or
    # environment: on a host of 104 GiB or more the default would take all 13.
    monkeypatch.setenv("VYRE_MAX_OUTPUT_BYTES", str(23 * GIB // 2))
    program = _outputs(13, GIB - 1)  # 13 x 4 GiB, each under the largest buffer
    assert default_max_output_bytes() < 13 * 4 * (GIB - 1)
    backend = acquire_backend("reference")
    started = time.monotonic()
    with pytest.raises(DeviceOutOfMemory, match="VYRE_MAX_OUTPUT_BYTES") as info:
        backend.dispatch(program, [], DispatchConfig(grid_override=(1, 1, 1)))
    assert time.monotonic() - started < 5  # refused, not allocated
    assert "Fix:" in str(info.value) and isinstance(info.value, MemoryError)


def test_the_default_is_half_the_machine_or_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VYRE_MAX_OUTPUT_BYTES", raising=False)
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert default_max_output_bytes() == physical // 2
    monkeypatch.setenv("VYRE_MAX_OUTPUT_BYTES", "4096")
    assert default_max_output_bytes() == 4096
    for bad in ("abc", "-1", "1e6"):
        monkeypatch.setenv("VYRE_MAX_OUTPUT_BYTES", bad)
        with pytest.raises(InvalidProgram, match="VYRE_MAX_OUTPUT_BYTES"):
            default_max_output_bytes()


def test_the_host_limit_applies_to_a_dispatch_and_a_config_raises_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VYRE_MAX_OUTPUT_BYTES", str(4 * 1000))
    backend = acquire_backend("reference")
    a = np.arange(1024, dtype=np.uint32)
    with pytest.raises(DeviceOutOfMemory, match="4096 bytes, over this host's limit of 4000"):
        backend.dispatch(elementwise_xor(1024), [a, a])
    # an explicit limit wins (and is the user's: over it is InvalidProgram)
    config = DispatchConfig(max_output_bytes=1 << 20)
    assert backend.dispatch_sync(elementwise_xor(1024), [a, a], config)[0].tolist() == [0] * 1024
    with pytest.raises(InvalidProgram, match="max_output_bytes=100"):
        backend.dispatch(elementwise_xor(1024), [a, a], DispatchConfig(max_output_bytes=100))


def test_a_batch_is_refused_on_its_outputs_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VYRE_MAX_OUTPUT_BYTES", str(3 * 4096))
    backend = acquire_backend("reference")
    a = np.arange(1024, dtype=np.uint32)
    pipeline = compile(backend, elementwise_xor(1024))
    three = pipeline.dispatch_batch([[a, a]] * 3)  # 3 x 4 KiB: at the limit
    assert all(p.result()[0].tolist() == [0] * 1024 for p in three)
    with pytest.raises(DeviceOutOfMemory, match="batch of 4 dispatches"):
        pipeline.dispatch_batch([[a, a]] * 4)  # each fits, the four together do not
