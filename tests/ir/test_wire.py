"""The canonical wire form: round trips, canonicalisation, digests and a strict decoder."""

from __future__ import annotations

import ast
import inspect
import math
import random
import struct
from typing import Any

import numpy as np
import pytest
from blake3 import blake3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.strategies import count_nodes, programs, small_inputs_for
from vyre_async import InvalidProgram, ir
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
    Expr,
    Fma,
    GridBarrier,
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
    UnOp,
    Var,
    f32,
    gid,
    i32,
    lid,
    u32,
    validate,
    wire,
)
from vyre_async.ir.expr import f32_from_bits
from vyre_async.ir.limits import (
    MAX_BUFFERS,
    MAX_EXPR_DEPTH,
    MAX_NAME_BYTES,
    MAX_NODES,
    MAX_STMT_DEPTH,
)

PROPERTY = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# Helpers ---------------------------------------------------------------------------------


def _u32(n: int) -> bytes:
    return struct.pack("<I", n)


def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return _u32(len(raw)) + raw


def _wire(body: bytes, *, magic: bytes = b"VYIR", version: int = 1, flags: int = 0) -> bytes:
    return magic + struct.pack("<HH", version, flags) + blake3(body).digest() + body


def _body(stmts: bytes, n_stmts: int = 1, buffers: bytes = _u32(0)) -> bytes:
    """A body with an empty op id, workgroup (1, 1, 1), the given buffers and statements."""
    return _str("") + _u32(1) * 3 + buffers + _u32(n_stmts) + stmts


def _reject(data: bytes | bytearray | memoryview, *words: str) -> InvalidProgram:
    with pytest.raises(InvalidProgram) as info:
        Program.from_wire(data)
    text = str(info.value)
    assert "Fix:" in text
    for word in words:
        assert word in text, text
    return info.value


def _reseal(data: bytes) -> bytes:
    """Recompute the header digest of (possibly edited) wire bytes."""
    return data[:8] + blake3(data[40:]).digest() + data[40:]


def _every_kind() -> Program:
    """A program holding every statement and expression kind."""
    i = Var("i")
    return Program(
        [
            BufferDecl("out", 3, Access.WRITE, DType.F32, 16),
            BufferDecl("src", 0, Access.READ, DType.F32),
            BufferDecl("cnt", 1, Access.READ_WRITE, DType.U32, 4),
            BufferDecl("par", 2, Access.UNIFORM, DType.I32, 1),
            BufferDecl("sh", 0, Access.WORKGROUP, DType.U32, 8),
        ],
        (8, 2, 1),
        [
            Let("i", gid()),
            Let("x", Load("src", i)),
            Let("n", Cast(DType.F32, Load("par", u32(0)))),
            Assign("x", Fma(Var("x"), f32(-0.0), Un(UnOp.SQRT, Var("n")))),
            If(
                i.lt(BufLen("out")),
                [Store("out", i, Select(Var("x").gt(f32(1.5)), Var("x"), f32(float("nan"))))],
                [Return()],
            ),
            Barrier(),
            Loop(
                "k",
                u32(0),
                u32(4),
                [
                    Store("sh", lid(), Atomic(AtomicOp.ADD, "cnt", Var("k"), u32(1))),
                    Block([Let("t", Atomic("cas", "sh", u32(0), u32(1), expected=u32(0)))]),
                    Barrier(),
                ],
            ),
            Let("m", Bin(BinOp.MULHI, i, Builtin(BuiltinKind.NWG, 2)) ^ i32(-5).cast("u32")),
        ],
        op_id="test.every_kind",
    )


# Code tables -----------------------------------------------------------------------------

_TABLES: list[tuple[Any, Any]] = [
    (DType, wire.DTYPE_CODES),
    (Access, wire.ACCESS_CODES),
    (BinOp, wire.BIN_OP_CODES),
    (UnOp, wire.UN_OP_CODES),
    (AtomicOp, wire.ATOMIC_OP_CODES),
    (BuiltinKind, wire.BUILTIN_CODES),
]


