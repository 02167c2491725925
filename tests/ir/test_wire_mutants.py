"""Triage of the surviving mutants of `vyre_async.ir.wire` (issue 28, mutation testing).

`tests/ir/test_wire.py` checks that malformed input is refused with a few key
words; a mutant that rewrites a message, a Fix, an offset, a limit comparison or
the byte layout of the options survived it. These tests pin what a user sees:
the exact `InvalidProgram` text (message, offset and Fix) and ``err.offset`` for
one crafted input per decoder error path (header, truncation of every field,
unknown codes, over-long, empty and non-UTF-8 names, counts over the limit and
over the bytes remaining, non-canonical order and constants, depth and node
limits, trailing bytes), every limit at the limit and one over, exact round
trips, the fingerprint and kernel digest recomputed from docs/wire-format.md,
and the encoder's and the compile options' exact errors. The expected texts
follow docs/wire-format.md: offsets are counted by hand from the byte layout.
Mutants no user can tell apart are listed, with the reason, in
scripts/mutation_equivalent/ (ir wire entries).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable
from typing import Any

import pytest
from blake3 import blake3

from tests.ir.test_wire import _body, _str, _u32, _wire
from tests.strategies import count_nodes
from vyre_async import InvalidProgram
from vyre_async.ir import (
    Assign,
    Atomic,
    Bin,
    Block,
    BufferDecl,
    BufLen,
    Cast,
    Const,
    Expr,
    Fma,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Stmt,
    Store,
    Un,
    u32,
    wire,
)
from vyre_async.ir.limits import MAX_EXPR_DEPTH, MAX_NODES, MAX_STMT_DEPTH

_DECODE_FIX = (
    "decode only bytes produced by Program.to_wire() of this wire version, "
    "transferred unmodified; re-encode the program from its source"
)
_ENCODE_FIX = "keep the program within vyre_async.ir.limits and run validate(program)"
_DOMAIN = b"vyre-async/kernel-digest/v1\x00"

# Byte offsets of the crafted bodies below (header 40, op_id "" 4, workgroup 12).
_BUFFERS_AT = 56  # the buffer table's count
_STMTS_AT = 60  # the statement count, with an empty buffer table
_FIRST_STMT = 64  # the first statement's tag
_LET_VALUE = 70  # the value of ``Let "x"`` as the first statement


# Helpers ---------------------------------------------------------------------------------


def _head(buffers: bytes = _u32(0)) -> bytes:
    """The body up to the statements: empty op id, workgroup (1, 1, 1), ``buffers``."""
    return _str("") + _u32(1) * 3 + buffers


def _let(value: bytes) -> bytes:
    """``Let "x" = value`` as the only statement of a program, behind a valid header."""
    return _wire(_body(b"\x00" + _str("x") + value))


def _const(bits: int = 7, code: int = 0) -> bytes:
    return bytes([0, code]) + _u32(bits)


_C = _const()  # 6 bytes: a U32 constant


def _decode_error(data: Any) -> InvalidProgram:
    with pytest.raises(InvalidProgram) as info:
        Program.from_wire(data)
    return info.value


def _deep(depth: int) -> Expr:
    """An expression ``depth`` nodes deep: negations of ``u32(7)`` (as the bytes of ``_C``)."""
    e: Expr = u32(7)
    for _ in range(depth - 1):
        e = Un("neg", e)
    return e


# Decoder errors, one crafted input per path ------------------------------------------------

_ZERO_DIGEST_BODY = _body(b"\x05")
_REJECTED: list[tuple[str, bytes, str, int]] = [
    # The header.
    ("empty", b"", "truncated: 0 bytes is shorter than the 40-byte header", 0),
    ("short-magic", b"VY", "truncated: 2 bytes is shorter than the 40-byte header", 0),
    ("short-5", b"VYIR\x01", "truncated: 5 bytes is shorter than the 40-byte header", 0),
    ("short-bad-magic", b"XY", "bad magic b'XY' (expected b'VYIR')", 0),
    ("short-bad-magic-5", b"XYZWQ", "bad magic b'XYZW' (expected b'VYIR')", 0),
    (
        "bad-magic",
        b"PVIR" + _wire(_ZERO_DIGEST_BODY)[4:],
        "bad magic b'PVIR' (expected b'VYIR')",
        0,
    ),
    (
        "flags",
        _wire(_ZERO_DIGEST_BODY, flags=0xABCD),
        "unknown flags 0xABCD (version 1 defines none)",
        6,
    ),
    (
        "flags-1",
        _wire(_ZERO_DIGEST_BODY, flags=1),
        "unknown flags 0x0001 (version 1 defines none)",
        6,
    ),
    (
        "digest",
        b"VYIR\x01\x00\x00\x00" + bytes(32) + _ZERO_DIGEST_BODY,
        "body digest mismatch: the stored blake3 digest 0000000000000000… does not match "
        f"the body's {blake3(_ZERO_DIGEST_BODY).digest()[:8].hex()}… (corrupted or tampered bytes)",
        8,
    ),
    (
        "header-only",
        _wire(b""),
        "truncated: expected 4 byte(s) for the byte length of op_id, only 0 remain",
        40,
    ),
    # The program's own fields.
    (
        "op_id-text",
        _wire(_u32(5) + b"ab"),
        "truncated: expected 5 byte(s) for op_id, only 2 remain",
        44,
    ),
    (
        "op_id-long",
        _wire(_u32(257) + b"x" * 300),
        "op_id is 257 bytes long, over MAX_NAME_BYTES (256)",
        40,
    ),
    (
        "op_id-utf8",
        _wire(_str(b"a\xff") + _u32(1) * 3),
        "op_id is not valid UTF-8 (invalid start byte at byte 1)",
        40,
    ),
    (
        "workgroup-x",
        _wire(_str("") + b"\x01\x00"),
        "truncated: expected 4 byte(s) for workgroup x, only 2 remain",
        44,
    ),
    (
        "workgroup-y",
        _wire(_str("") + _u32(1) + b"\x01"),
        "truncated: expected 4 byte(s) for workgroup y, only 1 remain",
        48,
    ),
    (
        "workgroup-z",
        _wire(_str("") + _u32(1) * 2),
        "truncated: expected 4 byte(s) for workgroup z, only 0 remain",
        52,
    ),
    # The buffer table.
    (
        "buffers-count",
        _wire(_head(b"\x00")),
        "truncated: expected 4 byte(s) for the item count of the buffer table, only 1 remain",
        _BUFFERS_AT,
    ),
    (
        "buffers-limit",
        _wire(_head(_u32(257))),
        "the buffer table declares 257 items, over the limit of 256",
        _BUFFERS_AT,
    ),
    (
        "buffers-remain",
        _wire(_head(_u32(3) + bytes(20))),
        "the buffer table declares 3 items (at least 42 bytes) but only 20 bytes remain",
        _BUFFERS_AT,
    ),
    (
        "buffer-name",
        _wire(_head(_u32(1) + _u32(20) + b"a" * 10)),
        "truncated: expected 20 byte(s) for the name of buffer #0, only 10 remain",
        64,
    ),
    (
        "buffer-binding",
        _wire(_head(_u32(1) + _str("abcdefghij") + b"\x00\x00")),
        "truncated: expected 4 byte(s) for the binding of buffer 'abcdefghij', only 2 remain",
        74,
    ),
    (
        "buffer-access",
        _wire(_head(_u32(1) + _str("a") + _u32(0) + bytes([5, 0]) + _u32(0))),
        "unknown access of buffer 'a' code 5 (known: 0, 1, 2, 3, 4)",
        69,
    ),
    (
        "buffer-dtype",
        _wire(_head(_u32(1) + _str("a") + _u32(0) + bytes([0, 4]) + _u32(0))),
        "unknown dtype of buffer 'a' code 4 (known: 0, 1, 2, 3)",
        70,
    ),
    (
        "buffer-count",
        _wire(_head(_u32(1) + _str("abcd") + _u32(0) + bytes([0, 0]) + b"\x00\x00")),
        "truncated: expected 4 byte(s) for the element count of buffer 'abcd', only 2 remain",
        74,
    ),
    (
        "buffer-order",
        _wire(
            _body(
                b"",
                0,
                _u32(2)
                + (_str("b") + _u32(1) + bytes([0, 0]) + _u32(0))
                + (_str("a") + _u32(0) + bytes([0, 0]) + _u32(0)),
            )
        ),
        "buffer 'a' is out of canonical order (buffers are sorted by is-workgroup, binding, "
        "name, access, dtype, count)",
        75,
    ),
    (
        "buffer-order-count",
        _wire(
            _body(
                b"",
                0,
                _u32(2)
                + (_str("a") + _u32(0) + bytes([0, 0]) + _u32(2))
                + (_str("a") + _u32(0) + bytes([0, 0]) + _u32(1)),
            )
        ),
        "buffer 'a' is out of canonical order (buffers are sorted by is-workgroup, binding, "
        "name, access, dtype, count)",
        75,
    ),
    (
        "buffer-empty-name",
        _wire(_body(b"", 0, _u32(1) + _str("") + _u32(0) + bytes([0, 0]) + _u32(0))),
        "the node there is invalid: buffer name must be a non-empty str, got ''",
        60,
    ),
    # Statement sequences.
    (
        "stmts-count",
        _wire(_head() + b"\x00\x00"),
        "truncated: expected 4 byte(s) for the item count of the program body, only 2 remain",
        _STMTS_AT,
    ),
    (
        "stmts-limit",
        _wire(_body(b"", 0xFFFF_FFFF)),
        "the program body declares 4294967295 items, over the limit of 100000",
        _STMTS_AT,
    ),
    (
        "stmts-remain",
        _wire(_body(b"", 1000)),
        "the program body declares 1000 items (at least 1000 bytes) but only 0 bytes remain",
        _STMTS_AT,
    ),
    (
        "then-remain",
        _wire(_body(b"\x03" + _C + _u32(50))),
        "an If then-body declares 50 items (at least 50 bytes) but only 0 bytes remain",
        71,
    ),
    (
        "else-remain",
        _wire(_body(b"\x03" + _C + _u32(0) + _u32(50))),
        "an If else-body declares 50 items (at least 50 bytes) but only 0 bytes remain",
        75,
    ),
    (
        "loop-remain",
        _wire(_body(b"\x04" + _str("i") + _C + _C + _u32(50))),
        "a Loop body declares 50 items (at least 50 bytes) but only 0 bytes remain",
        82,
    ),
    (
        "block-remain",
        _wire(_body(b"\x06" + _u32(50))),
        "a Block body declares 50 items (at least 50 bytes) but only 0 bytes remain",
        65,
    ),
    (
        "trailing",
        _wire(_body(b"\x05") + b"\x00\x00"),
        "2 trailing byte(s) after the program body",
        65,
    ),
    # Statements.
    (
        "stmt-tag",
        _wire(_body(b"\x06" + _u32(0), 2)),
        "truncated: expected 1 byte(s) for a statement tag, only 0 remain",
        69,
    ),
    ("stmt-unknown", _wire(_body(b"\x09")), "unknown statement tag 9 (known: 0..8)", _FIRST_STMT),
    (
        "let-length",
        _wire(_body(b"\x00\x01\x00")),
        "truncated: expected 4 byte(s) for the byte length of a Let name, only 2 remain",
        65,
    ),
    (
        "let-empty",
        _wire(_body(b"\x00" + _str(""))),
        "a Let name is empty; names are non-empty strings",
        65,
    ),
    (
        "let-long",
        _wire(_body(b"\x00" + _u32(257) + b"x" * 257)),
        "a Let name is 257 bytes long, over MAX_NAME_BYTES (256)",
        65,
    ),
    (
        "let-utf8",
        _wire(_body(b"\x00" + _str(b"a\xff"))),
        "a Let name is not valid UTF-8 (invalid start byte at byte 1)",
        65,
    ),
    (
        "assign-empty",
        _wire(_body(b"\x01" + _str(""))),
        "an Assign name is empty; names are non-empty strings",
        65,
    ),
    (
        "loop-empty",
        _wire(_body(b"\x04" + _str(""))),
        "a Loop variable is empty; names are non-empty strings",
        65,
    ),
    (
        "store-buffer",
        _wire(_body(b"\x02" + _u32(9) + b"abc")),
        "truncated: expected 9 byte(s) for a Store buffer name, only 3 remain",
        69,
    ),
    # Expressions (the value of ``Let "x"``, at offset 70).
    (
        "expr-tag",
        _let(b""),
        "truncated: expected 1 byte(s) for an expression tag, only 0 remain",
        _LET_VALUE,
    ),
    ("expr-unknown", _let(b"\x0b"), "unknown expression tag 11 (known: 0..10)", _LET_VALUE),
    (
        "var-empty",
        _let(b"\x01" + _str("")),
        "a variable name is empty; names are non-empty strings",
        71,
    ),
    (
        "load-buffer",
        _let(b"\x02" + _u32(9) + b"ab"),
        "truncated: expected 9 byte(s) for a Load buffer name, only 2 remain",
        75,
    ),
    (
        "buflen-buffer",
        _let(b"\x03" + _u32(9) + b"ab"),
        "truncated: expected 9 byte(s) for a BufLen buffer name, only 2 remain",
        75,
    ),
    (
        "atomic-buffer",
        _let(b"\x0a\x00" + _u32(9) + b"ab"),
        "truncated: expected 9 byte(s) for an Atomic buffer name, only 2 remain",
        76,
    ),
    (
        "builtin-kind",
        _let(b"\x04\x04\x00"),
        "unknown builtin kind code 4 (known: 0, 1, 2, 3)",
        71,
    ),
    (
        "builtin-axis-missing",
        _let(b"\x04\x00"),
        "truncated: expected 1 byte(s) for builtin axis, only 0 remain",
        72,
    ),
    ("builtin-axis", _let(b"\x04\x00\x03"), "builtin axis must be 0, 1 or 2, found 3", 72),
    (
        "bin-op-missing",
        _let(b"\x05"),
        "truncated: expected 1 byte(s) for binary operator, only 0 remain",
        71,
    ),
    (
        "bin-op",
        _let(b"\x05\x15"),
        "unknown binary operator code 21 (known: " + ", ".join(str(i) for i in range(21)) + ")",
        71,
    ),
    (
        "un-op",
        _let(b"\x06\x12"),
        "unknown unary operator code 18 (known: " + ", ".join(str(i) for i in range(18)) + ")",
        71,
    ),
    (
        "cast-dtype",
        _let(b"\x08\x04"),
        "unknown cast target dtype code 4 (known: 0, 1, 2, 3)",
        71,
    ),
    (
        "atomic-op",
        _let(b"\x0a\x08"),
        "unknown atomic operator code 8 (known: 0, 1, 2, 3, 4, 5, 6, 7)",
        71,
    ),
    (
        "atomic-flag-missing",
        _let(b"\x0a\x00" + _str("b") + _C + _C),
        "truncated: expected 1 byte(s) for the Atomic has-expected flag, only 0 remain",
        89,
    ),
    (
        "atomic-flag",
        _let(b"\x0a\x00" + _str("b") + _C + _C + b"\x02"),
        "Atomic has-expected flag must be 0 or 1, found 2",
        89,
    ),
    (
        "const-short",
        _let(b"\x00\x00\x01\x02"),
        "truncated: expected 5 byte(s) for a constant (dtype code and 32-bit word), only 3 remain",
        71,
    ),
    (
        "const-dtype",
        _let(_const(0, code=4)),
        "unknown constant dtype code 4 (known: 0, 1, 2, 3)",
        71,
    ),
    (
        "const-bool",
        _let(_const(2, code=3)),
        "bool constant bits must be 0 or 1, found 2",
        _LET_VALUE,
    ),
    (
        "const-nan",
        _let(_const(0x7FC0_0001, code=2)),
        "f32 constant NaN bits 0x7FC00001 are not canonical (0x7FC00000)",
        _LET_VALUE,
    ),
    (
        "expr-depth",
        _let(b"\x06\x00" * MAX_EXPR_DEPTH + _C),
        "an expression is nested deeper than MAX_EXPR_DEPTH (128)",
        _LET_VALUE + 2 * MAX_EXPR_DEPTH,
    ),
    (
        "stmt-depth",
        _wire(_body((b"\x06" + _u32(1)) * MAX_STMT_DEPTH + b"\x06" + _u32(0))),
        "statements are nested deeper than MAX_STMT_DEPTH (64)",
        _FIRST_STMT + 5 * MAX_STMT_DEPTH + 1,
    ),
]


@pytest.mark.parametrize(
    ("data", "message", "offset"),
    [case[1:] for case in _REJECTED],
    ids=[case[0] for case in _REJECTED],
)
def test_each_malformed_input_gets_its_exact_error(data: bytes, message: str, offset: int) -> None:
    """Message, byte offset (in the text and as ``err.offset``) and Fix of each error."""
    err = _decode_error(data)
    expected = f"invalid program wire bytes at offset {offset}: {message}"
    assert str(err) == f"{expected}\nFix: {_DECODE_FIX}"
    assert err.offset == offset  # type: ignore[attr-defined]


def test_an_unknown_version_is_reported_with_its_own_fix() -> None:
    """A version other than 1 and 2 says which versions this build reads, at offset 4."""
    err = _decode_error(_wire(_ZERO_DIGEST_BODY, version=3))
    message, _, fix = str(err).partition("\nFix: ")
    assert "unknown wire version 3 (this build reads versions 1 and 2)" in message
    assert fix == "re-encode the program with this vyre-async version's Program.to_wire()"
    assert err.offset == 4  # type: ignore[attr-defined]


def test_non_bytes_input_is_named_by_its_type() -> None:
    """A str is refused before anything is read, with a Fix that names to_wire()."""
    err = _decode_error("VYIR")
    assert str(err) == (
        "wire data must be bytes, bytearray or memoryview, got str\n"
        "Fix: pass the bytes returned by Program.to_wire()"
    )


def test_an_unreadable_buffer_is_an_invalid_program() -> None:
    """A released memoryview cannot be read: an InvalidProgram, chained to the cause."""
    view = memoryview(b"VYIR")
    view.release()
    err = _decode_error(view)
    assert str(err) == (
        "invalid program wire bytes: internal decoder error ValueError: "
        f"operation forbidden on released memoryview object\nFix: {_DECODE_FIX}"
    )
    assert isinstance(err.__cause__, ValueError)


def test_running_out_of_python_stack_is_an_invalid_program() -> None:
    """Decoding a deep (valid) program near the recursion limit gives InvalidProgram."""
    data = _let(b"\x06\x00" * (MAX_EXPR_DEPTH - 1) + _C)
    depth = 0
    frame: Any = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 60)
    try:
        with pytest.raises(InvalidProgram) as info:
            Program.from_wire(data)
    finally:
        sys.setrecursionlimit(limit)
    assert str(info.value) == (
        "invalid program wire bytes: decoding ran out of Python stack\n"
        "Fix: decode from a shallower call stack; the program nesting is within limits"
    )
    assert Program.from_wire(data).body[0] == Let("x", _deep(MAX_EXPR_DEPTH))


# Limits at the limit and one over ----------------------------------------------------------


def test_exactly_max_nodes_decode_and_one_more_is_refused() -> None:
    """MAX_NODES statements decode; a Block holding MAX_NODES statements is one too many."""
    at_limit = _wire(_body(b"\x05" * MAX_NODES, MAX_NODES))
    assert Program.from_wire(at_limit).body == (Return(),) * MAX_NODES
    over = _wire(_body(b"\x06" + _u32(MAX_NODES) + b"\x05" * MAX_NODES))
    err = _decode_error(over)
    offset = _FIRST_STMT + 5 + MAX_NODES - 1  # the last Return's tag
    assert str(err) == (
        f"invalid program wire bytes at offset {offset}: more than MAX_NODES (100000) "
        f"statement and expression nodes\nFix: {_DECODE_FIX}"
    )
    assert err.offset == offset  # type: ignore[attr-defined]


def test_expressions_at_max_depth_decode_in_every_statement_slot() -> None:
    """Each statement's expressions start at depth 1, wherever they sit."""
    deep = _deep(MAX_EXPR_DEPTH)
    p = Program(
        [BufferDecl("o", 0, "read_write", "u32", 4)],
        1,
        [
            Let("x", deep),
            Assign("x", deep),
            Store("o", deep, deep),
            If(deep, [Return()], [Return()]),
            Loop("i", deep, deep, [Return()]),
        ],
    )
    assert Program.from_wire(p.to_wire()) == p


