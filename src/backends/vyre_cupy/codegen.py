"""Program → CUDA C: one ``extern "C" __global__`` kernel per program.

Pure Python: nothing here imports CuPy or touches a device, so the generated
source is checked without a GPU (``nvcc`` and a CPU emulation harness, see
``docs/cuda.md``).

Rules of the emitted code:

- **ABI.** One ``T* __restrict__`` per non-``WORKGROUP`` buffer, in binding
  order (``const`` for READ and UNIFORM buffers), then ``const unsigned*
  __restrict__ vy_lens`` holding each of those buffers' element counts in the
  same order. `BufLen` and every bounds check read ``vy_lens``, so one compiled
  kernel serves every buffer size. ``WORKGROUP`` buffers the body names are
  static ``__shared__`` arrays, zeroed in a strided loop followed by
  ``__syncthreads()`` at entry (one it never names is left out).
- **SSA evaluation.** Every sub-expression is evaluated into its own typed
  temporary, children before parents in IR pre-order (left to right). Both arms
  of a `Select` and both operands of ``land``/``lor`` are therefore always
  evaluated — atomics inside them run — and C's short-circuit and ternary
  operators only ever see already-computed values.
- **Guards.** Loads are ``(i < n) ? p[i] : 0``, stores ``if (i < n) p[i] = v``,
  atomics ``(i < n) ? atomicOp(&p[i], v) : 0u``, for shared arrays too.
- **Semantics.** Every operator maps to a C operator whose result is fully
  defined, or to a helper of the prelude (`vyre_cupy.prelude`).
- **Grid barriers.** A `GridBarrier` becomes ``__threadfence();
  cooperative_groups::this_grid().sync();`` followed, when the kernel has
  shared arrays, by their strided re-zeroing and a ``__syncthreads()`` (the IR
  says workgroup memory is zero again after a grid barrier); such a kernel
  (``KernelSource.grid_sync``) includes ``<cooperative_groups.h>`` and must be
  launched cooperatively with its whole grid resident. The backend also runs
  these programs split at their grid barriers (`vyre_async.split_at_grid_barriers`),
  one ordinary kernel per segment.
- **Batch kernel.** A program without barriers and shared memory also gets
  ``<entry>_batch``: a persistent kernel that runs a batch of same-shape work
  items in ONE launch. Its blocks loop over (item, workgroup) tasks
  (``task = blockIdx.x; task += gridDim.x``); each task rebinds the buffer
  pointers to its item's arena (``vy_p<i> + item * vy_stride`` bytes) and
  replaces ``blockIdx``/``gridDim`` by the task's workgroup id and the item's
  grid (``vy_wg``/``vy_ng``); ``return`` ends the task (``goto vy_next``), not
  the thread. Programs with barriers keep plain launches only: lanes that
  finished a task early would meet the others at a different ``__syncthreads()``.
- **Identifiers.** Buffers become ``b0, b1, ...`` (parameters) and ``s0, s1,
  ...`` (shared arrays), variables ``v0, v1, ...``, temporaries ``t0, ...``.
  Names from the program only ever appear inside ``/* */`` comments, after
  `sanitize` reduced them to ``[A-Za-z0-9_.-]`` (so they can neither close the
  comment nor continue a line).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import InvalidArgument, InvalidProgram
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
from vyre_async.ir.walk import iter_exprs, iter_stmts
from vyre_cupy.prelude import PRELUDE, PRELUDE_VERSION

__all__ = [
    "CODEGEN_VERSION",
    "DEFAULT_ENTRY",
    "KernelParam",
    "KernelSource",
    "generate",
    "has_grid_barrier",
    "sanitize",
]
__dir__ = _public_dir(__name__)

#: Bump whenever generated code changes for the same program (part of the cache identity).
#: 3: shared arrays the body never names are no longer declared (grid barriers added).
CODEGEN_VERSION = f"3.{PRELUDE_VERSION}"
#: Entry point name of a generated kernel unless the caller picks another.
DEFAULT_ENTRY = "vyre_main"

_ENTRY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_COMMENT_CHARS = 48

#: C type of a value of each dtype while the kernel runs.
_VALUE_TYPE = {DType.U32: "unsigned", DType.I32: "int", DType.F32: "float", DType.BOOL: "bool"}
#: C type of a stored element (BOOL is a 32-bit word holding 0 or 1).
_STORAGE_TYPE = {
    DType.U32: "unsigned",
    DType.I32: "int",
    DType.F32: "float",
    DType.BOOL: "unsigned",
}
_ZERO = {DType.U32: "0u", DType.I32: "0", DType.F32: "0.0f"}
_AXES = ("x", "y", "z")


def sanitize(name: str) -> str:
    """Return ``name`` reduced to a comment-safe form: ``[A-Za-z0-9_.-]``, at most 48 chars.

    Every other character becomes ``?``; the result can never contain ``*/``,
    ``/*``, a backslash or a line break.
    """
    cleaned = _UNSAFE.sub("?", name)
    if len(cleaned) > _COMMENT_CHARS:
        cleaned = cleaned[: _COMMENT_CHARS - 3] + "..."
    return cleaned


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelParam:
    """One buffer parameter of a generated kernel.

    Attributes:
        index: Position in the kernel's parameter list (also its index in ``vy_lens``).
        name: The program's buffer name (never written into the source).
        cname: Its identifier in the source (``b0``, ``b1``...).
        decl: The buffer declaration.
    """

    index: int
    name: str
    cname: str
    decl: BufferDecl


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelSource:
    """A generated CUDA C translation unit and what is needed to launch it.

    Attributes:
        entry: The ``extern "C"`` kernel name.
        source: The whole translation unit (prelude + kernel).
        params: The buffer parameters, in order; ``vy_lens`` follows them.
        shared_bytes: Static shared memory the kernel declares.
        uses_barrier: True when the kernel calls ``__syncthreads()``.
        batch_entry: The batch (persistent) kernel's name, or None when the
            program uses barriers or shared memory and has none.
        line_paths: For each source line (index = line number - 1), the IR
            path of the statement it was generated from, or ``""``.
        grid_sync: True when the kernel has grid-wide barriers
            (``cooperative_groups::this_grid().sync()``): it must be launched
            cooperatively, with every workgroup of its grid resident at once.
    """

    entry: str
    source: str
    params: tuple[KernelParam, ...]
    shared_bytes: int
    uses_barrier: bool
    line_paths: tuple[str, ...]
    batch_entry: str | None = None
    grid_sync: bool = False

    def path_of_line(self, line: int) -> str:
        """Return the IR path of 1-based source ``line`` (``""`` outside the kernel body)."""
        if 1 <= line <= len(self.line_paths):
            return self.line_paths[line - 1]
        return ""


def has_grid_barrier(program: Program) -> bool:
    """True when ``program`` has a `GridBarrier` (a statement of its body itself, V034)."""
    return any(isinstance(stmt, GridBarrier) for stmt in program.body)


def generate(program: Program, *, entry: str = DEFAULT_ENTRY, batch: bool = True) -> KernelSource:
    """Return the CUDA C kernel of ``program`` (which must validate).

    A program with grid barriers becomes ONE kernel that synchronises the grid
    with cooperative groups (``grid_sync``; launch it cooperatively). Split it
    with `vyre_async.split_at_grid_barriers` for one ordinary kernel per segment.

    Args:
        program: A valid program (run `vyre_async.ir.validate_or_raise` first).
        entry: The kernel's ``extern "C"`` name; a C identifier of at most 64 chars.
        batch: Also emit the batch (persistent) kernel when the program allows
            one (no barriers of either kind, no shared memory); False for the
            plain kernel alone.

    Returns:
        The generated translation unit and its launch ABI.

    Raises:
        InvalidArgument: ``entry`` is not a C identifier.
        InvalidProgram: the program names an undeclared buffer or variable or is
            ill-typed (never for a valid program).
    """
    if not isinstance(entry, str) or not _ENTRY_RE.fullmatch(entry):
        raise InvalidArgument(
            f"kernel entry name {entry!r} is not a C identifier of at most 64 characters",
            fix="pass an entry such as 'vyre_main' (letters, digits and '_', not starting "
            "with a digit)",
        )
    kernel = _Emitter(program, entry).run()
    if kernel.uses_barrier or not batch or has_grid_barrier(program):
        return kernel  # (a grid-barrier program runs as a GridKernel, never batched)
    persistent = _Emitter(program, f"{entry}_batch", batch=True).run_batch()
    return dataclasses.replace(
        kernel,
        source=kernel.source + persistent,
        line_paths=kernel.line_paths + ("",) * persistent.count("\n"),
        batch_entry=f"{entry}_batch",
    )


@dataclass(frozen=True, slots=True)
class _Buffer:
    decl: BufferDecl
    cname: str
    length: str  # C expression of the element count
    param: int  # parameter index, -1 for shared arrays


class _Emitter:
    """Emits one kernel; all state of one generation lives here."""

    def __init__(self, program: Program, entry: str, *, batch: bool = False) -> None:
        self.program = program
        self.entry = entry
        self.batch = batch
        self.returns = False
        self.lines: list[str] = []
        self.paths: list[str] = []
        self.path = ""
        self.depth = 1
        self.temps = 0
        self.vars = 0
        self.scopes: list[dict[str, tuple[str, DType]]] = [{}]
        self.uses_barrier = False
        self.grid_sync = False
        self.used_lens: set[int] = set()
        self.buffers: dict[str, _Buffer] = {}
        self.params: list[KernelParam] = []
        self.named = _buffers_named(program)
        shared = 0
        for decl in program.buffers:
            if decl.access is Access.WORKGROUP:
                cname = f"s{shared}"
                shared += 1
                self.buffers[decl.name] = _Buffer(decl, cname, f"{decl.count}u", -1)
            else:
                index = len(self.params)
                cname = f"b{index}"
                self.params.append(KernelParam(index=index, name=decl.name, cname=cname, decl=decl))
                self.buffers[decl.name] = _Buffer(decl, cname, f"n{index}", index)

    # Output -----------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)
        self.paths.append(self.path)

    @contextmanager
    def block(self, opener: str) -> Iterator[None]:
        self.line(f"{opener} {{" if opener else "{")
        self.depth += 1
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()
            self.depth -= 1
            self.line("}")

    def temp(self, dtype: DType, value: str) -> str:
        name = f"t{self.temps}"
        self.temps += 1
        self.line(f"const {_VALUE_TYPE[dtype]} {name} = {value};")
        return name

    # Program ----------------------------------------------------------------------
    def run(self) -> KernelSource:
        self.body(self.program.body, "body")
        body_lines, body_paths = self.lines, self.paths
        self.lines, self.paths, self.path = [], [], ""

        op_id = sanitize(self.program.op_id) if self.program.op_id else "-"
        head = [
            f"/* vyre_cupy codegen {CODEGEN_VERSION}; program {op_id}; "
            f"workgroup {self.program.workgroup_size} */",
        ]
        params = []
        for p in self.params:
            const = "const " if p.decl.access in (Access.READ, Access.UNIFORM) else ""
            ctype = _STORAGE_TYPE[p.decl.dtype]
            params.append(
                f"    {const}{ctype}* __restrict__ {p.cname} "
                f"/* {sanitize(p.name)}: {p.decl.access.value} {p.decl.dtype.value} */,"
            )
        params.append("    const unsigned* __restrict__ vy_lens")
        if self.grid_sync:
            head.append("#include <cooperative_groups.h>")
        head += [f'extern "C" __global__ void {self.entry}(', *params, ") {"]

        prologue: list[str] = [
            f"  const unsigned n{i} = vy_lens[{i}];" for i in sorted(self.used_lens)
        ]
        shared = self.shared()
        for b in shared:
            prologue.append(
                f"  __shared__ {_STORAGE_TYPE[b.decl.dtype]} {b.cname}[{b.decl.count}]; "
                f"/* {sanitize(b.decl.name)}: workgroup {b.decl.dtype.value} */"
            )
        if shared:
            prologue += ["  " + line for line in _zero_shared(shared)]
        tail = ["}", ""]

        prelude_lines = PRELUDE.splitlines()
        lines = prelude_lines + head + prologue + body_lines + tail
        paths = [""] * (len(prelude_lines) + len(head) + len(prologue)) + body_paths + [""] * 2
        return KernelSource(
            entry=self.entry,
            source="\n".join(lines),
            params=tuple(self.params),
            shared_bytes=sum(4 * b.decl.count for b in shared),
            uses_barrier=self.uses_barrier or bool(shared),
            line_paths=tuple(paths),
            grid_sync=self.grid_sync,
        )

    def shared(self) -> list[_Buffer]:
        """The kernel's shared (``WORKGROUP``) arrays its body uses, in declaration order.

        An array no statement names is neither declared nor zeroed (a segment of
        a grid-barrier program often uses only some of the program's arrays).
        """
        return [b for b in self.buffers.values() if b.param < 0 and b.decl.name in self.named]

    def run_batch(self) -> str:
        """Return the batch kernel's source (appended to the plain kernel's unit)."""
        self.depth = 3
        self.body(self.program.body, "body")
        params = []
        rebind = []
        for p in self.params:
            const = "const " if p.decl.access in (Access.READ, Access.UNIFORM) else ""
            ctype = f"{const}{_STORAGE_TYPE[p.decl.dtype]}"
            params.append(f"    {ctype}* __restrict__ vy_p{p.index},")
            rebind.append(
                f"    [[maybe_unused]] {ctype}* __restrict__ {p.cname} = "
                f"({ctype}*)(({const}char*)vy_p{p.index} + vy_item * vy_stride);"
            )
        lines = [
            f"/* batch kernel: {len(self.params)} buffers per item, items vy_stride bytes apart */",
            f'extern "C" __global__ void {self.entry}(',
            *params,
            "    const unsigned* __restrict__ vy_lens,",
            "    const unsigned vy_items,",
            "    const unsigned long long vy_stride,",
            "    const unsigned vy_ngx, const unsigned vy_ngy, const unsigned vy_ngz) {",
            *(f"  const unsigned n{i} = vy_lens[{i}];" for i in sorted(self.used_lens)),
            "  const unsigned long long vy_groups = (unsigned long long)vy_ngx * vy_ngy * vy_ngz;",
            "  const unsigned long long vy_tasks = vy_groups * vy_items;",
            "  for (unsigned long long vy_task = blockIdx.x; vy_task < vy_tasks; "
            "vy_task += gridDim.x) {",
            "    const unsigned long long vy_item = vy_task / vy_groups;",
            "    const unsigned long long vy_g = vy_task % vy_groups;",
            "    [[maybe_unused]] const unsigned vy_wgx = (unsigned)(vy_g % vy_ngx);",
            "    [[maybe_unused]] const unsigned vy_wgy = (unsigned)((vy_g / vy_ngx) % vy_ngy);",
            "    [[maybe_unused]] const unsigned vy_wgz = "
            "(unsigned)(vy_g / ((unsigned long long)vy_ngx * vy_ngy));",
            *rebind,
            "    {",
            *self.lines,
            "    }",
            *(["  vy_next:;"] if self.returns else []),
            "  }",
            "}",
            "",
        ]
        return "\n".join(lines)

    # Statements -------------------------------------------------------------------
    def body(self, statements: tuple[Stmt, ...], where: str) -> None:
        top = where == "body"
        for i, stmt in enumerate(statements):
            self.path = f"{where}[{i}]"
            if top and isinstance(stmt, GridBarrier) and not _separates(statements, i):
                self.line("/* grid barrier: no phase before or after it here */")
                continue
            self.stmt(stmt, self.path)

    def stmt(self, stmt: Stmt, path: str) -> None:
        match stmt:
            case Let(name=name, value=value):
                operand, dtype = self.expr(value)
                cname = f"v{self.vars}"
                self.vars += 1
                self.line(
                    f"[[maybe_unused]] {_VALUE_TYPE[dtype]} {cname} = {operand}; "
                    f"/* {sanitize(name)} */"
                )
                self.scopes[-1][name] = (cname, dtype)
            case Assign(name=name, value=value):
                operand, _ = self.expr(value)
                cname, _ = self.lookup(name)
                self.line(f"{cname} = {operand};")
            case Store(buffer=name, index=index, value=value):
                i, _ = self.expr(index)
                v, _ = self.expr(value)
                buf = self.buffer(name)
                if buf.decl.dtype is DType.BOOL:
                    v = f"({v} ? 1u : 0u)"
                self.line(f"if ({i} < {buf.length}) VY_STORE(&{buf.cname}[{i}], {v});")
            case If(cond=cond, then=then, orelse=orelse):
                c = self.truth(cond)
                with self.block(f"if ({c})"):
                    self.body(then, f"{path}.then")
                if orelse:
                    self.path = path
                    with self.block("else"):
                        self.body(orelse, f"{path}.orelse")
            case Loop(var=var, start=start, end=end, body=inner):
                # Bounds are evaluated once: snapshot them (a Var bound may be assigned inside).
                lo = self.temp(DType.U32, self.expr(start)[0])
                hi = self.temp(DType.U32, self.expr(end)[0])
                cname = f"v{self.vars}"
                self.vars += 1
                with self.block(f"for (unsigned {cname} = {lo}; {cname} < {hi}; ++{cname})"):
                    self.lines[-1] += f" /* {sanitize(var)} */"
                    self.scopes[-1][var] = (cname, DType.U32)
                    self.body(inner, f"{path}.body")
            case Block(body=inner):
                with self.block(""):
                    self.body(inner, f"{path}.body")
            case Barrier():
                self.uses_barrier = True
                self.line("__syncthreads();")
            case GridBarrier():
                # Every lane of the grid arrives (its storage writes fenced) before any
                # goes on; then workgroup memory is zero again, as the IR says.
                self.uses_barrier = self.grid_sync = True
                self.line("__threadfence();")
                self.line("cooperative_groups::this_grid().sync(); /* grid barrier */")
                shared = self.shared()
                if shared:
                    for text in _zero_shared(shared):
                        self.line(text)
            case Return():
                self.returns = True
                self.line("goto vy_next;" if self.batch else "return;")
            case _:
                raise InvalidProgram(
                    f"unknown statement {stmt!r} at {path}",
                    fix="build programs from vyre_async.ir statements",
                )
        self.path = path

    def lookup(self, name: str) -> tuple[str, DType]:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise InvalidProgram(
            f"variable {name!r} is not declared at {self.path}",
            fix="run vyre_async.ir.validate(program) and fix what it lists",
        )

    def buffer(self, name: str) -> _Buffer:
        try:
            buf = self.buffers[name]
        except KeyError:
            raise InvalidProgram(
                f"buffer {name!r} is not declared at {self.path}",
                fix="run vyre_async.ir.validate(program) and fix what it lists",
            ) from None
        if buf.param >= 0:
            self.used_lens.add(buf.param)
        return buf

    def truth(self, cond: Expr) -> str:
        operand, dtype = self.expr(cond)
        return operand if dtype is DType.BOOL else f"({operand} != {_ZERO[dtype]})"

    # Expressions ------------------------------------------------------------------
    def expr(self, expr: Expr) -> tuple[str, DType]:
        """Emit ``expr``; return a side-effect-free C operand holding its value, and its dtype."""
        match expr:
            case Const():
                return _const(expr), expr.dtype
            case Var(name=name):
                return self.lookup(name)
            case BufLen(buffer=name):
                return self.buffer(name).length, DType.U32
            case Builtin(kind=kind, axis=axis):
                return _builtin(kind, axis, batch=self.batch), DType.U32
            case Load(buffer=name, index=index):
                i, _ = self.expr(index)
                buf = self.buffer(name)
                dtype = buf.decl.dtype
                if dtype is DType.BOOL:
                    value = f"({i} < {buf.length}) && (VY_LOAD(&{buf.cname}[{i}]) != 0u)"
                else:
                    value = f"({i} < {buf.length}) ? VY_LOAD(&{buf.cname}[{i}]) : {_ZERO[dtype]}"
                return self.temp(dtype, value), dtype
            case Bin(op=op, a=a, b=b):
                x, dtype = self.expr(a)
                y, _ = self.expr(b)
                result, text = _binary(op, dtype, x, y)
                return self.temp(result, text), result
            case Un(op=op, a=a):
                x, dtype = self.expr(a)
                return self.temp(dtype, _unary(op, dtype, x)), dtype
            case Select(cond=cond, if_true=t, if_false=f):
                c = self.truth(cond)
                x, dtype = self.expr(t)
                y, _ = self.expr(f)
                return self.temp(dtype, f"{c} ? {x} : {y}"), dtype
            case Cast(dtype=target, value=value):
                x, source = self.expr(value)
                return self.temp(target, _cast(source, target, x)), target
            case Fma(a=a, b=b, c=c):
                x, _ = self.expr(a)
                y, _ = self.expr(b)
                z, _ = self.expr(c)
                return self.temp(DType.F32, f"__fmaf_rn({x}, {y}, {z})"), DType.F32
            case Atomic(op=op, buffer=name, index=index, value=value, expected=expected):
                i, _ = self.expr(index)
                v, _ = self.expr(value)
                e = self.expr(expected)[0] if expected is not None else ""
                buf = self.buffer(name)
                address = f"VY_ATOMIC(&{buf.cname}[{i}])"
                call = (
                    f"atomicCAS({address}, {e}, {v})"
                    if op is AtomicOp.CAS
                    else f"{_ATOMIC[op]}({address}, {v})"
                )
                return self.temp(DType.U32, f"({i} < {buf.length}) ? {call} : 0u"), DType.U32
        raise InvalidProgram(
            f"unknown expression {expr!r} at {self.path}",
            fix="build programs from vyre_async.ir expressions",
        )


