"""The expression sugar and builtins, pinned exactly (triage of surviving mutants, issue 28).

A frontend writes ``gid() * 4 + 1`` or ``1 - x``; each Python operator must
build the `Bin` the IR defines, with the operands in the order written (a
reflected operator swapped would compute ``x - 1`` for ``1 - x``). These tests
pin every operator, reflected and not, every named comparison, and the
builtin helpers' kind and axis.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import pytest

import vyre_async.ir as ir
from vyre_async.ir import Bin, Builtin, BuiltinKind, Cast, DType, Expr, Un, Var, i32, u32
from vyre_async.ir.expr import gid, lid, nwg, wgid

X = Var("x")

BINARY: list[tuple[Callable[[object, object], object], str]] = [
    (operator.add, "add"),
    (operator.sub, "sub"),
    (operator.mul, "mul"),
    (operator.truediv, "div"),
    (operator.floordiv, "div"),
    (operator.mod, "mod"),
    (operator.and_, "and"),
    (operator.or_, "or"),
    (operator.xor, "xor"),
    (operator.lshift, "shl"),
    (operator.rshift, "shr"),
]


@pytest.mark.parametrize(("apply", "op"), BINARY, ids=[f.__name__ for f, _ in BINARY])
def test_each_operator_builds_its_bin_with_operands_as_written(
    apply: Callable[[object, object], object], op: str
) -> None:
    assert apply(X, 3) == Bin(op, X, u32(3))
    assert apply(3, X) == Bin(op, u32(3), X)  # the reflected form keeps the order written
    assert apply(X, Var("y")) == Bin(op, X, Var("y"))
    assert apply(-2, X) == Bin(op, i32(-2), X)


@pytest.mark.parametrize(
    ("method", "op"),
    [
        ("eq", "eq"),
        ("ne", "ne"),
        ("lt", "lt"),
        ("le", "le"),
        ("gt", "gt"),
        ("ge", "ge"),
        ("min", "min"),
        ("max", "max"),
        ("land", "land"),
        ("lor", "lor"),
    ],
)
def test_each_named_method_builds_its_bin(method: str, op: str) -> None:
    built = getattr(X, method)(Var("y"))
    assert built == Bin(op, X, Var("y"))
    assert getattr(X, method)(5) == Bin(op, X, u32(5))


def test_unary_operators_and_cast() -> None:
    assert Un("neg", X) == -X
    assert Un("not", X) == ~X
    assert X.cast("f32") == Cast(DType.F32, X)


@pytest.mark.parametrize(
    ("helper", "kind"),
    [
        (gid, BuiltinKind.GID),
        (lid, BuiltinKind.LID),
        (wgid, BuiltinKind.WGID),
        (nwg, BuiltinKind.NWG),
    ],
)
def test_builtin_helpers_name_their_kind_and_axis(
    helper: Callable[..., Expr], kind: BuiltinKind
) -> None:
    assert helper() == Builtin(kind, 0)
    assert helper(2) == Builtin(kind, 2)
    assert helper(1) != Builtin(kind, 0)
    built = helper(1)
    assert isinstance(built, Builtin)
    assert (built.kind, built.axis) == (kind, 1)


REPRS = [
    "f32(1.5)",
    "f32(float('inf'))",
    "f32(float('-inf'))",
    "f32(float('nan'))",
    "Const(DType.BOOL, True)",
    "u32(3)",
    "i32(-2)",
    "Atomic('add', 'x', u32(0), u32(1))",
    "Atomic('cas', 'x', u32(0), u32(1), expected=u32(2))",
    "If(Var('a'), [Return()], [Barrier()])",
    "If(Var('a'), [Return()])",
    "BufferDecl('x', 0, Access.READ_WRITE, DType.U32, 4)",
    "BufferDecl('x', 0, Access.READ, DType.F32)",
    "Program([BufferDecl('x', 0, Access.READ_WRITE, DType.U32)], (4, 1, 1), "
    "[Store('x', gid(0), u32(1))])",
]


@pytest.mark.parametrize("text", REPRS)
def test_a_nodes_repr_is_the_code_that_builds_it(text: str) -> None:
    namespace = {name: getattr(ir, name) for name in ir.__all__}
    node = eval(text, namespace)
    assert repr(node) == text
    assert eval(repr(node), namespace) == node