def _if_then_chain(levels: int) -> Stmt:
    s: Stmt = If(u32(1), [])
    for _ in range(levels - 1):
        s = If(u32(1), [s])
    return s


def _if_else_chain(levels: int) -> Stmt:
    s: Stmt = If(u32(1), [])
    for _ in range(levels - 1):
        s = If(u32(1), [], [s])
    return s


def _loop_chain(levels: int) -> Stmt:
    s: Stmt = Loop("i", u32(0), u32(1), [])
    for _ in range(levels - 1):
        s = Loop("i", u32(0), u32(1), [s])
    return s


@pytest.mark.parametrize("chain", [_if_then_chain, _if_else_chain, _loop_chain])
def test_max_stmt_depth_of_ifs_and_loops_round_trips(chain: Any) -> None:
    """MAX_STMT_DEPTH nested Ifs (through then or else) or Loops decode exactly."""
    p = Program([], 1, [chain(MAX_STMT_DEPTH)])
    assert Program.from_wire(p.to_wire()) == p


_OVER_DEEP = MAX_STMT_DEPTH + 1
_TOO_DEEP: list[tuple[str, bytes, int]] = [
    (
        "if-then",
        (b"\x03" + _C + _u32(1)) * (_OVER_DEEP - 1)
        + b"\x03"
        + _C
        + _u32(0)
        + _u32(0)
        + _u32(0) * (_OVER_DEEP - 1),
        _FIRST_STMT + 11 * (_OVER_DEEP - 1) + 7,
    ),
    (
        "if-else",
        (b"\x03" + _C + _u32(0) + _u32(1)) * (_OVER_DEEP - 1) + b"\x03" + _C + _u32(0) + _u32(0),
        _FIRST_STMT + 15 * (_OVER_DEEP - 1) + 7,
    ),
    (
        "loop",
        (b"\x04" + _str("i") + _C + _C + _u32(1)) * (_OVER_DEEP - 1)
        + b"\x04"
        + _str("i")
        + _C
        + _C
        + _u32(0),
        _FIRST_STMT + 22 * (_OVER_DEEP - 1) + 18,
    ),
]