@pytest.mark.parametrize(("enum", "table"), _TABLES, ids=lambda x: getattr(x, "__name__", ""))
def test_code_tables_cover_every_enum_member(enum: Any, table: Any) -> None:
    assert set(table) == set(enum)
    codes = list(table.values())
    assert len(set(codes)) == len(codes), "codes must be unique"
    assert all(isinstance(c, int) and 0 <= c <= 255 for c in codes)


def _node_classes(base: type) -> set[type]:
    # The public classes, not Expr.__subclasses__(): dataclass(slots=True) leaves the
    # pre-slots class objects behind in that list.
    return {
        obj
        for obj in vars(ir).values()
        if isinstance(obj, type) and issubclass(obj, base) and obj is not base
    }


def test_node_tag_tables_cover_every_node_class() -> None:
    assert set(wire.EXPR_TAGS) == _node_classes(Expr)
    assert set(wire.STMT_TAGS) == _node_classes(Stmt)
    for table in (wire.EXPR_TAGS, wire.STMT_TAGS):
        assert len(set(table.values())) == len(table)


def _names_by_code(table: Any) -> str:
    """The members' names in code order; also checks the codes are exactly 0..n-1."""
    assert sorted(table.values()) == list(range(len(table)))
    members = sorted(table, key=table.__getitem__)
    return " ".join(m.__name__ if isinstance(m, type) else m.value for m in members)


def test_code_tables_are_frozen() -> None:
    # Changing any of these breaks every stored wire form: bump WIRE_VERSION instead.
    assert _names_by_code(wire.DTYPE_CODES) == "u32 i32 f32 bool"
    assert _names_by_code(wire.ACCESS_CODES) == "read read_write uniform write workgroup"
    assert _names_by_code(wire.BIN_OP_CODES) == (
        "add sub mul div mod min max and or xor shl shr eq ne lt le gt ge land lor mulhi"
    )
    assert _names_by_code(wire.UN_OP_CODES) == (
        "neg not lnot popcount clz ctz abs sqrt rsqrt exp log sin cos tanh floor ceil round trunc"
    )
    assert _names_by_code(wire.ATOMIC_OP_CODES) == "add or and xor min max exchange cas"
    assert _names_by_code(wire.BUILTIN_CODES) == "gid lid wgid nwg"
    assert _names_by_code(wire.STMT_TAGS) == (
        "Let Assign Store If Loop Return Block Barrier GridBarrier"
    )
    assert _names_by_code(wire.EXPR_TAGS) == (
        "Const Var Load BufLen Builtin Bin Un Select Cast Fma Atomic"
    )
    with pytest.raises(TypeError):
        wire.DTYPE_CODES[DType.U32] = 9  # type: ignore[index]


def test_golden_bytes_of_a_small_program() -> None:
    p = Program(
        [BufferDecl("o", 1, "write", "u32", 4), BufferDecl("a", 0, "read", "f32")],
        4,
        [Store("o", gid(), Cast("u32", Load("a", gid()) + f32(-0.0)))],
        op_id="g",
    )
    body = (
        _str("g")
        + _u32(4)
        + _u32(1)
        + _u32(1)
        + _u32(2)
        + _str("a")
        + _u32(0)
        + bytes([0, 2])
        + _u32(0)
        + _str("o")
        + _u32(1)
        + bytes([3, 0])
        + _u32(4)
        + _u32(1)
        + bytes([2])
        + _str("o")
        + bytes([4, 0, 0])  # gid(0)
        + bytes([8, 0])  # cast to u32
        + bytes([5, 0])  # add
        + bytes([2])
        + _str("a")
        + bytes([4, 0, 0])
        + bytes([0, 2])
        + _u32(0x8000_0000)  # f32 -0.0
    )
    assert p.to_wire() == b"VYIR\x01\x00\x00\x00" + blake3(body).digest() + body
    assert p.fingerprint() == blake3(body).digest()


def test_wire_module_uses_no_pickle() -> None:
    tree = ast.parse(inspect.getsource(wire))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle", "copyreg"}


# Round trips -----------------------------------------------------------------------------


