"""The Program IR: types, expressions, statements, programs, validation and the wire form."""

from vyre_async._exports import public_dir as _public_dir
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
    f32,
    gid,
    i32,
    lid,
    nwg,
    u32,
    wgid,
)
from vyre_async.ir.ops import CORE_OPS, AtomicOp, BinOp, BuiltinKind, UnOp
from vyre_async.ir.program import Program
from vyre_async.ir.split import split_at_grid_barriers
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
from vyre_async.ir.validate import Diagnostic, validate, validate_or_raise
from vyre_async.ir.walk import ops_used

__all__ = [
    "CORE_OPS",
    "Access",
    "Assign",
    "Atomic",
    "AtomicOp",
    "Barrier",
    "Bin",
    "BinOp",
    "Block",
    "BufLen",
    "BufferDecl",
    "Builtin",
    "BuiltinKind",
    "Cast",
    "Const",
    "DType",
    "Diagnostic",
    "Expr",
    "Fma",
    "GridBarrier",
    "If",
    "Let",
    "Load",
    "Loop",
    "Program",
    "Return",
    "Select",
    "Stmt",
    "Store",
    "Un",
    "UnOp",
    "Var",
    "f32",
    "gid",
    "i32",
    "lid",
    "nwg",
    "ops_used",
    "split_at_grid_barriers",
    "u32",
    "validate",
    "validate_or_raise",
    "wgid",
]
__dir__ = _public_dir(__name__)
