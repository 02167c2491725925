"""Compile a validated `Program` once into closures, and cache the result.

Every expression node becomes a function ``Frame -> value`` and every statement
a function ``Frame -> None``, chosen with all static facts resolved (operand
dtypes, buffer kinds, whether an atomic's old value is used, which outer
variables a body assigns). Running a compiled body is a loop over closures:
the tree is never walked again. Compiled programs are kept in a bounded LRU
keyed by the program (whose hash is memoised).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from vyre_async.abc import public_dir as _public_dir
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
)
from vyre_async.ir.ops import AtomicOp, BinOp, BuiltinKind, un_result
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
from vyre_async.ir.validate import validate_or_raise
from vyre_async.ir.walk import child_exprs, iter_exprs, stmt_exprs
from vyre_reference import arith
from vyre_reference.affine import Affine
from vyre_reference.atomics import apply_atomic
from vyre_reference.frame import Frame, StmtFn, branch, merge, run_body
from vyre_reference.lanes import FlatLanes, GridLanes, LaneSet
from vyre_reference.memory import load_global, load_workgroup, store_global, store_workgroup

__all__ = ["Body", "CompiledProgram", "cache_clear", "cache_info", "compile_program"]
__dir__ = _public_dir(__name__)

ExprFn = Callable[[Frame], Any]

#: Most compiled programs kept in the cache.
CACHE_SIZE = 256

_MOD = 1 << 32
_AFFINE_OPS = frozenset({BinOp.ADD, BinOp.SUB, BinOp.MUL})
_COMPARE_OPS = frozenset({BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE, BinOp.EQ, BinOp.NE})
_FLIP = {
    BinOp.LT: BinOp.GT,
    BinOp.LE: BinOp.GE,
    BinOp.GT: BinOp.LT,
    BinOp.GE: BinOp.LE,
    BinOp.EQ: BinOp.EQ,
    BinOp.NE: BinOp.NE,
}


@dataclass(frozen=True, slots=True)
class Body:
    """A compiled statement list.

    Attributes:
        stmts: One closure per statement that does something (Barrier and dead
            `Let`s compile to nothing).
        outer: Variables the list assigns that are declared outside it → numpy dtype.
    """

    stmts: tuple[StmtFn, ...]
    outer: MappingProxyType[str, type[np.generic]]


@dataclass(frozen=True, slots=True)
class CompiledProgram:
    """A program compiled to closures; reusable for every launch of it.

    Attributes:
        program: The source program.
        body: The compiled top-level body.
    """

    program: Program
    body: Body


# ---------------------------------------------------------------------------------
# cache

_cache: OrderedDict[Program, CompiledProgram] = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def compile_program(program: Program) -> CompiledProgram:
    """Return the compiled form of ``program``, compiling and validating it on first use.

    Raises:
        InvalidProgram: ``program`` fails validation (the message lists the diagnostics).
    """
    with _cache_lock:
        hit = _cache.get(program)
        if hit is not None:
            _cache.move_to_end(program)
            _stats["hits"] += 1
            return hit
    _validate(program)
    compiled = CompiledProgram(program=program, body=_Compiler(program).body(program.body, {}))
    with _cache_lock:
        _stats["misses"] += 1
        _cache[program] = compiled
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def cache_info() -> dict[str, int]:
    """Return the compile cache's hits, misses and current size."""
    with _cache_lock:
        return {**_stats, "size": len(_cache)}


def cache_clear() -> None:
    """Drop every compiled program."""
    with _cache_lock:
        _cache.clear()
        _stats["hits"] = _stats["misses"] = 0


def _validate(program: Program) -> None:
    validate_or_raise(program)


# ---------------------------------------------------------------------------------
# static facts


def _contains_atomic(expr: Expr) -> bool:
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, Atomic):
            return True
        stack.extend(child_exprs(node))
    return False


def _outer_assigns(stmts: Iterable[Stmt], declared: frozenset[str]) -> set[str]:
    """Return the names ``stmts`` assign that are not declared inside them."""
    names = set(declared)
    out: set[str] = set()
    for stmt in stmts:
        match stmt:
            case Let(name=name):
                names.add(name)
            case Assign(name=name):
                if name not in names:
                    out.add(name)
            case If(then=then, orelse=orelse):
                out |= _outer_assigns(then, frozenset(names))
                out |= _outer_assigns(orelse, frozenset(names))
            case Loop(var=var, body=inner):
                out |= _outer_assigns(inner, frozenset(names | {var}))
            case Block(body=inner):
                out |= _outer_assigns(inner, frozenset(names))
    return out