@PROPERTY
@given(programs())
def test_round_trip_is_exact(p: Program) -> None:
    data = p.to_wire()
    q = Program.from_wire(data)
    assert q == p
    assert q.to_wire() == data  # re-encoding is byte-identical
    assert q.fingerprint() == p.fingerprint() == data[8:40] == blake3(data[40:]).digest()
    fresh = Program(p.buffers, p.workgroup_size, p.body, p.op_id)
    assert wire.fingerprint(fresh) == p.fingerprint()  # not from the memo
    assert Program.from_wire(bytearray(data)) == p
    assert Program.from_wire(memoryview(data)) == p


def test_every_kind_round_trips() -> None:
    p = _every_kind()
    assert Program.from_wire(p.to_wire()) == p
    assert len(p.fingerprint()) == 32
    assert p.fingerprint() == p.to_wire()[8:40]


@PROPERTY
@given(programs())
def test_drawn_programs_are_valid_and_small(p: Program) -> None:
    assert validate(p) == []
    assert count_nodes(p) <= 80


@PROPERTY
@given(st.data())
def test_small_inputs_match_the_input_buffers(data: st.DataObject) -> None:
    p = data.draw(programs())
    inputs = data.draw(small_inputs_for(p))
    assert len(inputs) == len(p.inputs)
    for arr, decl in zip(inputs, p.inputs, strict=True):
        assert arr.dtype == decl.dtype.numpy
        assert arr.ndim == 1
        if decl.count:
            assert len(arr) == decl.count
        else:
            assert 0 <= len(arr) <= 16


# Construction variants -------------------------------------------------------------------


def _variant_expr(e: Expr, rnd: random.Random, decls: dict[str, BufferDecl]) -> Any:
    def sub(x: Expr) -> Any:
        return _variant_expr(x, rnd, decls)

    def name(enum_value: Any) -> Any:
        return enum_value.value if rnd.random() < 0.5 else enum_value

    def buf(n: str) -> Any:
        return decls[n] if rnd.random() < 0.5 else n

    match e:
        case Const(dtype=DType.U32, value=v) if rnd.random() < 0.5:
            return rnd.choice([u32(int(v)), int(v)]) if int(v) < 2**31 else u32(int(v))
        case Const(dtype=DType.I32, value=v) if int(v) < 0 and rnd.random() < 0.5:
            return rnd.choice([i32(int(v)), int(v)])
        case Const(dtype=DType.F32, value=v) if rnd.random() < 0.5:
            return rnd.choice([f32(float(v)), float(v)])
        case Const(dtype=DType.BOOL, value=v) if rnd.random() < 0.5:
            return bool(v)
        case Const(dtype=dtype, value=v):
            return Const(name(dtype), v)
        case Builtin(kind=BuiltinKind.GID, axis=0) if rnd.random() < 0.5:
            return gid()
        case Builtin(kind=BuiltinKind.LID, axis=axis) if rnd.random() < 0.5:
            return lid(axis)
        case Builtin(kind=kind, axis=axis):
            return Builtin(name(kind), axis)
        case Var(name=n):
            return Var(n)
        case BufLen(buffer=n):
            return BufLen(buf(n))
        case Load(buffer=n, index=index):
            return Load(buf(n), sub(index))
        case Bin(op=op, a=a, b=b):
            return Bin(name(op), sub(a), sub(b))
        case Un(op=op, a=a):
            return Un(name(op), sub(a))
        case Select(cond=c, if_true=t, if_false=f):
            return Select(sub(c), sub(t), sub(f))
        case Cast(dtype=dtype, value=v):
            return Cast(name(dtype), sub(v))
        case Fma(a=a, b=b, c=c):
            return Fma(sub(a), sub(b), sub(c))
        case Atomic(op=op, buffer=n, index=index, value=v, expected=x):
            expected = None if x is None else sub(x)
            return Atomic(name(op), buf(n), sub(index), sub(v), expected)
    raise AssertionError(e)


def _variant_body(body: tuple[Stmt, ...], rnd: random.Random, decls: dict[str, BufferDecl]) -> Any:
    out = [_variant_stmt(s, rnd, decls) for s in body]
    return out if rnd.random() < 0.5 else tuple(out)


