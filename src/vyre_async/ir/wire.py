"""Canonical wire form of the Program IR: encoder, decoder, fingerprint and kernel digest.

Layout (little-endian; ``str`` = u32 byte length + UTF-8; ``seq<T>`` = u32 count + items)::

    wire   : b"VYIR" | u16 version (1 or 2) | u16 flags (0) | 32-byte blake3(body) | body
    body   : str op_id | u32 workgroup[3] | seq<buffer> | seq<stmt>
    buffer : str name | u32 binding | u8 access | u8 dtype | u32 count
    stmt   : u8 tag, then  Let(str name, expr) | Assign(str name, expr)
             | Store(str buffer, expr index, expr value) | If(expr cond, seq<stmt>, seq<stmt>)
             | Loop(str var, expr start, expr end, seq<stmt>) | Return() | Block(seq<stmt>)
             | Barrier() | GridBarrier()
    expr   : u8 tag, then  Const(u8 dtype, u32 bits) | Var(str) | Load(str, expr)
             | BufLen(str) | Builtin(u8 kind, u8 axis) | Bin(u8 op, expr, expr)
             | Un(u8 op, expr) | Select(expr, expr, expr) | Cast(u8 dtype, expr)
             | Fma(expr, expr, expr) | Atomic(u8 op, str, expr index, expr value,
               u8 has_expected, [expr expected])

Version 2 adds the ``GridBarrier`` statement (tag 8) and nothing else. A program
is written in the lowest version that holds it: version 1 unless it has a grid
barrier, so every program without one keeps its version-1 bytes (and older
readers keep reading it). The decoder reads both and refuses a grid barrier in
version-1 bytes and version-2 bytes without one (both non-canonical).

Every numeric code is fixed by the tables below (never by enum order) and never
changes within a wire version. Canonicalisation: buffers are ordered by
``(is-workgroup, binding, name)`` (then access, dtype and count codes, so the
order is total); F32 constants are their binary32 bits with every NaN as
``0x7FC00000`` and ``-0.0`` kept distinct from ``+0.0``; nothing else is
rewritten (no operand reordering, no block splicing), so
``decode_program(encode_program(p)) == p`` holds exactly.

The decoder is a security boundary: any malformed, truncated, tampered-with,
non-canonical or over-limit input raises `InvalidProgram` (with the byte offset
and a ``Fix:``), never another exception; its work and memory are linear in the
input length and every length field is checked against the bytes remaining
before anything is allocated. No pickle is involved anywhere.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, NoReturn

from blake3 import blake3

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir.expr import (
    Atomic,
    Bin,
    BufLen,
    Builtin,
    Cast,
    Const,
    Expr,
    Fma,
    Load,
    Select,
    Un,
    Var,
    f32_from_bits,
)
from vyre_async.ir.limits import (
    MAX_BUFFERS,
    MAX_EXPR_DEPTH,
    MAX_NAME_BYTES,
    MAX_NODES,
    MAX_STMT_DEPTH,
)
from vyre_async.ir.ops import AtomicOp, BinOp, BuiltinKind, UnOp
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import (
    Assign,
    Barrier,
    Block,
    GridBarrier,
    If,
    Let,
    Loop,
    Return,
    Stmt,
    Store,
)
from vyre_async.ir.types import Access, BufferDecl, DType
from vyre_async.ir.walk import iter_stmts

__all__ = [
    "ACCESS_CODES",
    "ATOMIC_OP_CODES",
    "BIN_OP_CODES",
    "BUILTIN_CODES",
    "DTYPE_CODES",
    "EXPR_TAGS",
    "HEADER_SIZE",
    "KERNEL_DIGEST_DOMAIN",
    "STMT_TAGS",
    "UN_OP_CODES",
    "WIRE_FLAGS",
    "WIRE_MAGIC",
    "WIRE_VERSION",
    "WIRE_VERSIONS",
    "decode_program",
    "encode_program",
    "fingerprint",
    "kernel_digest",
]
__dir__ = _public_dir(__name__)

# --------------------------------------------------------------------------------------
# Frozen code tables. Append-only: a code is never renumbered or reused.
# --------------------------------------------------------------------------------------

#: The four magic bytes every wire form starts with.
WIRE_MAGIC: Final = b"VYIR"
#: The newest wire version this module writes and reads (version 2: `GridBarrier`).
WIRE_VERSION: Final = 2
#: The versions this module reads; it writes the lowest one that holds the program.
WIRE_VERSIONS: Final = (1, 2)
#: The only flags value of versions 1 and 2.
WIRE_FLAGS: Final = 0
#: Bytes before the body: magic, version, flags, blake3 digest of the body.
HEADER_SIZE: Final = 4 + 2 + 2 + 32
#: Domain-separation prefix of `kernel_digest`.
KERNEL_DIGEST_DOMAIN: Final = b"vyre-async/kernel-digest/v1\x00"

#: Wire codes of `DType`.
DTYPE_CODES: Final[Mapping[DType, int]] = MappingProxyType(
    {DType.U32: 0, DType.I32: 1, DType.F32: 2, DType.BOOL: 3}
)
#: Wire codes of `Access`.
ACCESS_CODES: Final[Mapping[Access, int]] = MappingProxyType(
    {
        Access.READ: 0,
        Access.READ_WRITE: 1,
        Access.UNIFORM: 2,
        Access.WRITE: 3,
        Access.WORKGROUP: 4,
    }
)
#: Wire codes of `BinOp`.
BIN_OP_CODES: Final[Mapping[BinOp, int]] = MappingProxyType(
    {
        BinOp.ADD: 0,
        BinOp.SUB: 1,
        BinOp.MUL: 2,
        BinOp.DIV: 3,
        BinOp.MOD: 4,
        BinOp.MIN: 5,
        BinOp.MAX: 6,
        BinOp.AND: 7,
        BinOp.OR: 8,
        BinOp.XOR: 9,
        BinOp.SHL: 10,
        BinOp.SHR: 11,
        BinOp.EQ: 12,
        BinOp.NE: 13,
        BinOp.LT: 14,
        BinOp.LE: 15,
        BinOp.GT: 16,
        BinOp.GE: 17,
        BinOp.LAND: 18,
        BinOp.LOR: 19,
        BinOp.MULHI: 20,
    }
)
#: Wire codes of `UnOp`.
UN_OP_CODES: Final[Mapping[UnOp, int]] = MappingProxyType(
    {
        UnOp.NEG: 0,
        UnOp.NOT: 1,
        UnOp.LNOT: 2,
        UnOp.POPCOUNT: 3,
        UnOp.CLZ: 4,
        UnOp.CTZ: 5,
        UnOp.ABS: 6,
        UnOp.SQRT: 7,
        UnOp.RSQRT: 8,
        UnOp.EXP: 9,
        UnOp.LOG: 10,
        UnOp.SIN: 11,
        UnOp.COS: 12,
        UnOp.TANH: 13,
        UnOp.FLOOR: 14,
        UnOp.CEIL: 15,
        UnOp.ROUND: 16,
        UnOp.TRUNC: 17,
    }
)
#: Wire codes of `AtomicOp`.
ATOMIC_OP_CODES: Final[Mapping[AtomicOp, int]] = MappingProxyType(
    {
        AtomicOp.ADD: 0,
        AtomicOp.OR: 1,
        AtomicOp.AND: 2,
        AtomicOp.XOR: 3,
        AtomicOp.MIN: 4,
        AtomicOp.MAX: 5,
        AtomicOp.EXCHANGE: 6,
        AtomicOp.CAS: 7,
    }
)
#: Wire codes of `BuiltinKind`.
BUILTIN_CODES: Final[Mapping[BuiltinKind, int]] = MappingProxyType(
    {BuiltinKind.GID: 0, BuiltinKind.LID: 1, BuiltinKind.WGID: 2, BuiltinKind.NWG: 3}
)
#: Tags of statement nodes.
STMT_TAGS: Final[Mapping[type[Stmt], int]] = MappingProxyType(
    {Let: 0, Assign: 1, Store: 2, If: 3, Loop: 4, Return: 5, Block: 6, Barrier: 7, GridBarrier: 8}
)
#: Tags of expression nodes.
EXPR_TAGS: Final[Mapping[type[Expr], int]] = MappingProxyType(
    {
        Const: 0,
        Var: 1,
        Load: 2,
        BufLen: 3,
        Builtin: 4,
        Bin: 5,
        Un: 6,
        Select: 7,
        Cast: 8,
        Fma: 9,
        Atomic: 10,
    }
)

_CANONICAL_NAN: Final = 0x7FC0_0000
_U32 = struct.Struct("<I")
_PREFIX = struct.Struct("<4sHH")
_HEADER_PREFIX: Final = _PREFIX.pack(WIRE_MAGIC, 1, WIRE_FLAGS)
_HEADER_PREFIX_V2: Final = _PREFIX.pack(WIRE_MAGIC, 2, WIRE_FLAGS)
_WORKGROUP = struct.Struct("<III")
_BUFFER_TAIL = struct.Struct("<IBBI")  # binding, access, dtype, count (after the name)
_CONST = struct.Struct("<BBI")  # tag, dtype, bits
_U8_U32 = struct.Struct("<BI")
_F64 = struct.Struct("<d")
#: Smallest encoded buffer entry: empty name (4) + binding (4) + access + dtype + count (4).
_MIN_BUFFER_BYTES: Final = 14
#: Pre-packed small counts, so sequences of up to 255 items allocate nothing.
_SMALL_COUNTS: Final = tuple(_U32.pack(i) for i in range(256))

_ENCODE_FIX: Final = "keep the program within vyre_async.ir.limits and run validate(program)"
_DECODE_FIX: Final = (
    "decode only bytes produced by Program.to_wire() of this wire version, "
    "transferred unmodified; re-encode the program from its source"
)


def _tag_bytes(tag: int, codes: Mapping[Any, int]) -> dict[Any, bytes]:
    return {member: bytes((tag, code)) for member, code in codes.items()}


_T_LET, _T_ASSIGN, _T_STORE, _T_IF, _T_LOOP, _T_RETURN, _T_BLOCK, _T_BARRIER, _T_GRID = (
    bytes((STMT_TAGS[cls],))
    for cls in (Let, Assign, Store, If, Loop, Return, Block, Barrier, GridBarrier)
)
_E_CONST = EXPR_TAGS[Const]
_E_VAR, _E_LOAD, _E_BUFLEN, _E_SELECT, _E_FMA = (
    bytes((EXPR_TAGS[cls],)) for cls in (Var, Load, BufLen, Select, Fma)
)
_BIN_BYTES: Final = _tag_bytes(EXPR_TAGS[Bin], BIN_OP_CODES)
_UN_BYTES: Final = _tag_bytes(EXPR_TAGS[Un], UN_OP_CODES)
_CAST_BYTES: Final = _tag_bytes(EXPR_TAGS[Cast], DTYPE_CODES)
_ATOMIC_BYTES: Final = _tag_bytes(EXPR_TAGS[Atomic], ATOMIC_OP_CODES)
_BUILTIN_BYTES: Final = {
    (kind, axis): bytes((EXPR_TAGS[Builtin], code, axis))
    for kind, code in BUILTIN_CODES.items()
    for axis in (0, 1, 2)
}


# --------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------


def _encode_error(message: str) -> NoReturn:
    raise InvalidProgram(f"cannot encode program: {message}", fix=_ENCODE_FIX)


def _encode_str(text: str, what: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidProgram(
            f"cannot encode program: {what} {text!r} is not valid Unicode ({exc.reason})",
            fix="use names without lone surrogate code points",
        ) from None
    if len(raw) > MAX_NAME_BYTES:
        _encode_error(
            f"{what} {text[:40]!r}... is {len(raw)} UTF-8 bytes, over MAX_NAME_BYTES "
            f"({MAX_NAME_BYTES})"
        )
    return _U32.pack(len(raw)) + raw


def _buffer_sort_key(decl: BufferDecl, count: int) -> tuple[bool, int, str, int, int, int]:
    return (
        decl.access is Access.WORKGROUP,
        decl.binding,
        decl.name,
        ACCESS_CODES[decl.access],
        DTYPE_CODES[decl.dtype],
        count,
    )


def _encode_body(program: Program, *, zero_counts: bool = False) -> bytes:
    """Return the canonical body of ``program`` (optionally with storage counts zeroed).

    Raises:
        InvalidProgram: the program exceeds a structural limit or holds a node
            that is not part of the IR.
    """
    parts: list[bytes] = []
    append = parts.append
    names: dict[str, bytes] = {}
    small_counts = _SMALL_COUNTS
    u32_pack = _U32.pack
    const_pack = _CONST.pack
    dtype_codes = DTYPE_CODES
    bin_bytes = _BIN_BYTES
    un_bytes = _UN_BYTES
    cast_bytes = _CAST_BYTES
    atomic_bytes = _ATOMIC_BYTES
    builtin_bytes = _BUILTIN_BYTES
    max_expr = MAX_EXPR_DEPTH
    max_stmt = MAX_STMT_DEPTH
    max_nodes = MAX_NODES
    nodes = 0

    def name(text: str) -> bytes:
        raw = names.get(text)
        if raw is None:
            raw = names[text] = _encode_str(text, "name")
        return raw

    def count(n: int) -> bytes:
        return small_counts[n] if n < 256 else u32_pack(n)

    def too_deep() -> NoReturn:
        _encode_error(f"an expression is nested deeper than MAX_EXPR_DEPTH ({max_expr})")

    def too_many() -> NoReturn:
        _encode_error(f"the program has more than MAX_NODES ({max_nodes}) nodes")

    # Every expression is counted by its parent (an expression or a statement), so
    # leaves do no bookkeeping; nodes that multiply the work check the limit at once.
    def e_const(e: Const, depth: int) -> None:
        append(const_pack(_E_CONST, dtype_codes[e.dtype], e.bits))

    def e_var(e: Var, depth: int) -> None:
        append(_E_VAR)
        append(name(e.name))

    def e_buflen(e: BufLen, depth: int) -> None:
        append(_E_BUFLEN)
        append(name(e.buffer))

    def e_builtin(e: Builtin, depth: int) -> None:
        append(builtin_bytes[e.kind, e.axis])

    def e_load(e: Load, depth: int) -> None:
        nonlocal nodes
        nodes += 1
        if depth >= max_expr:
            too_deep()
        append(_E_LOAD)
        append(name(e.buffer))
        sub = e.index
        enc[type(sub)](sub, depth + 1)

    def e_bin(e: Bin, depth: int) -> None:
        nonlocal nodes
        nodes += 2
        if depth >= max_expr:
            too_deep()
        if nodes > max_nodes:
            too_many()
        append(bin_bytes[e.op])
        depth += 1
        sub = e.a
        enc[type(sub)](sub, depth)
        sub = e.b
        enc[type(sub)](sub, depth)

    def e_un(e: Un, depth: int) -> None:
        nonlocal nodes
        nodes += 1
        if depth >= max_expr:
            too_deep()
        append(un_bytes[e.op])
        sub = e.a
        enc[type(sub)](sub, depth + 1)

    def e_cast(e: Cast, depth: int) -> None:
        nonlocal nodes
        nodes += 1
        if depth >= max_expr:
            too_deep()
        append(cast_bytes[e.dtype])
        sub = e.value
        enc[type(sub)](sub, depth + 1)

    def e_select(e: Select, depth: int) -> None:
        nonlocal nodes
        nodes += 3
        if depth >= max_expr:
            too_deep()
        if nodes > max_nodes:
            too_many()
        append(_E_SELECT)
        depth += 1
        sub = e.cond
        enc[type(sub)](sub, depth)
        sub = e.if_true
        enc[type(sub)](sub, depth)
        sub = e.if_false
        enc[type(sub)](sub, depth)

    def e_fma(e: Fma, depth: int) -> None:
        nonlocal nodes
        nodes += 3
        if depth >= max_expr:
            too_deep()
        if nodes > max_nodes:
            too_many()
        append(_E_FMA)
        depth += 1
        sub = e.a
        enc[type(sub)](sub, depth)
        sub = e.b
        enc[type(sub)](sub, depth)
        sub = e.c
        enc[type(sub)](sub, depth)

    def e_atomic(e: Atomic, depth: int) -> None:
        nonlocal nodes
        nodes += 2
        if depth >= max_expr:
            too_deep()
        if nodes > max_nodes:
            too_many()
        append(atomic_bytes[e.op])
        append(name(e.buffer))
        depth += 1
        sub: Expr | None = e.index
        enc[type(sub)](sub, depth)
        sub = e.value
        enc[type(sub)](sub, depth)
        sub = e.expected
        if sub is None:
            append(b"\x00")
        else:
            nodes += 1
            append(b"\x01")
            enc[type(sub)](sub, depth)

    enc: dict[type, Callable[[Any, int], None]] = _ExprDispatch(
        {
            Const: e_const,
            Var: e_var,
            Load: e_load,
            BufLen: e_buflen,
            Builtin: e_builtin,
            Bin: e_bin,
            Un: e_un,
            Select: e_select,
            Cast: e_cast,
            Fma: e_fma,
            Atomic: e_atomic,
        }
    )

    # Statements count the root expressions they hold; expressions count their children.
    def s_let(s: Let, nesting: int) -> None:
        nonlocal nodes
        nodes += 1
        append(_T_LET)
        append(name(s.name))
        sub = s.value
        enc[type(sub)](sub, 1)

    def s_assign(s: Assign, nesting: int) -> None:
        nonlocal nodes
        nodes += 1
        append(_T_ASSIGN)
        append(name(s.name))
        sub = s.value
        enc[type(sub)](sub, 1)

    def s_store(s: Store, nesting: int) -> None:
        nonlocal nodes
        nodes += 2
        append(_T_STORE)
        append(name(s.buffer))
        sub = s.index
        enc[type(sub)](sub, 1)
        sub = s.value
        enc[type(sub)](sub, 1)

    def s_if(s: If, nesting: int) -> None:
        nonlocal nodes
        nodes += 1
        append(_T_IF)
        sub = s.cond
        enc[type(sub)](sub, 1)
        body(s.then, nesting + 1)
        body(s.orelse, nesting + 1)

    def s_loop(s: Loop, nesting: int) -> None:
        nonlocal nodes
        nodes += 2
        append(_T_LOOP)
        append(name(s.var))
        sub = s.start
        enc[type(sub)](sub, 1)
        sub = s.end
        enc[type(sub)](sub, 1)
        body(s.body, nesting + 1)

    def s_return(s: Return, nesting: int) -> None:
        append(_T_RETURN)

    def s_block(s: Block, nesting: int) -> None:
        append(_T_BLOCK)
        body(s.body, nesting + 1)

    def s_barrier(s: Barrier, nesting: int) -> None:
        append(_T_BARRIER)

    def s_grid_barrier(s: GridBarrier, nesting: int) -> None:
        append(_T_GRID)

    stmt_enc: dict[type, Callable[[Any, int], None]] = _StmtDispatch(
        {
            Let: s_let,
            Assign: s_assign,
            Store: s_store,
            If: s_if,
            Loop: s_loop,
            Return: s_return,
            Block: s_block,
            Barrier: s_barrier,
            GridBarrier: s_grid_barrier,
        }
    )

    def body(statements: tuple[Stmt, ...], nesting: int) -> None:
        nonlocal nodes
        if nesting > max_stmt:
            _encode_error(f"statements are nested deeper than MAX_STMT_DEPTH ({max_stmt})")
        nodes += len(statements)
        if nodes > max_nodes:
            too_many()
        if type(statements) is not tuple:  # pragma: no cover - the data model freezes bodies
            statements = tuple(statements)
        append(count(len(statements)))
        for s in statements:
            stmt_enc[type(s)](s, nesting)

    # Header fields ------------------------------------------------------------------
    append(_encode_str(program.op_id, "op_id"))
    try:
        append(_WORKGROUP.pack(*program.workgroup_size))
    except struct.error:
        _encode_error(f"workgroup_size {program.workgroup_size!r} does not fit 3 u32 axes")
    buffers = program.buffers
    if len(buffers) > MAX_BUFFERS:
        _encode_error(f"{len(buffers)} buffers, over MAX_BUFFERS ({MAX_BUFFERS})")
    entries: list[tuple[tuple[bool, int, str, int, int, int], BufferDecl, int]] = []
    for decl in buffers:
        n = 0 if zero_counts and decl.access is not Access.WORKGROUP else decl.count
        entries.append((_buffer_sort_key(decl, n), decl, n))
    entries.sort(key=lambda entry: entry[0])
    append(count(len(entries)))
    pack_tail = _BUFFER_TAIL.pack
    for key, decl, n in entries:
        append(_encode_str(decl.name, "buffer name"))
        append(pack_tail(decl.binding, key[3], key[4], n))
    body(program.body, 0)
    if nodes > max_nodes:
        too_many()
    return b"".join(parts)


class _ExprDispatch(dict[type, Callable[[Any, int], None]]):
    """Type → encoder map that reports nodes outside the IR as `InvalidProgram`."""

    __slots__ = ()

    def __missing__(self, key: type) -> NoReturn:
        raise InvalidProgram(
            f"cannot encode program: {key.__name__} is not an IR expression node",
            fix="build expressions only from the classes of vyre_async.ir (no subclasses)",
        )


class _StmtDispatch(dict[type, Callable[[Any, int], None]]):
    """Type → encoder map that reports nodes outside the IR as `InvalidProgram`."""

    __slots__ = ()

    def __missing__(self, key: type) -> NoReturn:
        raise InvalidProgram(
            f"cannot encode program: {key.__name__} is not an IR statement node",
            fix="build statements only from the classes of vyre_async.ir (no subclasses)",
        )


def _digest(data: bytes) -> bytes:
    return blake3(data).digest()


def encode_program(program: Program) -> bytes:
    """Return the canonical wire form of ``program``: header, blake3 digest, body.

    Args:
        program: The program to encode.

    Returns:
        The wire bytes. Equal programs, however they were built, give equal bytes.

    Raises:
        InvalidProgram: the program exceeds a limit of `vyre_async.ir.limits`
            (depth, node count, buffer count, name length), which no decoder
            would accept.
    """
    body = _encode_body(program)
    digest = _digest(body)
    program.memo.setdefault("fingerprint", digest)
    grid = any(type(stmt) is GridBarrier for stmt in iter_stmts(program.body))
    return b"".join((_HEADER_PREFIX_V2 if grid else _HEADER_PREFIX, digest, body))


def fingerprint(program: Program) -> bytes:
    """Return the 32-byte blake3 digest of ``program``'s canonical body.

    Args:
        program: The program to fingerprint.

    Returns:
        32 bytes, equal to the digest in the header of ``program.to_wire()``.

    Raises:
        InvalidProgram: as `encode_program`.
    """
    wire = program.memo.get("wire")
    if wire is not None:
        return bytes(wire[8:HEADER_SIZE])
    return _digest(_encode_body(program))


_OPT_NONE = b"\x00"
_OPT_FALSE = b"\x01"
_OPT_TRUE = b"\x02"
_OPT_INT = b"\x03"
_OPT_FLOAT = b"\x04"
_OPT_STR = b"\x05"
_OPT_TUPLE = b"\x06"
_MAX_OPTION_DEPTH: Final = 32
_CANONICAL_NAN64: Final = struct.pack("<Q", 0x7FF8_0000_0000_0000)


def _option_error(path: str, value: object) -> NoReturn:
    raise InvalidProgram(
        f"compile option {path} has unsupported type {type(value).__name__}: {value!r}",
        fix="use only str, int, float, bool, None or tuples of them as option values",
    )


def _encode_option_str(text: str, path: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidProgram(
            f"compile option {path} holds invalid Unicode ({exc.reason})",
            fix="use option strings without lone surrogate code points",
        ) from None
    return _U32.pack(len(raw)) + raw


def _encode_option_value(value: object, path: str, depth: int, out: list[bytes]) -> None:
    # bool before int: bool is an int subclass. Subclasses (StrEnum, IntEnum) encode as
    # their base value, so DType.F32 and "f32" are the same option.
    if value is None:
        out.append(_OPT_NONE)
    elif isinstance(value, bool):
        out.append(_OPT_TRUE if value else _OPT_FALSE)
    elif isinstance(value, int):
        number = int(value)
        raw = number.to_bytes((number.bit_length() + 8) // 8, "little", signed=True)
        out.extend((_OPT_INT, _U32.pack(len(raw)), raw))
    elif isinstance(value, float):
        real = float(value)
        out.append(_OPT_FLOAT)
        out.append(_CANONICAL_NAN64 if math.isnan(real) else _F64.pack(real))
    elif isinstance(value, str):
        out.extend((_OPT_STR, _encode_option_str(str.__str__(value), path)))
    elif isinstance(value, tuple):
        if depth >= _MAX_OPTION_DEPTH:
            raise InvalidProgram(
                f"compile option {path} nests tuples deeper than {_MAX_OPTION_DEPTH}",
                fix="flatten the option value",
            )
        out.extend((_OPT_TUPLE, _U32.pack(len(value))))
        for i, item in enumerate(value):
            _encode_option_value(item, f"{path}[{i}]", depth + 1, out)
    else:
        _option_error(path, value)


def _encode_options(options: Mapping[str, object] | None) -> bytes:
    if options is None:
        return _U32.pack(0)
    if not isinstance(options, Mapping):
        raise InvalidProgram(
            f"compile options must be a mapping, got {type(options).__name__}",
            fix="pass options as a dict of str keys",
        )
    keys = list(options)
    for key in keys:
        if not isinstance(key, str):
            raise InvalidProgram(
                f"compile option keys must be str, got {type(key).__name__}: {key!r}",
                fix="use str keys for compile options",
            )
    out: list[bytes] = [_U32.pack(len(keys))]
    for key in sorted(keys):
        out.append(_encode_option_str(str.__str__(key), f"key {key!r}"))
        _encode_option_value(options[key], repr(key), 0, out)
    return b"".join(out)


def kernel_digest(program: Program, options: Mapping[str, object] | None = None) -> bytes:
    """Return the 32-byte pipeline-cache digest of ``program`` under compile ``options``.

    The digest is blake3 over `KERNEL_DIGEST_DOMAIN`, the canonical body with
    the count of every non-``WORKGROUP`` buffer set to 0 (sizes reach kernels
    as launch parameters, so resizing never recompiles), and the options
    encoded canonically (sorted keys, type-tagged values).

    Args:
        program: The program.
        options: Compile options; values are str, int, float, bool, None or
            tuples of them. ``None`` is the same as ``{}``.

    Returns:
        32 bytes.

    Raises:
        InvalidProgram: an option key is not a str, an option value has another
            type, or the program exceeds a structural limit.
    """
    encoded_options = _encode_options(options)
    hasher = program.memo.get("kernel_hasher")
    if hasher is None:
        hasher = blake3(KERNEL_DIGEST_DOMAIN)
        hasher.update(_encode_body(program, zero_counts=True))
        program.memo["kernel_hasher"] = hasher
    hasher = hasher.copy()
    hasher.update(encoded_options)
    return bytes(hasher.digest())


# --------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------


def _invert(codes: Mapping[Any, int], size: int = 256) -> tuple[Any, ...]:
    table: list[Any] = [None] * size
    for member, code in codes.items():
        table[code] = member
    return tuple(table)


_DTYPES: Final = _invert(DTYPE_CODES)
_ACCESSES: Final = _invert(ACCESS_CODES)
_BIN_OPS: Final = _invert(BIN_OP_CODES)
_UN_OPS: Final = _invert(UN_OP_CODES)
_ATOMIC_OPS: Final = _invert(ATOMIC_OP_CODES)
_BUILTINS: Final = _invert(BUILTIN_CODES)
_I32_BIAS: Final = 1 << 32


class _Decoder:
    """Cursor over wire bytes; every read checks the bytes remaining first.

    Leaves (constants, variables, builtins) are immutable, so equal ones are
    decoded once and shared; names are decoded once per distinct byte string.
    """

    __slots__ = (
        "consts",
        "data",
        "end",
        "grid_barriers",
        "names",
        "node_at",
        "nodes",
        "pos",
        "variables",
        "version",
    )

    def __init__(self, data: bytes, version: int = WIRE_VERSION) -> None:
        self.data = data
        self.version = version
        self.grid_barriers = 0
        self.pos = HEADER_SIZE
        self.end = len(data)
        self.nodes = 0
        self.node_at = HEADER_SIZE  # offset of the node being decoded, for error messages
        self.names: dict[bytes, str] = {}
        self.consts: dict[tuple[int, int], Const] = {}
        self.variables: dict[str, Var] = {}

    # Errors ---------------------------------------------------------------------------
    def fail(self, message: str, offset: int | None = None) -> NoReturn:
        at = self.pos if offset is None else offset
        raise InvalidProgram(
            f"invalid program wire bytes at offset {at}: {message}", fix=_DECODE_FIX, offset=at
        )

    def truncated(self, size: int, what: str) -> NoReturn:
        self.fail(
            f"truncated: expected {size} byte(s) for {what}, only {self.end - self.pos} remain"
        )

    # Scalars --------------------------------------------------------------------------
    def u8(self, what: str) -> int:
        pos = self.pos
        if pos >= self.end:
            self.truncated(1, what)
        self.pos = pos + 1
        return self.data[pos]

    def u32(self, what: str) -> int:
        pos = self.pos
        if self.end - pos < 4:
            self.truncated(4, what)
        self.pos = pos + 4
        return int(_U32.unpack_from(self.data, pos)[0])

    def code(self, table: tuple[Any, ...], what: str) -> Any:
        pos = self.pos
        if pos >= self.end:
            self.truncated(1, what)
        self.pos = pos + 1
        member = table[self.data[pos]]
        if member is None:
            known = ", ".join(str(i) for i, m in enumerate(table) if m is not None)
            self.fail(f"unknown {what} code {self.data[pos]} (known: {known})", pos)
        return member

    def text(self, what: str, *, allow_empty: bool = False) -> str:
        at = self.pos
        size = self.u32(f"the byte length of {what}")
        if size > MAX_NAME_BYTES:
            self.fail(f"{what} is {size} bytes long, over MAX_NAME_BYTES ({MAX_NAME_BYTES})", at)
        if self.end - self.pos < size:
            self.truncated(size, what)
        if size == 0 and not allow_empty:
            self.fail(f"{what} is empty; names are non-empty strings", at)
        raw = self.data[self.pos : self.pos + size]
        value = self.names.get(raw)
        if value is None:
            try:
                value = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.fail(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})", at)
            self.names[raw] = value
        self.pos += size
        return value

    def seq_count(self, what: str, min_item_bytes: int, limit: int) -> int:
        at = self.pos
        n = self.u32(f"the item count of {what}")
        if n > limit:
            self.fail(f"{what} declares {n} items, over the limit of {limit}", at)
        if n * min_item_bytes > self.end - self.pos:
            self.fail(
                f"{what} declares {n} items (at least {n * min_item_bytes} bytes) but only "
                f"{self.end - self.pos} bytes remain",
                at,
            )
        return n

    def tag(self, what: str) -> int:
        """Read a node tag and count the node against `MAX_NODES`."""
        pos = self.node_at = self.pos
        if pos >= self.end:
            self.truncated(1, what)
        self.pos = pos + 1
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.fail(f"more than MAX_NODES ({MAX_NODES}) statement and expression nodes", pos)
        return self.data[pos]

    # Body -----------------------------------------------------------------------------
    def program(self) -> Program:
        try:
            op_id = self.text("op_id", allow_empty=True)
            workgroup = (
                self.u32("workgroup x"),
                self.u32("workgroup y"),
                self.u32("workgroup z"),
            )
            buffers = self.buffers()
            body = self.stmts(0, "the program body")
            if self.pos != self.end:
                self.fail(f"{self.end - self.pos} trailing byte(s) after the program body")
            if self.version == 2 and not self.grid_barriers:
                self.fail(
                    "non-canonical version 2: the program has no GridBarrier, so its "
                    "canonical form is version 1",
                    4,
                )
            return Program(buffers, workgroup, body, op_id)
        except InvalidProgram as exc:
            if hasattr(exc, "offset"):
                raise
            # A data-model constructor refused a decoded node: say where it was.
            first = str(exc).split("\nFix:", 1)[0]
            self.fail(f"the node there is invalid: {first}", self.node_at)

    def buffers(self) -> tuple[BufferDecl, ...]:
        n = self.seq_count("the buffer table", _MIN_BUFFER_BYTES, MAX_BUFFERS)
        out: list[BufferDecl] = []
        previous: tuple[bool, int, str, int, int, int] | None = None
        for i in range(n):
            at = self.node_at = self.pos
            name = self.text(f"the name of buffer #{i}", allow_empty=True)
            binding = self.u32(f"the binding of buffer {name!r}")
            access = self.code(_ACCESSES, f"access of buffer {name!r}")
            dtype = self.code(_DTYPES, f"dtype of buffer {name!r}")
            count = self.u32(f"the element count of buffer {name!r}")
            decl = BufferDecl(name, binding, access, dtype, count)
            key = _buffer_sort_key(decl, count)
            if previous is not None and key < previous:
                self.fail(
                    f"buffer {name!r} is out of canonical order (buffers are sorted by "
                    "is-workgroup, binding, name, access, dtype, count)",
                    at,
                )
            previous = key
            out.append(decl)
        return tuple(out)

    def stmts(self, nesting: int, what: str) -> tuple[Stmt, ...]:
        if nesting > MAX_STMT_DEPTH:
            self.fail(f"statements are nested deeper than MAX_STMT_DEPTH ({MAX_STMT_DEPTH})")
        n = self.seq_count(what, 1, MAX_NODES)
        stmt = self.stmt
        return tuple([stmt(nesting) for _ in range(n)])

    def stmt(self, nesting: int) -> Stmt:
        tag = self.tag("a statement tag")
        if tag == 0:
            name = self.text("a Let name")
            return Let(name, self.expr(1))
        if tag == 2:
            buffer = self.text("a Store buffer name", allow_empty=True)
            index = self.expr(1)
            return Store(buffer, index, self.expr(1))
        if tag == 1:
            name = self.text("an Assign name")
            return Assign(name, self.expr(1))
        if tag == 3:
            cond = self.expr(1)
            then = self.stmts(nesting + 1, "an If then-body")
            return If(cond, then, self.stmts(nesting + 1, "an If else-body"))
        if tag == 4:
            var = self.text("a Loop variable")
            start = self.expr(1)
            end = self.expr(1)
            return Loop(var, start, end, self.stmts(nesting + 1, "a Loop body"))
        if tag == 5:
            return Return()
        if tag == 6:
            return Block(self.stmts(nesting + 1, "a Block body"))
        if tag == 7:
            return Barrier()
        if tag == 8:
            if self.version < 2:
                self.fail(
                    "a GridBarrier (tag 8) in version-1 bytes: it needs version 2", self.pos - 1
                )
            self.grid_barriers += 1
            return GridBarrier()
        self.fail(f"unknown statement tag {tag} (known: 0..8)", self.pos - 1)

    def expr(self, depth: int) -> Expr:
        if depth > MAX_EXPR_DEPTH:
            self.fail(f"an expression is nested deeper than MAX_EXPR_DEPTH ({MAX_EXPR_DEPTH})")
        tag = self.tag("an expression tag")
        sub = depth + 1
        if tag == 0:
            return self.const()
        if tag == 1:
            name = self.text("a variable name")
            var = self.variables.get(name)
            if var is None:
                var = self.variables[name] = Var(name)
            return var
        if tag == 5:
            op = self.code(_BIN_OPS, "binary operator")
            a = self.expr(sub)
            return Bin(op, a, self.expr(sub))
        if tag == 2:
            buffer = self.text("a Load buffer name", allow_empty=True)
            return Load(buffer, self.expr(sub))
        if tag == 4:
            kind = self.code(_BUILTINS, "builtin kind")
            at = self.pos
            axis = self.u8("builtin axis")
            if axis > 2:
                self.fail(f"builtin axis must be 0, 1 or 2, found {axis}", at)
            return _BUILTIN_NODES[kind, axis]
        if tag == 3:
            return BufLen(self.text("a BufLen buffer name", allow_empty=True))
        if tag == 6:
            op = self.code(_UN_OPS, "unary operator")
            return Un(op, self.expr(sub))
        if tag == 7:
            cond = self.expr(sub)
            if_true = self.expr(sub)
            return Select(cond, if_true, self.expr(sub))
        if tag == 8:
            dtype = self.code(_DTYPES, "cast target dtype")
            return Cast(dtype, self.expr(sub))
        if tag == 9:
            a = self.expr(sub)
            b = self.expr(sub)
            return Fma(a, b, self.expr(sub))
        if tag == 10:
            op = self.code(_ATOMIC_OPS, "atomic operator")
            buffer = self.text("an Atomic buffer name", allow_empty=True)
            index = self.expr(sub)
            value = self.expr(sub)
            at = self.pos
            flag = self.u8("the Atomic has-expected flag")
            if flag > 1:
                self.fail(f"Atomic has-expected flag must be 0 or 1, found {flag}", at)
            expected = self.expr(sub) if flag else None
            return Atomic(op, buffer, index, value, expected)
        self.fail(f"unknown expression tag {tag} (known: 0..10)", self.pos - 1)

    def const(self) -> Const:
        at = self.node_at
        if self.end - self.pos < 5:
            self.truncated(5, "a constant (dtype code and 32-bit word)")
        code, bits = _U8_U32.unpack_from(self.data, self.pos)
        cached = self.consts.get((code, bits))
        if cached is not None:
            self.pos += 5
            return cached
        dtype = self.code(_DTYPES, "constant dtype")
        self.pos += 4
        if dtype is DType.F32:
            is_nan = (bits & 0x7F80_0000) == 0x7F80_0000 and bits & 0x007F_FFFF
            if is_nan and bits != _CANONICAL_NAN:
                self.fail(f"f32 constant NaN bits 0x{bits:08X} are not canonical (0x7FC00000)", at)
            value: int | float | bool = f32_from_bits(bits)
        elif dtype is DType.BOOL:
            if bits > 1:
                self.fail(f"bool constant bits must be 0 or 1, found {bits}", at)
            value = bool(bits)
        elif dtype is DType.I32:
            value = bits - _I32_BIAS if bits & 0x8000_0000 else bits
        else:
            value = bits
        node = self.consts[code, bits] = Const(dtype, value)
        return node


_BUILTIN_NODES: Final = {
    (kind, axis): Builtin(kind, axis) for kind in BuiltinKind for axis in (0, 1, 2)
}


def decode_program(data: bytes | bytearray | memoryview) -> Program:
    """Decode a program from its wire form, checking everything.

    Args:
        data: Bytes produced by `encode_program` (``Program.to_wire()``).

    Returns:
        The program; ``decode_program(encode_program(p)) == p``.

    Raises:
        InvalidProgram: the bytes are not a canonical version-1 or -2 wire form: bad
            magic, unknown version or flags, digest mismatch, truncation,
            trailing bytes, unknown codes, invalid UTF-8, non-canonical order or
            NaN, or a structural limit exceeded. Never any other exception.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidProgram(
            f"wire data must be bytes, bytearray or memoryview, got {type(data).__name__}",
            fix="pass the bytes returned by Program.to_wire()",
        )
    try:
        raw = bytes(data)
        return _decode(raw)
    except InvalidProgram:
        raise
    except RecursionError:
        raise InvalidProgram(
            "invalid program wire bytes: decoding ran out of Python stack",
            fix="decode from a shallower call stack; the program nesting is within limits",
        ) from None
    except Exception as exc:  # the contract: nothing but InvalidProgram escapes
        raise InvalidProgram(
            f"invalid program wire bytes: internal decoder error {type(exc).__name__}: {exc}",
            fix=_DECODE_FIX,
        ) from exc