@pytest.mark.parametrize(
    ("stmts", "offset"), [c[1:] for c in _TOO_DEEP], ids=[c[0] for c in _TOO_DEEP]
)
def test_one_if_or_loop_past_max_stmt_depth_is_refused(stmts: bytes, offset: int) -> None:
    """The body one level too deep is refused where its count starts."""
    err = _decode_error(_wire(_body(stmts)))
    assert str(err) == (
        f"invalid program wire bytes at offset {offset}: statements are nested deeper than "
        f"MAX_STMT_DEPTH (64)\nFix: {_DECODE_FIX}"
    )


# Exact round trips -------------------------------------------------------------------------


def test_empty_buffer_names_in_expressions_round_trip() -> None:
    """Store, Load, BufLen and Atomic may name the buffer "" (validate reports it, not wire)."""
    p = Program(
        [],
        1,
        [Store("", BufLen(""), Atomic("add", "", Load("", u32(0)), u32(1)))],
    )
    assert Program.from_wire(p.to_wire()) == p


def test_duplicate_buffer_entries_round_trip() -> None:
    """Two equal buffer entries are in canonical order (ties are allowed) and decode."""
    decl = BufferDecl("a", 0, "read", "u32", 3)
    p = Program([decl, decl], 1, [])
    data = p.to_wire()
    q = Program.from_wire(data)
    assert q == p
    assert q.buffers == (decl, decl)
    assert q.to_wire() == data


