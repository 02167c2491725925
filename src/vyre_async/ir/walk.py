"""Read-only walks over a program's statements and expressions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from vyre_async._exports import public_dir as _public_dir
from vyre_async.ir.expr import Atomic, Bin, Cast, Expr, Fma, Load, Select, Un
from vyre_async.ir.ops import GRID_BARRIER_OP
from vyre_async.ir.program import Program
from vyre_async.ir.stmt import Assign, Block, GridBarrier, If, Let, Loop, Stmt, Store

__all__ = [
    "child_exprs",
    "iter_exprs",
    "iter_stmts",
    "ops_used",
    "uses_atomics",
    "uses_workgroup_memory",
]
__dir__ = _public_dir(__name__)


def iter_stmts(statements: Iterable[Stmt]) -> Iterator[Stmt]:
    """Yield every statement in pre-order, descending into If, Loop and Block bodies."""
    stack = list(reversed(tuple(statements)))
    while stack:
        stmt = stack.pop()
        yield stmt
        match stmt:
            case If(then=then, orelse=orelse):
                stack.extend(reversed(orelse))
                stack.extend(reversed(then))
            case Loop(body=inner) | Block(body=inner):
                stack.extend(reversed(inner))


def stmt_exprs(stmt: Stmt) -> tuple[Expr, ...]:
    """Return the expressions a statement holds directly (not those of nested statements)."""
    match stmt:
        case Let(value=value) | Assign(value=value):
            return (value,)
        case Store(index=index, value=value):
            return (index, value)
        case If(cond=cond):
            return (cond,)
        case Loop(start=start, end=end):
            return (start, end)
    return ()


def child_exprs(expr: Expr) -> tuple[Expr, ...]:
    """Return the direct sub-expressions of ``expr``, in evaluation (pre-order) order."""
    match expr:
        case Load(index=index):
            return (index,)
        case Bin(a=a, b=b):
            return (a, b)
        case Un(a=a) | Cast(value=a):
            return (a,)
        case Select(cond=c, if_true=t, if_false=f):
            return (c, t, f)
        case Fma(a=a, b=b, c=c):
            return (a, b, c)
        case Atomic(index=index, value=value, expected=expected):
            return (index, value) if expected is None else (index, value, expected)
    return ()


def iter_exprs(statements: Iterable[Stmt]) -> Iterator[Expr]:
    """Yield every expression node of every statement, pre-order."""
    for stmt in iter_stmts(statements):
        stack = list(reversed(stmt_exprs(stmt)))
        while stack:
            expr = stack.pop()
            yield expr
            stack.extend(reversed(child_exprs(expr)))


def uses_atomics(program: Program) -> bool:
    """Return True when any expression of ``program`` is an `Atomic`."""
    cached = program.memo.get("uses_atomics")
    if cached is None:
        cached = any(isinstance(e, Atomic) for e in iter_exprs(program.body))
        program.memo["uses_atomics"] = cached
    return bool(cached)


def uses_workgroup_memory(program: Program) -> bool:
    """Return True when ``program`` declares any WORKGROUP buffer."""
    return bool(program.workgroup_buffers)


def ops_used(program: Program) -> frozenset[str]:
    """Return the operations ``program`` uses, named as in `CORE_OPS` (memoised).

    A `GridBarrier` anywhere in the body counts as ``"stmt.grid_barrier"``.
    """
    cached = program.memo.get("ops_used")
    if cached is None:
        found: set[str] = set()
        if any(isinstance(stmt, GridBarrier) for stmt in iter_stmts(program.body)):
            found.add(GRID_BARRIER_OP)
        for expr in iter_exprs(program.body):
            if isinstance(expr, Bin):
                found.add(f"bin.{expr.op.value}")
            elif isinstance(expr, Un):
                found.add(f"un.{expr.op.value}")
            elif isinstance(expr, Atomic):
                found.add(f"atomic.{expr.op.value}")
        cached = frozenset(found)
        program.memo["ops_used"] = cached
    return frozenset(cached)
