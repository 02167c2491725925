"""The IR's walks and operator tables, pinned exactly (triage of surviving mutants, issue 28).

`vyre_async.ir.walk` is what every pass (the validator's flow checks, the
reference compiler, the CUDA lowering) uses to visit a program; the tests in
tests/ir reached it only through programs whose answer did not depend on the
order or completeness of a walk. These pin both: every node kind's children
in evaluation order, the pre-order of nested statements, and the memoised
`uses_atomics` answer. `ops`' tables are pinned per operator.
"""

from __future__ import annotations

import pytest

from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    Bin,
    BinOp,
    Block,
    BufferDecl,
    BuiltinKind,
    Cast,
    DType,
    Expr,
    Fma,
    If,
    Let,
    Load,
    Loop,
    Program,
    Return,
    Select,
    Store,
    Un,
    UnOp,
    Var,
    gid,
    u32,
)
from vyre_async.ir.ops import (
    AtomicOp,
    bin_operand_types,
    bin_result,
    un_operand_types,
    un_result,
)
from vyre_async.ir.walk import (
    child_exprs,
    iter_exprs,
    iter_stmts,
    stmt_exprs,
    uses_atomics,
    uses_workgroup_memory,
)

A, B, C = Var("a"), Var("b"), Var("c")


@pytest.mark.parametrize(
    ("expr", "children"),
    [
        (Load("x", A), (A,)),
        (Bin("add", A, B), (A, B)),
        (Un("neg", A), (A,)),
        (Cast("f32", A), (A,)),
        (Select(A, B, C), (A, B, C)),
        (Fma(A, B, C), (A, B, C)),
        (Atomic("add", "x", A, B), (A, B)),
        (Atomic("cas", "x", A, B, C), (A, B, C)),
        (A, ()),
        (u32(1), ()),
        (gid(), ()),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, tuple) else str(len(v)),
)
def test_child_exprs_are_each_kinds_operands_in_evaluation_order(
    expr: Expr, children: tuple[Expr, ...]
) -> None:
    assert child_exprs(expr) == children


@pytest.mark.parametrize(
    ("stmt", "exprs"),
    [
        (Let("v", A), (A,)),
        (Assign("v", A), (A,)),
        (Store("x", A, B), (A, B)),
        (If(A, [Return()]), (A,)),
        (Loop("i", A, B, [Return()]), (A, B)),
        (Block([Let("v", A)]), ()),
        (Barrier(), ()),
        (Return(), ()),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, tuple) else str(len(v)),
)
def test_stmt_exprs_are_the_statements_own_expressions(
    stmt: object, exprs: tuple[Expr, ...]
) -> None:
    assert stmt_exprs(stmt) == exprs  # type: ignore[arg-type]


def test_iter_stmts_is_pre_order_through_if_loop_and_block() -> None:
    s = [Let(f"s{i}", u32(i)) for i in range(8)]
    nested_if = If(A, [s[1], Block([s[2]])], [s[3]])
    loop = Loop("i", u32(0), u32(2), [s[4], If(B, [s[5]])])
    body = [s[0], nested_if, loop, s[6], Block([s[7]])]
    order = list(iter_stmts(body))
    assert order == [
        s[0],
        nested_if,
        s[1],
        order[3],  # the Block inside the If
        s[2],
        s[3],  # else branch after the then branch
        loop,
        s[4],
        order[8],  # the If inside the loop
        s[5],
        s[6],
        body[4],
        s[7],
    ]
    assert isinstance(order[3], Block) and isinstance(order[8], If)


def test_iter_exprs_is_pre_order_over_every_statement() -> None:
    index = Bin("add", gid(), u32(1))
    value = Select(A, Un("neg", B), Cast("u32", C))
    body = [
        Let("v", Fma(A, B, C)),
        If(Bin("lt", A, B), [Store("x", index, value)]),
        Loop("i", u32(0), Load("y", u32(2)), [Assign("v", Atomic("cas", "x", A, B, C))]),
    ]
    assert list(iter_exprs(body)) == [
        Fma(A, B, C),
        A,
        B,
        C,
        Bin("lt", A, B),
        A,
        B,
        index,
        gid(),
        u32(1),
        value,
        A,
        Un("neg", B),
        B,
        Cast("u32", C),
        C,
        u32(0),
        Load("y", u32(2)),
        u32(2),
        Atomic("cas", "x", A, B, C),
        A,
        B,
        C,
    ]


def _program(body: list[object], *, workgroup: bool = False) -> Program:
    buffers = [BufferDecl("x", 0, Access.READ_WRITE, DType.U32)]
    if workgroup:
        buffers.append(BufferDecl("w", 1, Access.WORKGROUP, DType.U32, 4))
    return Program(buffers, 1, body)  # type: ignore[arg-type]


def test_uses_atomics_finds_an_atomic_anywhere_and_remembers_the_answer() -> None:
    nested = _program(
        [If(Bin("eq", u32(1), u32(1)), [Let("o", Atomic("add", "x", u32(0), u32(1)))])]
    )
    assert uses_atomics(nested) is True
    assert nested.memo["uses_atomics"] is True
    plain = _program([Store("x", u32(0), u32(1))])
    assert uses_atomics(plain) is False
    assert plain.memo["uses_atomics"] is False
    # The memo is what is answered from (a program is immutable, so it never goes stale).
    plain.memo["uses_atomics"] = True
    assert uses_atomics(plain) is True


def test_uses_workgroup_memory_is_whether_a_workgroup_buffer_is_declared() -> None:
    assert uses_workgroup_memory(_program([], workgroup=True)) is True
    assert uses_workgroup_memory(_program([])) is False


def test_operand_type_tables_per_operator() -> None:
    numeric = {DType.U32, DType.I32, DType.F32}
    assert bin_operand_types(BinOp.ADD) == numeric
    assert bin_operand_types(BinOp("eq")) == numeric | {DType.BOOL}
    assert bin_operand_types(BinOp.MULHI) == {DType.U32}
    assert un_operand_types(UnOp.NOT) == {DType.U32, DType.I32}
    assert un_operand_types(UnOp("sqrt")) == {DType.F32}


def test_result_types_same_as_operand_or_fixed() -> None:
    assert un_result(UnOp.NEG, DType.I32) == DType.I32
    assert un_result(UnOp.LNOT, DType.BOOL) == DType.BOOL
    assert un_result(UnOp.NEG, DType.BOOL) is None
    assert bin_result(BinOp.LT, DType.F32) == DType.BOOL
    assert bin_result(BinOp.ADD, DType.F32) == DType.F32


@pytest.mark.parametrize("member", [BinOp.ADD, UnOp.NEG, AtomicOp.CAS, BuiltinKind.GID])
def test_operator_reprs_are_their_wire_names(member: object) -> None:
    assert repr(member) == repr(member.value)  # type: ignore[attr-defined]
    assert repr(member) not in ("None", "")
    assert repr(member).strip("'") == str(member)
