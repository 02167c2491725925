"""`InvalidArgument`: argument misuse is its own class, code 1006, under `InvalidProgram`.

An argument that is not a program (a setting, a size, a backend, a callback)
raises exactly `InvalidArgument`; a program, wire bytes or inputs that do not
fit a program raise exactly `InvalidProgram`. Both keep the code and the Fix.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import anyio
import numpy as np
import pytest

import vyre_async
import vyre_async.abc
import vyre_async.errors
from vyre_async import (
    BackendError,
    DispatchConfig,
    ErrorCode,
    InvalidArgument,
    InvalidProgram,
    VyreBackend,
    acquire_backend,
    register_backend,
)
from vyre_async._graph import ArmGraph
from vyre_async._prefetch import Prefetcher
from vyre_async._shadow import ShadowBackend
from vyre_async.errors import error_for_code
from vyre_async.ir import Access, BufferDecl, DType, Program
from vyre_async.programs import elementwise_xor
from vyre_async.tracing import configure_tracing
from vyre_reference import reference_backend

XOR = elementwise_xor(64)
A = np.arange(64, dtype=np.uint32)


def _backend() -> VyreBackend:
    return reference_backend(prefetch=False)


def test_invalid_argument_is_an_invalid_program_with_its_code() -> None:
    assert issubclass(InvalidArgument, InvalidProgram)
    assert issubclass(InvalidArgument, BackendError)
    assert issubclass(InvalidArgument, ValueError)
    assert InvalidArgument.code is ErrorCode.InvalidProgram
    assert int(InvalidArgument.code) == 1006
    assert error_for_code(1006) is InvalidProgram  # the code still maps to the base
    err = InvalidArgument("capacity must be an int >= 1, got 0")
    assert str(err) == f"capacity must be an int >= 1, got 0\nFix: {InvalidArgument.default_fix}"
    assert InvalidArgument.default_fix != InvalidProgram.default_fix


def test_invalid_argument_is_exported_where_errors_are() -> None:
    for module in (vyre_async, vyre_async.errors, vyre_async.abc):
        assert "InvalidArgument" in module.__all__
        assert module.InvalidArgument is InvalidArgument


def test_invalid_argument_pickles_to_the_same_class_and_message() -> None:
    err = InvalidArgument("sample_rate must be in 0..1", fix="pass 0.5", backend_id="reference")
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is InvalidArgument
    assert str(clone) == str(err) == "sample_rate must be in 0..1\nFix: pass 0.5"
    assert clone.backend_id == "reference"  # type: ignore[attr-defined]
    assert clone.code == 1006


def test_invalid_program_handlers_still_catch_it() -> None:
    with pytest.raises(InvalidProgram):
        reference_backend(max_workers=0)
    try:
        DispatchConfig(timeout=-1)
    except BackendError as exc:
        assert exc.code == ErrorCode.InvalidProgram
    else:  # pragma: no cover
        pytest.fail("DispatchConfig(timeout=-1) was accepted")


def _graph_with_resource() -> ArmGraph:
    graph = ArmGraph()
    graph.resource("x", "u32", 64)
    return graph


ARGUMENT_MISUSE: dict[str, Callable[[], object]] = {
    'VyreBackend("reference")': lambda: VyreBackend("reference"),  # type: ignore[arg-type]
    "reference_backend(max_workers=0)": lambda: reference_backend(max_workers=0),
    "reference_backend(pipeline_cache_capacity=0)": lambda: reference_backend(
        pipeline_cache_capacity=0
    ),
    "reference_backend(close_timeout=-1)": lambda: reference_backend(close_timeout=-1),
    "DispatchConfig(timeout=-1)": lambda: DispatchConfig(timeout=-1),
    "DispatchConfig(grid_override=2.0)": lambda: DispatchConfig(grid_override=2.0),  # type: ignore[arg-type]
    "DispatchConfig(label=3)": lambda: DispatchConfig(label=3),  # type: ignore[arg-type]
    "ShadowBackend(sample_rate=2)": lambda: ShadowBackend(_backend(), _backend(), sample_rate=2),
    "acquire_backend(3)": lambda: acquire_backend(3),  # type: ignore[arg-type]
    "register_backend(dict)": lambda: register_backend({"id": "x"}),  # type: ignore[arg-type]
    "dispatch with a dict as config": lambda: _backend().dispatch(XOR, [A, A], {"timeout": 1}),  # type: ignore[arg-type]
    'alloc("nope", 4)': lambda: _backend().alloc("nope", 4),
    'alloc("u32", -1)': lambda: _backend().alloc("u32", -1),
    "upload(label=3)": lambda: _backend().upload(A, label=3),  # type: ignore[arg-type]
    "download(5)": lambda: _backend().download(5),  # type: ignore[arg-type]
    "result(timeout='soon')": lambda: _backend().dispatch(XOR, [A, A]).result(timeout="soon"),  # type: ignore[arg-type]
    "add_done_callback(None)": lambda: _backend().dispatch(XOR, [A, A]).add_done_callback(None),  # type: ignore[arg-type]
    "ArmGraph(label=3)": lambda: ArmGraph(label=3),  # type: ignore[arg-type]
    'ArmGraph.resource dtype "f64"': lambda: ArmGraph().resource("r", "f64", 4),
    "ArmGraph.arm bindings not a mapping": lambda: _graph_with_resource().arm(XOR, ["x"]),  # type: ignore[arg-type]
    "ArmGraph.run on a non-backend": lambda: anyio.run(_graph_with_resource().run, "reference"),  # type: ignore[arg-type]
    "Prefetcher(max_queue=0)": lambda: Prefetcher(_backend().store, max_queue=0),
    "configure_tracing('loud')": lambda: configure_tracing("loud"),
    "vyre_async.compile(non-backend)": lambda: vyre_async.compile("reference", XOR),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("call", list(ARGUMENT_MISUSE.values()), ids=list(ARGUMENT_MISUSE))
def test_argument_misuse_raises_exactly_invalid_argument(call: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgument) as info:
        call()
    assert type(info.value) is InvalidArgument
    assert "\nFix: " in str(info.value)
    assert info.value.code == 1006


def _invalid_program() -> Program:
    # V006: a WRITE buffer needs a static count.
    return Program([BufferDecl("out", 0, Access.WRITE, DType.U32)], 64, [])


def _another_ulp_budget() -> object:
    backend = _backend()
    strict = backend.compile(XOR, DispatchConfig(ulp_budget=1))
    return strict.dispatch([A, A], DispatchConfig(ulp_budget=3))


PROGRAM_ERRORS: dict[str, Callable[[], object]] = {
    "wrong input count": lambda: _backend().dispatch(XOR, [A]),
    "wrong input dtype": lambda: _backend().dispatch(XOR, [A, A.astype(np.float32)]),
    "invalid program (V006)": lambda: _backend().dispatch(_invalid_program(), []),
    "dispatch of a non-Program": lambda: _backend().dispatch("xor", [A, A]),  # type: ignore[arg-type]
    "pipeline compiled for another ulp_budget": _another_ulp_budget,
    "malformed wire bytes": lambda: Program.from_wire(b"not a program"),
}


@pytest.mark.parametrize("call", list(PROGRAM_ERRORS.values()), ids=list(PROGRAM_ERRORS))
def test_program_and_input_errors_stay_exactly_invalid_program(
    call: Callable[[], object],
) -> None:
    with pytest.raises(InvalidProgram) as info:
        call()
    assert type(info.value) is InvalidProgram
    assert "\nFix: " in str(info.value)


def test_the_invalid_program_case_is_the_validation_rule() -> None:
    with pytest.raises(InvalidProgram, match="V006"):
        _backend().dispatch(_invalid_program(), [])