def test_decoded_leaves_are_equal_to_the_encoded_ones() -> None:
    """Repeated names, variables and constants decode to equal values every time."""
    p = Program([], 1, [Let("x", u32(5)), Let("y", Const("u32", 5)), Assign("x", _deep(3))])
    q = Program.from_wire(p.to_wire())
    assert q == p


# Fingerprint and kernel digest -------------------------------------------------------------


def test_fingerprint_of_an_encoded_program_is_its_header_digest() -> None:
    """wire.fingerprint after to_wire() is the 32-byte digest in the header."""
    p = Program([], 1, [Let("x", u32(1))], op_id="fp")
    data = p.to_wire()
    assert wire.fingerprint(p) == data[8:40] == blake3(data[40:]).digest()
    assert wire.fingerprint(Program([], 1, [Let("x", u32(1))], op_id="fp")) == data[8:40]


def test_kernel_digest_follows_the_documented_layout() -> None:
    """blake3(DOMAIN | body with storage counts 0 | u32 count, sorted keys, tagged values)."""
    p = Program([], 1, [Return()], op_id="k")
    options = {
        "g": 2**40,
        "b": (None, False, True),
        "a": 127,
        "c": -129,
        "d": 1.5,
        "e": "hé",
        "f": float("nan"),
    }
    encoded = (
        _u32(7)
        + _str("a")
        + b"\x03"
        + _u32(1)
        + b"\x7f"
        + _str("b")
        + b"\x06"
        + _u32(3)
        + b"\x00\x01\x02"
        + _str("c")
        + b"\x03"
        + _u32(2)
        + b"\x7f\xff"
        + _str("d")
        + b"\x04"
        + struct.pack("<d", 1.5)
        + _str("e")
        + b"\x05"
        + _str("hé")
        + _str("f")
        + b"\x04"
        + struct.pack("<Q", 0x7FF8_0000_0000_0000)
        + _str("g")
        + b"\x03"
        + _u32(6)
        + (2**40).to_bytes(6, "little")
    )
    body = p.to_wire()[40:]
    assert p.kernel_digest(options) == blake3(_DOMAIN + body + encoded).digest()
    assert p.kernel_digest() == blake3(_DOMAIN + body + _u32(0)).digest()


