"""The IR data model: construction, normalisation, equality, hashing, repr, sugar."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from vyre_async import ErrorCode, InvalidProgram
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    AtomicOp,
    Barrier,
    Bin,
    BinOp,
    Block,
    BufferDecl,
    BufLen,
    Builtin,
    BuiltinKind,
    Cast,
    Const,
    DType,
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
    f32,
    gid,
    i32,
    lid,
    nwg,
    u32,
    wgid,
)
from vyre_async.ir.ops import bin_result, un_result


def _xor(order: str = "sorted") -> Program:
    decls = [
        BufferDecl("a", 0, Access.READ, DType.U32),
        BufferDecl("b", 1, "read", "u32"),
        BufferDecl("out", 2, Access.WRITE, DType.U32, 16),
    ]
    if order == "reversed":
        decls.reverse()
    i = Var("i")
    return Program(
        decls,
        64,
        [Let("i", gid()), If(i.lt(BufLen("out")), [Store("out", i, Load("a", i) ^ Load("b", i))])],
    )


def test_buffers_are_kept_sorted_by_binding() -> None:
    p = _xor("reversed")
    assert [b.name for b in p.buffers] == ["a", "b", "out"]
    assert p == _xor()
    assert hash(p) == hash(_xor())


def test_workgroup_size_is_normalised_to_three_axes() -> None:
    assert _xor().workgroup_size == (64, 1, 1)
    p = Program([], (8, 4), [])
    assert p.workgroup_size == (8, 4, 1)
    assert p.lanes_per_workgroup == 32


@pytest.mark.parametrize("bad", [(), (1, 2, 3, 4), "64", 1.5, (True, 1), (-1,)])
def test_bad_workgroup_size_raises_with_fix(bad: object) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        Program([], bad, [])  # type: ignore[arg-type]


def test_strings_and_enums_build_equal_nodes() -> None:
    assert Bin("add", gid(), u32(1)) == Bin(
        BinOp.ADD, Builtin(BuiltinKind.GID, 0), Const(DType.U32, 1)
    )
    assert Un("sqrt", f32(2.0)).op is UnOp.SQRT
    assert Atomic("cas", "h", 0, 1, expected=0).op is AtomicOp.CAS
    assert BufferDecl("x", 0, "read_write", "f32").access is Access.READ_WRITE


@pytest.mark.parametrize(
    "build",
    [
        lambda: Bin("frob", u32(1), u32(2)),
        lambda: Un("sin2", f32(1.0)),
        lambda: Atomic("nand", "h", 0, 1),
        lambda: BufferDecl("x", 0, "readonly", "u32"),
        lambda: BufferDecl("x", 0, "read", "u64"),
        lambda: BufferDecl("x", -1, "read", "u32"),
        lambda: BufferDecl("x", 0, "read", "u32", 2**32),
        lambda: BufferDecl(3, 0, "read", "u32"),  # type: ignore[arg-type]
        lambda: Builtin("gid", 3),
        lambda: Builtin("tid", 0),
        lambda: Var(""),
        lambda: Let("", u32(0)),
        lambda: Store(7, 0, 0),  # type: ignore[arg-type]
        lambda: If(u32(1), [u32(3)]),  # type: ignore[list-item]
        lambda: Program([1], 1, []),  # type: ignore[list-item]
        lambda: Program([], 1, [], op_id=3),  # type: ignore[arg-type]
        lambda: Load("a", "zero"),  # type: ignore[arg-type]
        lambda: If(u32(1), 5),  # type: ignore[arg-type]
        lambda: Block("Return()"),
    ],
)
def test_malformed_nodes_raise_invalid_program_with_fix(build: object) -> None:
    with pytest.raises(InvalidProgram, match="Fix:") as info:
        build()  # type: ignore[operator]
    assert info.value.code is ErrorCode.InvalidProgram


@pytest.mark.parametrize(
    ("build", "ok"),
    [
        (lambda: u32(0), True),
        (lambda: u32(2**32 - 1), True),
        (lambda: u32(2**32), False),
        (lambda: u32(-1), False),
        (lambda: i32(-(2**31)), True),
        (lambda: i32(2**31), False),
        (lambda: u32(True), False),
        (lambda: Const(DType.BOOL, 2), False),
        (lambda: Const(DType.F32, "1"), False),
    ],
)
def test_constant_ranges(build: object, ok: bool) -> None:
    if ok:
        build()  # type: ignore[operator]
    else:
        with pytest.raises(InvalidProgram, match="Fix:"):
            build()  # type: ignore[operator]


def test_f32_constants_are_binary32_and_compare_by_bits() -> None:
    assert f32(0.1).value == float(np.float32(0.1))
    assert f32(-0.0) != f32(0.0)
    assert hash(f32(-0.0)) != hash(f32(0.0))
    assert f32(math.nan) == f32(-math.nan)
    assert f32(math.nan).bits == 0x7FC00000
    assert f32(1e39).bits == 0x7F800000  # overflow rounds to +inf
    assert f32(1e-45).bits == 1  # smallest subnormal survives
    assert i32(-1).bits == 0xFFFFFFFF
    assert Const(DType.BOOL, 1).value is True


def test_python_numbers_are_lifted() -> None:
    assert Store("out", 3, 1.5).index == u32(3)
    assert Store("out", 3, 1.5).value == f32(1.5)
    assert Store("out", 0, -2).value == i32(-2)
    assert Select(True, 1, 2).cond == Const(DType.BOOL, True)


def test_operator_sugar_builds_ir() -> None:
    x = Var("x")
    assert x + 1 == Bin("add", x, u32(1))
    assert 1 - x == Bin("sub", u32(1), x)
    assert x * x / x % x == Bin("mod", Bin("div", Bin("mul", x, x), x), x)
    assert (x & 1, x | 1, x ^ 1) == (Bin("and", x, 1), Bin("or", x, 1), Bin("xor", x, 1))
    assert (x << 2, x >> 2) == (Bin("shl", x, 2), Bin("shr", x, 2))
    assert -x == Un("neg", x) and ~x == Un("not", x)
    assert x.lt(1).op is BinOp.LT and x.ge(1).op is BinOp.GE and x.ne(1).op is BinOp.NE
    assert x.min(1).op is BinOp.MIN and x.max(1).op is BinOp.MAX
    assert x.cast("f32") == Cast(DType.F32, x)
    assert x.lt(1).land(x.gt(0)).op is BinOp.LAND
    assert (x == x) is True  # structural equality, not an IR node


def test_repr_round_trips_through_eval() -> None:
    p = Program(
        [
            BufferDecl("h", 0, Access.READ_WRITE, DType.U32),
            BufferDecl("s", 1, Access.WORKGROUP, DType.F32, 8),
        ],
        (8, 1, 1),
        [
            Let("x", Fma(f32(1.0), f32(math.inf), f32(-0.0))),
            Loop("k", u32(0), nwg(), [Assign("x", Var("x") + f32(1e-40))]),
            Block([Let("y", Atomic("cas", "h", lid(), u32(1), expected=u32(0)))]),
            If(wgid().eq(0), [Barrier()], [Return()]),
            Let("z", Select(Const(DType.BOOL, True), Un("clz", i32(-5)), i32(0))),
        ],
        op_id="demo",
    )
    namespace = {name: obj for name, obj in globals().items() if not name.startswith("_")}
    namespace["float"] = float
    assert eval(repr(p), namespace) == p


def test_programs_are_immutable_hashable_and_pickle() -> None:
    p = _xor()
    with pytest.raises(AttributeError):
        p.op_id = "x"  # type: ignore[misc]
    assert {p: 1}[_xor()] == 1
    clone = pickle.loads(pickle.dumps(p))
    assert clone == p and hash(clone) == hash(p)


def test_inputs_outputs_and_lookup() -> None:
    p = Program(
        [
            BufferDecl("o", 3, Access.WRITE, DType.U32, 4),
            BufferDecl("u", 1, Access.UNIFORM, DType.U32, 1),
            BufferDecl("rw", 2, Access.READ_WRITE, DType.F32),
            BufferDecl("r", 0, Access.READ, DType.I32),
            BufferDecl("w", 4, Access.WORKGROUP, DType.U32, 8),
        ],
        1,
        [],
    )
    assert [b.name for b in p.inputs] == ["r", "u", "rw"]
    assert [b.name for b in p.outputs] == ["rw", "o"]
    assert [b.name for b in p.workgroup_buffers] == ["w"]
    assert p.buffer("rw").dtype is DType.F32
    with pytest.raises(KeyError):
        p.buffer("nope")


def test_typing_tables() -> None:
    assert bin_result("add", DType.I32) is DType.I32
    assert bin_result("lt", DType.F32) is DType.BOOL
    assert bin_result("shl", DType.F32) is None
    assert bin_result("land", DType.BOOL) is DType.BOOL
    assert bin_result("mulhi", DType.I32) is None
    assert un_result("popcount", DType.I32) is DType.I32
    assert un_result("sqrt", DType.U32) is None
    assert un_result("lnot", DType.BOOL) is DType.BOOL
    for op in BinOp:
        assert any(bin_result(op, d) for d in DType), op
    for uop in UnOp:
        assert any(un_result(uop, d) for d in DType), uop
