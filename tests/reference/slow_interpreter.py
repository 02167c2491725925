"""A slow, obviously correct interpreter of the IR, for the reference engine's property test.

Every value is a Python scalar: U32 and I32 are ``int`` kept in range, F32 is a
``float`` holding an exact binary32 value (rounded with `struct` after every
operation), BOOL is ``bool``. Every lane has its own variables; workgroups
have their own shared memory. Nothing is vectorised: each operation is
computed lane by lane with plain Python.

Scheduling (the reference order, which the engine documents and follows):
all lanes of the grid run in *lockstep*, statement by statement; within a
statement each expression node is computed for every active lane (in lane
order) before its parent node; a store writes lane by lane in lane order;
`If` runs its then-branch, then its else-branch; a loop's iteration ``t``
runs on the lanes whose own trip count exceeds ``t``. Under this schedule a
`Barrier` is reached by every live lane of a workgroup together; the
interpreter checks that it is (barrier uniformity).

Float arithmetic: ``+ - * /`` and ``sqrt`` are computed in binary64 and
rounded to binary32, which equals the correctly rounded binary32 result
(binary64 has more than twice the precision plus two bits). ``Fma`` is
computed exactly with `fractions.Fraction`. Transcendentals use `math` in
binary64, then round.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from vyre_async._plan import normalize_inputs, plan_dispatch
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    AtomicOp,
    Barrier,
    Bin,
    BinOp,
    Block,
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
)
from vyre_async.ir.infer import expr_dtype

__all__ = ["BarrierDivergence", "f32_round", "fraction_to_f32", "run_slow"]

M32 = 0xFFFF_FFFF
INT_MIN = -(2**31)


class BarrierDivergence(AssertionError):
    """A barrier was reached by only some live lanes of a workgroup."""


# ---------------------------------------------------------------------------------
# scalar semantics


def f32_round(x: float) -> float:
    """Round a binary64 value to the nearest binary32 value (ties to even)."""
    if math.isnan(x):
        return math.nan
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def fraction_to_f32(q: Fraction) -> float:
    """Round an exact rational to the nearest binary32 value (ties to even); q != 0."""
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    e = max(e, -126)  # subnormal range has the fixed quantum 2**-149
    quantum = Fraction(2) ** (e - 23)
    scaled = q / quantum
    n = scaled.numerator // scaled.denominator
    rest = scaled - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    value = n * quantum
    if value >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(value)


def wrap_i32(x: int) -> int:
    """Return ``x`` reduced to a two's complement 32-bit integer."""
    return ((x + 2**31) & M32) - 2**31


def _bits(x: float) -> int:
    return int(struct.unpack("<I", struct.pack("<f", x))[0])


def _negative(x: float) -> bool:
    return math.copysign(1.0, x) < 0