def _buffers_named(program: Program) -> frozenset[str]:
    """The buffers some statement or expression of ``program``'s body names."""
    names = {stmt.buffer for stmt in iter_stmts(program.body) if isinstance(stmt, Store)}
    names.update(
        expr.buffer for expr in iter_exprs(program.body) if isinstance(expr, Load | Atomic | BufLen)
    )
    return frozenset(names)


def _separates(body: tuple[Stmt, ...], at: int) -> bool:
    """True when the grid barrier ``body[at]`` ends a phase that another one follows.

    A barrier first, last, or followed by another adds nothing (the segments of
    `vyre_async.split_at_grid_barriers` leave those empty phases out): the
    kernel synchronises the grid once between two non-empty phases.
    """
    before = any(not isinstance(stmt, GridBarrier) for stmt in body[:at])
    after = any(not isinstance(stmt, GridBarrier) for stmt in body[at + 1 :])
    return before and after and not isinstance(body[at + 1], GridBarrier)


def _zero_shared(shared: list[_Buffer]) -> list[str]:
    """Lines zeroing ``shared`` in a strided loop over the workgroup, then ``__syncthreads()``."""
    lines = [
        "{",
        "  const unsigned vy_tid = threadIdx.x + blockDim.x * (threadIdx.y + "
        "blockDim.y * threadIdx.z);",
        "  const unsigned vy_nt = blockDim.x * blockDim.y * blockDim.z;",
    ]
    for b in shared:
        zero = "0.0f" if b.decl.dtype is DType.F32 else "0"
        lines.append(
            f"  for (unsigned vy_i = vy_tid; vy_i < {b.decl.count}u; vy_i += vy_nt) "
            f"{b.cname}[vy_i] = {zero};"
        )
    return [*lines, "}", "__syncthreads();"]


