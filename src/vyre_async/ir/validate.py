"""Validate a `Program` against every rule of the IR specification.

`validate` walks a program once and returns every broken rule as a
`Diagnostic` (a stable code, a path into the program, a message with the
observed values and one fix); `validate_or_raise` turns a non-empty list into
`InvalidProgram`. The verdict is memoised on the program instance.

Barrier uniformity is decided by a conservative, flow-insensitive analysis.
Every variable binding (each ``Let``, each loop variable) and every ``If`` /
``Loop`` is a node of a dependency graph. A node is divergent when one of its
sources is: ``gid``, ``lid``, a load from a non-``UNIFORM`` buffer, an atomic,
a divergent variable, or (for variables written by ``Let``/``Assign``) an
enclosing divergent ``If``/``Loop``. The graph is solved to a fixed point over
the whole program, so a variable is divergent if *any* write to it anywhere is,
regardless of the order of the writes. A loop variable is divergent iff its
bounds are. A ``Barrier`` is then illegal under divergent control, and after a
divergent ``Return`` earlier in program order or anywhere in a loop body that
also encloses the barrier.

A ``GridBarrier`` ends the top-level scope: it is legal only at the top level
of the body, a variable declared before it cannot be used after it (it may be
declared again), and a program with one has no ``Return``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

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
)
from vyre_async.ir.limits import (
    MAX_BUFFERS,
    MAX_EXPR_DEPTH,
    MAX_NAME_BYTES,
    MAX_NODES,
    MAX_STMT_DEPTH,
    MAX_WORKGROUP_BYTES,
    MAX_WORKGROUP_LANES,
)
from vyre_async.ir.ops import AtomicOp, BuiltinKind, bin_result, un_result
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

__all__ = ["DIAGNOSTIC_CODES", "Diagnostic", "validate", "validate_or_raise"]
__dir__ = _public_dir(__name__)

#: Every diagnostic code and its one-line title. Stable and append-only:
#: a code is never renumbered, reused or given another meaning.
DIAGNOSTIC_CODES: dict[str, str] = {
    "V001": "duplicate buffer name",
    "V002": "duplicate buffer binding",
    "V003": "workgroup axis below 1",
    "V004": "too many lanes per workgroup",
    "V005": "too much workgroup memory",
    "V006": "WRITE or WORKGROUP buffer without a count",
    "V007": "too many buffers",
    "V008": "name too long",
    "V009": "undeclared buffer",
    "V010": "undeclared variable",
    "V011": "name already declared in scope",
    "V012": "assignment to a loop variable",
    "V013": "store to a read-only buffer",
    "V014": "stored value does not match the buffer dtype",
    "V015": "operand dtypes differ",
    "V016": "operator not defined on the dtype",
    "V017": "index is not u32",
    "V018": "loop bound is not u32",
    "V019": "condition is not bool or u32",
    "V020": "select arms differ in dtype",
    "V021": "fma operand is not f32",
    "V022": "assignment changes the variable's dtype",
    "V023": "invalid atomic target",
    "V024": "atomic operand is not u32",
    "V025": "cas without expected",
    "V026": "expected on a non-cas atomic",
    "V027": "barrier under divergent control",
    "V028": "barrier after a divergent return",
    "V029": "statements nested too deeply",
    "V030": "expression too deep",
    "V031": "too many nodes",
    "V032": "unknown node type",
    "V033": "name is not valid Unicode",
    "V034": "grid barrier not at the top level of the body",
    "V035": "variable used across a grid barrier",
    "V036": "return in a program with a grid barrier",
}

_CONDITION_DTYPES = (DType.BOOL, DType.U32)
_READ_ONLY = (Access.READ, Access.UNIFORM)
_DIVERGENT_BUILTINS = (BuiltinKind.GID, BuiltinKind.LID)
_ZERO = {DType.I32: "i32(0)", DType.F32: "f32(0.0)", DType.U32: "u32(0)"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    """One broken validation rule.

    Args:
        code: Stable code, a key of `DIAGNOSTIC_CODES` (for example ``"V015"``).
        path: Location in the program, such as ``"body[1].then[0].value.a"``,
            ``"buffers[2]"`` or ``"workgroup_size"``.
        message: What is wrong, with the observed values.
        fix: One action that repairs it.
    """

    code: str
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.code} at {self.path}: {self.message} Fix: {self.fix}"


def validate(program: Program) -> list[Diagnostic]:
    """Return every rule ``program`` breaks; an empty list means it is valid.

    The order is deterministic: buffer table, workgroup shape and op id first,
    then the body in program order. The verdict is memoised on the program.

    Args:
        program: The program to check.

    Returns:
        The diagnostics, a fresh list on every call.

    Raises:
        InvalidProgram: ``program`` is not a `Program`.
    """
    if not isinstance(program, Program):
        raise InvalidProgram(
            f"validate() takes a Program, got {type(program).__name__}",
            fix="build the kernel with Program(buffers, workgroup_size, body)",
        )
    cached = program.memo.get("diagnostics")
    if cached is None:
        cached = tuple(_check_program(program))
        program.memo["diagnostics"] = cached
    return list(cached)


def validate_or_raise(program: Program) -> Program:
    """Return ``program`` unchanged if it is valid.

    Args:
        program: The program to check.

    Returns:
        ``program`` itself.

    Raises:
        InvalidProgram: the program breaks at least one rule; the message lists
            every diagnostic, one per line, and ``.diagnostics`` holds them.
    """
    diagnostics = validate(program)
    if not diagnostics:
        return program
    if len(diagnostics) == 1:  # its Fix is the error's, said once
        (only,) = diagnostics
        fix = only.fix
        message = f"program breaks 1 validation rule:\n{only.code} at {only.path}: {only.message}"
    else:
        fix = "apply the Fix of each line above, starting with the first"
        lines = "\n".join(str(d) for d in diagnostics)
        message = f"program breaks {len(diagnostics)} validation rules:\n{lines}"
    raise InvalidProgram(f"{message}\nFix: {fix}", fix=fix, diagnostics=tuple(diagnostics))


def _check_program(program: Program) -> list[Diagnostic]:
    diagnostics = [
        *_check_buffer_table(program.buffers),
        *_check_workgroup_memory(program.buffers),
        *_check_workgroup_size(program.workgroup_size),
        *_check_op_id(program.op_id),
    ]
    nodes = _count_nodes(program.body, MAX_NODES + 1)
    if nodes > MAX_NODES:
        diagnostics.append(
            Diagnostic(
                code="V031",
                path="body",
                message=f"the body has more than {MAX_NODES} statement and expression nodes",
                fix="split the work into several programs (the body was not checked further)",
            )
        )
        return diagnostics
    return [*diagnostics, *_BodyChecker(program.buffers).run(program.body)]


# Program-level rules ---------------------------------------------------------------


def _check_buffer_table(buffers: Sequence[BufferDecl]) -> Iterator[Diagnostic]:
    if len(buffers) > MAX_BUFFERS:
        yield Diagnostic(
            code="V007",
            path="buffers",
            message=f"{len(buffers)} buffers are declared (limit {MAX_BUFFERS})",
            fix="pack several arrays into one buffer or split the program",
        )
    names: dict[str, int] = {}
    bindings: dict[int, int] = {}
    for i, decl in enumerate(buffers):
        yield from _check_buffer(decl, f"buffers[{i}]", names, bindings)
        names.setdefault(decl.name, i)
        bindings.setdefault(decl.binding, i)


def _check_buffer(
    decl: BufferDecl, path: str, names: dict[str, int], bindings: dict[int, int]
) -> Iterator[Diagnostic]:
    yield from _check_name(decl.name, path, "buffer name")
    if decl.name in names:
        yield Diagnostic(
            code="V001",
            path=path,
            message=f"buffer name {decl.name!r} is already used by buffers[{names[decl.name]}]",
            fix="give each buffer a unique name",
        )
    if decl.binding in bindings:
        yield Diagnostic(
            code="V002",
            path=path,
            message=f"buffer {decl.name!r} reuses binding {decl.binding} of "
            f"buffers[{bindings[decl.binding]}]",
            fix="give each buffer a unique binding",
        )
    if decl.count == 0 and decl.access in (Access.WRITE, Access.WORKGROUP):
        yield Diagnostic(
            code="V006",
            path=path,
            message=f"{decl.access.name} buffer {decl.name!r} has count 0",
            fix=f"declare its element count: BufferDecl({decl.name!r}, ..., count=N) with N > 0",
        )


def _check_workgroup_memory(buffers: Sequence[BufferDecl]) -> Iterator[Diagnostic]:
    shared = [(i, decl) for i, decl in enumerate(buffers) if decl.access is Access.WORKGROUP]
    total = sum(decl.nbytes for _, decl in shared)
    if total <= MAX_WORKGROUP_BYTES:
        return
    running = 0
    for i, decl in shared:
        running += decl.nbytes
        if running > MAX_WORKGROUP_BYTES:
            yield Diagnostic(
                code="V005",
                path=f"buffers[{i}]",
                message=f"WORKGROUP buffers take {total} bytes (limit {MAX_WORKGROUP_BYTES}); "
                f"{decl.name!r} crosses the limit",
                fix=f"shrink the WORKGROUP buffers to at most {MAX_WORKGROUP_BYTES} bytes in all",
            )
            return


def _check_workgroup_size(size: tuple[int, int, int]) -> Iterator[Diagnostic]:
    for axis, lanes in enumerate(size):
        if lanes < 1:
            yield Diagnostic(
                code="V003",
                path=f"workgroup_size[{axis}]",
                message=f"workgroup axis {axis} is {lanes} in {size}",
                fix="give every workgroup axis at least 1 lane",
            )
    x, y, z = size
    if x * y * z > MAX_WORKGROUP_LANES:
        yield Diagnostic(
            code="V004",
            path="workgroup_size",
            message=f"workgroup {size} has {x * y * z} lanes (limit {MAX_WORKGROUP_LANES})",
            fix=f"use a workgroup of at most {MAX_WORKGROUP_LANES} lanes, e.g. (256, 1, 1)",
        )


def _check_op_id(op_id: str) -> Iterator[Diagnostic]:
    yield from _check_name(op_id, "op_id", "op id")


def _check_name(name: str, path: str, what: str) -> Iterator[Diagnostic]:
    try:  # the wire form (and so the fingerprint) holds names as strict UTF-8
        name.encode("utf-8")
    except UnicodeEncodeError as exc:
        yield Diagnostic(
            code="V033",
            path=path,
            message=f"{what} {name[:16]!r} is not valid Unicode ({exc.reason})",
            fix="use a name without lone surrogate code points",
        )
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        yield Diagnostic(
            code="V008",
            path=path,
            message=f"{what} {name[:16]!r}... is {size} UTF-8 bytes (limit {MAX_NAME_BYTES})",
            fix=f"use a name of at most {MAX_NAME_BYTES} bytes",
        )


def _count_nodes(body: Sequence[Stmt], cap: int) -> int:
    """Count statement and expression nodes without recursion, stopping at ``cap``.

    The cap keeps programs that share sub-trees (a DAG that unfolds into an
    exponential tree) from hanging the count.
    """
    stack: list[object] = list(body)
    count = 0
    while stack and count < cap:
        count += 1
        stack.extend(_children(stack.pop()))
    return count


def _children(node: object) -> tuple[object, ...]:
    match node:
        case Let(value=value) | Assign(value=value) | Cast(value=value):
            return (value,)
        case Store(index=index, value=value):
            return (index, value)
        case If(cond=cond, then=then, orelse=orelse):
            return (cond, *then, *orelse)
        case Loop(start=start, end=end, body=body):
            return (start, end, *body)
        case Block(body=body):
            return body
        case Load(index=index) | Un(a=index):
            return (index,)
        case Bin(a=a, b=b):
            return (a, b)
        case Select(cond=cond, if_true=if_true, if_false=if_false):
            return (cond, if_true, if_false)
        case Fma(a=a, b=b, c=c):
            return (a, b, c)
        case Atomic(index=index, value=value, expected=expected):
            return (index, value) if expected is None else (index, value, expected)
    return ()


# Uniformity ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Uni:
    """Uniformity of a value: divergent outright, or divergent iff one of ``deps`` is."""

    divergent: bool
    deps: frozenset[int] = frozenset()

    def __or__(self, other: _Uni) -> _Uni:
        if self.divergent or other.divergent:
            return _DIVERGENT
        return _Uni(False, self.deps | other.deps)


_UNIFORM = _Uni(False)
_DIVERGENT = _Uni(True)


class _Flow:
    """The dependency graph of the uniformity analysis (nodes are ints)."""

    def __init__(self) -> None:
        self._size = 0
        self._seeds: list[int] = []
        self._users: dict[int, list[int]] = {}

    def node(self, *sources: _Uni) -> int:
        """Return a new node that is divergent when any of ``sources`` is."""
        node = self._size
        self._size += 1
        for source in sources:
            self.add(node, source)
        return node

    def add(self, node: int, source: _Uni) -> None:
        """Make ``node`` divergent whenever ``source`` is."""
        if source.divergent:
            self._seeds.append(node)
        for dep in source.deps:
            self._users.setdefault(dep, []).append(node)

    def solve(self) -> frozenset[int]:
        """Return the divergent nodes (the least fixed point, computed by a worklist)."""
        divergent = set(self._seeds)
        work = list(divergent)
        while work:
            for user in self._users.get(work.pop(), ()):
                if user not in divergent:
                    divergent.add(user)
                    work.append(user)
        return frozenset(divergent)


@dataclass(frozen=True, slots=True)
class _Control:
    """An enclosing ``If`` or ``Loop``: its graph node and where it is."""

    node: int
    kind: str
    path: str
    parent: _Control | None


@dataclass(frozen=True, slots=True)
class _Site:
    """A ``Barrier`` or ``Return``, recorded for the checks made after solving."""

    path: str
    position: int
    order: int
    control: _Control | None
    loops: tuple[int, ...]

    def divergent_control(self, divergent: frozenset[int]) -> _Control | None:
        """Return the outermost divergent enclosing ``If``/``Loop``, if any."""
        found = None
        control = self.control
        while control is not None:
            if control.node in divergent:
                found = control
            control = control.parent
        return found


# Body walk -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Binding:
    node: int
    dtype: DType | None
    is_loop: bool = False


@dataclass(frozen=True, slots=True)
class _Val:
    """What the walk knows about an expression: dtype (None = unknown) and uniformity."""

    dtype: DType | None
    uni: _Uni


_UNKNOWN = _Val(None, _UNIFORM)


class _Scopes:
    """Nested variable scopes: a new one per Block, If branch and Loop body."""

    def __init__(self) -> None:
        self._frames: list[dict[str, _Binding]] = [{}]

    def lookup(self, name: str) -> _Binding | None:
        for frame in reversed(self._frames):
            if name in frame:
                return frame[name]
        return None

    def declare(self, name: str, binding: _Binding) -> None:
        self._frames[-1][name] = binding

    def close_top(self) -> list[str]:
        """End the top-level scope (at a top-level GridBarrier); return its variables."""
        names = list(self._frames[0])
        self._frames[0] = {}
        return names

    @contextmanager
    def nested(self) -> Iterator[None]:
        self._frames.append({})
        try:
            yield
        finally:
            self._frames.pop()


class _BodyChecker:
    """One walk over a program body: scopes, typing, limits and the uniformity graph."""

    def __init__(self, buffers: Sequence[BufferDecl]) -> None:
        self._buffers: dict[str, BufferDecl] = {}
        for decl in buffers:
            self._buffers.setdefault(decl.name, decl)
        self._diagnostics: list[Diagnostic] = []
        self._scopes = _Scopes()
        self._flow = _Flow()
        self._control: _Control | None = None
        self._loops: tuple[int, ...] = ()
        self._barriers: list[_Site] = []
        self._returns: list[_Site] = []
        self._grid_barriers = 0
        self._expired: dict[str, str] = {}  # variable -> the GridBarrier that ended its scope
        self._too_deep = False  # V030 already reported for the current root expression

    def run(self, body: Sequence[Stmt]) -> list[Diagnostic]:
        """Return the diagnostics of ``body``, barrier ones merged in program order."""
        self._body(body, "body", 0)
        divergent = self._flow.solve()
        keyed = [((i, 1, 0), d) for i, d in enumerate(self._diagnostics)]
        keyed += [((p, 0, o), d) for p, o, d in self._barrier_diagnostics(divergent)]
        if self._grid_barriers:
            keyed += [
                ((site.position, 0, site.order), _return_with_grid_barrier(site))
                for site in self._returns
            ]
        return [d for _, d in sorted(keyed, key=lambda item: item[0])]

    def _report(self, code: str, path: str, message: str, fix: str) -> None:
        self._diagnostics.append(Diagnostic(code=code, path=path, message=message, fix=fix))

    # Statements --------------------------------------------------------------------

    def _body(self, body: Sequence[Stmt], path: str, depth: int) -> None:
        for i, stmt in enumerate(body):
            self._stmt(stmt, f"{path}[{i}]", depth)

    def _stmt(self, stmt: Stmt, path: str, depth: int) -> None:
        match stmt:
            case Let():
                self._let(stmt, path)
            case Assign():
                self._assign(stmt, path)
            case Store():
                self._store(stmt, path)
            case Barrier():
                self._barriers.append(self._site(path))
            case GridBarrier():
                self._grid_barrier(path, depth)
            case Return():
                self._returns.append(self._site(path))
            case If() | Loop() | Block():
                self._compound(stmt, path, depth + 1)
            case _:
                self._unknown_node(stmt, path)

    def _compound(self, stmt: If | Loop | Block, path: str, depth: int) -> None:
        if depth > MAX_STMT_DEPTH:
            self._report(
                "V029",
                path,
                f"{type(stmt).__name__} is nested {depth} levels deep (limit {MAX_STMT_DEPTH})",
                "flatten the nesting: hoist conditions into Let variables or split the program",
            )
            return
        match stmt:
            case If():
                self._if(stmt, path, depth)
            case Loop():
                self._loop(stmt, path, depth)
            case Block():
                with self._scopes.nested():
                    self._body(stmt.body, f"{path}.body", depth)

    def _grid_barrier(self, path: str, depth: int) -> None:
        self._grid_barriers += 1
        if depth:
            self._report(
                "V034",
                path,
                "GridBarrier inside an If, Loop or Block; it must be a statement of the "
                "program body itself",
                "move the GridBarrier to the top level of the body (every lane must reach it)",
            )
            return
        for name in self._scopes.close_top():
            self._expired[name] = path

    def _let(self, stmt: Let, path: str) -> None:
        value = self._root(stmt.value, f"{path}.value")
        node = self._flow.node(value.uni, self._control_uni())
        self._declare(stmt.name, _Binding(node, value.dtype), path)

    def _assign(self, stmt: Assign, path: str) -> None:
        value = self._root(stmt.value, f"{path}.value")
        binding = self._scopes.lookup(stmt.name)
        if binding is None:
            self._undeclared_variable(stmt.name, path)
        elif binding.is_loop:
            self._report(
                "V012",
                path,
                f"Assign to loop variable {stmt.name!r}, which is read-only",
                f"copy it first: Let('my_{stmt.name}', Var({stmt.name!r})) and assign the copy",
            )
        else:
            if value.dtype is not None and binding.dtype not in (None, value.dtype):
                self._report(
                    "V022",
                    f"{path}.value",
                    f"Assign gives {stmt.name!r} a {value.dtype} value but its Let made it "
                    f"{binding.dtype}",
                    f"cast the value: Cast({binding.dtype!r}, ...)",
                )
            self._flow.add(binding.node, value.uni | self._control_uni())

    def _store(self, stmt: Store, path: str) -> None:
        index = self._root(stmt.index, f"{path}.index")
        value = self._root(stmt.value, f"{path}.value")
        self._index(index, f"{path}.index", f"Store to {stmt.buffer!r}")
        decl = self._buffer(stmt.buffer, path, "Store")
        if decl is None:
            return
        if decl.access in _READ_ONLY:
            self._report(
                "V013",
                path,
                f"Store to {decl.access.name} buffer {decl.name!r}",
                f"declare {decl.name!r} as Access.READ_WRITE, or store into a WRITE buffer",
            )
        if value.dtype is not None and value.dtype is not decl.dtype:
            self._report(
                "V014",
                f"{path}.value",
                f"Store of a {value.dtype} value into {decl.name!r}, a {decl.dtype} buffer",
                f"cast the value: Cast({decl.dtype!r}, ...)",
            )

    def _if(self, stmt: If, path: str, depth: int) -> None:
        cond = self._root(stmt.cond, f"{path}.cond")
        self._condition(cond, f"{path}.cond", "If condition")
        with self._under(self._new_control(cond.uni, "If", path)):
            with self._scopes.nested():
                self._body(stmt.then, f"{path}.then", depth)
            with self._scopes.nested():
                self._body(stmt.orelse, f"{path}.orelse", depth)

    def _loop(self, stmt: Loop, path: str, depth: int) -> None:
        start = self._root(stmt.start, f"{path}.start")
        end = self._root(stmt.end, f"{path}.end")
        for val, field in ((start, "start"), (end, "end")):
            self._require(val, DType.U32, "V018", f"{path}.{field}", f"loop {stmt.var!r} {field}")
        bounds = start.uni | end.uni
        control = self._new_control(bounds, "Loop", path)
        variable = _Binding(self._flow.node(bounds), DType.U32, is_loop=True)
        with self._under(control, loop=True), self._scopes.nested():
            self._declare(stmt.var, variable, path)
            self._body(stmt.body, f"{path}.body", depth)

    def _declare(self, name: str, binding: _Binding, path: str) -> None:
        self._diagnostics.extend(_check_name(name, path, "variable name"))
        if self._scopes.lookup(name) is not None:
            self._report(
                "V011",
                path,
                f"variable {name!r} is already declared in an enclosing or the same scope",
                f"rename it (e.g. {name + '_2'!r}) or Assign to the existing variable",
            )
        self._scopes.declare(name, binding)

    # Control context ---------------------------------------------------------------

    def _control_uni(self) -> _Uni:
        if self._control is None:
            return _UNIFORM
        return _Uni(False, frozenset({self._control.node}))

    def _new_control(self, uni: _Uni, kind: str, path: str) -> _Control:
        node = self._flow.node(uni, self._control_uni())
        return _Control(node, kind, path, self._control)

    @contextmanager
    def _under(self, control: _Control, *, loop: bool = False) -> Iterator[None]:
        saved = (self._control, self._loops)
        self._control = control
        if loop:
            self._loops = (*self._loops, control.node)
        try:
            yield
        finally:
            self._control, self._loops = saved

    def _site(self, path: str) -> _Site:
        order = len(self._barriers) + len(self._returns)
        return _Site(path, len(self._diagnostics), order, self._control, self._loops)

    def _barrier_diagnostics(
        self, divergent: frozenset[int]
    ) -> Iterator[tuple[int, int, Diagnostic]]:
        first_return: _Site | None = None
        in_loop: dict[int, _Site] = {}
        for site in self._returns:
            if site.divergent_control(divergent) is None:
                continue
            first_return = first_return or site
            for loop in site.loops:
                in_loop.setdefault(loop, site)
        for site in self._barriers:
            control = site.divergent_control(divergent)
            if control is not None:
                yield site.position, site.order, _divergent_barrier(site, control)
            earlier = first_return if first_return and first_return.order < site.order else None
            looped = next((in_loop[loop] for loop in site.loops if loop in in_loop), None)
            returned = earlier or looped
            if returned is not None:
                yield site.position, site.order, _barrier_after_return(site, returned)

    # Expressions -------------------------------------------------------------------

    def _root(self, expr: Expr, path: str) -> _Val:
        self._too_deep = False
        return self._expr(expr, path, 1)

    def _expr(self, expr: Expr, path: str, depth: int) -> _Val:
        if depth > MAX_EXPR_DEPTH:
            if not self._too_deep:
                self._too_deep = True
                self._report(
                    "V030",
                    path,
                    f"expression is nested more than {MAX_EXPR_DEPTH} levels deep",
                    "split it: compute parts into Let variables and combine the Vars",
                )
            return _UNKNOWN
        match expr:
            case Const(dtype=dtype):
                return _Val(dtype, _UNIFORM)
            case Var(name=name):
                return self._var(name, path)
            case Load():
                return self._load(expr, path, depth)
            case BufLen(buffer=name):
                self._buffer(name, path, "BufLen")
                return _Val(DType.U32, _UNIFORM)
            case Builtin(kind=kind):
                return _Val(DType.U32, _DIVERGENT if kind in _DIVERGENT_BUILTINS else _UNIFORM)
            case Bin():
                return self._bin(expr, path, depth)
            case Un():
                return self._un(expr, path, depth)
            case Select():
                return self._select(expr, path, depth)
            case Cast(dtype=dtype, value=value):
                return _Val(dtype, self._expr(value, f"{path}.value", depth + 1).uni)
            case Fma():
                return self._fma(expr, path, depth)
            case Atomic():
                return self._atomic(expr, path, depth)
        self._unknown_node(expr, path)
        return _UNKNOWN

    def _var(self, name: str, path: str) -> _Val:
        binding = self._scopes.lookup(name)
        if binding is None:
            self._undeclared_variable(name, path)
            return _UNKNOWN
        return _Val(binding.dtype, _Uni(False, frozenset({binding.node})))

    def _load(self, expr: Load, path: str, depth: int) -> _Val:
        index = self._expr(expr.index, f"{path}.index", depth + 1)
        self._index(index, f"{path}.index", f"Load from {expr.buffer!r}")
        decl = self._buffer(expr.buffer, path, "Load")
        if decl is None:
            return _Val(None, index.uni)
        return _Val(decl.dtype, index.uni if decl.access is Access.UNIFORM else _DIVERGENT)

    def _bin(self, expr: Bin, path: str, depth: int) -> _Val:
        a = self._expr(expr.a, f"{path}.a", depth + 1)
        b = self._expr(expr.b, f"{path}.b", depth + 1)
        uni = a.uni | b.uni
        if a.dtype is None or b.dtype is None:
            return _Val(None, uni)
        if a.dtype is not b.dtype:
            self._report(
                "V015",
                path,
                f"operands of {expr.op.value!r} differ: {a.dtype} vs {b.dtype}",
                f"cast one side: Cast({a.dtype!r}, ...)",
            )
            return _Val(None, uni)
        return _Val(self._op_result(bin_result, expr.op.value, a.dtype, path), uni)

    def _un(self, expr: Un, path: str, depth: int) -> _Val:
        a = self._expr(expr.a, f"{path}.a", depth + 1)
        if a.dtype is None:
            return a
        return _Val(self._op_result(un_result, expr.op.value, a.dtype, path), a.uni)

    def _op_result(
        self, rule: Callable[[str, DType], DType | None], op: str, dtype: DType, path: str
    ) -> DType | None:
        result = rule(op, dtype)
        if result is None:
            accepted = [d for d in DType if rule(op, d) is not None]
            names = ", ".join(str(d) for d in accepted)
            self._report(
                "V016",
                path,
                f"{op!r} is not defined on {dtype} (it takes {names})",
                f"cast the operands: Cast({accepted[0]!r}, ...)",
            )
        return result

    def _select(self, expr: Select, path: str, depth: int) -> _Val:
        cond = self._expr(expr.cond, f"{path}.cond", depth + 1)
        if_true = self._expr(expr.if_true, f"{path}.if_true", depth + 1)
        if_false = self._expr(expr.if_false, f"{path}.if_false", depth + 1)
        self._condition(cond, f"{path}.cond", "Select condition")
        uni = cond.uni | if_true.uni | if_false.uni
        if if_true.dtype is None or if_false.dtype is None:
            return _Val(None, uni)
        if if_true.dtype is not if_false.dtype:
            self._report(
                "V020",
                path,
                f"Select arms differ: {if_true.dtype} vs {if_false.dtype}",
                f"cast one arm: Cast({if_true.dtype!r}, ...)",
            )
            return _Val(None, uni)
        return _Val(if_true.dtype, uni)

    def _fma(self, expr: Fma, path: str, depth: int) -> _Val:
        uni = _UNIFORM
        for operand, field in ((expr.a, "a"), (expr.b, "b"), (expr.c, "c")):
            val = self._expr(operand, f"{path}.{field}", depth + 1)
            self._require(val, DType.F32, "V021", f"{path}.{field}", f"Fma operand {field!r}")
            uni |= val.uni
        return _Val(DType.F32, uni)

    def _atomic(self, expr: Atomic, path: str, depth: int) -> _Val:
        index = self._expr(expr.index, f"{path}.index", depth + 1)
        value = self._expr(expr.value, f"{path}.value", depth + 1)
        self._index(index, f"{path}.index", f"Atomic on {expr.buffer!r}")
        self._require(value, DType.U32, "V024", f"{path}.value", "atomic value")
        if expr.expected is not None:
            expected = self._expr(expr.expected, f"{path}.expected", depth + 1)
            self._require(expected, DType.U32, "V024", f"{path}.expected", "atomic expected")
        self._cas_operand(expr, path)
        decl = self._buffer(expr.buffer, path, "Atomic")
        if decl is not None:
            self._atomic_target(expr.op, decl, path)
        return _Val(DType.U32, _DIVERGENT)

    def _cas_operand(self, expr: Atomic, path: str) -> None:
        if expr.op is AtomicOp.CAS and expr.expected is None:
            self._report(
                "V025",
                path,
                f"atomic 'cas' on {expr.buffer!r} has no expected value",
                "pass the value to compare against: Atomic('cas', ..., expected=...)",
            )
        elif expr.op is not AtomicOp.CAS and expr.expected is not None:
            self._report(
                "V026",
                f"{path}.expected",
                f"atomic {expr.op.value!r} on {expr.buffer!r} has an expected value; "
                "only 'cas' takes one",
                "drop expected=..., or use op 'cas'",
            )

    def _atomic_target(self, op: AtomicOp, decl: BufferDecl, path: str) -> None:
        storage = decl.access is Access.READ_WRITE
        if decl.dtype is DType.U32 and (storage or decl.access is Access.WORKGROUP):
            return
        self._report(
            "V023",
            path,
            f"atomic {op.value!r} on {decl.name!r}, a {decl.access.name} {decl.dtype} buffer; "
            "atomics need a READ_WRITE u32 buffer or a u32 WORKGROUP buffer",
            f"declare {decl.name!r} as Access.READ_WRITE (or WORKGROUP) with DType.U32",
        )

    # Shared checks -----------------------------------------------------------------

    def _buffer(self, name: str, path: str, user: str) -> BufferDecl | None:
        decl = self._buffers.get(name)
        if decl is None:
            known = ", ".join(repr(n) for n in list(self._buffers)[:8]) or "none"
            self._report(
                "V009",
                path,
                f"{user} names buffer {name!r}, which is not declared (declared: {known})",
                f"declare it with BufferDecl({name!r}, binding, access, dtype, count)",
            )
        return decl

    def _undeclared_variable(self, name: str, path: str) -> None:
        barrier = self._expired.get(name)
        if barrier is not None:
            self._report(
                "V035",
                path,
                f"variable {name!r} was declared before the GridBarrier at {barrier} and "
                "is used after it; variables do not live across a grid barrier",
                f"store it to a buffer before the barrier and Load it after, or compute "
                f"{name!r} again after the barrier with Let({name!r}, ...)",
            )
            return
        self._report(
            "V010",
            path,
            f"variable {name!r} is not declared in this scope",
            f"introduce it first with Let({name!r}, value) in this or an enclosing scope",
        )

    def _index(self, index: _Val, path: str, what: str) -> None:
        self._require(index, DType.U32, "V017", path, f"index of {what}")

    def _require(self, val: _Val, dtype: DType, code: str, path: str, what: str) -> None:
        if val.dtype is not None and val.dtype is not dtype:
            self._report(
                code, path, f"{what} is {val.dtype}, not {dtype}", f"cast it: Cast({dtype!r}, ...)"
            )

    def _condition(self, cond: _Val, path: str, what: str) -> None:
        if cond.dtype is not None and cond.dtype not in _CONDITION_DTYPES:
            self._report(
                "V019",
                path,
                f"{what} is {cond.dtype}; it must be bool or u32",
                f"compare it instead: (...).ne({_ZERO[cond.dtype]})",
            )

    def _unknown_node(self, node: object, path: str) -> None:
        self._report(
            "V032",
            path,
            f"{type(node).__name__} is not an IR node this version knows",
            "build the program only from the node classes in vyre_async.ir",
        )


def _divergent_barrier(site: _Site, control: _Control) -> Diagnostic:
    what, verb = ("condition", "is") if control.kind == "If" else ("bounds", "are")
    return Diagnostic(
        code="V027",
        path=site.path,
        message=f"Barrier under the {control.kind} at {control.path}, whose {what} {verb} "
        "divergent (derived from gid, lid, a non-UNIFORM load, an atomic, or a variable "
        "written under divergent control)",
        fix=f"move the Barrier out of the {control.kind}, or make its {what} uniform "
        "(literals, wgid, nwg, BufLen, UNIFORM loads)",
    )


def _return_with_grid_barrier(site: _Site) -> Diagnostic:
    return Diagnostic(
        code="V036",
        path=site.path,
        message="Return in a program with a GridBarrier: every lane must reach every grid "
        "barrier, so no lane may end early",
        fix="guard the work with If(condition, [...]) instead of returning (for example "
        "If(gid() < n, [...]) in each phase)",
    )


def _barrier_after_return(site: _Site, returned: _Site) -> Diagnostic:
    return Diagnostic(
        code="V028",
        path=site.path,
        message=f"Barrier can run after the divergent Return at {returned.path}",
        fix="make the Return's condition uniform, or place the Barrier before it "
        "and outside any loop that contains it",
    )