def _variant_stmt(s: Stmt, rnd: random.Random, decls: dict[str, BufferDecl]) -> Stmt:
    def e(x: Expr) -> Any:
        return _variant_expr(x, rnd, decls)

    match s:
        case Let(name=n, value=v):
            return Let(n, e(v))
        case Assign(name=n, value=v):
            return Assign(n, e(v))
        case Store(buffer=n, index=index, value=v):
            return Store(decls[n] if rnd.random() < 0.5 else n, e(index), e(v))
        case If(cond=c, then=then, orelse=orelse):
            other = _variant_body(orelse, rnd, decls)
            if not orelse and rnd.random() < 0.5:
                return If(e(c), _variant_body(then, rnd, decls))
            return If(e(c), _variant_body(then, rnd, decls), other)
        case Loop(var=var, start=start, end=end, body=body):
            return Loop(var, e(start), e(end), _variant_body(body, rnd, decls))
        case Block(body=body):
            return Block(_variant_body(body, rnd, decls))
        case Barrier():
            return Barrier()
        case Return():
            return Return()
    raise AssertionError(s)


def _variant_program(p: Program, rnd: random.Random) -> Program:
    decls = {d.name: d for d in p.buffers}
    buffers = [
        BufferDecl(d.name, d.binding, d.access.value, d.dtype.value, d.count)  # type: ignore[arg-type]
        if rnd.random() < 0.5
        else d
        for d in p.buffers
    ]
    rnd.shuffle(buffers)
    x, y, z = p.workgroup_size
    shapes: list[Any] = [[x, y, z], (x, y, z)]
    if z == 1:
        shapes.append((x, y))
        if y == 1:
            shapes += [x, (x,), np.int64(x)]
    return Program(buffers, rnd.choice(shapes), _variant_body(p.body, rnd, decls), p.op_id)


@PROPERTY
@given(programs(), st.randoms(use_true_random=False))
def test_other_constructions_encode_to_the_same_bytes(p: Program, rnd: random.Random) -> None:
    q = _variant_program(p, rnd)
    assert q == p
    assert q.to_wire() == p.to_wire()
    assert q.fingerprint() == p.fingerprint()


def test_named_construction_variants_encode_identically() -> None:
    a = Program(
        [
            BufferDecl("out", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("in", 0, Access.READ, DType.U32),
        ],
        (64, 1, 1),
        (Store("out", gid(), Bin(BinOp.ADD, Load("in", gid()), u32(1))),),
    )
    b = Program(
        [BufferDecl("in", 0, "read", "u32"), BufferDecl("out", 1, "write", "u32", 8)],
        64,
        [Store("out", Builtin("gid", 0), Bin("add", Load("in", Builtin("gid")), 1))],
    )
    c = Program(
        [BufferDecl("out", 1, "write", "u32", 8), BufferDecl("in", 0, "read", "u32")],
        [64],
        [Store("out", gid(0), Load("in", gid()) + 1)],
    )
    assert a.to_wire() == b.to_wire() == c.to_wire()
    assert a.fingerprint() == b.fingerprint() == c.fingerprint()


def test_workgroup_buffers_come_last_in_the_table() -> None:
    p = Program(
        [
            BufferDecl("sh", 0, Access.WORKGROUP, DType.U32, 4),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 4),
            BufferDecl("a", 1, Access.READ, DType.U32),
        ],
        1,
        [],
    )
    data = p.to_wire()
    assert data.index(b"\x01\x00\x00\x00a") < data.index(b"out") < data.index(b"sh")
    assert Program.from_wire(data) == p


# Constants -------------------------------------------------------------------------------


def test_negative_zero_is_distinct_from_positive_zero() -> None:
    def prog(value: float) -> Program:
        return Program([BufferDecl("o", 0, "write", "f32", 1)], 1, [Store("o", 0, f32(value))])

    pos, neg = prog(0.0), prog(-0.0)
    assert pos.to_wire() != neg.to_wire()
    assert pos.fingerprint() != neg.fingerprint()
    back = Program.from_wire(neg.to_wire()).body[0]
    assert isinstance(back, Store) and isinstance(back.value, Const)
    assert math.copysign(1.0, float(back.value.value)) == -1.0