def _const(expr: Const) -> str:
    bits = expr.bits
    if expr.dtype is DType.U32:
        return f"0x{bits:08X}u"
    if expr.dtype is DType.I32:
        value = int(expr.value)
        if value == -(2**31):
            return "(-2147483647 - 1)"
        return str(value) if value >= 0 else f"({value})"
    if expr.dtype is DType.F32:
        return f"__uint_as_float(0x{bits:08X}u)"
    return "true" if bits else "false"


_BUILTIN = {
    BuiltinKind.GID: "(blockIdx.{a} * blockDim.{a} + threadIdx.{a})",
    BuiltinKind.LID: "threadIdx.{a}",
    BuiltinKind.WGID: "blockIdx.{a}",
    BuiltinKind.NWG: "gridDim.{a}",
}


#: In the batch kernel a task's workgroup id and its item's grid replace the launch's.
_BATCH_BUILTIN = {
    BuiltinKind.GID: "(vy_wg{a} * blockDim.{a} + threadIdx.{a})",
    BuiltinKind.LID: "threadIdx.{a}",
    BuiltinKind.WGID: "vy_wg{a}",
    BuiltinKind.NWG: "vy_ng{a}",
}


def _builtin(kind: BuiltinKind, axis: int, *, batch: bool = False) -> str:
    return (_BATCH_BUILTIN if batch else _BUILTIN)[kind].format(a=_AXES[axis])