def test_kernel_digest_zeroes_storage_counts_in_the_body() -> None:
    """Only the WORKGROUP buffer keeps its count in the digested body."""
    p = Program(
        [BufferDecl("a", 0, "read", "u32", 9), BufferDecl("s", 1, "workgroup", "u32", 4)], 1, []
    )
    body = _head(
        _u32(2)
        + (_str("a") + _u32(0) + bytes([0, 0]) + _u32(0))
        + (_str("s") + _u32(1) + bytes([4, 0]) + _u32(4))
    ) + _u32(0)
    assert p.kernel_digest({}) == blake3(_DOMAIN + body + _u32(0)).digest()


def _nested(levels: int) -> tuple[Any, ...]:
    value: tuple[Any, ...] = ()
    for _ in range(levels - 1):
        value = (value,)
    return value


def test_options_nest_32_tuples_deep_and_no_deeper() -> None:
    """A tuple 32 deep is an option value; one more level is refused with its path."""
    p = Program([], 1, [])
    deepest = _nested(32)
    encoded = _u32(1) + _str("x") + (b"\x06" + _u32(1)) * 31 + b"\x06" + _u32(0)
    assert p.kernel_digest({"x": deepest}) == blake3(_DOMAIN + p.to_wire()[40:] + encoded).digest()
    with pytest.raises(InvalidProgram) as info:
        p.kernel_digest({"x": _nested(33)})
    assert str(info.value) == (
        "compile option 'x'" + "[0]" * 32 + " nests tuples deeper than 32\n"
        "Fix: flatten the option value"
    )


