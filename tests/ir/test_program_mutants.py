"""A `Program`'s derived facts are computed once (triage of surviving mutants, issue 28).

`Program.to_wire`, `fingerprint`, `hash()` and the buffer selections are
documented as cached per instance: the driver asks for them on every dispatch
(docs/hot-path), so a cache that silently recomputes costs every call. These
tests count the work done, and pin `buffer()`'s error.
"""

from __future__ import annotations

from typing import Any

import pytest

import vyre_async.ir.wire as wire_module
from vyre_async.ir import Access, BufferDecl, DType, Program, Store, gid, u32


def _program(op_id: str = "") -> Program:
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.READ_WRITE, DType.U32),
            BufferDecl("w", 2, Access.WORKGROUP, DType.U32, 4),
        ],
        4,
        [Store("out", gid(), u32(1))],
        op_id,
    )


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(wire_module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(wire_module, name, counted)
    return calls


def test_the_wire_form_is_encoded_once_per_program(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, "encode_program")
    program = _program()
    first = program.to_wire()
    assert program.to_wire() == first
    assert len(calls) == 1
    assert Program.from_wire(first) == program


def test_the_fingerprint_is_computed_once_per_program(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, "fingerprint")
    program = _program()
    first = program.fingerprint()
    assert len(first) == 32
    assert program.fingerprint() == first
    assert len(calls) == 1
    assert _program().fingerprint() == first  # an equal program: the same digest


def test_the_hash_is_computed_once_per_program(monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []
    real = BufferDecl.__hash__

    def counted(self: BufferDecl) -> int:
        hashed.append(1)
        return real(self)

    monkeypatch.setattr(BufferDecl, "__hash__", counted)
    program = _program()
    first = hash(program)
    once = len(hashed)
    assert once == 3  # each buffer hashed for the first hash
    assert hash(program) == first
    assert len(hashed) == once  # and not again
    monkeypatch.setattr(BufferDecl, "__hash__", real)
    assert hash(_program()) == first  # equal programs hash alike
    assert hash(_program("op")) != first


def test_buffer_selections_are_made_once_and_in_binding_order() -> None:
    program = _program()
    assert [b.name for b in program.inputs] == ["a", "out"]
    assert [b.name for b in program.outputs] == ["out"]
    assert [b.name for b in program.workgroup_buffers] == ["w"]
    assert program.inputs is program.inputs
    assert program.outputs is program.outputs
    assert program.workgroup_buffers is program.workgroup_buffers


def test_buffer_by_name_and_the_error_for_an_unknown_name() -> None:
    program = _program()
    assert program.buffer("out") is program.buffers[1]
    with pytest.raises(KeyError) as info:
        program.buffer("nope")
    assert info.value.args == ("nope",)


def test_the_repr_shows_an_op_id_only_when_there_is_one() -> None:
    assert repr(_program("vyre.test")).endswith(", op_id='vyre.test')")
    assert "op_id" not in repr(_program())
    assert repr(_program()).endswith("[Store('out', gid(0), u32(1))])")


def test_the_body_is_encoded_once_for_the_wire_form_fingerprint_and_kernel_digests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _counting(monkeypatch, "_encode_body")
    program = _program()
    wire = program.to_wire()
    assert program.fingerprint() == wire[8:40]  # read from the wire form's header
    assert wire_module.fingerprint(program) == wire[8:40]
    assert len(calls) == 1
    first = wire_module.kernel_digest(program, {"fast_math": False})
    second = wire_module.kernel_digest(program, {"fast_math": True})
    assert first != second
    assert wire_module.kernel_digest(program, {"fast_math": False}) == first
    assert len(calls) == 2  # one more: the count-free body every kernel digest starts from
    fresh = _program()
    assert wire_module.kernel_digest(fresh, {"fast_math": False}) == first


def test_encoding_a_program_records_its_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    program = _program()
    wire = wire_module.encode_program(program)
    calls = _counting(monkeypatch, "_encode_body")
    assert program.fingerprint() == wire[8:40]
    assert len(calls) == 0