_ATOMIC = {
    AtomicOp.ADD: "atomicAdd",
    AtomicOp.OR: "atomicOr",
    AtomicOp.AND: "atomicAnd",
    AtomicOp.XOR: "atomicXor",
    AtomicOp.MIN: "atomicMin",
    AtomicOp.MAX: "atomicMax",
    AtomicOp.EXCHANGE: "atomicExch",
}

_COMPARE = {
    BinOp.EQ: "==",
    BinOp.NE: "!=",
    BinOp.LT: "<",
    BinOp.LE: "<=",
    BinOp.GT: ">",
    BinOp.GE: ">=",
}
_INFIX_U32 = {BinOp.ADD: "+", BinOp.SUB: "-", BinOp.MUL: "*"}
_INFIX_BITS = {BinOp.AND: "&", BinOp.OR: "|", BinOp.XOR: "^"}
_CALL: dict[DType, dict[BinOp, str]] = {
    DType.U32: {
        BinOp.DIV: "vy_div_u32",
        BinOp.MOD: "vy_mod_u32",
        BinOp.MIN: "vy_min_u32",
        BinOp.MAX: "vy_max_u32",
        BinOp.SHL: "vy_shl_u32",
        BinOp.SHR: "vy_shr_u32",
        BinOp.MULHI: "__umulhi",
    },
    DType.I32: {
        BinOp.ADD: "vy_add_i32",
        BinOp.SUB: "vy_sub_i32",
        BinOp.MUL: "vy_mul_i32",
        BinOp.DIV: "vy_div_i32",
        BinOp.MOD: "vy_mod_i32",
        BinOp.MIN: "vy_min_i32",
        BinOp.MAX: "vy_max_i32",
        BinOp.SHL: "vy_shl_i32",
        BinOp.SHR: "vy_shr_i32",
    },
    DType.F32: {
        BinOp.ADD: "__fadd_rn",
        BinOp.SUB: "__fsub_rn",
        BinOp.MUL: "__fmul_rn",
        BinOp.DIV: "__fdiv_rn",
        BinOp.MOD: "fmodf",
        BinOp.MIN: "vy_fmin",
        BinOp.MAX: "vy_fmax",
    },
    DType.BOOL: {},
}


