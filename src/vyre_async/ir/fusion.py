"""Horizontal fusion: independent programs as one program in which each workgroup range
runs one member.

`fuse_programs` takes member programs of one workgroup shape and returns a
`FusedProgram`: one `Program` whose grid is every member's grid laid end to end
along x. A UNIFORM table (``vyf_table``, the last input) holds each member's
first fused workgroup and its own grid, so one fused program (one compile)
serves members of any grid. Inside, each member's body runs under ``If`` on the
fused workgroup id, with its builtins rewritten to its own geometry (``wgid``,
``nwg``, ``gid``; ``lid`` is unchanged), its buffers and variables renamed
(``m<i>_<name>``), and its workgroup buffers shared with other members where
dtype and count agree (a workgroup runs one member, and starts zeroed). Each
member then computes exactly what it computes launched alone. Pure; the result
for a tuple of member programs is cached.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    u32,
    wgid,
)
from vyre_async.ir.limits import MAX_BUFFERS, MAX_NAME_BYTES
from vyre_async.ir.ops import BuiltinKind
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
from vyre_async.ir.validate import validate, validate_or_raise
from vyre_async.ir.walk import iter_stmts

__all__ = ["TABLE", "FusedProgram", "fuse_programs"]
__dir__ = _public_dir(__name__)

#: The fused program's member table: per member (first workgroup, gx, gy, gz), u32.
TABLE = "vyf_table"
_CACHE_SIZE = 128
_cache: OrderedDict[tuple[Program, ...], FusedProgram] = OrderedDict()
_lock = threading.Lock()

Grid = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class FusedProgram:
    """Member programs fused into one program (`fuse_programs`).

    Attributes:
        program: The fused program. Its inputs are member 0's inputs, member
            1's, ... and last the member table; its outputs likewise, member by
            member.
        members: The member programs, in the order given.
        inputs: How many inputs each member takes.
        outputs: How many outputs each member returns.
    """

    program: Program
    members: tuple[Program, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def grid(self, grids: Sequence[Grid]) -> Grid:
        """The fused launch grid for the members' grids: all their workgroups along x.

        Raises:
            InvalidProgram: one grid per member was not given, or over 2**32 - 1
                workgroups in all.
        """
        total = sum(_workgroups(self._grids(grids)))
        if total > 0xFFFF_FFFF:
            raise InvalidProgram(
                f"the fused grid would have {total} workgroups, over 2**32 - 1",
                fix="fuse fewer or smaller dispatches",
            )
        return (total, 1, 1)

    def table(self, grids: Sequence[Grid]) -> np.ndarray:
        """The member table for the members' grids: ``(first, gx, gy, gz)`` per member."""
        rows = []
        first = 0
        for grid, count in zip(self._grids(grids), _workgroups(grids), strict=True):
            rows.append((first, *grid))
            first += count
        return np.array(rows, dtype=np.uint32).reshape(-1)

    def fused_inputs(
        self, member_inputs: Sequence[Sequence[Any]], grids: Sequence[Grid]
    ) -> list[Any]:
        """The fused program's inputs: each member's own, in order, then the table.

        Raises:
            InvalidProgram: not one input list per member, or a list of the wrong length.
        """
        if len(member_inputs) != len(self.members):
            raise InvalidProgram(
                f"{len(self.members)} members, {len(member_inputs)} input lists",
                fix="pass one input list per member, in member order",
            )
        out: list[Any] = []
        for index, (inputs, want) in enumerate(zip(member_inputs, self.inputs, strict=True)):
            if len(inputs) != want:
                raise InvalidProgram(
                    f"member {index} takes {want} inputs, got {len(inputs)}",
                    fix="pass one input per READ, UNIFORM and READ_WRITE buffer of the member",
                )
            out.extend(inputs)
        out.append(self.table(grids))
        return out

    def split_outputs(self, outputs: Sequence[Any]) -> list[list[Any]]:
        """Cut the fused program's outputs into each member's own."""
        out = []
        at = 0
        for count in self.outputs:
            out.append(list(outputs[at : at + count]))
            at += count
        return out

    def _grids(self, grids: Sequence[Grid]) -> Sequence[Grid]:
        if len(grids) != len(self.members):
            raise InvalidProgram(
                f"{len(self.members)} members, {len(grids)} grids",
                fix="pass one grid per member, in member order",
            )
        return grids


def _workgroups(grids: Sequence[Grid]) -> list[int]:
    return [gx * gy * gz for gx, gy, gz in grids]


