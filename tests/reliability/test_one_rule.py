"""Issue 26, defect 9: one rule, not two, where two entry points took the same thing.

- A timeout is any positive real number (numpy scalars, fractions), as the guide says.
- ``upload()`` takes arrays of either byte order, as ``dispatch()`` does.
- ``validate()`` refuses the names ``dispatch()`` cannot encode (V033).
- Input lengths: exact for a buffer with a declared count, free for count 0
  (loads past the end read 0), on ``dispatch()`` and as the guide states.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from vyre_async import DispatchConfig, InvalidProgram, acquire_backend
from vyre_async.ir import (
    Access,
    BufferDecl,
    DType,
    Let,
    Load,
    Program,
    Store,
    Var,
    gid,
    u32,
    validate,
)
from vyre_async.programs import elementwise_xor


@pytest.mark.parametrize(
    ("timeout", "seconds"),
    [
        (np.float32(1.5), 1.5),
        (np.int64(2), 2.0),
        (Fraction(1, 4), 0.25),
        (10**400, math.inf),
        (3, 3.0),
    ],
)
def test_a_timeout_is_any_positive_real_number(timeout: Any, seconds: float) -> None:
    config = DispatchConfig(timeout=timeout)
    assert config.timeout == seconds and type(config.timeout) is float
    backend = acquire_backend("reference")
    a = np.arange(8, dtype=np.uint32)
    assert backend.dispatch_sync(elementwise_xor(8), [a, a], config)[0].tolist() == [0] * 8


@pytest.mark.parametrize("timeout", [True, np.bool_(True), 0, -1.0, math.nan, "1", np.float32(0)])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout: Any) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        DispatchConfig(timeout=timeout)


@pytest.mark.parametrize("dtype", [">u4", ">i4", ">f4", "<u4"])
def test_upload_takes_either_byte_order_as_dispatch_does(dtype: str) -> None:
    backend = acquire_backend("reference")
    data = np.array([1, 2, 300000], dtype=dtype)
    handle = backend.upload(data)
    try:
        back = backend.download(handle)
        assert back.tolist() == data.tolist()
        assert back.dtype == data.dtype.newbyteorder("=")
    finally:
        backend.free(handle)


def _named(name: str, op_id: str = "ok") -> Program:
    return Program(
        [BufferDecl(name, 0, Access.WRITE, DType.U32, 4)],
        4,
        [Let("v", u32(1)), Store(name, gid(), Var("v"))],
        op_id=op_id,
    )


@pytest.mark.parametrize(("name", "op_id"), [("o\ud800", "ok"), ("out", "x\udfff")])
def test_validate_refuses_a_name_dispatch_cannot_encode(name: str, op_id: str) -> None:
    program = _named(name, op_id)
    assert [d.code for d in validate(program)] == ["V033"]
    with pytest.raises(InvalidProgram, match="V033"):
        acquire_backend("reference").dispatch(program, [])


def test_a_variable_name_dispatch_cannot_encode_is_refused_too() -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
        4,
        [Let("v\udc80", u32(1)), Store("out", gid(), Var("v\udc80"))],
    )
    assert [d.code for d in validate(program)] == ["V033"]


def test_input_lengths_are_exact_where_declared_and_free_for_count_zero() -> None:
    backend = acquire_backend("reference")
    a = np.arange(1, 11, dtype=np.uint32)
    b = np.full(1024, 5, dtype=np.uint32)
    # count 0: sized by the input; a load past its end reads 0 (ir.md)
    (out,) = backend.dispatch_sync(elementwise_xor(1024), [a, b])
    assert out[:10].tolist() == (a ^ 5).tolist() and out[10:].tolist() == [5] * 1014
    # a declared count: exactly that many elements
    fixed = Program(
        [
            BufferDecl("src", 0, Access.READ, DType.U32, 4),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
        ],
        4,
        [Store("out", gid(), Load("src", gid()))],
    )
    assert backend.dispatch_sync(fixed, [np.arange(4, dtype=np.uint32)])[0].tolist() == [0, 1, 2, 3]
    for wrong in (3, 5):
        with pytest.raises(InvalidProgram, match="declares count=4"):
            backend.dispatch(fixed, [np.arange(wrong, dtype=np.uint32)])