def _binary(op: BinOp, dtype: DType, x: str, y: str) -> tuple[DType, str]:
    """Return the result dtype and C text of ``op`` on operands ``x``, ``y`` of ``dtype``."""
    if op in _COMPARE:
        return DType.BOOL, f"{x} {_COMPARE[op]} {y}"
    if dtype is DType.BOOL:
        if op is BinOp.LAND:
            return DType.BOOL, f"{x} && {y}"
        if op is BinOp.LOR:
            return DType.BOOL, f"{x} || {y}"
    elif op in _CALL[dtype]:
        return dtype, f"{_CALL[dtype][op]}({x}, {y})"
    elif dtype is DType.U32 and op in _INFIX_U32:
        return dtype, f"{x} {_INFIX_U32[op]} {y}"
    elif dtype in (DType.U32, DType.I32) and op in _INFIX_BITS:
        return dtype, f"{x} {_INFIX_BITS[op]} {y}"
    raise InvalidProgram(
        f"{op.value} is not defined on {dtype.value}",
        fix="run vyre_async.ir.validate(program) and fix what it lists",
    )


_FLOAT_UNARY = {
    UnOp.ABS: "fabsf",
    UnOp.SQRT: "__fsqrt_rn",
    UnOp.RSQRT: "vy_rsqrt",
    UnOp.EXP: "vy_exp",
    UnOp.LOG: "vy_log",
    UnOp.SIN: "vy_sin",
    UnOp.COS: "vy_cos",
    UnOp.TANH: "vy_tanh",
    UnOp.FLOOR: "floorf",
    UnOp.CEIL: "ceilf",
    UnOp.ROUND: "rintf",
    UnOp.TRUNC: "truncf",
}
_BIT_COUNT = {UnOp.POPCOUNT: "vy_popc", UnOp.CLZ: "vy_clz", UnOp.CTZ: "vy_ctz"}