def fuse_programs(programs: Sequence[Program]) -> FusedProgram:
    """Fuse independent member ``programs`` into one (cached per tuple of members).

    The members must validate, share one workgroup shape and hold no
    `GridBarrier`. Members that end lanes with ``Return`` run after those with
    a ``Barrier`` (the validator requires every barrier to come before a
    divergent return in program order); at most one member may have both. The
    fused program validates clean.

    Raises:
        InvalidProgram: fewer than one member, a member that does not validate,
            differing workgroup shapes, a grid barrier, more than one member
            with both a ``Barrier`` and a ``Return``, or a fused program past
            the IR's limits (buffers, names).
    """
    members = tuple(programs)
    with _lock:
        hit = _cache.get(members)
        if hit is not None:
            _cache.move_to_end(members)
            return hit
    fused = _fuse(members)
    with _lock:
        _cache[members] = fused
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return fused


def _refuse(message: str, fix: str) -> InvalidProgram:
    return InvalidProgram(f"cannot fuse these programs: {message}", fix=fix)


def _fuse(members: tuple[Program, ...]) -> FusedProgram:
    if not members or not all(isinstance(p, Program) for p in members):
        raise _refuse("give at least one Program", "pass the member programs")
    for program in members:
        validate_or_raise(program)
    workgroup = members[0].workgroup_size
    if any(p.workgroup_size != workgroup for p in members):
        raise _refuse(
            "their workgroup shapes differ",
            "fuse only programs of one workgroup_size",
        )
    kinds = [_kinds(p) for p in members]
    if any(grid for grid, _, _ in kinds):
        raise _refuse("a member has a GridBarrier", "dispatch grid-barrier programs on their own")
    both = [i for i, (_, barrier, ret) in enumerate(kinds) if barrier and ret]
    if len(both) > 1:
        raise _refuse(
            "more than one member has both a Barrier and a Return",
            "fuse at most one such program per group",
        )
    # Barriers first, then the one member with both, then the members that return.
    order = sorted(range(len(members)), key=lambda i: (kinds[i][2], not kinds[i][1]))
    buffers: list[BufferDecl] = []
    renames: list[dict[str, str]] = []
    slots: dict[tuple[DType, int], list[str]] = {}
    binding = 0
    for index, program in enumerate(members):
        names: dict[str, str] = {}
        used: dict[tuple[DType, int], int] = {}
        for decl in program.buffers:
            if decl.access is Access.WORKGROUP:
                key = (decl.dtype, decl.count)
                k = used.get(key, 0)
                used[key] = k + 1
                shared = slots.setdefault(key, [])
                if k == len(shared):
                    shared.append(f"vyf_s{len(buffers)}")
                    buffers.append(
                        BufferDecl(shared[k], binding, decl.access, decl.dtype, decl.count)
                    )
                    binding += 1
                names[decl.name] = shared[k]
                continue
            name = _name(f"m{index}_{decl.name}")
            names[decl.name] = name
            buffers.append(BufferDecl(name, binding, decl.access, decl.dtype, decl.count))
            binding += 1
        renames.append(names)
    buffers.append(BufferDecl(TABLE, binding, Access.UNIFORM, DType.U32, 4 * len(members)))
    if len(buffers) > MAX_BUFFERS:
        raise _refuse(
            f"{len(buffers)} buffers, over MAX_BUFFERS ({MAX_BUFFERS})",
            "fuse fewer programs per group",
        )
    body: list[Stmt] = [Let("vyf_w", wgid(0))]
    w = Var("vyf_w")
    for index in order:
        first = Load(TABLE, u32(4 * index))
        end = first + _count(index)
        inner = _Member(index, renames[index], workgroup).prelude()
        inner += [_Member(index, renames[index], workgroup).stmt(s) for s in members[index].body]
        body.append(If(w.ge(first).land(w.lt(end)), inner))
    op_id = "fused:" + ",".join(p.op_id or "program" for p in members)
    program = Program(buffers, workgroup, body, op_id[:MAX_NAME_BYTES] if _fits(op_id) else "fused")
    problems = validate(program)
    if problems:  # a member mix the rules above did not foresee: refuse, never run it
        raise _refuse(
            f"the fused program breaks {problems[0]}",
            "dispatch these programs separately",
        )
    return FusedProgram(
        program=program,
        members=members,
        inputs=tuple(len(p.inputs) for p in members),
        outputs=tuple(len(p.outputs) for p in members),
    )