def _own(value: Any) -> Any:
    """Return ``value`` detached from buffer memory (views are copied)."""
    if isinstance(value, np.ndarray) and value.base is not None:
        return value.copy()
    return value


# ---------------------------------------------------------------------------------
# lane-affine arithmetic


def _uniform_int(value: Any) -> int | None:
    if type(value) is Affine:  # (its constant may lie outside 0..2**32-1: wrap it)
        return value.c % _MOD if value.is_uniform else None
    if isinstance(value, np.generic):
        return int(value)
    return None


def _affine_binary(op: BinOp, a: Any, b: Any, frame: Frame, fallback: arith.BinaryFn) -> Any:
    """Apply a U32 ``op`` when an operand is `Affine`: stay symbolic or decide from bounds."""
    ka = _uniform_int(a)
    kb = _uniform_int(b)
    if op in _AFFINE_OPS:
        if type(a) is Affine and (type(b) is Affine or kb is not None):
            other: Affine | int = b if type(b) is Affine else kb  # type: ignore[assignment]
            if op is BinOp.ADD:
                return a.add(other)
            if op is BinOp.SUB:
                return a.add(other, -1)
            if kb is not None:
                return a.scale(kb)
        elif type(b) is Affine and ka is not None:
            if op is BinOp.ADD:
                return b.add(ka)
            if op is BinOp.SUB:
                return b.rsub(ka)
            return b.scale(ka)
    elif op in _COMPARE_OPS:
        decided: Any = None
        if type(a) is Affine and kb is not None:
            decided = _decide(op, a, kb, frame)
        elif type(b) is Affine and ka is not None:
            decided = _decide(_FLIP[op], b, ka, frame)
        if decided is not None:
            return decided
    lanes = frame.lanes
    return fallback(lanes.value(a), lanes.value(b))


def _decide(op: BinOp, x: Affine, k: int, frame: Frame) -> Any:
    """Return ``x op k`` cheaply, or None to compute it on materialized values.

    The result is a bool scalar when the comparison is the same on every lane
    (from bounds), or a prefix/suffix mask when ``x`` steps evenly through a
    contiguous run of lanes (``gid < n`` on a partial last workgroup).
    """
    lanes = frame.lanes
    lo, hi = lanes.bounds(x)
    if lo < 0 or hi >= _MOD:
        return None
    if op is BinOp.LT:
        verdict = True if hi < k else False if lo >= k else None
    elif op is BinOp.LE:
        verdict = True if hi <= k else False if lo > k else None
    elif op is BinOp.GT:
        verdict = True if lo > k else False if hi <= k else None
    elif op is BinOp.GE:
        verdict = True if lo >= k else False if hi < k else None
    else:
        inside = lo <= k <= hi
        same = lo == hi
        if op is BinOp.EQ:
            verdict = False if not inside else True if same else None
        else:
            verdict = True if not inside else False if same else None
    if verdict is not None:
        return np.bool_(verdict)
    return _run_mask(op, x, k, lanes)