def _unary(op: UnOp, dtype: DType, x: str) -> str:
    """Return the C text of ``op`` on operand ``x`` of ``dtype`` (the result has ``dtype``)."""
    if dtype is DType.F32:
        if op is UnOp.NEG:
            return f"-{x}"
        if op in _FLOAT_UNARY:
            return f"{_FLOAT_UNARY[op]}({x})"
    elif dtype is DType.U32:
        if op is UnOp.NEG:
            return f"0u - {x}"
        if op is UnOp.NOT:
            return f"~{x}"
        if op in _BIT_COUNT:
            return f"{_BIT_COUNT[op]}({x})"
    elif dtype is DType.I32:
        if op is UnOp.NEG:
            return f"vy_neg_i32({x})"
        if op is UnOp.NOT:
            return f"~{x}"
        if op in _BIT_COUNT:
            return f"(int){_BIT_COUNT[op]}((unsigned){x})"
    elif op is UnOp.LNOT:
        return f"!{x}"
    raise InvalidProgram(
        f"{op.value} is not defined on {dtype.value}",
        fix="run vyre_async.ir.validate(program) and fix what it lists",
    )


def _cast(source: DType, target: DType, x: str) -> str:
    """Return the C text converting ``x`` from ``source`` to ``target`` (ir.md cast rules)."""
    if source is target:
        return x
    if target is DType.BOOL:
        return f"{x} != {_ZERO[source]}"
    if source is DType.BOOL:
        return f"{x} ? 1.0f : 0.0f" if target is DType.F32 else f"({_VALUE_TYPE[target]}){x}"
    if target is DType.F32:
        return f"__uint2float_rn({x})" if source is DType.U32 else f"__int2float_rn({x})"
    if source is DType.F32:
        return f"vy_f2u({x})" if target is DType.U32 else f"vy_f2i({x})"
    return f"({_VALUE_TYPE[target]}){x}"  # u32 <-> i32: the same 32 bits