@pytest.mark.parametrize("bits", [0x7FC0_0000, 0x7FA0_0001, 0xFFC0_0000, 0x7F80_0001, 0xFFFF_FFFF])
def test_nan_payloads_canonicalise(bits: int) -> None:
    nan = f32_from_bits(bits)
    assert math.isnan(nan)
    p = Program([BufferDecl("o", 0, "write", "f32", 1)], 1, [Store("o", 0, f32(nan))])
    data = p.to_wire()
    assert _u32(0x7FC0_0000) in data
    assert data == Program([p.buffers[0]], 1, [Store("o", 0, f32(float("nan")))]).to_wire()


def test_non_canonical_nan_bits_are_rejected() -> None:
    p = Program([BufferDecl("o", 0, "write", "f32", 1)], 1, [Store("o", 0, f32(float("nan")))])
    data = p.to_wire()
    tampered = _reseal(data.replace(_u32(0x7FC0_0000), _u32(0x7FC0_0001)))
    _reject(tampered, "NaN", "offset")


def test_subnormals_and_extremes_survive() -> None:
    values = [f32_from_bits(b) for b in (1, 0x8000_0001, 0x007F_FFFF, 0x7F7F_FFFF, 0x7F80_0000)]
    body = [Store("o", i, f32(v)) for i, v in enumerate(values)]
    p = Program([BufferDecl("o", 0, "write", "f32", 8)], 1, body)
    q = Program.from_wire(p.to_wire())
    assert q == p
    got = [s.value.value for s in q.body if isinstance(s, Store) and isinstance(s.value, Const)]
    assert got == values


# Kernel digest ---------------------------------------------------------------------------


def _sized(read: int, write: int, shared: int, op_id: str = "") -> Program:
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.F32, read),
            BufferDecl("o", 1, Access.WRITE, DType.F32, write),
            BufferDecl("rw", 2, Access.READ_WRITE, DType.U32, read),
            BufferDecl("u", 3, Access.UNIFORM, DType.U32, read),
            BufferDecl("sh", 4, Access.WORKGROUP, DType.F32, shared),
        ],
        32,
        [Store("sh", lid(), Load("a", gid())), Barrier(), Store("o", gid(), Load("sh", lid()))],
        op_id,
    )


def test_kernel_digest_ignores_storage_counts_but_not_workgroup_counts() -> None:
    base = _sized(0, 16, 32)
    resized = _sized(1000, 4096, 32)
    assert base.fingerprint() != resized.fingerprint()
    assert base.kernel_digest() == resized.kernel_digest()
    assert base.kernel_digest({"x": 1}) == resized.kernel_digest({"x": 1})
    assert base.kernel_digest() != _sized(0, 16, 64).kernel_digest()
    assert base.kernel_digest() != _sized(0, 16, 32, op_id="other").kernel_digest()
    assert len(base.kernel_digest()) == 32
    assert base.kernel_digest() != base.fingerprint()


def test_kernel_digest_changes_with_options() -> None:
    p = _sized(0, 16, 32)
    seen = {
        p.kernel_digest(None),
        p.kernel_digest({"fast": True}),
        p.kernel_digest({"fast": False}),
        p.kernel_digest({"fast": 1}),
        p.kernel_digest({"fast": 1.0}),
        p.kernel_digest({"fast": "1"}),
        p.kernel_digest({"fast": None}),
        p.kernel_digest({"fast": (1,)}),
        p.kernel_digest({"fast": ((1,),)}),
        p.kernel_digest({"fast": -0.0}),
        p.kernel_digest({"fast": 0.0}),
        p.kernel_digest({"fast": 2**70}),
        p.kernel_digest({"fast": -1}),
        p.kernel_digest({"Fast": True}),
    }
    assert len(seen) == 14
    assert p.kernel_digest(None) == p.kernel_digest({})
    assert p.kernel_digest({"a": 1, "b": (2, "x")}) == p.kernel_digest({"b": (2, "x"), "a": 1})
    nan = p.kernel_digest({"x": float("nan")})
    assert nan == p.kernel_digest({"x": -float("nan")})
    assert p.kernel_digest({"arch": DType.F32}) == p.kernel_digest({"arch": "f32"})
    # The memoised prefix never leaks one call's options into the next.
    first = p.kernel_digest({"a": 1})
    p.kernel_digest({"b": 2})
    assert p.kernel_digest({"a": 1}) == first
    fresh = _sized(0, 16, 32)
    assert fresh.kernel_digest({"a": 1}) == first