def _run_mask(op: BinOp, x: Affine, k: int, lanes: LaneSet) -> Any:
    """Return ``x op k`` as a mask built by slicing when ``x = c0 + b·position``, else None."""
    if op not in (BinOp.LT, BinOp.LE, BinOp.GT, BinOp.GE):
        return None
    lin = x.linear(lanes.grid, lanes.workgroup)
    nl_total = lanes.workgroup[0] * lanes.workgroup[1] * lanes.workgroup[2]
    if lin is None or lin[2] <= 0 or lin[1] != lin[2] * nl_total:
        return None
    c, _, b = lin
    if isinstance(lanes, GridLanes):
        if not (
            isinstance(lanes.rows, slice)
            and isinstance(lanes.cols, slice)
            and lanes.cols == slice(0, nl_total)
        ):
            return None
        c0 = c + b * lanes.rows.start * nl_total
    elif isinstance(lanes, FlatLanes) and isinstance(lanes.lanes, slice):
        c0 = c + b * lanes.lanes.start
    else:
        return None
    # The value at position p is c0 + b·p: find the first p where the test flips,
    # the first p with c0 + b·p >= k (for < and >=) or with c0 + b·p > k (for <= and >).
    flips_at_k = op in (BinOp.LT, BinOp.GE)
    cut = -(-(k - c0) // b) if flips_at_k else (k - c0) // b + 1
    cut = min(max(cut, 0), lanes.size)
    mask = np.zeros(lanes.size, dtype=np.bool_)
    if op in (BinOp.LT, BinOp.LE):
        mask[:cut] = True
    else:
        mask[cut:] = True
    return mask.reshape(lanes.shape)


# ---------------------------------------------------------------------------------
# the compiler


class _Compiler:
    """Turns one program's statements and expressions into closures."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.decls: dict[str, BufferDecl] = {d.name: d for d in program.buffers}
        self.used: set[str] = {e.name for e in iter_exprs(program.body) if isinstance(e, Var)}
        self.stmt_has_atomic = False

    # -- statements -------------------------------------------------------------------
    def body(self, stmts: Iterable[Stmt], scope: dict[str, DType]) -> Body:
        stmts = tuple(stmts)
        inner = dict(scope)
        fns = [fn for fn in (self.stmt(s, inner) for s in stmts) if fn is not None]
        outer = {
            name: arith.NUMPY_DTYPE[scope[name]]
            for name in _outer_assigns(stmts, frozenset())
            if name in scope
        }
        return Body(tuple(fns), MappingProxyType(outer))

    def stmt(self, stmt: Stmt, scope: dict[str, DType]) -> StmtFn | None:
        self.stmt_has_atomic = any(_contains_atomic(e) for e in stmt_exprs(stmt))
        match stmt:
            case Let(name=name, value=value):
                return self._let(name, value, scope)
            case Assign(name=name, value=value):
                return self._assign(name, value, scope)
            case Store(buffer=buffer, index=index, value=value):
                return self._store(buffer, index, value, scope)
            case If(cond=cond, then=then, orelse=orelse):
                return self._if(cond, then, orelse, scope)
            case Loop(var=var, start=start, end=end, body=inner):
                return self._loop(var, start, end, inner, scope)
            case Block(body=inner):
                return self._block(inner, scope)
            case Barrier():
                return None  # lockstep execution already completes every statement first
            case GridBarrier():
                # Lockstep over the whole grid completes every statement first here too;
                # what remains is the rule that workgroup memory is zero again after it.
                return self._grid_barrier()
            case Return():
                return _return
        raise InvalidProgram(
            f"unknown statement {stmt!r}", fix="build statements from vyre_async.ir"
        )

    def _grid_barrier(self) -> StmtFn | None:
        shared = [d for d in self.program.buffers if d.access is Access.WORKGROUP]
        if not shared:
            return None

        def grid_barrier(frame: Frame) -> None:
            arrays = frame.state.arrays
            for decl in shared:
                arrays[decl.name] = np.zeros_like(arrays[decl.name])

        return grid_barrier

    def _let(self, name: str, value: Expr, scope: dict[str, DType]) -> StmtFn | None:
        if name not in self.used:
            if isinstance(value, Atomic):
                fn, dtype, _ = self._atomic(value, scope, want_old=False)
            else:
                fn, dtype, _ = self.expr(value, scope)
            scope[name] = dtype
            if not self.stmt_has_atomic:
                return None
            return _evaluate_only(fn)
        fn, dtype, alias = self.expr(value, scope)
        scope[name] = dtype

        if alias:

            def let_copy(frame: Frame) -> None:
                frame.env[name] = _own(fn(frame))

            return let_copy

        def let(frame: Frame) -> None:
            frame.env[name] = fn(frame)

        return let

    def _assign(self, name: str, value: Expr, scope: dict[str, DType]) -> StmtFn | None:
        fn, _, alias = self.expr(value, scope)
        if name not in self.used:
            return _evaluate_only(fn) if self.stmt_has_atomic else None

        def assign(frame: Frame) -> None:
            new = fn(frame)
            env = frame.env
            mask = frame.mask
            if mask is None:
                env[name] = _own(new) if alias else new
            else:
                lanes = frame.lanes
                env[name] = arith.fix(np.where(mask, lanes.value(new), lanes.value(env[name])))
            env.assigned.add(name)

        return assign

    def _store(self, buffer: str, index: Expr, value: Expr, scope: dict[str, DType]) -> StmtFn:
        decl = self.decls[buffer]
        index_fn, _, _ = self.expr(index, scope)
        value_fn, _, _ = self.expr(value, scope)
        is_bool = decl.dtype is DType.BOOL
        fresh = isinstance(value, _FRESH)

        if decl.access is Access.WORKGROUP:

            def store_shared(frame: Frame) -> None:
                i = index_fn(frame)
                lanes = frame.lanes
                v = lanes.value(value_fn(frame))
                if is_bool:
                    v = arith.fix(np.asarray(v).astype(np.uint32))
                store_workgroup(lanes, frame.mask, frame.state.arrays[buffer], i, v)

            return store_shared

        def store(frame: Frame) -> None:
            i = index_fn(frame)
            lanes = frame.lanes
            v = lanes.value(value_fn(frame))
            if is_bool:
                v = arith.fix(np.asarray(v).astype(np.uint32))
            store_global(lanes, frame.mask, frame.state.arrays, buffer, i, v, fresh=fresh)

        return store

    def _if(
        self,
        cond: Expr,
        then: tuple[Stmt, ...],
        orelse: tuple[Stmt, ...],
        scope: dict[str, DType],
    ) -> StmtFn:
        cond_fn, _, _ = self.expr(cond, scope)
        then_body = self.body(then, scope)
        else_body = self.body(orelse, scope)

        def run_if(frame: Frame) -> None:
            truth = arith.truth(frame.lanes.value(cond_fn(frame)))
            if then_body.stmts:
                child = branch(frame, truth)
                if child is not None:
                    run_body(child, then_body.stmts)
                    merge(frame, child, then_body.outer)
            if else_body.stmts and not frame.dead:
                child = branch(frame, arith.fix(np.logical_not(truth)))
                if child is not None:
                    run_body(child, else_body.stmts)
                    merge(frame, child, else_body.outer)

        return run_if

    def _loop(
        self,
        var: str,
        start: Expr,
        end: Expr,
        inner: tuple[Stmt, ...],
        scope: dict[str, DType],
    ) -> StmtFn:
        # The bounds are evaluated once, before the first iteration (ir.md). A start
        # loaded from a writable buffer may be a view of it: it is copied, or the body's
        # stores and atomics would move the counters of later iterations.
        start_fn, _, start_alias = self.expr(start, scope)
        end_fn, _, _ = self.expr(end, scope)
        body = self.body(inner, {**scope, var: DType.U32})
        stmts = body.stmts

        def loop(frame: Frame) -> None:
            lanes = frame.lanes
            first = lanes.value(start_fn(frame))
            if start_alias:
                first = _own(first)
            stop = lanes.value(end_fn(frame))
            check = frame.state.check_cancel
            if not isinstance(first, np.ndarray) and not isinstance(stop, np.ndarray):
                env = frame.env
                for t in range(int(first), int(stop)):
                    check()
                    env[var] = np.uint32(t)
                    run_body(frame, stmts)
                    if frame.dead:
                        return
                return
            trips = np.maximum(
                np.asarray(stop, dtype=np.int64) - np.asarray(first, dtype=np.int64), 0
            )
            if frame.mask is not None:
                trips = np.where(frame.mask, trips, 0)
            most = int(trips.max()) if trips.size else 0
            for t in range(most):
                check()
                running = trips > t
                if frame.mask is not None:
                    running = np.logical_and(running, frame.mask)
                child = branch(frame, running)
                if child is None:
                    return
                counter = arith.fix(first + np.uint32(t))
                child.env[var] = counter if child.lanes is lanes else child.lanes.restrict(counter)
                run_body(child, stmts)
                merge(frame, child, body.outer)
                if frame.dead:
                    return

        return loop

    def _block(self, inner: tuple[Stmt, ...], scope: dict[str, DType]) -> StmtFn | None:
        body = self.body(inner, scope)
        if not body.stmts:
            return None
        stmts = body.stmts

        def block(frame: Frame) -> None:
            run_body(frame, stmts)

        return block

    # -- expressions ------------------------------------------------------------------
    def expr(self, expr: Expr, scope: dict[str, DType]) -> tuple[ExprFn, DType, bool]:
        """Return (closure, dtype, may_alias): may_alias = the value may view a writable buffer."""
        match expr:
            case Const(dtype=dtype):
                const = arith.const_value(dtype, expr.bits)
                return (lambda frame: const), dtype, False
            case Var(name=name):
                return (lambda frame: frame.env[name]), _var_dtype(scope, name), False
            case Load(buffer=buffer, index=index):
                return self._load(buffer, index, scope)
            case BufLen(buffer=buffer):
                self._decl(buffer)
                return (lambda frame: frame.state.lengths[buffer]), DType.U32, False
            case Builtin(kind=kind, axis=axis):
                key = (BuiltinKind(kind).value, axis)
                return (lambda frame: frame.state.builtins[key]), DType.U32, False
            case Bin(op=op, a=a, b=b):
                return self._bin(op, a, b, scope)
            case Un(op=op, a=a):
                fa, dtype, _ = self.expr(a, scope)
                fn = _lookup(arith.unary_op, op, dtype)
                out = un_result(op, dtype) or dtype
                if dtype is DType.U32:
                    return (lambda frame: fn(frame.lanes.value(fa(frame)))), out, False
                return (lambda frame: fn(fa(frame))), out, False
            case Select(cond=cond, if_true=if_true, if_false=if_false):
                return self._select(cond, if_true, if_false, scope)
            case Cast(dtype=target, value=value):
                fv, source, alias = self.expr(value, scope)
                cast = arith.cast_op(source, target)
                keeps_alias = alias and (source is target or {source, target} <= _INTS)
                return (lambda frame: cast(frame.lanes.value(fv(frame)))), target, keeps_alias
            case Fma(a=a, b=b, c=c):
                fa, _, _ = self.expr(a, scope)
                fb, _, _ = self.expr(b, scope)
                fc, _, _ = self.expr(c, scope)
                return (
                    (lambda frame: arith.fma_f32(fa(frame), fb(frame), fc(frame))),
                    DType.F32,
                    False,
                )
            case Atomic():
                return self._atomic(expr, scope, want_old=True)
        raise InvalidProgram(
            f"unknown expression {expr!r}", fix="build expressions from vyre_async.ir"
        )

    def _decl(self, name: str) -> BufferDecl:
        try:
            return self.decls[name]
        except KeyError:
            raise InvalidProgram(
                f"buffer {name!r} is not declared",
                fix="declare it in Program.buffers or fix the name",
            ) from None

    def _load(
        self, buffer: str, index: Expr, scope: dict[str, DType]
    ) -> tuple[ExprFn, DType, bool]:
        decl = self._decl(buffer)
        index_fn, _, _ = self.expr(index, scope)
        reader = load_workgroup if decl.access is Access.WORKGROUP else load_global
        writable = decl.access.is_writable
        if decl.dtype is DType.BOOL:

            def load_bool(frame: Frame) -> Any:
                lanes = frame.lanes
                words = reader(lanes, frame.state.arrays[buffer], index_fn(frame))
                return arith.fix(np.not_equal(words, 0))

            return load_bool, DType.BOOL, False
        if writable and self.stmt_has_atomic:

            def load_copy(frame: Frame) -> Any:
                return _own(reader(frame.lanes, frame.state.arrays[buffer], index_fn(frame)))

            return load_copy, decl.dtype, False

        def load(frame: Frame) -> Any:
            return reader(frame.lanes, frame.state.arrays[buffer], index_fn(frame))

        return load, decl.dtype, writable

    def _bin(
        self, op: BinOp, a: Expr, b: Expr, scope: dict[str, DType]
    ) -> tuple[ExprFn, DType, bool]:
        fa, dtype, _ = self.expr(a, scope)
        fb, _, _ = self.expr(b, scope)
        fn = _lookup(arith.binary_op, op, dtype)
        result = DType.BOOL if op in _COMPARE_OPS else dtype
        ufunc = arith.in_place_ufunc(op, dtype)
        fresh_a = isinstance(a, _FRESH)
        fresh_b = isinstance(b, _FRESH)
        if ufunc is not None and (fresh_a or fresh_b):
            affine = dtype is DType.U32

            def reuse(frame: Frame) -> Any:
                x = fa(frame)
                y = fb(frame)
                if affine and (type(x) is Affine or type(y) is Affine):
                    return _affine_binary(op, x, y, frame, fn)
                if fresh_a and _scratch(x, y):
                    return ufunc(x, y, out=x)
                if fresh_b and _scratch(y, x):
                    return ufunc(x, y, out=y)
                return fn(x, y)

            return reuse, result, False
        if dtype is not DType.U32:
            return (lambda frame: fn(fa(frame), fb(frame))), result, False
        if op in _AFFINE_OPS or op in _COMPARE_OPS:

            def affine_aware(frame: Frame) -> Any:
                x = fa(frame)
                y = fb(frame)
                if type(x) is Affine or type(y) is Affine:
                    return _affine_binary(op, x, y, frame, fn)
                return fn(x, y)

            return affine_aware, result, False

        def materialized(frame: Frame) -> Any:
            lanes = frame.lanes
            return fn(lanes.value(fa(frame)), lanes.value(fb(frame)))

        return materialized, result, False

    def _select(
        self, cond: Expr, if_true: Expr, if_false: Expr, scope: dict[str, DType]
    ) -> tuple[ExprFn, DType, bool]:
        fc, _, _ = self.expr(cond, scope)
        ft, dtype, alias_t = self.expr(if_true, scope)
        ff, _, alias_f = self.expr(if_false, scope)

        def select(frame: Frame) -> Any:
            lanes = frame.lanes
            c = arith.truth(lanes.value(fc(frame)))
            t = lanes.value(ft(frame))
            f = lanes.value(ff(frame))
            if not isinstance(c, np.ndarray):
                return t if c else f
            return arith.fix(np.where(c, t, f))

        return select, dtype, alias_t or alias_f  # a uniform condition returns an arm as is

    def _atomic(
        self, expr: Atomic, scope: dict[str, DType], *, want_old: bool
    ) -> tuple[ExprFn, DType, bool]:
        decl = self._decl(expr.buffer)
        buffer = expr.buffer
        op = AtomicOp(expr.op)
        index_fn, _, _ = self.expr(expr.index, scope)
        value_fn, _, _ = self.expr(expr.value, scope)
        expected_fn = None
        if expr.expected is not None:
            expected_fn, _, _ = self.expr(expr.expected, scope)
        workgroup = decl.access is Access.WORKGROUP

        def atomic(frame: Frame) -> Any:
            index = index_fn(frame)
            value = value_fn(frame)
            expected = None if expected_fn is None else frame.lanes.value(expected_fn(frame))
            return apply_atomic(
                frame.lanes,
                frame.mask,
                frame.state.arrays[buffer],
                workgroup=workgroup,
                op=op,
                index=index,
                value=value,
                expected=expected,
                want_old=want_old,
                check=frame.state.check_cancel,
            )

        return atomic, DType.U32, False


_INTS = frozenset({DType.U32, DType.I32})


def _var_dtype(scope: dict[str, DType], name: str) -> DType:
    try:
        return scope[name]
    except KeyError:
        raise InvalidProgram(
            f"variable {name!r} is used before it is declared",
            fix="declare it with Let (or as a Loop variable) in an enclosing scope",
        ) from None


def _lookup(table: Callable[[Any, DType], Any], op: Any, dtype: DType) -> Any:
    try:
        return table(op, dtype)
    except KeyError:
        raise InvalidProgram(
            f"operator {op.value!r} is not defined on {dtype.value}",
            fix="run vyre_async.ir.validate(program) and fix what it lists",
        ) from None


#: Nodes whose value, when an array, is a new array that nothing else references.
_FRESH = (Bin, Un, Fma)


def _scratch(target: Any, other: Any) -> bool:
    """Return True when ``target`` (a fresh result) can receive ``op(target, other)`` in place."""
    return (
        isinstance(target, np.ndarray)
        and target.base is None
        and target.flags.writeable
        and (
            not isinstance(other, np.ndarray)
            or other.shape == target.shape
            or np.broadcast_shapes(other.shape, target.shape) == target.shape
        )
    )


def _evaluate_only(fn: ExprFn) -> StmtFn:
    def evaluate(frame: Frame) -> None:
        fn(frame)

    return evaluate


def _return(frame: Frame) -> None:
    mask = frame.mask
    shape = frame.lanes.shape
    now = np.ones(shape, dtype=np.bool_) if mask is None else np.array(np.broadcast_to(mask, shape))
    frame.returned = now if frame.returned is None else frame.returned | now
    frame.dead = True