_UNSUPPORTED = "Fix: use only str, int, float, bool, None or tuples of them as option values"
_SURROGATE = "Fix: use option strings without lone surrogate code points"
_BAD_OPTIONS: list[tuple[str, Any, str]] = [
    (
        "not-a-mapping",
        [("a", 1)],
        "compile options must be a mapping, got list\nFix: pass options as a dict of str keys",
    ),
    (
        "int-key",
        {"a": 1, 2: True},
        "compile option keys must be str, got int: 2\nFix: use str keys for compile options",
    ),
    (
        "list",
        {"x": [1, 2]},
        f"compile option 'x' has unsupported type list: [1, 2]\n{_UNSUPPORTED}",
    ),
    (
        "nested-bytes",
        {"x": (1, (2, b"r"))},
        f"compile option 'x'[1][1] has unsupported type bytes: b'r'\n{_UNSUPPORTED}",
    ),
    (
        "surrogate-value",
        {"x": "\ud800"},
        f"compile option 'x' holds invalid Unicode (surrogates not allowed)\n{_SURROGATE}",
    ),
    (
        "surrogate-in-tuple",
        {"x": ("ok", "\ud800")},
        f"compile option 'x'[1] holds invalid Unicode (surrogates not allowed)\n{_SURROGATE}",
    ),
    (
        "surrogate-key",
        {"\ud800": 1},
        "compile option key '\\ud800' holds invalid Unicode (surrogates not allowed)\n"
        f"{_SURROGATE}",
    ),
]


@pytest.mark.parametrize(
    ("options", "text"), [c[1:] for c in _BAD_OPTIONS], ids=[c[0] for c in _BAD_OPTIONS]
)
def test_bad_compile_options_get_their_exact_error(options: Any, text: str) -> None:
    """Each refused option says which one (its path), what was wrong, and a Fix."""
    with pytest.raises(InvalidProgram) as info:
        Program([], 1, []).kernel_digest(options)
    assert str(info.value) == text


# Encoder errors ----------------------------------------------------------------------------


class _ForeignExpr(Expr):
    __slots__ = ()


class _ForeignStmt(Stmt):
    __slots__ = ()


def test_encoder_errors_are_exact() -> None:
    """Too many buffers, a surrogate name and nodes outside the IR: message and Fix."""
    many = [BufferDecl(f"b{i}", i, "read", "u32") for i in range(257)]
    cases: list[tuple[Program, str]] = [
        (
            Program(many, 1, []),
            f"cannot encode program: 257 buffers, over MAX_BUFFERS (256)\nFix: {_ENCODE_FIX}",
        ),
        (
            Program([], 1, [Let("\ud800", u32(0))]),
            "cannot encode program: name '\\ud800' is not valid Unicode (surrogates not "
            "allowed)\nFix: use names without lone surrogate code points",
        ),
        (
            Program([], 1, [Let("x", _ForeignExpr())]),
            "cannot encode program: _ForeignExpr is not an IR expression node\n"
            "Fix: build expressions only from the classes of vyre_async.ir (no subclasses)",
        ),
        (
            Program([], 1, [_ForeignStmt()]),
            "cannot encode program: _ForeignStmt is not an IR statement node\n"
            "Fix: build statements only from the classes of vyre_async.ir (no subclasses)",
        ),
    ]
    for program, text in cases:
        with pytest.raises(InvalidProgram) as info:
            program.to_wire()
        assert str(info.value) == text


