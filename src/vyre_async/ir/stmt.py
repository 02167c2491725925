"""Statements of the Program IR. Bodies are tuples; lists are accepted and frozen."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir.expr import Expr, ExprLike, _buffer_name, _set, lift
from vyre_async.ir.types import BufferDecl

__all__ = [
    "Assign",
    "Barrier",
    "Body",
    "Block",
    "GridBarrier",
    "If",
    "Let",
    "Loop",
    "Return",
    "Stmt",
    "Store",
    "as_body",
]
__dir__ = _public_dir(__name__)


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidProgram(
            f"{what} must be a non-empty str, got {value!r}", fix=f"give the {what} a name"
        )
    return value


def as_body(statements: Stmt | Iterable[object], *, where: str = "body") -> tuple[Stmt, ...]:
    """Return ``statements`` as a tuple of statements.

    Raises:
        InvalidProgram: an item is not a statement (for example a bare expression).
    """
    if isinstance(statements, Stmt):
        statements = (statements,)
    elif not isinstance(statements, Iterable) or isinstance(statements, str | bytes):
        raise InvalidProgram(
            f"{where} must be a list of statements, got {statements!r}",
            fix="pass a list such as [Let(...), Store(...)]",
        )
    out: list[Stmt] = []
    for i, item in enumerate(statements):
        if not isinstance(item, Stmt):
            raise InvalidProgram(
                f"{where}[{i}] is a {type(item).__name__}, not a statement: {item!r}",
                fix="wrap expressions in a statement: Let, Assign or Store",
            )
        out.append(item)
    return tuple(out)


class Stmt:
    """Base class of every statement node."""

    __slots__ = ()


#: What a statement body may be given as: a statement or any iterable of them.
Body: TypeAlias = "Stmt | Iterable[Stmt]"


@dataclass(frozen=True, slots=True, init=False)
class Let(Stmt):
    """Introduce variable ``name`` with ``value``; its dtype is fixed from then on."""

    name: str
    value: Expr

    def __init__(self, name: str, value: ExprLike) -> None:
        _set(self, "name", _name(name, "Let name"))
        _set(self, "value", lift(value))

    def __repr__(self) -> str:
        return f"Let({self.name!r}, {self.value!r})"


@dataclass(frozen=True, slots=True, init=False)
class Assign(Stmt):
    """Give variable ``name`` a new ``value`` of its dtype."""

    name: str
    value: Expr

    def __init__(self, name: str, value: ExprLike) -> None:
        _set(self, "name", _name(name, "Assign name"))
        _set(self, "value", lift(value))

    def __repr__(self) -> str:
        return f"Assign({self.name!r}, {self.value!r})"


@dataclass(frozen=True, slots=True, init=False)
class Store(Stmt):
    """Write ``value`` to ``buffer[index]``; an out-of-bounds store does nothing."""

    buffer: str
    index: Expr
    value: Expr

    def __init__(self, buffer: str | BufferDecl, index: ExprLike, value: ExprLike) -> None:
        _set(self, "buffer", _buffer_name(buffer))
        _set(self, "index", lift(index))
        _set(self, "value", lift(value))

    def __repr__(self) -> str:
        return f"Store({self.buffer!r}, {self.index!r}, {self.value!r})"


@dataclass(frozen=True, slots=True, init=False)
class If(Stmt):
    """Run ``then`` where ``cond`` (BOOL or U32, non-zero = true) holds, else ``orelse``."""

    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()

    def __init__(self, cond: ExprLike, then: Body, orelse: Body = ()) -> None:
        _set(self, "cond", lift(cond))
        _set(self, "then", as_body(then, where="If.then"))
        _set(self, "orelse", as_body(orelse, where="If.orelse"))

    def __repr__(self) -> str:
        tail = f", {list(self.orelse)!r}" if self.orelse else ""
        return f"If({self.cond!r}, {list(self.then)!r}{tail})"


@dataclass(frozen=True, slots=True, init=False)
class Loop(Stmt):
    """Run ``body`` with read-only U32 ``var`` over ``[start, end)``; bounds evaluated once."""

    var: str
    start: Expr
    end: Expr
    body: tuple[Stmt, ...]

    def __init__(self, var: str, start: ExprLike, end: ExprLike, body: Body) -> None:
        _set(self, "var", _name(var, "Loop variable"))
        _set(self, "start", lift(start))
        _set(self, "end", lift(end))
        _set(self, "body", as_body(body, where="Loop.body"))

    def __repr__(self) -> str:
        return f"Loop({self.var!r}, {self.start!r}, {self.end!r}, {list(self.body)!r})"


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    """Workgroup execution and memory barrier; legal only in uniform control flow."""

    def __repr__(self) -> str:
        return "Barrier()"


@dataclass(frozen=True, slots=True)
class GridBarrier(Stmt):
    """Grid-wide barrier: every lane of the grid reaches it before any lane goes on.

    Every storage write before it is visible to every lane after it, and
    workgroup memory is zero again after it. Legal only at the top level of
    the program body, with no variable used across it and no ``Return`` in the
    program (`vyre_async.ir.validate`: V034 to V036). Backends without a
    native grid barrier run the program as one launch per segment
    (`vyre_async.split_at_grid_barriers`).
    """

    def __repr__(self) -> str:
        return "GridBarrier()"


@dataclass(frozen=True, slots=True)
class Return(Stmt):
    """End this lane; returned lanes no longer count at barriers."""

    def __repr__(self) -> str:
        return "Return()"


@dataclass(frozen=True, slots=True, init=False)
class Block(Stmt):
    """A scope: variables introduced inside are not visible after it."""

    body: tuple[Stmt, ...]

    def __init__(self, body: Body) -> None:
        _set(self, "body", as_body(body, where="Block.body"))

    def __repr__(self) -> str:
        return f"Block({list(self.body)!r})"
