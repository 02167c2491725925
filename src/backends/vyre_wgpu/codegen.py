"""Program → WGSL: one compute shader per program.

Pure Python: nothing here imports wgpu or touches a device, so the generated
source is checked without an adapter (``naga`` through wgpu when one is
installed, see ``tests/wgpu``).

Rules of the emitted code:

- **Bindings.** Group 0. One ``var<storage>`` array per non-``WORKGROUP``
  buffer, at binding ``0, 1, ...`` in the program's order (``read`` for READ
  and UNIFORM buffers, ``read_write`` otherwise), then ``vy_info``, a uniform
  block holding each of those buffers' element counts, the workgroup offset
  of this launch and the whole grid (``BufLen``, every bounds check, ``wgid``
  and ``nwg`` read it, so one compiled pipeline serves every buffer size and a
  grid split into several launches), then, where the adapter cuts long loops
  (lavapipe), ``vy_status``: a word the shader sets when a loop was cut, so
  the executor fails the dispatch instead of returning wrong outputs.
  ``WORKGROUP`` buffers are module-scope ``var<workgroup>`` arrays, which the
  shader zero-fills at entry (lavapipe was seen to skip WebGPU's own fill). A
  buffer that any `Atomic` touches is an array of ``atomic<u32>``; its plain
  loads and stores are ``atomicLoad``/``atomicStore``.
- **SSA evaluation.** Every sub-expression is evaluated into its own ``let``,
  children before parents in IR pre-order, so both arms of a `Select` and
  both operands of ``land``/``lor`` are always evaluated (atomics in them run).
- **Guards.** Loads are ``select(0, p[i], i < n)`` (WebGPU's robust access
  makes the unselected read harmless), stores and atomics ``if (i < n)``.
- **Semantics.** Every operator maps to a WGSL operator whose result is the
  IR's for every operand, or to a helper of the prelude (`vyre_wgpu.prelude`).
- **Return.** Without barriers, ``return``. With barriers, a lane that
  returns clears ``vy_live`` and keeps walking the program doing nothing but
  meeting barriers, so the lanes still running never wait for it in vain
  (``ctl.return``: returned lanes do not count at barriers).
- **Identifiers.** Buffers become ``b0, b1, ...`` and ``s0, s1, ...``,
  variables ``v0, ...``, temporaries ``t0, ...``. Names from the program
  appear only in ``//`` comments, reduced by `sanitize` (no line break).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

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
from vyre_wgpu.prelude import PRELUDE, PRELUDE_VERSION

__all__ = ["CODEGEN_VERSION", "ENTRY", "ShaderBinding", "ShaderSource", "generate", "sanitize"]
__dir__ = _public_dir(__name__)

#: Bump whenever generated code changes for the same program (part of the cache identity).
CODEGEN_VERSION = f"1.{PRELUDE_VERSION}"
#: The entry point of every generated shader.
ENTRY = "vyre_main"

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")
_COMMENT_CHARS = 48

_VALUE_TYPE = {DType.U32: "u32", DType.I32: "i32", DType.F32: "f32", DType.BOOL: "bool"}
_STORAGE_TYPE = {DType.U32: "u32", DType.I32: "i32", DType.F32: "f32", DType.BOOL: "u32"}
_ZERO = {DType.U32: "0u", DType.I32: "0i", DType.F32: "vy_f32(0u)", DType.BOOL: "false"}
_AXES = ("x", "y", "z")


def sanitize(name: str) -> str:
    """Return ``name`` reduced to ``[A-Za-z0-9_.-]`` (others become ``?``), at most 48 chars."""
    cleaned = _UNSAFE.sub("?", name)
    if len(cleaned) > _COMMENT_CHARS:
        cleaned = cleaned[: _COMMENT_CHARS - 3] + "..."
    return cleaned


@dataclass(frozen=True, slots=True, kw_only=True)
class ShaderBinding:
    """One storage buffer of a generated shader.

    Attributes:
        index: Its binding number (also its slot in ``vy_info.lens``).
        name: The program's buffer name (never written into code).
        decl: The buffer declaration.
        atomic: True when it is declared as ``array<atomic<u32>>``.
    """

    index: int
    name: str
    decl: BufferDecl
    atomic: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ShaderSource:
    """A generated WGSL module and what is needed to bind and launch it.

    Attributes:
        source: The whole module (prelude + shader).
        bindings: The storage buffers, in binding order.
        info_binding: Binding number of the ``vy_info`` uniform block.
        info_words: Its size in 32-bit words (``lens`` padded to vec4s, then
            ``base`` and ``grid``, one vec4 each).
        status_binding: Binding number of ``vy_status``, or None (no loop guard).
            Bit 0: a loop was cut (the outputs are wrong); bit 1: a lane suspended.
        state_binding: Binding number of ``vy_state``, or None: the shader is
            not sliced (see `generate`).
        state_words: 32-bit words of one lane's saved state (sliced shaders).
        workgroup_size: The ``@workgroup_size``.
        workgroup_bytes: Workgroup memory the shader declares.
        uses_barrier: True when the shader has a barrier.
    """

    source: str
    bindings: tuple[ShaderBinding, ...]
    info_binding: int
    info_words: int
    status_binding: int | None
    state_binding: int | None
    state_words: int
    workgroup_size: tuple[int, int, int]
    workgroup_bytes: int
    uses_barrier: bool


#: Default loop-bound tests one lane runs in one slice of a sliced shader. Lavapipe
#: allows 65 535 per SIMD vector of lanes (every loop of the shader together, and a
#: vector runs a loop as long as its slowest lane), so the executor passes
#: ``65 535 / lanes per vector`` less a margin (`vyre_wgpu.backend`).
SLICE_BUDGET = 8_000
#: Words of ``vy_state`` before the first lane's record: [0] is the slice number.
STATE_HEADER_WORDS = 4


def generate(
    program: Program, *, loop_guard: bool = False, slice_budget: int = SLICE_BUDGET
) -> ShaderSource:
    """Return the WGSL shader of ``program`` (which must validate).

    Args:
        program: A valid program (run `vyre_async.ir.validate_or_raise` first).
        loop_guard: For an adapter that cuts long loops (lavapipe). A program
            with loops and without barriers or workgroup memory is **sliced**:
            each lane tests loop bounds at most ``slice_budget`` times per launch,
            then saves its variables and where it was to its record in
            ``vy_state`` and sets bit 1 of ``vy_status``; the executor launches
            again with the next slice number in ``vy_state[0]`` and suspended
            lanes resume where they stopped (lanes that finished do nothing).
            A lane that cannot save (``vy_state`` too small: the executor's
            first, unsliced attempt) sets bit 0 instead. Other programs record
            in bit 0 a loop that ended before its bound.

    A program with `GridBarrier` statements has no single shader: generate one
    per segment of `vyre_async.split_at_grid_barriers` (the executor does).

    Raises:
        InvalidProgram: the program names an undeclared buffer or variable or is
            ill-typed (never for a valid program), or holds a `GridBarrier`.
    """
    return _Emitter(program, loop_guard, slice_budget).run()


def _loops_in(statements: tuple[Stmt, ...]) -> int:
    return sum(isinstance(stmt, Loop) for stmt in iter_stmts(statements))


def _to_word(dtype: DType, value: str) -> str:
    if dtype is DType.U32:
        return value
    if dtype is DType.BOOL:
        return f"select(0u, 1u, {value})"
    return f"bitcast<u32>({value})"


def _from_word(dtype: DType, word: str) -> str:
    if dtype is DType.U32:
        return word
    if dtype is DType.BOOL:
        return f"({word} != 0u)"
    return f"bitcast<{_VALUE_TYPE[dtype]}>({word})"


@dataclass(frozen=True, slots=True)
class _Buffer:
    decl: BufferDecl
    name: str
    length: str
    atomic: bool


def _atomic_buffers(statements: tuple[Stmt, ...]) -> set[str]:
    found: set[str] = set()
    for expr in iter_exprs(statements):
        if isinstance(expr, Atomic):
            found.add(expr.buffer)
    return found


def _has_return(statements: tuple[Stmt, ...]) -> bool:
    return any(isinstance(stmt, Return) for stmt in iter_stmts(statements))


def _has_barrier(statements: tuple[Stmt, ...]) -> bool:
    return any(isinstance(stmt, Barrier) for stmt in iter_stmts(statements))


class _Emitter:
    """Emits one shader; all state of one generation lives here."""

    def __init__(
        self, program: Program, loop_guard: bool, slice_budget: int = SLICE_BUDGET
    ) -> None:
        self.program = program
        self.loop_guard = loop_guard
        self.slice_budget = slice_budget
        self.lines: list[str] = []
        self.depth = 1
        self.temps = 0
        self.vars = 0
        self.opaques = 0
        self.scopes: list[dict[str, tuple[str, DType]]] = [{}]
        self.barriers = _has_barrier(program.body)
        # Decided before anything is emitted: every statement of a program with barriers
        # and a Return runs only on lanes that have not returned.
        self.uses_live = self.barriers and _has_return(program.body)
        self.sliced = (
            loop_guard
            and not self.barriers
            and not program.workgroup_buffers
            and _loops_in(program.body) > 0
        )
        self.next_loop = 0
        #: A shader with loops on a loop-capped adapter also reports a cut prelude loop
        #: (vy_fmod's), which its IR loops' guards cannot see.
        self.cut_flag = loop_guard and _loops_in(program.body) > 0
        self.uses_loop_guard = self.cut_flag
        #: Sliced shaders: every saved variable's word in a lane record, and the
        #: saved variables of each open scope.
        self.slots: dict[str, tuple[int, DType]] = {}
        self.slot_scopes: list[list[str]] = [[]]
        atomics = _atomic_buffers(program.body)
        self.buffers: dict[str, _Buffer] = {}
        self.bindings: list[ShaderBinding] = []
        shared = 0
        for decl in program.buffers:
            atomic = decl.name in atomics
            if decl.access is Access.WORKGROUP:
                self.buffers[decl.name] = _Buffer(decl, f"s{shared}", f"{decl.count}u", atomic)
                shared += 1
            else:
                index = len(self.bindings)
                self.bindings.append(
                    ShaderBinding(index=index, name=decl.name, decl=decl, atomic=atomic)
                )
                length = f"vy_info.lens[{index // 4}].{_AXES[index % 4] if index % 4 < 3 else 'w'}"
                self.buffers[decl.name] = _Buffer(decl, f"b{index}", length, atomic)

    # Output -----------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    @contextmanager
    def block(self, opener: str) -> Iterator[None]:
        self.line(f"{opener} {{" if opener else "{")
        self.depth += 1
        self.scopes.append({})
        self.slot_scopes.append([])
        try:
            yield
        finally:
            self.slot_scopes.pop()
            self.scopes.pop()
            self.depth -= 1
            self.line("}")

    def declare(self, cname: str, dtype: DType, name: str) -> None:
        self.line(f"var {cname}: {_VALUE_TYPE[dtype]} = {_ZERO[dtype]}; // {sanitize(name)}")

    def temp(self, dtype: DType, value: str) -> str:
        name = f"t{self.temps}"
        self.temps += 1
        self.line(f"let {name}: {_VALUE_TYPE[dtype]} = {value};")
        return name

    # Program ----------------------------------------------------------------------
    def run(self) -> ShaderSource:
        self.body(self.program.body)
        body = self.lines
        wx, wy, wz = self.program.workgroup_size
        lens_vec4 = max(1, (len(self.bindings) + 3) // 4)
        op_id = sanitize(self.program.op_id) if self.program.op_id else "-"
        head = [f"// vyre_wgpu codegen {CODEGEN_VERSION}; program {op_id}"]
        for binding in self.bindings:
            decl = binding.decl
            access = "read" if decl.access in (Access.READ, Access.UNIFORM) else "read_write"
            element = "atomic<u32>" if binding.atomic else _STORAGE_TYPE[decl.dtype]
            head.append(
                f"@group(0) @binding({binding.index}) var<storage, {access}> b{binding.index}: "
                f"array<{element}>; // {sanitize(decl.name)}: {decl.access.value} "
                f"{decl.dtype.value}"
            )
        info = len(self.bindings)
        head += [
            f"struct VyInfo {{ lens: array<vec4<u32>, {lens_vec4}>, base: vec4<u32>, "
            "grid: vec4<u32> }",
            f"@group(0) @binding({info}) var<uniform> vy_info: VyInfo;",
        ]
        status = state = None
        if self.uses_loop_guard or self.sliced:
            status = info + 1
            head.append(
                f"@group(0) @binding({status}) var<storage, read_write> vy_status: "
                "array<atomic<u32>>;"
            )
        if self.sliced:
            state = info + 2
            head.append(
                f"@group(0) @binding({state}) var<storage, read_write> vy_state: array<u32>;"
            )
        shared_bytes = 0
        for buf in self.buffers.values():
            if buf.decl.access is Access.WORKGROUP:
                element = "atomic<u32>" if buf.atomic else _STORAGE_TYPE[buf.decl.dtype]
                shared_bytes += 4 * buf.decl.count
                head.append(
                    f"var<workgroup> {buf.name}: array<{element}, {buf.decl.count}>; "
                    f"// {sanitize(buf.decl.name)}: workgroup {buf.decl.dtype.value}"
                )
        head += [
            # Pipeline-overridable: one shader module serves every workgroup_override.
            f"override vy_wx: u32 = {wx}u;",
            f"override vy_wy: u32 = {wy}u;",
            f"override vy_wz: u32 = {wz}u;",
            "@compute @workgroup_size(vy_wx, vy_wy, vy_wz)",
            f"fn {ENTRY}(@builtin(local_invocation_id) vy_lid: vec3<u32>, "
            "@builtin(workgroup_id) vy_wid: vec3<u32>) {",
            "  let vy_wg = vy_wid + vy_info.base.xyz;",
            "  let vy_gid = vy_wg * vec3<u32>(vy_wx, vy_wy, vy_wz) + vy_lid;",
        ]
        shared = [b for b in self.buffers.values() if b.decl.access is Access.WORKGROUP]
        if shared:
            # WebGPU promises zero-filled workgroup memory, but lavapipe (Mesa 22.3) was
            # seen to hand out stale words: the shader zero-fills it itself.
            head += [
                "  let vy_tid = vy_lid.x + vy_wx * (vy_lid.y + vy_wy * vy_lid.z);",
                "  let vy_nt = vy_wx * vy_wy * vy_wz;",
            ]
            for buf in shared:
                zero = "0u" if buf.decl.dtype is DType.BOOL else _ZERO[buf.decl.dtype]
                store = (
                    f"atomicStore(&{buf.name}[vy_i], 0u)"
                    if buf.atomic
                    else f"{buf.name}[vy_i] = {zero}"
                )
                head.append(
                    f"  for (var vy_i: u32 = vy_tid; vy_i < {buf.decl.count}u; "
                    f"vy_i = vy_i + vy_nt) {{ {store}; }}"
                )
            head.append("  workgroupBarrier();")
        if self.uses_live:
            head.append("  var vy_live: bool = true;")
        words = 2 + len(self.slots)
        if self.sliced:
            head += [
                "  let vy_tid = vy_lid.x + vy_wx * (vy_lid.y + vy_wy * vy_lid.z);",
                "  let vy_lane = ((vy_wg.z * vy_info.grid.y + vy_wg.y) * vy_info.grid.x + vy_wg.x)"
                " * (vy_wx * vy_wy * vy_wz) + vy_tid;",
                f"  let vy_rec = {STATE_HEADER_WORDS}u + vy_lane * {words}u;",
                f"  let vy_saves = vy_rec + {words}u <= arrayLength(&vy_state);",
                "  let vy_slice = vy_state[0];",
                f"  var vy_budget: u32 = {self.slice_budget}u;",
                "  var vy_resume: bool = false;",
                "  var vy_at: u32 = 0u;",
                "  if (vy_slice == 0u) {",
                "    if (vy_saves) { vy_state[vy_rec] = 0u; }",
                "  } else {",
                "    if (!vy_saves || vy_state[vy_rec] != vy_slice) { return; }",
                "    vy_resume = true;",
                "    vy_at = vy_state[vy_rec + 1u];",
                "  }",
            ]
        tail = ["  if (vy_cut) { atomicOr(&vy_status[0], 1u); }"] if self.cut_flag else []
        source = "\n".join([PRELUDE.rstrip("\n"), *head, *body, *tail, "}", ""])
        return ShaderSource(
            source=source,
            bindings=tuple(self.bindings),
            info_binding=info,
            info_words=4 * lens_vec4 + 8,
            status_binding=status,
            state_binding=state,
            state_words=words if self.sliced else 0,
            workgroup_size=(wx, wy, wz),
            workgroup_bytes=shared_bytes,
            uses_barrier=self.barriers,
        )

    # Statements -------------------------------------------------------------------
    def body(self, statements: tuple[Stmt, ...]) -> None:
        for stmt in statements:
            self.stmt(stmt)

    @contextmanager
    def live(self, guarded: bool) -> Iterator[None]:
        """Run what is emitted inside only on lanes that have not returned (``guarded``)."""
        if guarded and self.uses_live:
            with self.block("if (vy_live)"):
                yield
        else:
            yield

    def stmt(self, stmt: Stmt) -> None:
        if self.sliced:
            self.sliced_stmt(stmt)
            return
        guarded = self.barriers  # a program with barriers keeps returned lanes walking
        match stmt:
            case Let(name=name, value=value):
                cname = f"v{self.vars}"
                self.vars += 1
                dtype = self.dtype_of(value)
                self.line(
                    f"var {cname}: {_VALUE_TYPE[dtype]} = {_ZERO[dtype]}; // {sanitize(name)}"
                )
                with self.live(guarded):
                    operand, _ = self.expr(value)
                    self.line(f"{cname} = {operand};")
                self.scopes[-1][name] = (cname, dtype)
            case Assign(name=name, value=value):
                cname, _ = self.lookup(name)
                with self.live(guarded):
                    operand, _ = self.expr(value)
                    self.line(f"{cname} = {operand};")
            case Store(buffer=name, index=index, value=value):
                with self.live(guarded):
                    i = self.index(index)
                    v, _ = self.expr(value)
                    buf = self.buffer(name)
                    if buf.decl.dtype is DType.BOOL:
                        v = f"select(0u, 1u, {v})"
                    if buf.atomic:
                        self.line(
                            f"if ({i} < {buf.length}) {{ atomicStore(&{buf.name}[{i}], {v}); }}"
                        )
                    else:
                        self.line(f"if ({i} < {buf.length}) {{ {buf.name}[{i}] = {v}; }}")
            case If(cond=cond, then=then, orelse=orelse):
                inner = _has_barrier(then) or _has_barrier(orelse)
                # A barrier inside: the condition is uniform (validated), so every lane,
                # returned or not, evaluates it and meets the same barriers.
                with self.live(guarded and not inner):
                    c = self.truth(cond)
                    with self.block(f"if ({c})"):
                        self.body(then)
                    if orelse:
                        with self.block("else"):
                            self.body(orelse)
            case Loop(var=var, start=start, end=end, body=inner_body):
                inner = _has_barrier(inner_body)
                with self.live(guarded and not inner):
                    lo = self.temp(DType.U32, self.expr(start)[0])
                    hi = self.temp(DType.U32, self.expr(end)[0])
                    cname = f"v{self.vars}"
                    self.vars += 1
                    self.line(f"var {cname}: u32 = {lo}; // {sanitize(var)}")
                    with self.block("loop"):
                        self.line(f"if ({cname} >= {hi}) {{ break; }}")
                        if self.uses_live and not inner:  # a returned lane leaves at once
                            self.line("if (!vy_live) { break; }")
                        self.scopes[-1][var] = (cname, DType.U32)
                        self.body(inner_body)
                        with self.block("continuing"):
                            self.line(f"{cname} = {cname} + 1u;")
                    if self.loop_guard:
                        self.uses_loop_guard = True
                        cut = f"vy_live && {cname} < {hi}" if self.uses_live else f"{cname} < {hi}"
                        self.line(f"if ({cut}) {{ atomicOr(&vy_status[0], 1u); }}")
            case Block(body=inner_body):
                with self.block(""):
                    self.body(inner_body)
            case Barrier():
                self.line("storageBarrier();")
                self.line("workgroupBarrier();")
            case Return():
                if self.uses_live:
                    self.line("vy_live = false;")
                else:
                    self.ret()
            case GridBarrier():
                raise InvalidProgram(
                    "a GridBarrier has no WGSL form: WebGPU has no grid-wide barrier",
                    fix="generate one shader per segment of "
                    "vyre_async.split_at_grid_barriers(program)",
                )
            case _:
                raise InvalidProgram(
                    f"unknown statement {stmt!r}",
                    fix="build programs from vyre_async.ir statements",
                )

    # Sliced statements -------------------------------------------------------------
    def slot(self, cname: str, dtype: DType) -> int:
        """Give ``cname`` a word of the lane record (saved when a lane suspends)."""
        index = 2 + len(self.slots)
        self.slots[cname] = (index, dtype)
        self.slot_scopes[-1].append(cname)
        return index

    def restore(self, cname: str) -> str:
        index, dtype = self.slots[cname]
        return f"{cname} = {_from_word(dtype, f'vy_state[vy_rec + {index}u]')};"

    def in_range(self, first: int, count: int) -> str:
        if count == 1:
            return f"vy_at == {first}u"
        return f"(vy_at >= {first}u && vy_at <= {first + count - 1}u)"

    def sliced_stmt(self, stmt: Stmt) -> None:
        """One statement of a sliced shader.

        While ``vy_resume`` is set the lane is replaying its way back to the loop
        it suspended in (``vy_at``): statements before it are skipped, `Let`
        variables are restored from the lane record, and only the `If` branches
        and loops that contain ``vy_at`` are entered, loops at their saved counter.
        """
        loops = _loops_in((stmt,))
        match stmt:
            case Let(name=name, value=value):
                cname = f"v{self.vars}"
                self.vars += 1
                dtype = self.dtype_of(value)
                self.line(
                    f"var {cname}: {_VALUE_TYPE[dtype]} = {_ZERO[dtype]}; // {sanitize(name)}"
                )
                self.slot(cname, dtype)
                with self.block("if (vy_resume)"):
                    self.line(self.restore(cname))
                with self.block("else"):
                    operand, _ = self.expr(value)
                    self.line(f"{cname} = {operand};")
                self.scopes[-1][name] = (cname, dtype)
            case Assign() | Store() | Return():
                with self.block("if (!vy_resume)"):
                    saved, self.sliced = self.sliced, False
                    try:
                        self.stmt(stmt)
                    finally:
                        self.sliced = saved
            case If(cond=cond, then=then, orelse=orelse) if loops:
                first = self.next_loop
                n_then = _loops_in(then)
                n_else = loops - n_then
                choice = f"t{self.temps}"
                self.temps += 1
                self.line(f"var {choice}: u32 = 0u;")
                with self.block("if (vy_resume)"):
                    if n_then:
                        self.line(f"if ({self.in_range(first, n_then)}) {{ {choice} = 1u; }}")
                    if n_else:
                        self.line(
                            f"if ({self.in_range(first + n_then, n_else)}) {{ {choice} = 2u; }}"
                        )
                with self.block("else"):
                    c = self.truth(cond)
                    self.line(f"{choice} = select(2u, 1u, {c});")
                with self.block(f"if ({choice} == 1u)"):
                    self.body(then)
                with self.block(f"else if ({choice} == 2u)"):
                    self.body(orelse)
            case Loop(var=var, start=start, end=end, body=inner_body):
                own = self.next_loop
                self.next_loop += 1
                cname = f"v{self.vars}"
                hi = f"v{self.vars + 1}"
                enter = f"t{self.temps}"
                self.vars += 2
                self.temps += 1
                self.line(f"var {cname}: u32 = 0u; // {sanitize(var)}")
                self.line(f"var {hi}: u32 = 0u;")
                self.line(f"var {enter}: bool = false;")
                self.slot(cname, DType.U32)
                self.slot(hi, DType.U32)
                with self.block("if (vy_resume)"), self.block(f"if ({self.in_range(own, loops)})"):
                    self.line(self.restore(cname))
                    self.line(self.restore(hi))
                    self.line(f"{enter} = true;")
                with self.block("else"):
                    lo_value = self.expr(start)[0]
                    hi_value = self.expr(end)[0]
                    self.line(f"{cname} = {lo_value};")
                    self.line(f"{hi} = {hi_value};")
                    self.line(f"{enter} = true;")
                with self.block(f"if ({enter})"):
                    with self.block("loop"):
                        # The budget counts every test of the bound, the one that ends
                        # the loop too, as lavapipe's limiter does.
                        with self.block("if (vy_resume)"):
                            self.line(f"if (vy_at == {own}u) {{ vy_resume = false; }}")
                        with self.block("else"):
                            with self.block("if (vy_budget <= vy_ticks)"):
                                self.save(own)
                            self.line("vy_budget = vy_budget - 1u - vy_ticks;")
                            self.line("vy_ticks = 0u;")
                        self.line(f"if ({cname} >= {hi}) {{ break; }}")
                        self.scopes[-1][var] = (cname, DType.U32)
                        self.body(inner_body)
                        with self.block("continuing"):
                            self.line(f"{cname} = {cname} + 1u;")
                    self.line(f"if ({cname} < {hi}) {{ atomicOr(&vy_status[0], 1u); }}")
            case Block(body=inner_body):
                with self.block(""):
                    self.body(inner_body)
            case _:  # an If without loops
                with self.block("if (!vy_resume)"):
                    saved, self.sliced = self.sliced, False
                    try:
                        self.stmt(stmt)
                    finally:
                        self.sliced = saved

    def save(self, loop: int) -> None:
        """Suspend the lane at the top of ``loop``: save what is in scope, then end."""
        with self.block("if (!vy_saves)"):
            self.line("atomicOr(&vy_status[0], 1u);")
            self.line("return;")
        self.line("vy_state[vy_rec] = vy_slice + 1u;")
        self.line(f"vy_state[vy_rec + 1u] = {loop}u;")
        for scope in self.slot_scopes:
            for cname in scope:
                index, dtype = self.slots[cname]
                self.line(f"vy_state[vy_rec + {index}u] = {_to_word(dtype, cname)};")
        self.line("atomicOr(&vy_status[0], 2u);")
        self.ret()

    def ret(self) -> None:
        """``return``, reporting first a prelude loop that lavapipe cut (``vy_cut``)."""
        if self.cut_flag:
            self.line("if (vy_cut) { atomicOr(&vy_status[0], 1u); }")
        self.line("return;")

    def lookup(self, name: str) -> tuple[str, DType]:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        raise InvalidProgram(
            f"variable {name!r} is not declared",
            fix="run vyre_async.ir.validate(program) and fix what it lists",
        )

    def buffer(self, name: str) -> _Buffer:
        try:
            return self.buffers[name]
        except KeyError:
            raise InvalidProgram(
                f"buffer {name!r} is not declared",
                fix="run vyre_async.ir.validate(program) and fix what it lists",
            ) from None

    def opaque(self, operand: str) -> str:  # (docstring below)
        """``operand``, as a value no shader compiler can see through.

        WGSL lets compilers assume floats are finite, and Mesa rewrites ``x * 0``
        to ``0``, ``x - x`` to ``0`` and ``(x + c) - c`` to ``x``, which is wrong
        for NaN, infinities and -0 and changes roundings. Every f32 constant and
        the right operand of every f32 ``+ - * /`` is XOR-ed with ``vy_info.grid.w``
        (always 0, unknown to the compiler) times a number of its own, so no two
        of them are the same value to the compiler and none is a constant.
        """
        if operand.startswith("vy_o("):  # an f32 constant, opaque already
            return operand
        self.opaques += 1
        return f"vy_o({operand}, {self.opaques}u)"

    def index(self, index: Expr) -> str:
        """An index operand that is never a const-expression (naga refuses a constant index
        that is out of bounds, which the IR defines: a load gives 0, a store is skipped)."""
        i, _ = self.expr(index)
        if isinstance(index, Var | Load | Atomic | Builtin):
            return i  # run-time values already
        # Anything else may be a const-expression (a literal, `1u + 0u`, the BufLen of a
        # workgroup array): naga refuses an out-of-bounds constant index.
        return self.temp(DType.U32, f"vy_idx({i})")

    def truth(self, cond: Expr) -> str:
        operand, dtype = self.expr(cond)
        if dtype is DType.BOOL:
            return operand
        if dtype is DType.F32:
            return f"vy_ftrue({operand})"
        return f"({operand} != {_ZERO[dtype]})"

    def dtype_of(self, expr: Expr) -> DType:
        """The dtype of ``expr`` without emitting it (a `Let`'s variable is declared first)."""
        saved = (self.lines, self.temps)
        self.lines = []
        try:
            return self.expr(expr)[1]
        finally:
            self.lines, self.temps = saved

    # Expressions ------------------------------------------------------------------
    def expr(self, expr: Expr) -> tuple[str, DType]:
        """Emit ``expr``; return a side-effect-free WGSL operand of its value, and its dtype."""
        match expr:
            case Const():
                if expr.dtype is DType.F32:
                    return self.opaque(f"vy_f32(0x{expr.bits:08x}u)"), DType.F32
                return _const(expr), expr.dtype
            case Var(name=name):
                return self.lookup(name)
            case BufLen(buffer=name):
                return self.buffer(name).length, DType.U32
            case Builtin(kind=kind, axis=axis):
                return _BUILTIN[kind].format(a=_AXES[axis]), DType.U32
            case Load(buffer=name, index=index):
                i = self.index(index)
                buf = self.buffer(name)
                dtype = buf.decl.dtype
                word = f"atomicLoad(&{buf.name}[{i}])" if buf.atomic else f"{buf.name}[{i}]"
                ok = f"{i} < {buf.length}"
                if dtype is DType.BOOL:
                    value = f"({ok}) && ({word} != 0u)"
                elif buf.atomic:
                    # atomicLoad is a statement-like access: do it only in bounds.
                    name_ = f"t{self.temps}"
                    self.temps += 1
                    self.line(f"var {name_}: u32 = 0u;")
                    self.line(f"if ({ok}) {{ {name_} = {word}; }}")
                    return name_, dtype
                else:
                    value = f"select({_ZERO[dtype]}, {word}, {ok})"
                return self.temp(dtype, value), dtype
            case Bin(op=op, a=a, b=b):
                x, dtype = self.expr(a)
                y, _ = self.expr(b)
                if dtype is DType.F32 and op in _INFIX_F32:
                    # Both operands: a left one can be a constant too (Cast(F32, u32(0))),
                    # and an opaque product cannot be contracted into an fma.
                    x, y = self.opaque(x), self.opaque(y)
                result, text = _binary(op, dtype, x, y)
                return self.temp(result, text), result
            case Un(op=op, a=a):
                x, dtype = self.expr(a)
                return self.temp(dtype, _unary(op, dtype, x)), dtype
            case Select(cond=cond, if_true=t, if_false=f):
                c = self.truth(cond)
                x, dtype = self.expr(t)
                y, _ = self.expr(f)
                return self.temp(dtype, f"select({y}, {x}, {c})"), dtype
            case Cast(dtype=target, value=value):
                x, source = self.expr(value)
                return self.temp(target, _cast(source, target, x)), target
            case Fma(a=a, b=b, c=c):
                x, _ = self.expr(a)
                y, _ = self.expr(b)
                z, _ = self.expr(c)
                return self.temp(DType.F32, f"vy_fma({x}, {y}, {z})"), DType.F32
            case Atomic(op=op, buffer=name, index=index, value=value, expected=expected):
                i = self.index(index)
                v, _ = self.expr(value)
                e = self.expr(expected)[0] if expected is not None else ""
                buf = self.buffer(name)
                name_ = f"t{self.temps}"
                self.temps += 1
                self.line(f"var {name_}: u32 = 0u;")
                address = f"&{buf.name}[{i}]"
                with self.block(f"if ({i} < {buf.length})"):
                    if op is AtomicOp.CAS:
                        # The weak exchange may fail spuriously: retry until it either
                        # stored or saw another value.
                        with self.block("loop"):
                            self.line(f"let r = atomicCompareExchangeWeak({address}, {e}, {v});")
                            self.line(f"if (r.exchanged || r.old_value != {e}) {{")
                            self.line(f"  {name_} = r.old_value;")
                            self.line("  break;")
                            self.line("}")
                    else:
                        self.line(f"{name_} = {_ATOMIC[op]}({address}, {v});")
                return name_, DType.U32
        raise InvalidProgram(
            f"unknown expression {expr!r}",
            fix="build programs from vyre_async.ir expressions",
        )


def _const(expr: Const) -> str:
    bits = expr.bits
    if expr.dtype is DType.U32:
        return f"0x{bits:08x}u"
    if expr.dtype is DType.I32:
        return f"bitcast<i32>(0x{bits:08x}u)"
    if expr.dtype is DType.F32:
        return f"vy_f32(0x{bits:08x}u)"
    return "true" if bits else "false"


_BUILTIN = {
    BuiltinKind.GID: "vy_gid.{a}",
    BuiltinKind.LID: "vy_lid.{a}",
    BuiltinKind.WGID: "vy_wg.{a}",
    BuiltinKind.NWG: "vy_info.grid.{a}",
}

_ATOMIC = {
    AtomicOp.ADD: "atomicAdd",
    AtomicOp.OR: "atomicOr",
    AtomicOp.AND: "atomicAnd",
    AtomicOp.XOR: "atomicXor",
    AtomicOp.MIN: "atomicMin",
    AtomicOp.MAX: "atomicMax",
    AtomicOp.EXCHANGE: "atomicExchange",
}

_COMPARE = {
    BinOp.EQ: "==",
    BinOp.NE: "!=",
    BinOp.LT: "<",
    BinOp.LE: "<=",
    BinOp.GT: ">",
    BinOp.GE: ">=",
}
_FLOAT_COMPARE = {
    BinOp.EQ: "vy_feq",
    BinOp.NE: "vy_fne",
    BinOp.LT: "vy_flt",
    BinOp.LE: "vy_fle",
    BinOp.GT: "vy_fgt",
    BinOp.GE: "vy_fge",
}
_INFIX_U32 = {BinOp.ADD: "+", BinOp.SUB: "-", BinOp.MUL: "*"}
_INFIX_BITS = {BinOp.AND: "&", BinOp.OR: "|", BinOp.XOR: "^"}
_CALL: dict[DType, dict[BinOp, str]] = {
    DType.U32: {
        BinOp.DIV: "vy_div_u32",
        BinOp.MOD: "vy_mod_u32",
        BinOp.MIN: "min",
        BinOp.MAX: "max",
        BinOp.SHL: "vy_shl_u32",
        BinOp.SHR: "vy_shr_u32",
        BinOp.MULHI: "vy_mulhi_u32",
    },
    DType.I32: {
        BinOp.ADD: "vy_add_i32",
        BinOp.SUB: "vy_sub_i32",
        BinOp.MUL: "vy_mul_i32",
        BinOp.DIV: "vy_div_i32",
        BinOp.MOD: "vy_mod_i32",
        BinOp.MIN: "min",
        BinOp.MAX: "max",
        BinOp.SHL: "vy_shl_i32",
        BinOp.SHR: "vy_shr_i32",
    },
    DType.F32: {
        BinOp.MOD: "vy_fmod",
        BinOp.MIN: "vy_fmin",
        BinOp.MAX: "vy_fmax",
    },
    DType.BOOL: {},
}
_INFIX_F32 = {BinOp.ADD: "+", BinOp.SUB: "-", BinOp.MUL: "*", BinOp.DIV: "/"}


def _binary(op: BinOp, dtype: DType, x: str, y: str) -> tuple[DType, str]:
    """Return the result dtype and WGSL text of ``op`` on operands ``x``, ``y`` of ``dtype``."""
    if op in _COMPARE:
        if dtype is DType.F32:
            return DType.BOOL, f"{_FLOAT_COMPARE[op]}({x}, {y})"
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
    elif dtype is DType.F32 and op in _INFIX_F32:
        return dtype, f"{x} {_INFIX_F32[op]} {y}"
    elif dtype in (DType.U32, DType.I32) and op in _INFIX_BITS:
        return dtype, f"{x} {_INFIX_BITS[op]} {y}"
    raise InvalidProgram(
        f"{op.value} is not defined on {dtype.value}",
        fix="run vyre_async.ir.validate(program) and fix what it lists",
    )


_FLOAT_UNARY = {
    UnOp.NEG: "vy_fneg",
    UnOp.ABS: "vy_fabs",
    UnOp.SQRT: "sqrt",
    UnOp.RSQRT: "vy_rsqrt",
    UnOp.EXP: "vy_exp",
    UnOp.LOG: "vy_log",
    UnOp.SIN: "vy_sin",
    UnOp.COS: "vy_cos",
    UnOp.TANH: "vy_tanh",
    UnOp.FLOOR: "vy_floor",
    UnOp.CEIL: "vy_ceil",
    UnOp.ROUND: "vy_round",
    UnOp.TRUNC: "vy_trunc",
}
_BIT_COUNT = {UnOp.POPCOUNT: "vy_popc", UnOp.CLZ: "vy_clz", UnOp.CTZ: "vy_ctz"}


def _unary(op: UnOp, dtype: DType, x: str) -> str:
    """Return the WGSL text of ``op`` on operand ``x`` of ``dtype`` (the result has ``dtype``)."""
    if dtype is DType.F32:
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
            return f"bitcast<i32>({_BIT_COUNT[op]}(bitcast<u32>({x})))"
    elif op is UnOp.LNOT:
        return f"!{x}"
    raise InvalidProgram(
        f"{op.value} is not defined on {dtype.value}",
        fix="run vyre_async.ir.validate(program) and fix what it lists",
    )


def _cast(source: DType, target: DType, x: str) -> str:
    """Return the WGSL text converting ``x`` from ``source`` to ``target`` (ir.md cast rules)."""
    if source is target:
        return x
    if target is DType.BOOL:
        return f"vy_ftrue({x})" if source is DType.F32 else f"{x} != {_ZERO[source]}"
    if source is DType.BOOL:
        if target is DType.F32:
            return f"vy_f32(select(0u, 0x3f800000u, {x}))"
        return f"select({_ZERO[target]}, {'1u' if target is DType.U32 else '1i'}, {x})"
    if target is DType.F32:
        return f"vy_u2f({x})" if source is DType.U32 else f"vy_i2f({x})"
    if source is DType.F32:
        return f"vy_f2u({x})" if target is DType.U32 else f"vy_f2i({x})"
    return f"bitcast<{_VALUE_TYPE[target]}>({x})"  # u32 <-> i32: the same 32 bits