# Tables built at import --------------------------------------------------------------------


def test_code_tables_are_inverted_and_tagged_byte_by_byte() -> None:
    """The helpers that build the decoder's and encoder's tables (run only at import)."""
    for codes, table in (
        (wire.DTYPE_CODES, wire._DTYPES),
        (wire.ACCESS_CODES, wire._ACCESSES),
        (wire.BIN_OP_CODES, wire._BIN_OPS),
    ):
        inverted = wire._invert(codes)
        by_byte = {code: inverted[code] for code in range(256)}
        assert by_byte == {code: table[code] for code in range(256)}
        assert {by_byte[code]: code for code in codes.values()} == dict(codes)
        assert sum(m is not None for m in by_byte.values()) == len(codes)
    assert wire._tag_bytes(5, {"x": 3, "y": 0}) == {"x": b"\x05\x03", "y": b"\x05\x00"}


# Encoder limits at the limit and one over --------------------------------------------------

_L = u32(1)
_WRAPS: dict[str, Callable[[Expr], Expr]] = {
    "load": lambda e: Load("o", e),
    "bin-a": lambda e: Bin("add", e, _L),
    "bin-b": lambda e: Bin("add", _L, e),
    "un": lambda e: Un("neg", e),
    "cast": lambda e: Cast("u32", e),
    "select-cond": lambda e: Select(e, _L, _L),
    "select-true": lambda e: Select(_L, e, _L),
    "select-false": lambda e: Select(_L, _L, e),
    "fma-a": lambda e: Fma(e, _L, _L),
    "fma-b": lambda e: Fma(_L, e, _L),
    "fma-c": lambda e: Fma(_L, _L, e),
    "atomic-index": lambda e: Atomic("add", "o", e, _L),
    "atomic-value": lambda e: Atomic("add", "o", _L, e),
    "atomic-expected": lambda e: Atomic("cas", "o", _L, _L, expected=e),
}
_TOO_DEEP_TO_ENCODE = (
    "cannot encode program: an expression is nested deeper than MAX_EXPR_DEPTH (128)\n"
    f"Fix: {_ENCODE_FIX}"
)


def _encode_error(program: Program) -> str:
    with pytest.raises(InvalidProgram) as info:
        program.to_wire()
    return str(info.value)


@pytest.mark.parametrize("wrap", list(_WRAPS.values()), ids=list(_WRAPS))
def test_encoder_depth_limit_through_every_child(wrap: Callable[[Expr], Expr]) -> None:
    """A chain through each child is encoded at MAX_EXPR_DEPTH and refused one deeper."""
    e: Expr = _L
    for _ in range(MAX_EXPR_DEPTH - 1):
        e = wrap(e)
    ok = Program([], 1, [Let("x", e)])
    assert Program.from_wire(ok.to_wire()) == ok
    assert _encode_error(Program([], 1, [Let("x", wrap(e))])) == _TOO_DEEP_TO_ENCODE


_SLOTS: dict[str, Callable[[Expr], Stmt]] = {
    "let": lambda e: Let("x", e),
    "assign": lambda e: Assign("x", e),
    "store-index": lambda e: Store("o", e, _L),
    "store-value": lambda e: Store("o", _L, e),
    "if": lambda e: If(e, []),
    "loop-start": lambda e: Loop("i", e, _L, []),
    "loop-end": lambda e: Loop("i", _L, e, []),
}


@pytest.mark.parametrize("slot", list(_SLOTS.values()), ids=list(_SLOTS))
def test_encoder_depth_limit_in_every_statement_slot(slot: Callable[[Expr], Stmt]) -> None:
    """Each statement's expressions start at depth 1 in the encoder too."""
    ok = Program([], 1, [slot(_deep(MAX_EXPR_DEPTH))])
    assert Program.from_wire(ok.to_wire()) == ok
    assert _encode_error(Program([], 1, [slot(_deep(MAX_EXPR_DEPTH + 1))])) == _TOO_DEEP_TO_ENCODE


_TOO_MANY_TO_ENCODE = (
    f"cannot encode program: the program has more than MAX_NODES (100000) nodes\nFix: {_ENCODE_FIX}"
)
# The last statement of a program padded with Returns, and its node count (statement
# and expression nodes, as docs/wire-format.md counts them).
_COUNTED: dict[str, tuple[Stmt, int]] = {
    "return": (Return(), 1),
    "let-leaf": (Let("x", _L), 2),
    "let-load": (Let("x", Load("o", _L)), 3),
    "let-bin": (Let("x", Bin("add", _L, _L)), 4),
    "let-un": (Let("x", Un("neg", _L)), 3),
    "let-cast": (Let("x", Cast("f32", _L)), 3),
    "let-select": (Let("x", Select(_L, _L, _L)), 5),
    "let-fma": (Let("x", Fma(_L, _L, _L)), 5),
    "let-atomic": (Let("x", Atomic("add", "o", _L, _L)), 4),
    "let-cas": (Let("x", Atomic("cas", "o", _L, _L, expected=_L)), 5),
    "assign": (Assign("x", _L), 2),
    "store": (Store("o", _L, _L), 3),
    "if": (If(_L, [Return()], [Return()]), 4),
    "loop": (Loop("i", _L, _L, [Return()]), 4),
    "block": (Block([Return(), Return()]), 3),
}


