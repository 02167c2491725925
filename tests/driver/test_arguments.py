"""Bad arguments of any kind are `BackendError`s with a Fix, never raw builtin errors.

Each case raised a raw ``TypeError``, ``AttributeError``, ``ValueError`` or
``OverflowError`` on 0.1.0 (or ran work it should have refused).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import anyio
import numpy as np
import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import (
    BackendError,
    BackendRegistration,
    DispatchConfig,
    InvalidProgram,
    ShadowBackend,
    UnsupportedFeature,
)
from vyre_async._arguments import real_number, wait_seconds
from vyre_async._backend import VyreBackend
from vyre_async._cache.disk import DiskPipelineCache
from vyre_async._calibration import CalibrationStore
from vyre_async._capabilities import BackendCapabilities
from vyre_async._graph import ArmGraph
from vyre_async._store import MemoryPipelineCache
from vyre_async.ir import Access, Assign, BufferDecl, DType, Let, Load, Loop, Program, Var, u32
from vyre_async.programs import elementwise_xor, sum_reduction
from vyre_async.tracing import configure_tracing
from vyre_reference import reference_backend

U = np.uint32
XOR = elementwise_xor(64)
A = np.arange(64, dtype=U)


def _backend() -> VyreBackend:
    return reference_backend(prefetch=False)


BAD_CALLS: dict[str, Callable[[], object]] = {
    "dispatch(p, None)": lambda: _backend().dispatch(XOR, None),  # type: ignore[arg-type]
    "dispatch(p, generator)": lambda: _backend().dispatch(XOR, (x for x in [A, A])),  # type: ignore[arg-type]
    "dispatch(p, dict)": lambda: _backend().dispatch(XOR, {"a": A, "b": A}),  # type: ignore[arg-type]
    "dispatch(p, 'ab')": lambda: _backend().dispatch(XOR, "ab"),  # type: ignore[arg-type]
    "dispatch config dict": lambda: _backend().dispatch(XOR, [A, A], {"timeout": 1}),  # type: ignore[arg-type]
    "pipeline.dispatch config dict": lambda: (
        _backend()
        .compile(XOR)
        .dispatch(
            [A, A],
            {"timeout": 1},  # type: ignore[arg-type]
        )
    ),
    "compile config str": lambda: _backend().compile(XOR, "fast"),  # type: ignore[arg-type]
    "grid_override=2.0": lambda: DispatchConfig(grid_override=2.0),  # type: ignore[arg-type]
    "grid_override='8'": lambda: DispatchConfig(grid_override="8"),  # type: ignore[arg-type]
    "workgroup_override=(2**31,1,1)": lambda: DispatchConfig(workgroup_override=(2**31, 1, 1)),
    "alloc('f64', 4)": lambda: _backend().alloc("f64", 4),
    "alloc(None, 4)": lambda: _backend().alloc(None, 4),  # type: ignore[arg-type]
    "alloc('u32', 1.5)": lambda: _backend().alloc("u32", 1.5),  # type: ignore[arg-type]
    "alloc('u32', '4')": lambda: _backend().alloc("u32", "4"),  # type: ignore[arg-type]
    "upload([1, 2])": lambda: _backend().upload([1, 2]),  # type: ignore[arg-type]
    "upload(complex)": lambda: _backend().upload(np.zeros(2, complex)),
    "ShadowBackend(sample_rate='1')": lambda: ShadowBackend(
        _backend(),
        _backend(),
        sample_rate="1",  # type: ignore[arg-type]
    ),
    "ShadowBackend(sample_rate=2)": lambda: ShadowBackend(_backend(), _backend(), sample_rate=2),
    "ShadowBackend(primary=None)": lambda: ShadowBackend(None, _backend()),  # type: ignore[arg-type]
    "reference_backend(max_workers=0)": lambda: reference_backend(max_workers=0),
    "reference_backend(max_workers='2')": lambda: reference_backend(max_workers="2"),  # type: ignore[arg-type]
    "reference_backend(inline_ns=-1)": lambda: reference_backend(inline_ns=-1),
    "reference_backend(close_timeout=inf)": lambda: reference_backend(close_timeout=math.inf),
    "reference_backend(pipeline_cache_capacity=0)": lambda: reference_backend(
        pipeline_cache_capacity=0
    ),
    "reference_backend(disk_cache='/tmp')": lambda: reference_backend(disk_cache="/tmp"),  # type: ignore[arg-type]
    "result(timeout='1')": lambda: _backend().dispatch(XOR, [A, A]).result(timeout="1"),  # type: ignore[arg-type]
    "result(timeout=nan)": lambda: _backend().dispatch(XOR, [A, A]).result(timeout=math.nan),
    "graph resource 2**40": lambda: ArmGraph().resource("r", "u32", 2**40),
    "add_done_callback(None)": lambda: _backend().dispatch(XOR, [A, A]).add_done_callback(None),  # type: ignore[arg-type]
    "dispatch_batch(None)": lambda: _backend().compile(XOR).dispatch_batch(None),  # type: ignore[arg-type]
    "dispatch_batch(mode='fast')": lambda: (
        _backend()
        .compile(XOR)
        .dispatch_batch(
            [[A, A]],
            mode="fast",  # type: ignore[arg-type]
        )
    ),
    "MemoryPipelineCache(0)": lambda: MemoryPipelineCache(0),
    "reference_backend(close_timeout=10**400)": lambda: reference_backend(close_timeout=10**400),
    "download(5)": lambda: _backend().download(5),  # type: ignore[arg-type]
    "free('buffer')": lambda: _backend().free("buffer"),  # type: ignore[arg-type]
    "DiskPipelineCache(123)": lambda: DiskPipelineCache(123),  # type: ignore[arg-type]
    "CalibrationStore(123)": lambda: CalibrationStore(123),  # type: ignore[arg-type]
    "configure_tracing(None)": lambda: configure_tracing(None),  # type: ignore[arg-type]
    "configure_tracing(export_timeout_s=10**400)": lambda: configure_tracing(
        "none", export_timeout_s=10**400
    ),
    "grid_override=(2**31,)*3": lambda: _backend().dispatch(
        XOR, [A, A], DispatchConfig(grid_override=(2**31,) * 3)
    ),
    "grid_override=(2**40,1,1)": lambda: _backend().dispatch(
        XOR, [A, A], DispatchConfig(grid_override=(2**40, 1, 1))
    ),
    "reference lanes over MAX_LANES": lambda: _backend().dispatch(
        XOR, [A, A], DispatchConfig(grid_override=(2**26, 2**5, 1))
    ),
    "sum_reduction(workgroup=3)": lambda: sum_reduction(64, workgroup=3),
    "graph resource dtype f64": lambda: ArmGraph().resource("r", "f64", 4),
}


@pytest.mark.parametrize("call", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_bad_arguments_raise_backend_errors_with_a_fix(call: Callable[[], object]) -> None:
    with pytest.raises(BackendError) as info:
        call()
    assert "\nFix: " in str(info.value)
    assert isinstance(info.value, InvalidProgram | UnsupportedFeature)


def _slow_program() -> Program:
    return Program(
        [
            BufferDecl("n", 0, Access.UNIFORM, DType.U32, 1),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 1),
        ],
        1,
        [Let("a", u32(0)), Loop("i", u32(0), Load("n", u32(0)), [Assign("a", Var("a") + 1)])],
        op_id="test.slow",
    )


@pytest.mark.parametrize("timeout", [1e10, 1e300, math.inf, 10**400])
def test_huge_timeouts_wait_like_no_timeout(timeout: float) -> None:
    """DispatchConfig(timeout=1e10) or result(timeout=1e10) raised a raw OverflowError."""
    backend = reference_backend(inline_ns=0)
    n = [np.array([200_000], U)]  # long enough that both waits really block (0.1.0 overflowed)
    config = DispatchConfig(timeout=timeout)
    assert backend.dispatch(_slow_program(), n, config).result()[0].tolist() == [0]
    assert backend.dispatch(_slow_program(), n).result(timeout=timeout)[0].tolist() == [0]


@pytest.mark.anyio
async def test_huge_timeouts_can_be_awaited() -> None:
    backend = reference_backend(inline_ns=0)
    pending = backend.dispatch(
        _slow_program(), [np.array([20_000], U)], DispatchConfig(timeout=1e10)
    )
    with anyio.fail_after(30):
        assert (await pending)[0].tolist() == [0]


class Limited(BytesBackend):
    """A backend whose device takes at most 256 lanes per workgroup and 1 KiB buffers."""

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(
            max_workgroup_size=(256, 4, 1), max_workgroup_lanes=256, max_storage_buffer_bytes=1024
        )


def test_workgroup_override_is_checked_against_the_backend() -> None:
    """(2**31, 1, 1) ran for 4.4 s on the reference backend in 0.1.0."""
    backend = backend_of(Limited)
    ok = backend.dispatch(XOR, [A, A], DispatchConfig(workgroup_override=(128, 1, 1)))
    assert ok.result()[0].size == 64
    for shape in [(512, 1, 1), (64, 8, 1), (1, 1, 2)]:
        with pytest.raises(UnsupportedFeature, match="max_workgroup_size") as info:
            config = DispatchConfig(workgroup_override=shape, grid_override=1)
            backend.dispatch(XOR, [A, A], config)
        assert info.value.feature == "workgroup size"  # type: ignore[attr-defined]
    reference = reference_backend()
    with pytest.raises(UnsupportedFeature):
        config = DispatchConfig(workgroup_override=(1, 1, 128), grid_override=1)
        reference.dispatch(XOR, [A, A], config)


def test_max_storage_buffer_bytes_is_enforced_before_copying() -> None:
    backend = backend_of(Limited)
    small = np.zeros(256, U)  # exactly 1 KiB
    assert backend.dispatch(elementwise_xor(256), [small, small]).result()[0].size == 256
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.dispatch(elementwise_xor(257), [np.zeros(257, U)] * 2)
    with pytest.raises(InvalidProgram, match="largest buffer"):
        backend.dispatch(elementwise_xor(300), [b"\0" * 1200] * 2)


def test_speculation_disable_skips_shape_prediction_and_force_needs_a_prefetcher() -> None:
    backend = reference_backend()
    assert backend.prefetcher is not None
    backend.dispatch(XOR, [A, A], DispatchConfig(speculation="disable")).result()
    assert backend.prefetcher.stats().dispatches == 0
    backend.dispatch(XOR, [A, A], DispatchConfig(speculation="force")).result()
    assert backend.prefetcher.stats().dispatches == 1
    without = reference_backend(prefetch=False)
    with pytest.raises(UnsupportedFeature, match="prefetch") as info:
        without.dispatch(XOR, [A, A], DispatchConfig(speculation="force"))
    assert "Fix:" in str(info.value)
    assert without.dispatch(XOR, [A, A]).result()[0].size == 64


def test_every_bad_call_is_listed_once() -> None:
    names: list[Any] = list(BAD_CALLS)
    assert len(names) == len(set(names)) >= 25


def test_a_strided_memoryview_input_is_copied_in_order() -> None:
    """memoryview(...).cast("B") raised a raw TypeError for non-contiguous views."""
    backing = np.arange(128, dtype=U)
    strided = memoryview(backing)[::2]  # every other word, not contiguous
    (out,) = _backend().dispatch(XOR, [strided, np.zeros(64, U)]).result()
    assert out.tolist() == backing[::2].tolist()
    handle = _backend().upload(strided)
    assert handle.count == 64


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (2, 2.0),
        (np.float32(0.5), 0.5),
        (np.int64(-3), -3.0),
        (Fraction(1, 4), 0.25),
        (10**400, math.inf),
        (-(10**400), -math.inf),
    ],
)
def test_real_number_takes_every_real_and_keeps_it_as_a_float(
    value: object, expected: float
) -> None:
    got = real_number(value)
    assert type(got) is float and got == expected


@pytest.mark.parametrize("value", [True, np.bool_(False), "1", None, Decimal("1"), 1j, [1]])
def test_real_number_is_nan_for_anything_else(value: object) -> None:
    assert math.isnan(real_number(value))


def test_wait_seconds_names_the_call_in_its_fix() -> None:
    assert wait_seconds(None, example="x") == math.inf
    assert wait_seconds(-2, example="x") == 0.0
    assert wait_seconds(10**400, example="x") == math.inf
    with pytest.raises(InvalidProgram, match=r"Fix: pass e\.g\. prefetcher\.drain\(timeout=5\.0\)"):
        wait_seconds("soon", example="prefetcher.drain(timeout=5.0)")


@pytest.mark.parametrize(
    ("given", "kept"), [(np.float32(5), 5), (np.int64(7), 7), (Fraction(1, 2), 0.5), (2.0, 2)]
)
def test_a_precedence_is_kept_as_a_plain_number_that_prints_and_serialises(
    given: object, kept: float
) -> None:
    registration = BackendRegistration(id="p", factory="x:y", precedence=given)  # type: ignore[arg-type]
    assert registration.precedence == kept and type(registration.precedence) is type(kept)
    assert json.loads(json.dumps({"p": registration.precedence})) == {"p": kept}
    assert f"{registration.precedence:<4}"  # (the text of `vyre-async info`)
