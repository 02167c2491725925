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

import pytest

from vyre_async.errors import InvalidProgram
from vyre_async.ir import Assign, Block, BufferDecl, If, Let, Loop, u32
from vyre_async.ir.types import as_dtype

BODY_FIX = "Fix: pass a list such as [Let(...), Store(...)]"
DTYPES = "Fix: use one of 'u32', 'i32', 'f32', 'bool'"
FIVE: Any = 5  # (a wrong type, on purpose)
THREE: Any = 3
ONE_AND_A_HALF: Any = 1.5

CASES: list[tuple[str, Callable[[], object], str]] = [
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


def test_a_bad_access_is_named_with_the_choices() -> None:
    with pytest.raises(InvalidProgram) as info:
        BufferDecl("x", 0, "nope", "u32")
    assert re.fullmatch(
        r"buffer access 'nope' is not an? Access\n"
        r"Fix: use one of 'read', 'read_write', 'uniform', 'write', 'workgroup'",
        str(info.value),
    )


def test_good_values_are_kept_whatever_their_integer_type() -> None:
    import numpy as np

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