@pytest.mark.parametrize(
    "options",
    [
        {"x": [1, 2]},
        {"x": {"y": 1}},
        {"x": b"raw"},
        {"x": object()},
        {"x": np.int64(3)},
        {1: True},
        {"x": (1, [2])},
        {"x": "\ud800"},
    ],
    ids=["list", "dict", "bytes", "object", "numpy", "int-key", "nested-list", "surrogate"],
)
def test_kernel_digest_rejects_unsupported_options(options: dict[Any, Any]) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        _sized(0, 16, 32).kernel_digest(options)


def test_kernel_digest_rejects_a_non_mapping() -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        _sized(0, 16, 32).kernel_digest([("a", 1)])  # type: ignore[arg-type]


# Malformed input -------------------------------------------------------------------------


def test_tampered_digest_is_rejected() -> None:
    data = bytearray(_every_kind().to_wire())
    data[20] ^= 0x01
    _reject(bytes(data), "digest")


def test_tampered_body_is_rejected() -> None:
    data = bytearray(_every_kind().to_wire())
    data[-1] ^= 0x80
    _reject(bytes(data), "digest")


def test_bad_magic_is_rejected() -> None:
    data = _every_kind().to_wire()
    _reject(b"PVIR" + data[4:], "magic")
    _reject(b"", "truncated")
    _reject(b"VY", "truncated")
    _reject(b"XY", "magic")


def test_unknown_version_is_rejected() -> None:
    body = _every_kind().to_wire()[40:]
    err = _reject(_wire(body, version=3), "version 3")
    assert err.offset == 4  # type: ignore[attr-defined]
    _reject(_wire(body, version=0), "version")


def test_unknown_flags_are_rejected() -> None:
    _reject(_wire(_every_kind().to_wire()[40:], flags=1), "flags")


def test_every_truncation_is_rejected() -> None:
    data = _every_kind().to_wire()
    for cut in range(len(data)):
        _reject(data[:cut])
        if cut > 40:  # with a valid digest the parser itself must find the truncation
            _reject(_reseal(data[:cut]), "offset")


def test_trailing_bytes_are_rejected() -> None:
    data = _every_kind().to_wire()
    _reject(data + b"\x00", "digest")
    _reject(_reseal(data + b"\x00"), "trailing")
    _reject(_reseal(data + data), "trailing")


def test_non_bytes_input_is_rejected() -> None:
    for value in ("VYIR", None, 42, [1, 2]):
        with pytest.raises(InvalidProgram, match="Fix:"):
            Program.from_wire(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stmts", "words"),
    [
        (bytes([9]), ("statement tag 9",)),
        (bytes([0]) + _str("x") + bytes([11]), ("expression tag 11",)),
        (bytes([0]) + _str("x") + bytes([0, 4]) + _u32(0), ("constant dtype code 4",)),
        (bytes([0]) + _str("x") + bytes([0, 3]) + _u32(2), ("bool",)),
        (bytes([0]) + _str("x") + bytes([5, 21]), ("binary operator code 21",)),
        (bytes([0]) + _str("x") + bytes([6, 18]), ("unary operator code 18",)),
        (bytes([0]) + _str("x") + bytes([4, 4, 0]), ("builtin kind code 4",)),
        (bytes([0]) + _str("x") + bytes([4, 0, 3]), ("axis",)),
        (bytes([0]) + _str(""), ("empty",)),
        (bytes([0]) + _str(b"\xff\xfe"), ("UTF-8",)),
        (bytes([0]) + _str(b"\xed\xa0\x80"), ("UTF-8",)),  # an encoded surrogate
        (bytes([0]) + _u32(0xFFFF_FFFF), ("MAX_NAME_BYTES",)),
        (bytes([0]) + _u32(MAX_NAME_BYTES + 1) + b"x" * 300, ("MAX_NAME_BYTES",)),
        (bytes([0]) + _u32(200), ("truncated",)),
        (bytes([6]) + _u32(0xFFFF_FFFF), ("items",)),
        (
            bytes([0]) + _str("x") + bytes([10, 8]),
            ("atomic operator code 8",),
        ),
        (
            bytes([0]) + _str("x") + bytes([10, 0]) + _str("b") + bytes([4, 0, 0]) * 2 + b"\x02",
            ("has-expected",),
        ),
    ],
)
def test_malformed_bodies_are_rejected(stmts: bytes, words: tuple[str, ...]) -> None:
    _reject(_wire(_body(stmts)), "offset", *words)


