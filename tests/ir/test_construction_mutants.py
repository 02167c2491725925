"""Building IR nodes from bad arguments: each error names the argument (issue 28 triage).

A frontend author who passes a wrong value to a constructor gets an
`InvalidProgram` at once, naming the field and the node it belongs to
(``If.orelse``, ``Loop variable``, ``buffer 'x': count``), with a Fix. These
tests pin each of those messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Assign,
    Atomic,
    Bin,
    Block,
    BufferDecl,
    Cast,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Un,
    Var,
    gid,
    u32,
)
from vyre_async.ir.expr import Builtin, f32_bits
from vyre_async.ir.stmt import as_body
from vyre_async.ir.types import as_dtype

BODY_FIX = "Fix: pass a list such as [Let(...), Store(...)]"
DTYPES = "Fix: use one of 'u32', 'i32', 'f32', 'bool'"
FIVE: Any = 5  # (a wrong type, on purpose)
THREE: Any = 3
ONE_AND_A_HALF: Any = 1.5
TEXT: Any = "x"
TEXT_A: Any = "a"
ONE_FLOAT: Any = (1.0,)

B = BufferDecl("x", 0, "read", "u32")
WG_FIX = "Fix: pass e.g. 64 or (16, 16)"
WG_AXES = "workgroup_size must hold 1 to 3 non-negative ints, got"
STMT_FIX = "Fix: wrap expressions in a statement: Let, Assign or Store"
DECL_FIX = "Fix: declare each buffer with BufferDecl(name, binding, access, dtype, count)"

CASES: list[tuple[str, Callable[[], object], str]] = [
    (
        "load-buffer",
        lambda: Load(FIVE, u32(0)),
        "a buffer is referenced by its name (str) or BufferDecl, got 5\n"
        "Fix: pass the buffer's name",
    ),
    (
        "lift",
        lambda: Bin("add", TEXT, 1),
        "expected an expression or a number, got str: 'x'\n"
        "Fix: build the value with u32(...), i32(...), f32(...), Var(...) or Load(...)",
    ),
    ("axis", lambda: gid(3), "builtin axis must be 0, 1 or 2, got 3\nFix: use axis 0, 1 or 2"),
    (
        "var",
        lambda: Var(""),
        "variable name must be a non-empty str, got ''\nFix: name variables with non-empty strings",
    ),
    (
        "wg-type",
        lambda: Program([B], TEXT_A, []),
        f"workgroup_size must be an int or a tuple of 1 to 3 ints, got 'a'\n{WG_FIX}",
    ),
    ("wg-axes", lambda: Program([B], (1, 2, 3, 4), []), f"{WG_AXES} (1, 2, 3, 4)\n{WG_FIX}"),
    ("wg-none", lambda: Program([B], (), []), f"{WG_AXES} ()\n{WG_FIX}"),
    ("wg-big", lambda: Program([B], 2**32, []), f"{WG_AXES} 4294967296\n{WG_FIX}"),
    ("wg-big-axis", lambda: Program([B], (1, 2**32), []), f"{WG_AXES} (1, 4294967296)\n{WG_FIX}"),
    ("wg-negative", lambda: Program([B], (-1,), []), f"{WG_AXES} (-1,)\n{WG_FIX}"),
    ("wg-bool", lambda: Program([B], (True,), []), f"{WG_AXES} (True,)\n{WG_FIX}"),
    ("wg-float", lambda: Program([B], ONE_FLOAT, []), f"{WG_AXES} (1.0,)\n{WG_FIX}"),
    (
        "buffers-items",
        lambda: Program([FIVE], 1, []),
        f"buffers must be BufferDecl items, got [5]\n{DECL_FIX}",
    ),
    (
        "buffers",
        lambda: Program(FIVE, 1, []),
        f"buffers must be BufferDecl items, got 5\n{DECL_FIX}",
    ),
    (
        "op-id",
        lambda: Program([B], 1, [], op_id=THREE),
        "op_id must be a str, got 3\nFix: pass a str",
    ),
    (
        "program-body",
        lambda: Program([B], 1, FIVE),
        f"Program.body must be a list of statements, got 5\n{BODY_FIX}",
    ),
    (
        "program-item",
        lambda: Program([B], 1, [FIVE]),
        f"Program.body[0] is a int, not a statement: 5\n{STMT_FIX}",
    ),
    ("as-body", lambda: as_body(FIVE), f"body must be a list of statements, got 5\n{BODY_FIX}"),
    (
        "as-body-item",
        lambda: as_body([Let("v", 1), "s"]),
        f"body[1] is a str, not a statement: 's'\n{STMT_FIX}",
    ),
    (
        "let",
        lambda: Let("", u32(1)),
        "Let name must be a non-empty str, got ''\nFix: give the Let name a name",
    ),
    (
        "assign",
        lambda: Assign(THREE, u32(1)),
        "Assign name must be a non-empty str, got 3\nFix: give the Assign name a name",
    ),
    (
        "loop-var",
        lambda: Loop("", 0, 1, []),
        "Loop variable must be a non-empty str, got ''\nFix: give the Loop variable a name",
    ),
    ("if-then", lambda: If(True, FIVE), f"If.then must be a list of statements, got 5\n{BODY_FIX}"),
    (
        "if-orelse",
        lambda: If(True, [], FIVE),
        f"If.orelse must be a list of statements, got 5\n{BODY_FIX}",
    ),
    ("block", lambda: Block(FIVE), f"Block.body must be a list of statements, got 5\n{BODY_FIX}"),
    (
        "loop-body",
        lambda: Loop("i", 0, 1, FIVE),
        f"Loop.body must be a list of statements, got 5\n{BODY_FIX}",
    ),
    (
        "buffer-name",
        lambda: BufferDecl("", 0, "read", "u32"),
        "buffer name must be a non-empty str, got ''\nFix: name buffers with strings",
    ),
    (
        "buffer-name-type",
        lambda: BufferDecl(FIVE, 0, "read", "u32"),
        "buffer name must be a non-empty str, got 5\nFix: name buffers with strings",
    ),
    (
        "binding-bool",
        lambda: BufferDecl("x", True, "read", "u32"),
        "buffer 'x': binding must be an int, got True\nFix: pass an integer binding",
    ),
    (
        "count-float",
        lambda: BufferDecl("x", 0, "read", "u32", ONE_AND_A_HALF),
        "buffer 'x': count must be an int, got 1.5\nFix: pass an integer count",
    ),
    (
        "binding-range",
        lambda: BufferDecl("x", -1, "read", "u32"),
        "buffer 'x': binding -1 is outside 0..4294967295\n"
        "Fix: use a binding that fits in an unsigned 32-bit integer",
    ),
    (
        "dtype",
        lambda: BufferDecl("x", 0, "read", "u8"),
        f"buffer dtype 'u8' is not a DType\n{DTYPES}",
    ),
    ("as-dtype", lambda: as_dtype("q"), f"buffer dtype 'q' is not a DType\n{DTYPES}"),
    (
        "as-dtype-what",
        lambda: as_dtype("q", "cast dtype"),
        f"cast dtype 'q' is not a DType\n{DTYPES}",
    ),
]


@pytest.mark.parametrize(("build", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_bad_argument_is_named_with_a_fix(build: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidProgram) as info:
        build()
    assert str(info.value) == message


ENUMS: list[tuple[Callable[[], object], str, str, str]] = [
    (
        lambda: Atomic("nope", "x", 0, 1),
        "atomic operator",
        "AtomicOp",
        "'add', 'or', 'and', 'xor', 'min', 'max', 'exchange', 'cas'",
    ),
    (
        lambda: Bin("nope", 1, 1),
        "binary operator",
        "BinOp",
        "'add', 'sub', 'mul', 'div', 'mod', 'min', 'max', 'and', 'or', 'xor', 'shl', 'shr', "
        "'eq', 'ne', 'lt', 'le', 'gt', 'ge', 'land', 'lor', 'mulhi'",
    ),
    (lambda: Builtin("nope"), "builtin kind", "BuiltinKind", "'gid', 'lid', 'wgid', 'nwg'"),
    (lambda: Cast("nope", 1), "cast target dtype", "DType", "'u32', 'i32', 'f32', 'bool'"),
    (
        lambda: Un("nope", 1),
        "unary operator",
        "UnOp",
        "'neg', 'not', 'lnot', 'popcount', 'clz', 'ctz', 'abs', 'sqrt', 'rsqrt', 'exp', 'log', "
        "'sin', 'cos', 'tanh', 'floor', 'ceil', 'round', 'trunc'",
    ),
]


@pytest.mark.parametrize(("build", "what", "enum", "choices"), ENUMS, ids=[e[1] for e in ENUMS])
def test_each_unknown_name_lists_the_choices(
    build: Callable[[], object], what: str, enum: str, choices: str
) -> None:
    with pytest.raises(InvalidProgram) as info:
        build()
    assert re.fullmatch(
        f"{re.escape(what)} 'nope' is not {'an' if enum[0] in 'AEIO' else 'a'} {enum}\n"
        f"Fix: use one of {re.escape(choices)}",
        str(info.value),
    )


def test_workgroup_sizes_at_the_u32_limit_and_numpy_ints_are_taken() -> None:
    assert Program([B], (2**32 - 1,), []).workgroup_size == (2**32 - 1, 1, 1)
    four: Any = np.int64(4)
    assert Program([B], four, []).workgroup_size == (4, 1, 1)
    mixed: Any = [2, np.uint16(3)]
    assert Program([B], mixed, []).workgroup_size == (2, 3, 1)


def test_an_f32_beyond_binary32_rounds_to_the_infinity_of_its_sign() -> None:
    assert f32_bits(1e39) == 0x7F80_0000
    assert f32_bits(-1e39) == 0xFF80_0000


def test_a_bad_access_is_named_with_the_choices() -> None:
    with pytest.raises(InvalidProgram) as info:
        BufferDecl("x", 0, "nope", "u32")
    assert re.fullmatch(
        r"buffer access 'nope' is not an Access\n"
        r"Fix: use one of 'read', 'read_write', 'uniform', 'write', 'workgroup'",
        str(info.value),
    )


def test_good_values_are_kept_whatever_their_integer_type() -> None:
    binding: Any = np.uint32(3)
    count: Any = np.int64(7)
    decl = BufferDecl("x", binding, "read", "u32", count)
    assert (decl.binding, decl.count) == (3, 7)
    assert type(decl.binding) is int and type(decl.count) is int
    assert as_dtype("f32").value == "f32"


def test_binding_and_count_at_the_u32_limit_and_one_past_it() -> None:
    top = 0xFFFF_FFFF
    decl = BufferDecl("x", top, "read", "u32", top)
    assert (decl.binding, decl.count) == (top, top)
    for binding, count, field in ((top + 1, 0, "binding"), (0, top + 1, "count")):
        with pytest.raises(InvalidProgram, match=f"{field} {top + 1} is outside 0..{top}"):
            BufferDecl("x", binding, "read", "u32", count)


def test_a_single_statement_is_a_body_of_one() -> None:
    assert If(True, Return()).then == (Return(),)
    assert Loop("i", 0, 1, Return()).body == (Return(),)
    assert as_body(Return()) == (Return(),)