def _f32_div(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if b == 0:
        if a == 0:
            return math.nan
        return -math.inf if _negative(a) != _negative(b) else math.inf
    return f32_round(a / b)


def _f32_mod(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return math.nan
    if math.isinf(b):
        return a
    return math.fmod(a, b)  # exact


def _f32_min(a: float, b: float) -> float:
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == 0 and b == 0:
        return -0.0 if _negative(a) or _negative(b) else 0.0
    return a if a < b else b


def _f32_max(a: float, b: float) -> float:
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    if a == 0 and b == 0:
        return -0.0 if _negative(a) and _negative(b) else 0.0
    return a if a > b else b


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return -q if (a < 0) != (b < 0) else q


def _bin_u32(op: BinOp, a: int, b: int) -> int | bool:
    match op:
        case BinOp.ADD:
            return (a + b) & M32
        case BinOp.SUB:
            return (a - b) & M32
        case BinOp.MUL:
            return (a * b) & M32
        case BinOp.DIV:
            return M32 if b == 0 else a // b
        case BinOp.MOD:
            return 0 if b == 0 else a % b
        case BinOp.MIN:
            return min(a, b)
        case BinOp.MAX:
            return max(a, b)
        case BinOp.AND:
            return a & b
        case BinOp.OR:
            return a | b
        case BinOp.XOR:
            return a ^ b
        case BinOp.SHL:
            return (a << (b & 31)) & M32
        case BinOp.SHR:
            return a >> (b & 31)
        case BinOp.MULHI:
            return (a * b) >> 32
    return _compare(op, a, b)


def _bin_i32(op: BinOp, a: int, b: int) -> int | bool:
    match op:
        case BinOp.ADD:
            return wrap_i32(a + b)
        case BinOp.SUB:
            return wrap_i32(a - b)
        case BinOp.MUL:
            return wrap_i32(a * b)
        case BinOp.DIV:
            return 0 if b == 0 else wrap_i32(_trunc_div(a, b))
        case BinOp.MOD:
            return 0 if b == 0 else a - _trunc_div(a, b) * b
        case BinOp.MIN:
            return min(a, b)
        case BinOp.MAX:
            return max(a, b)
        case BinOp.AND:
            return a & b
        case BinOp.OR:
            return a | b
        case BinOp.XOR:
            return a ^ b
        case BinOp.SHL:
            return wrap_i32((a & M32) << (b & 31))
        case BinOp.SHR:
            return a >> (b & 31)
    return _compare(op, a, b)


def _bin_f32(op: BinOp, a: float, b: float) -> float | bool:
    match op:
        case BinOp.ADD:
            return f32_round(a + b)
        case BinOp.SUB:
            return f32_round(a - b)
        case BinOp.MUL:
            return f32_round(a * b)
        case BinOp.DIV:
            return _f32_div(a, b)
        case BinOp.MOD:
            return _f32_mod(a, b)
        case BinOp.MIN:
            return _f32_min(a, b)
        case BinOp.MAX:
            return _f32_max(a, b)
    return _compare(op, a, b)


def _compare(op: BinOp, a: Any, b: Any) -> bool:
    match op:
        case BinOp.EQ:
            return bool(a == b)
        case BinOp.NE:
            return bool(a != b)
        case BinOp.LT:
            return bool(a < b)
        case BinOp.LE:
            return bool(a <= b)
        case BinOp.GT:
            return bool(a > b)
        case BinOp.GE:
            return bool(a >= b)
        case BinOp.LAND:
            return bool(a and b)
        case BinOp.LOR:
            return bool(a or b)
    raise AssertionError(f"binary op {op} has no rule")


def binary(op: BinOp, dtype: DType, a: Any, b: Any) -> Any:
    """Return ``op(a, b)`` for operands of ``dtype``."""
    if dtype is DType.U32:
        return _bin_u32(op, a, b)
    if dtype is DType.I32:
        return _bin_i32(op, a, b)
    if dtype is DType.F32:
        return _bin_f32(op, a, b)
    return _compare(op, a, b)


def _round_half_even(x: float) -> float:
    if not math.isfinite(x):
        return x
    return math.copysign(float(round(x)), x)  # Python's round() ties to even


def _floor(x: float) -> float:
    return x if not math.isfinite(x) else math.copysign(float(math.floor(x)), x)


def _ceil(x: float) -> float:
    return x if not math.isfinite(x) else math.copysign(float(math.ceil(x)), x)


def _trunc(x: float) -> float:
    return x if not math.isfinite(x) else math.copysign(float(math.trunc(x)), x)


def _sqrt(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    return f32_round(math.sqrt(x))


def _rsqrt(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return math.copysign(math.inf, x)
    return f32_round(1.0 / math.sqrt(x))


def _exp(x: float) -> float:
    try:
        return f32_round(math.exp(x))
    except OverflowError:
        return math.inf


def _log(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    return f32_round(math.log(x))


def _periodic(fn: Callable[[float], float]) -> Callable[[float], float]:
    def run(x: float) -> float:
        if not math.isfinite(x):
            return math.nan
        return f32_round(fn(x))

    return run


_F32_UNARY: dict[UnOp, Callable[[float], float]] = {
    UnOp.NEG: lambda x: -x,
    UnOp.ABS: math.fabs,
    UnOp.SQRT: _sqrt,
    UnOp.RSQRT: _rsqrt,
    UnOp.EXP: _exp,
    UnOp.LOG: _log,
    UnOp.SIN: _periodic(math.sin),
    UnOp.COS: _periodic(math.cos),
    UnOp.TANH: lambda x: f32_round(math.tanh(x)),
    UnOp.FLOOR: _floor,
    UnOp.CEIL: _ceil,
    UnOp.ROUND: _round_half_even,
    UnOp.TRUNC: _trunc,
}


def unary(op: UnOp, dtype: DType, a: Any) -> Any:
    """Return ``op(a)`` for an operand of ``dtype``."""
    if dtype is DType.F32:
        return _F32_UNARY[op](a)
    if dtype is DType.BOOL:
        assert op is UnOp.LNOT
        return not a
    bits = a & M32
    match op:
        case UnOp.NEG:
            result = -a
        case UnOp.NOT:
            result = ~a
        case UnOp.POPCOUNT:
            result = bin(bits).count("1")
        case UnOp.CLZ:
            result = 32 - bits.bit_length()
        case UnOp.CTZ:
            result = 32 if bits == 0 else (bits & -bits).bit_length() - 1
        case _:
            raise AssertionError(f"unary op {op} on {dtype}")
    return result & M32 if dtype is DType.U32 else wrap_i32(result)


def cast(source: DType, target: DType, a: Any) -> Any:
    """Return ``a`` (of ``source``) converted to ``target`` by the IR's cast rules."""
    if source is target:
        return a
    if target is DType.BOOL:
        return bool(a != 0)
    if source is DType.BOOL:
        return (1.0 if a else 0.0) if target is DType.F32 else int(bool(a))
    if target is DType.F32:
        return f32_round(float(a))  # int → binary64 is exact
    if source is DType.F32:
        if math.isnan(a):
            return 0
        lo, hi = (0, M32) if target is DType.U32 else (INT_MIN, 2**31 - 1)
        if math.isinf(a):
            return hi if a > 0 else lo
        return min(max(math.trunc(a), lo), hi)
    return a & M32 if target is DType.U32 else wrap_i32(a)


def fma(a: float, b: float, c: float) -> float:
    """Return ``a * b + c`` rounded once to binary32."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c  # inf/NaN results need no rounding
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return fraction_to_f32(exact)
    product_negative = (a * b == 0) and (_negative(a) != _negative(b))
    if a * b == 0 and c == 0:
        return -0.0 if product_negative and _negative(c) else 0.0
    return 0.0


def atomic(op: AtomicOp, old: int, value: int, expected: int | None) -> int:
    """Return the word an atomic writes given the ``old`` word."""
    match op:
        case AtomicOp.ADD:
            return (old + value) & M32
        case AtomicOp.OR:
            return old | value
        case AtomicOp.AND:
            return old & value
        case AtomicOp.XOR:
            return old ^ value
        case AtomicOp.MIN:
            return min(old, value)
        case AtomicOp.MAX:
            return max(old, value)
        case AtomicOp.EXCHANGE:
            return value
    assert expected is not None
    return value if old == expected else old


# ---------------------------------------------------------------------------------
# memory and lanes


def _from_word(dtype: DType, word: int) -> Any:
    if dtype is DType.U32:
        return word
    if dtype is DType.I32:
        return wrap_i32(word)
    if dtype is DType.F32:
        return float(struct.unpack("<f", struct.pack("<I", word))[0])
    return word  # BOOL buffers hold raw words; a load tests them against 0


def _to_word(dtype: DType, value: Any) -> int:
    if dtype is DType.F32:
        return _bits(value)
    return int(value) & M32


_ZERO: dict[DType, Any] = {DType.U32: 0, DType.I32: 0, DType.F32: 0.0, DType.BOOL: False}


@dataclass
class _Lane:
    lane: int
    wg: int
    lid: int
    wg_xyz: tuple[int, int, int]
    lid_xyz: tuple[int, int, int]
    gid_xyz: tuple[int, int, int]
    env: dict[str, Any] = field(default_factory=dict)
    alive: bool = True


def _split(linear: int, extent: tuple[int, int, int]) -> tuple[int, int, int]:
    x = linear % extent[0]
    y = (linear // extent[0]) % extent[1]
    z = linear // (extent[0] * extent[1])
    return (x, y, z)


class _Interpreter:
    def __init__(
        self,
        program: Program,
        storage: dict[str, list[Any]],
        grid: tuple[int, int, int],
        workgroup: tuple[int, int, int],
    ) -> None:
        self.program = program
        self.decls = {d.name: d for d in program.buffers}
        self.storage = storage
        self.grid = grid
        self.workgroup = workgroup
        self.shared: list[dict[str, list[Any]]] = []
        self.zeros: dict[str, Any] = {}  # WORKGROUP buffer -> its zero (grid barriers reset)
        self.by_wg: dict[int, list[_Lane]] = {}

    # memory ---------------------------------------------------------------------------
    def _memory(self, name: str, lane: _Lane) -> list[Any]:
        if self.decls[name].access is Access.WORKGROUP:
            return self.shared[lane.wg][name]
        return self.storage[name]

    def _load(self, name: str, lane: _Lane, index: int) -> Any:
        memory = self._memory(name, lane)
        dtype = self.decls[name].dtype
        if index >= len(memory):
            return _ZERO[dtype]
        value = memory[index]
        return bool(value != 0) if dtype is DType.BOOL else value

    def _store(self, name: str, lane: _Lane, index: int, value: Any) -> None:
        memory = self._memory(name, lane)
        if index < len(memory):
            memory[index] = int(value) if self.decls[name].dtype is DType.BOOL else value

    # launch ---------------------------------------------------------------------------
    def launch(self) -> None:
        ng = self.grid[0] * self.grid[1] * self.grid[2]
        nl = self.workgroup[0] * self.workgroup[1] * self.workgroup[2]
        zeros = {
            d.name: _ZERO[d.dtype] if d.dtype is not DType.BOOL else 0
            for d in self.program.workgroup_buffers
        }
        self.zeros = zeros
        self.shared = [
            {d.name: [zeros[d.name]] * d.count for d in self.program.workgroup_buffers}
            for _ in range(ng)
        ]
        lanes = []
        self.by_wg = {}
        for w in range(ng):
            wg_xyz = _split(w, self.grid)
            group = []
            for lid in range(nl):
                lid_xyz = _split(lid, self.workgroup)
                gx, gy, gz = (wg_xyz[k] * self.workgroup[k] + lid_xyz[k] for k in range(3))
                group.append(_Lane(w * nl + lid, w, lid, wg_xyz, lid_xyz, (gx, gy, gz)))
            self.by_wg[w] = group
            lanes.extend(group)
        self.block(self.program.body, lanes, {})

    # statements -----------------------------------------------------------------------
    def block(self, body: Sequence[Stmt], lanes: list[_Lane], scope: dict[str, DType]) -> None:
        scope = dict(scope)
        for stmt in body:
            lanes = [lane for lane in lanes if lane.alive]
            if not lanes:
                return
            self.stmt(stmt, lanes, scope)

    def stmt(self, stmt: Stmt, lanes: list[_Lane], scope: dict[str, DType]) -> None:
        match stmt:
            case Let(name=name, value=value):
                values = self.eval(value, lanes, scope)
                scope[name] = self.dtype(value, scope)
                for lane, v in zip(lanes, values, strict=True):
                    lane.env[name] = v
            case Assign(name=name, value=value):
                values = self.eval(value, lanes, scope)
                for lane, v in zip(lanes, values, strict=True):
                    lane.env[name] = v
            case Store(buffer=buffer, index=index, value=value):
                indices = self.eval(index, lanes, scope)
                values = self.eval(value, lanes, scope)
                for lane, i, v in zip(lanes, indices, values, strict=True):
                    self._store(buffer, lane, i, v)
            case If(cond=cond, then=then, orelse=orelse):
                truth = [bool(c) for c in self.eval(cond, lanes, scope)]
                taken = [lane for lane, t in zip(lanes, truth, strict=True) if t]
                other = [lane for lane, t in zip(lanes, truth, strict=True) if not t]
                if taken:
                    self.block(then, taken, scope)
                if other:
                    self.block(orelse, other, scope)
            case Loop(var=var, start=start, end=end, body=body):
                first = self.eval(start, lanes, scope)
                stop = self.eval(end, lanes, scope)
                inner = {**scope, var: DType.U32}
                t = 0
                while True:
                    running = [
                        lane
                        for lane, s, e in zip(lanes, first, stop, strict=True)
                        if lane.alive and s + t < e
                    ]
                    if not running:
                        break
                    for lane, s in zip(lanes, first, strict=True):
                        lane.env[var] = s + t
                    self.block(body, running, inner)
                    t += 1
            case Block(body=body):
                self.block(body, lanes, scope)
            case Barrier():
                here: dict[int, int] = {}
                for lane in lanes:
                    here[lane.wg] = here.get(lane.wg, 0) + 1
                for wg, n in here.items():
                    live = sum(1 for lane in self.by_wg[wg] if lane.alive)
                    if n != live:
                        raise BarrierDivergence(f"workgroup {wg}: {n} of {live} live lanes")
            case GridBarrier():
                total = sum(len(group) for group in self.by_wg.values())
                if len(lanes) != total or not all(lane.alive for lane in lanes):
                    raise BarrierDivergence(f"grid barrier: {len(lanes)} of {total} lanes")
                self.shared = [
                    {name: [self.zeros[name]] * len(values) for name, values in memory.items()}
                    for memory in self.shared
                ]
            case Return():
                for lane in lanes:
                    lane.alive = False
            case _:
                raise AssertionError(f"unknown statement {stmt!r}")

    # expressions ----------------------------------------------------------------------
    def dtype(self, expr: Expr, scope: dict[str, DType]) -> DType:
        return expr_dtype(expr, scope, self.decls)

    def eval(self, expr: Expr, lanes: list[_Lane], scope: dict[str, DType]) -> list[Any]:
        """Return ``expr`` on every lane of ``lanes`` (children first, node by node)."""
        match expr:
            case Const(dtype=dtype, value=value):
                v: Any = value if dtype is not DType.BOOL else bool(value)
                if dtype is DType.F32:
                    v = float(value)
                return [v] * len(lanes)
            case Var(name=name):
                return [lane.env[name] for lane in lanes]
            case Load(buffer=buffer, index=index):
                indices = self.eval(index, lanes, scope)
                return [self._load(buffer, lane, i) for lane, i in zip(lanes, indices, strict=True)]
            case BufLen(buffer=buffer):
                decl = self.decls[buffer]
                n = decl.count if decl.access is Access.WORKGROUP else len(self.storage[buffer])
                return [n] * len(lanes)
            case Builtin(kind=kind, axis=axis):
                if kind is BuiltinKind.GID:
                    return [lane.gid_xyz[axis] & M32 for lane in lanes]
                if kind is BuiltinKind.LID:
                    return [lane.lid_xyz[axis] for lane in lanes]
                if kind is BuiltinKind.WGID:
                    return [lane.wg_xyz[axis] for lane in lanes]
                return [self.grid[axis] & M32] * len(lanes)
            case Bin(op=op, a=a, b=b):
                dtype = self.dtype(a, scope)
                left = self.eval(a, lanes, scope)
                right = self.eval(b, lanes, scope)
                return [binary(op, dtype, x, y) for x, y in zip(left, right, strict=True)]
            case Un(op=op, a=a):
                dtype = self.dtype(a, scope)
                return [unary(op, dtype, x) for x in self.eval(a, lanes, scope)]
            case Select(cond=cond, if_true=if_true, if_false=if_false):
                c = self.eval(cond, lanes, scope)
                t = self.eval(if_true, lanes, scope)
                f = self.eval(if_false, lanes, scope)
                return [x if bool(k) else y for k, x, y in zip(c, t, f, strict=True)]
            case Cast(dtype=target, value=value):
                source = self.dtype(value, scope)
                return [cast(source, target, x) for x in self.eval(value, lanes, scope)]
            case Fma(a=a, b=b, c=c):
                xs = self.eval(a, lanes, scope)
                ys = self.eval(b, lanes, scope)
                zs = self.eval(c, lanes, scope)
                return [fma(x, y, z) for x, y, z in zip(xs, ys, zs, strict=True)]
            case Atomic(op=op, buffer=buffer, index=index, value=value, expected=expected):
                indices = self.eval(index, lanes, scope)
                values = self.eval(value, lanes, scope)
                wanted = (
                    self.eval(expected, lanes, scope)
                    if expected is not None
                    else [None] * len(lanes)
                )
                olds = []
                for lane, i, v, e in zip(lanes, indices, values, wanted, strict=True):
                    memory = self._memory(buffer, lane)
                    if i >= len(memory):
                        olds.append(0)
                        continue
                    old = memory[i]
                    memory[i] = atomic(op, old, v, e)
                    olds.append(old)
                return olds
        raise AssertionError(f"unknown expression {expr!r}")


def run_slow(
    program: Program,
    inputs: Sequence[np.ndarray[Any, Any]],
    *,
    grid_override: int | Sequence[int] | None = None,
    fixpoint_iterations: int = 1,
) -> list[np.ndarray[Any, Any]]:
    """Interpret ``program`` lane by lane and return its outputs (as `execute` does).

    Raises:
        InvalidProgram: the inputs do not fit the program, or the grid cannot be inferred.
        BarrierDivergence: a barrier was reached by only part of a workgroup.
    """
    arrays = normalize_inputs(program, inputs)
    plan = plan_dispatch(program, [a.size for a in arrays], grid_override=grid_override)
    given = dict(zip((d.name for d in program.inputs), arrays, strict=True))
    storage: dict[str, list[Any]] = {}
    for decl, count in zip(program.buffers, plan.counts, strict=True):
        if decl.access is Access.WORKGROUP:
            continue
        if decl.access is Access.WRITE:
            storage[decl.name] = [_from_word(decl.dtype, 0)] * count
        else:
            words = given[decl.name].view(np.uint32).tolist()
            storage[decl.name] = [_from_word(decl.dtype, w) for w in words]
    interpreter = _Interpreter(program, storage, plan.geometry.grid, plan.geometry.workgroup)
    if plan.geometry.lanes:
        for _ in range(fixpoint_iterations):
            interpreter.launch()
    outputs = []
    for decl in plan.outputs:
        words = [_to_word(decl.dtype, v) for v in storage[decl.name]]
        out = np.array(words, dtype=np.uint32).view(decl.dtype.numpy)
        outputs.append(out)
    return outputs