def test_huge_counts_are_rejected_before_allocating() -> None:
    _reject(_wire(_body(b"", n_stmts=0xFFFF_FFFF)), "items")
    _reject(_wire(_body(b"", n_stmts=1000)), "remain")
    _reject(_wire(_body(b"", buffers=_u32(0xFFFF_FFFF))), str(MAX_BUFFERS))
    _reject(_wire(_body(b"", buffers=_u32(MAX_BUFFERS))), "remain")
    _reject(_wire(_u32(0xFFFF_FFFF)), "MAX_NAME_BYTES")


def test_non_canonical_buffer_order_is_rejected() -> None:
    table = (
        _u32(2)
        + _str("b")
        + _u32(1)
        + bytes([0, 0])
        + _u32(0)
        + _str("a")
        + _u32(0)
        + bytes([0, 0])
        + _u32(0)
    )
    _reject(_wire(_body(b"", n_stmts=0, buffers=table)), "canonical order")
    unknown_access = _u32(1) + _str("a") + _u32(0) + bytes([5, 0]) + _u32(0)
    _reject(_wire(_body(b"", n_stmts=0, buffers=unknown_access)), "access")


# Limits ----------------------------------------------------------------------------------


def _let_of_depth(depth: int) -> bytes:
    """A Let whose value is ``depth - 1`` nested negations of a constant."""
    return bytes([0]) + _str("x") + bytes([6, 0]) * (depth - 1) + bytes([0, 0]) + _u32(7)


def _nested_blocks(levels: int) -> bytes:
    return (bytes([6]) + _u32(1)) * (levels - 1) + bytes([6]) + _u32(0)


def test_expression_depth_limit_in_the_decoder() -> None:
    p = Program.from_wire(_wire(_body(_let_of_depth(MAX_EXPR_DEPTH))))
    assert isinstance(p.body[0], Let)
    _reject(_wire(_body(_let_of_depth(MAX_EXPR_DEPTH + 1))), "MAX_EXPR_DEPTH")
    _reject(_wire(_body(_let_of_depth(200_000))), "MAX_EXPR_DEPTH")  # no RecursionError


def test_statement_depth_limit_in_the_decoder() -> None:
    p = Program.from_wire(_wire(_body(_nested_blocks(MAX_STMT_DEPTH))))
    assert isinstance(p.body[0], Block)
    _reject(_wire(_body(_nested_blocks(MAX_STMT_DEPTH + 1))), "MAX_STMT_DEPTH")
    _reject(_wire(_body(_nested_blocks(200_000))), "MAX_STMT_DEPTH")


def test_depth_limits_in_the_encoder() -> None:
    deep: Expr = u32(1)
    for _ in range(MAX_EXPR_DEPTH - 1):
        deep = Un("not", deep)
    ok = Program([], 1, [Let("x", deep)])
    assert Program.from_wire(ok.to_wire()) == ok
    with pytest.raises(InvalidProgram, match="MAX_EXPR_DEPTH"):
        Program([], 1, [Let("x", Un("not", deep))]).to_wire()
    for _ in range(5000):  # far past the limit, and past Python's recursion limit
        deep = Un("not", deep)
    with pytest.raises(InvalidProgram, match="MAX_EXPR_DEPTH"):
        Program([], 1, [Let("x", deep)]).fingerprint()
    body: tuple[Stmt, ...] = ()
    for _ in range(MAX_STMT_DEPTH):
        body = (Block(body),)
    assert Program.from_wire(Program([], 1, body).to_wire()).body == body
    with pytest.raises(InvalidProgram, match="MAX_STMT_DEPTH"):
        Program([], 1, (Block(body),)).to_wire()