@pytest.mark.parametrize(("last", "count"), list(_COUNTED.values()), ids=list(_COUNTED))
def test_encoder_node_limit_counts_every_node_kind(last: Stmt, count: int) -> None:
    """MAX_NODES nodes encode; one more is refused, whatever the kind of the last node."""
    pad = [Return()] * (MAX_NODES - count)
    assert count_nodes(Program([], 1, [last])) == count
    Program([], 1, [*pad, last]).to_wire()  # no error at the limit
    assert _encode_error(Program([], 1, [Return(), *pad, last])) == _TOO_MANY_TO_ENCODE


@pytest.mark.parametrize("n", [255, 256, 257, 300])
def test_long_bodies_encode_their_count(n: int) -> None:
    """A body of n statements is written as u32 n then the statements."""
    p = Program([], 1, [Return()] * n)
    data = p.to_wire()
    assert data[40:] == _head() + _u32(n) + b"\x05" * n
    assert Program.from_wire(data) == p


def test_over_long_names_are_refused_by_the_encoder() -> None:
    """The name, its first 40 characters, its UTF-8 length and the limit."""
    fix = f"\nFix: {_ENCODE_FIX}"
    long_name = "n" * 257
    assert _encode_error(Program([], 1, [Let(long_name, _L)])) == (
        f"cannot encode program: name {'n' * 40!r}... is 257 UTF-8 bytes, over "
        f"MAX_NAME_BYTES (256){fix}"
    )
    assert _encode_error(Program([], 1, [], op_id="é" * 129)) == (
        f"cannot encode program: op_id {'é' * 40!r}... is 258 UTF-8 bytes, over "
        f"MAX_NAME_BYTES (256){fix}"
    )
    assert _encode_error(Program([BufferDecl(long_name, 0, "read", "u32")], 1, [])) == (
        f"cannot encode program: buffer name {'n' * 40!r}... is 257 UTF-8 bytes, over "
        f"MAX_NAME_BYTES (256){fix}"
    )


def _block_chain(levels: int) -> Stmt:
    s: Stmt = Block([])
    for _ in range(levels - 1):
        s = Block([s])
    return s


@pytest.mark.parametrize("chain", [_if_then_chain, _if_else_chain, _loop_chain, _block_chain])
def test_encoder_refuses_one_level_past_max_stmt_depth(chain: Callable[[int], Stmt]) -> None:
    """Ifs (through then or else), Loops or Blocks one level too deep: exact error."""
    assert _encode_error(Program([], 1, [chain(MAX_STMT_DEPTH + 1)])) == (
        "cannot encode program: statements are nested deeper than MAX_STMT_DEPTH (64)\n"
        f"Fix: {_ENCODE_FIX}"
    )
    ok = Program([], 1, [chain(MAX_STMT_DEPTH)])
    assert Program.from_wire(ok.to_wire()) == ok


def test_max_buffers_encode() -> None:
    """Exactly MAX_BUFFERS buffers encode and decode."""
    p = Program([BufferDecl(f"b{i:03}", i, "read", "u32") for i in range(256)], 1, [])
    assert Program.from_wire(p.to_wire()) == p


def _entry(name: str, binding: int, access: int, dtype: int, count: int) -> bytes:
    return _str(name) + _u32(binding) + bytes([access, dtype]) + _u32(count)


def test_buffer_table_order_breaks_every_tie() -> None:
    """Workgroup last, then binding, name, access code, dtype code and count."""
    p = Program(
        [
            BufferDecl("s", 0, "workgroup", "u32", 8),
            BufferDecl("z", 5, "read", "u32", 1),
            BufferDecl("a", 0, "write", "u32", 1),
            BufferDecl("a", 0, "read", "f32", 2),
            BufferDecl("a", 0, "read", "u32", 3),
            BufferDecl("a", 0, "read", "u32", 2),
            BufferDecl("b", 0, "read", "u32", 0),
        ],
        1,
        [],
    )
    table = (
        _u32(7)
        + _entry("a", 0, 0, 0, 2)
        + _entry("a", 0, 0, 0, 3)
        + _entry("a", 0, 0, 2, 2)
        + _entry("a", 0, 3, 0, 1)
        + _entry("b", 0, 0, 0, 0)
        + _entry("z", 5, 0, 0, 1)
        + _entry("s", 0, 4, 0, 8)
    )
    data = p.to_wire()
    assert data[40:] == _head(table) + _u32(0)
    assert Program.from_wire(data) == p
    zeroed = (
        _u32(7)
        + _entry("a", 0, 0, 0, 0) * 2
        + _entry("a", 0, 0, 2, 0)
        + _entry("a", 0, 3, 0, 0)
        + _entry("b", 0, 0, 0, 0)
        + _entry("z", 5, 0, 0, 0)
        + _entry("s", 0, 4, 0, 8)
    )
    assert p.kernel_digest() == blake3(_DOMAIN + _head(zeroed) + _u32(0) + _u32(0)).digest()