def _fits(text: str) -> bool:
    return len(text.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES


def _name(text: str) -> str:
    if not _fits(text):
        raise _refuse(
            f"the name {text[:40]!r}... is over {MAX_NAME_BYTES} bytes once prefixed",
            "use shorter buffer and variable names",
        )
    return text


def _count(index: int) -> Expr:
    """Member ``index``'s workgroup count, from the table."""
    base = 4 * index
    return Load(TABLE, u32(base + 1)) * Load(TABLE, u32(base + 2)) * Load(TABLE, u32(base + 3))


def _kinds(program: Program) -> tuple[bool, bool, bool]:
    """(has a GridBarrier, has a Barrier, has a Return)."""
    grid = barrier = ret = False
    for stmt in iter_stmts(program.body):
        grid |= isinstance(stmt, GridBarrier)
        barrier |= isinstance(stmt, Barrier)
        ret |= isinstance(stmt, Return)
    return grid, barrier, ret


class _Member:
    """Rewrites one member's statements: names, buffers and builtins."""

    def __init__(self, index: int, buffers: dict[str, str], workgroup: Grid) -> None:
        self.index = index
        self.buffers = buffers
        self.workgroup = workgroup
        self.prefix = f"m{index}_"

    def prelude(self) -> list[Stmt]:
        """The member's own workgroup id per axis (``vyf_m<i>_x/y/z``)."""
        base = 4 * self.index
        gx, gy = Load(TABLE, u32(base + 1)), Load(TABLE, u32(base + 2))
        local = Var("vyf_w") - Load(TABLE, u32(base))
        p = f"vyf_m{self.index}_"
        return [
            Let(p + "x", local % gx),
            Let(p + "y", (local / gx) % gy),
            Let(p + "z", local / (gx * gy)),
        ]

    def var(self, name: str) -> str:
        return _name(self.prefix + name)

    def buffer(self, name: str) -> str:
        found = self.buffers.get(name)
        if found is None:  # (validated members name only their own buffers)
            raise _refuse(f"unknown buffer {name!r}", "validate the member first")
        return found

    def builtin(self, expr: Builtin) -> Expr:
        axis = expr.axis
        if expr.kind is BuiltinKind.LID:
            return expr
        group = Var(f"vyf_m{self.index}_{'xyz'[axis]}")
        if expr.kind is BuiltinKind.WGID:
            return group
        if expr.kind is BuiltinKind.NWG:
            return Load(TABLE, u32(4 * self.index + 1 + axis))
        return group * u32(self.workgroup[axis]) + Builtin(BuiltinKind.LID, axis)  # GID

    def stmt(self, stmt: Stmt) -> Stmt:
        e = self.expr
        match stmt:
            case Let(name=name, value=value):
                return Let(self.var(name), e(value))
            case Assign(name=name, value=value):
                return Assign(self.var(name), e(value))
            case Store(buffer=buffer, index=index, value=value):
                return Store(self.buffer(buffer), e(index), e(value))
            case If(cond=cond, then=then, orelse=orelse):
                return If(e(cond), [self.stmt(s) for s in then], [self.stmt(s) for s in orelse])
            case Loop(var=var, start=start, end=end, body=body):
                return Loop(self.var(var), e(start), e(end), [self.stmt(s) for s in body])
            case Block(body=body):
                return Block([self.stmt(s) for s in body])
            case Barrier() | Return():
                return stmt
        raise _refuse(f"{type(stmt).__name__} cannot be fused", "dispatch it on its own")

    def expr(self, expr: Expr) -> Expr:
        e = self.expr
        match expr:
            case Const():
                return expr
            case Var(name=name):
                return Var(self.var(name))
            case Load(buffer=buffer, index=index):
                return Load(self.buffer(buffer), e(index))
            case BufLen(buffer=buffer):
                return BufLen(self.buffer(buffer))
            case Builtin():
                return self.builtin(expr)
            case Bin(op=op, a=a, b=b):
                return Bin(op, e(a), e(b))
            case Un(op=op, a=a):
                return Un(op, e(a))
            case Select(cond=c, if_true=t, if_false=f):
                return Select(e(c), e(t), e(f))
            case Cast(dtype=dtype, value=value):
                return Cast(dtype, e(value))
            case Fma(a=a, b=b, c=c):
                return Fma(e(a), e(b), e(c))
            case Atomic(op=op, buffer=buffer, index=index, value=value, expected=expected):
                return Atomic(
                    op,
                    self.buffer(buffer),
                    e(index),
                    e(value),
                    expected=None if expected is None else e(expected),
                )
        raise _refuse(f"{type(expr).__name__} cannot be fused", "dispatch it on its own")