def _decode(raw: bytes) -> Program:
    size = len(raw)
    if size < HEADER_SIZE:
        if raw[:4] != WIRE_MAGIC[: min(4, size)]:
            _header_fail(f"bad magic {raw[:4]!r} (expected {WIRE_MAGIC!r})", 0)
        _header_fail(f"truncated: {size} bytes is shorter than the {HEADER_SIZE}-byte header", 0)
    magic, version, flags = _PREFIX.unpack_from(raw, 0)
    if magic != WIRE_MAGIC:
        _header_fail(f"bad magic {magic!r} (expected {WIRE_MAGIC!r})", 0)
    if version not in WIRE_VERSIONS:
        raise InvalidProgram(
            f"invalid program wire bytes: unknown wire version {version} "
            f"(this build reads versions 1 and {WIRE_VERSION})",
            fix="re-encode the program with this vyre-async version's Program.to_wire()",
            offset=4,
        )
    if flags != WIRE_FLAGS:
        _header_fail(f"unknown flags 0x{flags:04X} (version {version} defines none)", 6)
    body_digest = _digest(raw[HEADER_SIZE:])
    if body_digest != raw[8:HEADER_SIZE]:
        _header_fail(
            "body digest mismatch: the stored blake3 digest "
            f"{raw[8:16].hex()}… does not match the body's {body_digest[:8].hex()}… "
            "(corrupted or tampered bytes)",
            8,
        )
    return _Decoder(raw, version).program()


def _header_fail(message: str, offset: int) -> NoReturn:
    raise InvalidProgram(
        f"invalid program wire bytes at offset {offset}: {message}",
        fix=_DECODE_FIX,
        offset=offset,
    )
