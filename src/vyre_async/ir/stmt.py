"""Statements of the Program IR. Bodies are tuples; lists are accepted and frozen."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vyre_async.errors import InvalidProgram
from vyre_async.ir.expr import Expr, _buffer_name, _set, lift

__all__ = [
    "Assign",
    "Barrier",
    "Block",
    "If",
    "Let",
    "Loop",
    "Return",
    "Stmt",
    "Store",
    "as_body",
]


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidProgram(
            f"{what} must be a non-empty str, got {value!r}", fix=f"give the {what} a name"
        )
    return value


def as_body(statements: Iterable[object], *, where: str = "body") -> tuple[Stmt, ...]:
    """Return ``statements`` as a tuple of statements.

    Raises:
        InvalidProgram: an item is not a statement (for example a bare expression).
    """
    if isinstance(statements, Stmt):
        statements = (statements,)
    out = tuple(statements)
    for i, item in enumerate(out):
        if not isinstance(item, Stmt):
            raise InvalidProgram(
                f"{where}[{i}] is a {type(item).__name__}, not a statement: {item!r}",
                fix="wrap expressions in a statement: Let, Assign or Store",
            )
    return out


class Stmt:
    """Base class of every statement node."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Let(Stmt):
    """Introduce variable ``name`` with ``value``; its dtype is fixed from then on."""

    name: str
    value: Expr

    def __post_init__(self) -> None:
        _set(self, "name", _name(self.name, "Let name"))
        _set(self, "value", lift(self.value))

    def __repr__(self) -> str:
        return f"Let({self.name!r}, {self.value!r})"


@dataclass(frozen=True, slots=True)
class Assign(Stmt):
    """Give variable ``name`` a new ``value`` of its dtype."""

    name: str
    value: Expr

    def __post_init__(self) -> None:
        _set(self, "name", _name(self.name, "Assign name"))
        _set(self, "value", lift(self.value))

    def __repr__(self) -> str:
        return f"Assign({self.name!r}, {self.value!r})"


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    """Write ``value`` to ``buffer[index]``; an out-of-bounds store does nothing."""

    buffer: str
    index: Expr
    value: Expr

    def __post_init__(self) -> None:
        _set(self, "buffer", _buffer_name(self.buffer))
        _set(self, "index", lift(self.index))
        _set(self, "value", lift(self.value))

    def __repr__(self) -> str:
        return f"Store({self.buffer!r}, {self.index!r}, {self.value!r})"


@dataclass(frozen=True, slots=True)
class If(Stmt):
    """Run ``then`` where ``cond`` (BOOL or U32, non-zero = true) holds, else ``orelse``."""

    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "cond", lift(self.cond))
        _set(self, "then", as_body(self.then, where="If.then"))
        _set(self, "orelse", as_body(self.orelse, where="If.orelse"))

    def __repr__(self) -> str:
        tail = f", {list(self.orelse)!r}" if self.orelse else ""
        return f"If({self.cond!r}, {list(self.then)!r}{tail})"


@dataclass(frozen=True, slots=True)
class Loop(Stmt):
    """Run ``body`` with read-only U32 ``var`` over ``[start, end)``; bounds evaluated once."""

    var: str
    start: Expr
    end: Expr
    body: tuple[Stmt, ...]

    def __post_init__(self) -> None:
        _set(self, "var", _name(self.var, "Loop variable"))
        _set(self, "start", lift(self.start))
        _set(self, "end", lift(self.end))
        _set(self, "body", as_body(self.body, where="Loop.body"))

    def __repr__(self) -> str:
        return f"Loop({self.var!r}, {self.start!r}, {self.end!r}, {list(self.body)!r})"


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    """Workgroup execution and memory barrier; legal only in uniform control flow."""

    def __repr__(self) -> str:
        return "Barrier()"


@dataclass(frozen=True, slots=True)
class Return(Stmt):
    """End this lane; returned lanes no longer count at barriers."""

    def __repr__(self) -> str:
        return "Return()"


@dataclass(frozen=True, slots=True)
class Block(Stmt):
    """A scope: variables introduced inside are not visible after it."""

    body: tuple[Stmt, ...]

    def __post_init__(self) -> None:
        _set(self, "body", as_body(self.body, where="Block.body"))

    def __repr__(self) -> str:
        return f"Block({list(self.body)!r})"