def test_node_limit() -> None:
    lets = [Let(f"v{i}", u32(i)) for i in range(MAX_NODES // 2)]
    at_limit = Program([], 1, lets)
    assert count_nodes(at_limit) == MAX_NODES
    data = at_limit.to_wire()
    assert Program.from_wire(data) == at_limit
    over = Program([], 1, [*lets, Return()])
    with pytest.raises(InvalidProgram, match="MAX_NODES"):
        over.to_wire()
    body = data[40:]
    stmts_at = body.index(_u32(len(lets)), 16)
    crafted = body[:stmts_at] + _u32(len(lets) + 1) + body[stmts_at + 4 :] + bytes([5])
    _reject(_wire(crafted), "MAX_NODES")


def test_shared_subtrees_cannot_blow_up_the_encoder() -> None:
    e: Expr = u32(1)
    for _ in range(60):  # 2**60 nodes once unfolded
        e = Bin("add", e, e)
    with pytest.raises(InvalidProgram, match="MAX_NODES"):
        Program([], 1, [Let("x", e)]).to_wire()


def test_limits_on_names_and_buffers_in_the_encoder() -> None:
    with pytest.raises(InvalidProgram, match="MAX_NAME_BYTES"):
        Program([], 1, [Let("é" * (MAX_NAME_BYTES // 2 + 1), u32(0))]).to_wire()
    with pytest.raises(InvalidProgram, match="MAX_NAME_BYTES"):
        Program([], 1, [], op_id="x" * (MAX_NAME_BYTES + 1)).to_wire()
    many = [BufferDecl(f"b{i}", i, "read", "u32") for i in range(MAX_BUFFERS + 1)]
    with pytest.raises(InvalidProgram, match="MAX_BUFFERS"):
        Program(many, 1, []).to_wire()
    with pytest.raises(InvalidProgram, match="Fix:"):
        Program([], 1, [Let("\ud800", u32(0))]).to_wire()
    name = "n" * MAX_NAME_BYTES
    p = Program([BufferDecl(name, 0, "read", "u32")], 1, [Let(name, BufLen(name))], op_id=name)
    assert Program.from_wire(p.to_wire()) == p


def test_foreign_nodes_are_rejected_by_the_encoder() -> None:
    class Weird(Stmt):
        __slots__ = ()

    with pytest.raises(InvalidProgram, match="Fix:"):
        Program([], 1, [Weird()]).to_wire()


def test_decoder_errors_carry_the_offset() -> None:
    data = _wire(_body(bytes([9])))
    err = _reject(data, "offset")
    assert err.offset == len(data) - 1  # type: ignore[attr-defined]


# Version 2: the grid barrier ---------------------------------------------------------------


def _grid_program() -> Program:
    return Program(
        [BufferDecl("x", 0, Access.READ_WRITE, DType.U32)],
        64,
        [
            GridBarrier(),
            Let("i", gid()),
            Store("x", Var("i"), u32(1)),
            GridBarrier(),
            Store("x", u32(0), u32(2)),
            GridBarrier(),
        ],
    )


def test_a_grid_barrier_program_is_written_as_version_2_and_round_trips() -> None:
    program = _grid_program()
    data = program.to_wire()
    assert data[4:6] == b"\x02\x00"
    assert Program.from_wire(data) == program
    assert program.fingerprint() == blake3(data[40:]).digest()


def test_a_program_without_a_grid_barrier_keeps_its_version_1_bytes() -> None:
    data = _every_kind().to_wire()
    assert data[4:6] == b"\x01\x00"
    assert Program.from_wire(data) == _every_kind()


def test_a_grid_barrier_in_version_1_bytes_is_refused_where_it_is() -> None:
    data = _grid_program().to_wire()
    body = data[40:]
    err = _reject(_wire(body, version=1), "GridBarrier (tag 8) in version-1 bytes")
    assert err.offset == body.index(b"\x08") + 40  # type: ignore[attr-defined]


def test_version_2_bytes_without_a_grid_barrier_are_not_canonical() -> None:
    body = _every_kind().to_wire()[40:]
    err = _reject(_wire(body, version=2), "non-canonical version 2")
    assert err.offset == 4  # type: ignore[attr-defined]
