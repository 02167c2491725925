"""Triage of the surviving mutants of `vyre_async.ir.validate` (issue 28, mutation testing).

`tests/ir/test_validate.py` pins each diagnostic's code and path; a mutant that
rewrites a message, a Fix, a limit comparison or the bookkeeping of the walk
survived it. These tests pin what a user reads: the exact (code, path, message,
fix) of every diagnostic, the error `validate_or_raise` raises, every limit at
limit and limit + 1, the dtype and uniformity each expression passes on, and the
order of the diagnostics. The expected texts follow docs/validation.md and
shared/spec/ir.md (observed values, limits and dtypes are checked against them,
not copied from the output). The 20 mutants no user can tell apart are listed,
each with its reason, among the ir package's equivalents in
scripts/mutation_equivalent/.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import pytest

from tests.ir.test_validate import DOCS, FOUT, OUT, PARAMS, RW, SRC, TILE
from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Assign,
    Atomic,
    Barrier,
    Bin,
    Block,
    BufferDecl,
    BufLen,
    Cast,
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
    Var,
    f32,
    gid,
    i32,
    lid,
    u32,
    validate,
    validate_or_raise,
    wgid,
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
from vyre_async.ir.validate import DIAGNOSTIC_CODES

ALL = (SRC, OUT, FOUT, RW, PARAMS, TILE)  # (test_validate's, without its COUNTER)
DECLARED = "'src', 'out', 'fout', 'rw', 'params', 'tile'"

#: (code, path, message, fix), what a user reads of one diagnostic.
Seen = tuple[str, str, str, str]
#: A Program memoises its verdict, so the tables hold builders and each test validates
#: a fresh Program: one built at import and validated in an earlier run of the same
#: process (the mutation check runs the tests once per mutant) would answer from memo.
Build = Callable[[], Program]


def program(
    body: Sequence[Stmt],
    buffers: Sequence[BufferDecl] = ALL,
    workgroup_size: int | tuple[int, ...] = 64,
    op_id: str = "",
) -> Program:
    """Return a program over ``ALL`` (unless ``buffers`` is given)."""
    return Program(tuple(buffers), workgroup_size, tuple(body), op_id)


def seen(p: Program) -> list[Seen]:
    """Return the diagnostics of ``p`` as (code, path, message, fix)."""
    return [(d.code, d.path, d.message, d.fix) for d in validate(p)]


def chain(levels: int, dtype: DType = DType.U32) -> Expr:
    """Return an expression ``levels`` deep whose deepest branch is always ``.a``."""
    one = f32(1.0) if dtype is DType.F32 else u32(1)
    expr: Expr = f32(0.0) if dtype is DType.F32 else u32(0)
    for _ in range(levels - 1):
        expr = expr + one
    return expr


def nested(levels: int, wrap: Callable[[int, list[Stmt]], Stmt]) -> Stmt:
    """Return ``levels`` statements inside each other; ``wrap(level, body)`` builds one."""
    stmt = wrap(levels, [])
    for level in range(levels - 1, 0, -1):
        stmt = wrap(level, [stmt])
    return stmt


class AlienStmt(Stmt):
    """A statement class the IR does not know."""

    __slots__ = ()


class AlienExpr(Expr):
    """An expression class the IR does not know."""

    __slots__ = ()


def store(value: Expr) -> Store:
    """Return ``out[0] = value``."""
    return Store("out", u32(0), value)


def fstore(value: Expr) -> Store:
    """Return ``fout[0] = value``."""
    return Store("fout", u32(0), value)


# The texts the docs promise for a code, shared by several cases ----------------------

V027_WHY = (
    "divergent (derived from gid, lid, a non-UNIFORM load, an atomic, or a variable "
    "written under divergent control)"
)
V027_IF_FIX = (
    "move the Barrier out of the If, or make its condition uniform "
    "(literals, wgid, nwg, BufLen, UNIFORM loads)"
)
V027_LOOP_FIX = (
    "move the Barrier out of the Loop, or make its bounds uniform "
    "(literals, wgid, nwg, BufLen, UNIFORM loads)"
)
V028_FIX = (
    "make the Return's condition uniform, or place the Barrier before it "
    "and outside any loop that contains it"
)
V030 = (
    f"expression is nested more than {MAX_EXPR_DEPTH} levels deep",
    "split it: compute parts into Let variables and combine the Vars",
)
V031 = (
    "V031",
    "body",
    f"the body has more than {MAX_NODES} statement and expression nodes",
    "split the work into several programs (the body was not checked further)",
)
CAST_U32 = "cast it: Cast(DType.U32, ...)"
LONG = "n" * (MAX_NAME_BYTES + 1)
BAD = "a" * 20 + "\ud800"  # a lone surrogate after 20 characters: only 16 are shown


def v009(user: str, name: str, path: str = "body[0]", declared: str = DECLARED) -> Seen:
    """The V009 a ``user`` (Store, Load, BufLen, Atomic) of an undeclared buffer gets."""
    return (
        "V009",
        path,
        f"{user} names buffer {name!r}, which is not declared (declared: {declared})",
        f"declare it with BufferDecl({name!r}, binding, access, dtype, count)",
    )


def v010(name: str, path: str) -> Seen:
    """The V010 a use of the undeclared variable ``name`` gets."""
    return (
        "V010",
        path,
        f"variable {name!r} is not declared in this scope",
        f"introduce it first with Let({name!r}, value) in this or an enclosing scope",
    )


# One program per code, with every field of what the user reads -----------------------

CATALOG: list[tuple[str, Build, list[Seen]]] = [
    (
        "V001",
        lambda: program(
            [],
            [
                BufferDecl("a", 0, Access.READ, DType.U32),
                *[BufferDecl("src", b, Access.READ, DType.U32) for b in (1, 2, 3)],
            ],
        ),
        [
            (
                "V001",
                f"buffers[{i}]",
                "buffer name 'src' is already used by buffers[1]",
                "give each buffer a unique name",
            )
            for i in (2, 3)
        ],
    ),
    (
        "V002",
        lambda: program(
            [],
            [
                BufferDecl("a", 0, Access.READ, DType.U32),
                *[BufferDecl(name, 7, Access.READ, DType.U32) for name in ("b", "c", "d")],
            ],
        ),
        [
            (
                "V002",
                f"buffers[{i}]",
                f"buffer {name!r} reuses binding 7 of buffers[1]",
                "give each buffer a unique binding",
            )
            for i, name in ((2, "c"), (3, "d"))
        ],
    ),
    (
        "V003",
        lambda: program([], workgroup_size=(64, 0, 1)),
        [
            (
                "V003",
                "workgroup_size[1]",
                "workgroup axis 1 is 0 in (64, 0, 1)",
                "give every workgroup axis at least 1 lane",
            )
        ],
    ),
    (
        "V004",
        lambda: program([], workgroup_size=(64, 16, 2)),  # 2048 lanes; x * y / z would be 512
        [
            (
                "V004",
                "workgroup_size",
                f"workgroup (64, 16, 2) has 2048 lanes (limit {MAX_WORKGROUP_LANES})",
                f"use a workgroup of at most {MAX_WORKGROUP_LANES} lanes, e.g. (256, 1, 1)",
            )
        ],
    ),
    (
        "V005",  # the first WORKGROUP buffer fills the limit exactly; the second crosses it
        lambda: program(
            [],
            [
                SRC,
                BufferDecl("w1", 1, Access.WORKGROUP, DType.U32, MAX_WORKGROUP_BYTES // 4),
                BufferDecl("w2", 2, Access.WORKGROUP, DType.U32, 1),
            ],
        ),
        [
            (
                "V005",
                "buffers[2]",
                f"WORKGROUP buffers take {MAX_WORKGROUP_BYTES + 4} bytes "
                f"(limit {MAX_WORKGROUP_BYTES}); 'w2' crosses the limit",
                f"shrink the WORKGROUP buffers to at most {MAX_WORKGROUP_BYTES} bytes in all",
            )
        ],
    ),
    (
        "V006",
        lambda: program(
            [],
            [
                BufferDecl("o", 0, Access.WRITE, DType.U32),
                BufferDecl("w", 1, Access.WORKGROUP, DType.U32),
            ],
        ),
        [
            (
                "V006",
                "buffers[0]",
                "WRITE buffer 'o' has count 0",
                "declare its element count: BufferDecl('o', ..., count=N) with N > 0",
            ),
            (
                "V006",
                "buffers[1]",
                "WORKGROUP buffer 'w' has count 0",
                "declare its element count: BufferDecl('w', ..., count=N) with N > 0",
            ),
        ],
    ),
    (
        "V007",
        lambda: program(
            [], [BufferDecl(f"b{i}", i, Access.READ, DType.U32) for i in range(MAX_BUFFERS + 1)]
        ),
        [
            (
                "V007",
                "buffers",
                f"{MAX_BUFFERS + 1} buffers are declared (limit {MAX_BUFFERS})",
                "pack several arrays into one buffer or split the program",
            )
        ],
    ),
    (
        "V008",
        lambda: program(
            [Let(LONG, u32(0))], [BufferDecl(LONG, 0, Access.READ, DType.U32)], op_id=LONG
        ),
        [
            (
                "V008",
                "buffers[0]",
                f"buffer name {'n' * 16!r}... is {MAX_NAME_BYTES + 1} UTF-8 bytes "
                f"(limit {MAX_NAME_BYTES})",
                f"use a name of at most {MAX_NAME_BYTES} bytes",
            ),
            (
                "V008",
                "op_id",
                f"op id {'n' * 16!r}... is {MAX_NAME_BYTES + 1} UTF-8 bytes "
                f"(limit {MAX_NAME_BYTES})",
                f"use a name of at most {MAX_NAME_BYTES} bytes",
            ),
            (
                "V008",
                "body[0]",
                f"variable name {'n' * 16!r}... is {MAX_NAME_BYTES + 1} UTF-8 bytes "
                f"(limit {MAX_NAME_BYTES})",
                f"use a name of at most {MAX_NAME_BYTES} bytes",
            ),
        ],
    ),
    (
        "V009",
        lambda: program([Store("missing", u32(0), u32(1))]),
        [v009("Store", "missing")],
    ),
    (
        "V010",
        lambda: program([store(Var("nope")), Assign("gone", u32(1))]),
        [v010("nope", "body[0].value"), v010("gone", "body[1]")],
    ),
    (
        "V011",
        lambda: program([Let("x", u32(0)), Let("x", u32(1))]),
        [
            (
                "V011",
                "body[1]",
                "variable 'x' is already declared in an enclosing or the same scope",
                "rename it (e.g. 'x_2') or Assign to the existing variable",
            )
        ],
    ),
    (
        "V012",
        lambda: program([Loop("i", u32(0), u32(4), [Assign("i", u32(0))])]),
        [
            (
                "V012",
                "body[0].body[0]",
                "Assign to loop variable 'i', which is read-only",
                "copy it first: Let('my_i', Var('i')) and assign the copy",
            )
        ],
    ),
    (
        "V013",
        lambda: program([Store("src", u32(0), u32(1)), Store("params", u32(0), u32(1))]),
        [
            (
                "V013",
                "body[0]",
                "Store to READ buffer 'src'",
                "declare 'src' as Access.READ_WRITE, or store into a WRITE buffer",
            ),
            (
                "V013",
                "body[1]",
                "Store to UNIFORM buffer 'params'",
                "declare 'params' as Access.READ_WRITE, or store into a WRITE buffer",
            ),
        ],
    ),
    (
        "V014",
        lambda: program([store(f32(1.0))]),
        [
            (
                "V014",
                "body[0].value",
                "Store of a f32 value into 'out', a u32 buffer",
                "cast the value: Cast(DType.U32, ...)",
            )
        ],
    ),
    (
        "V015",
        lambda: program([store(Bin("add", u32(1), i32(1)))]),
        [
            (
                "V015",
                "body[0].value",
                "operands of 'add' differ: u32 vs i32",
                "cast one side: Cast(DType.U32, ...)",
            )
        ],
    ),
    (
        "V016",  # ir.md: `and or xor shl shr` take u32 and i32; the unary f32 ops f32 only
        lambda: program(
            [store(Un("sqrt", u32(4))), store(Cast(DType.U32, Bin("and", f32(1), f32(2))))]
        ),
        [
            (
                "V016",
                "body[0].value",
                "'sqrt' is not defined on u32 (it takes f32)",
                "cast the operands: Cast(DType.F32, ...)",
            ),
            (
                "V016",
                "body[1].value.value",
                "'and' is not defined on f32 (it takes u32, i32)",
                "cast the operands: Cast(DType.U32, ...)",
            ),
        ],
    ),
    (
        "V017",
        lambda: program(
            [
                Store("out", i32(0), u32(1)),
                store(Load("src", f32(0.0))),
                store(Atomic("add", "rw", i32(0), u32(1))),
            ]
        ),
        [
            ("V017", "body[0].index", "index of Store to 'out' is i32, not u32", CAST_U32),
            ("V017", "body[1].value.index", "index of Load from 'src' is f32, not u32", CAST_U32),
            ("V017", "body[2].value.index", "index of Atomic on 'rw' is i32, not u32", CAST_U32),
        ],
    ),
    (
        "V018",
        lambda: program([Loop("i", i32(0), f32(4.0), [])]),
        [
            ("V018", "body[0].start", "loop 'i' start is i32, not u32", CAST_U32),
            ("V018", "body[0].end", "loop 'i' end is f32, not u32", CAST_U32),
        ],
    ),
    (
        "V019",
        lambda: program([If(f32(1.0), []), store(Select(i32(1), u32(1), u32(2)))]),
        [
            (
                "V019",
                "body[0].cond",
                "If condition is f32; it must be bool or u32",
                "compare it instead: (...).ne(f32(0.0))",
            ),
            (
                "V019",
                "body[1].value.cond",
                "Select condition is i32; it must be bool or u32",
                "compare it instead: (...).ne(i32(0))",
            ),
        ],
    ),
    (
        "V020",
        lambda: program([store(Select(True, u32(1), i32(1)))]),
        [
            (
                "V020",
                "body[0].value",
                "Select arms differ: u32 vs i32",
                "cast one arm: Cast(DType.U32, ...)",
            )
        ],
    ),
    (
        "V021",
        lambda: program([fstore(Fma(u32(1), i32(2), True))]),
        [
            (
                "V021",
                f"body[0].value.{field}",
                f"Fma operand {field!r} is {dtype}, not f32",
                "cast it: Cast(DType.F32, ...)",
            )
            for field, dtype in (("a", "u32"), ("b", "i32"), ("c", "bool"))
        ],
    ),
    (
        "V022",
        lambda: program([Let("x", u32(0)), Assign("x", f32(1.0))]),
        [
            (
                "V022",
                "body[1].value",
                "Assign gives 'x' a f32 value but its Let made it u32",
                "cast the value: Cast(DType.U32, ...)",
            )
        ],
    ),
    (
        "V023",
        lambda: program([store(Atomic("add", "src", u32(0), u32(1)))]),
        [
            (
                "V023",
                "body[0].value",
                "atomic 'add' on 'src', a READ u32 buffer; "
                "atomics need a READ_WRITE u32 buffer or a u32 WORKGROUP buffer",
                "declare 'src' as Access.READ_WRITE (or WORKGROUP) with DType.U32",
            )
        ],
    ),
    (
        "V024",
        lambda: program([store(Atomic("cas", "rw", u32(0), i32(1), expected=f32(0.0)))]),
        [
            ("V024", "body[0].value.value", "atomic value is i32, not u32", CAST_U32),
            ("V024", "body[0].value.expected", "atomic expected is f32, not u32", CAST_U32),
        ],
    ),
    (
        "V025",
        lambda: program([store(Atomic("cas", "rw", u32(0), u32(1)))]),
        [
            (
                "V025",
                "body[0].value",
                "atomic 'cas' on 'rw' has no expected value",
                "pass the value to compare against: Atomic('cas', ..., expected=...)",
            )
        ],
    ),
    (
        "V026",
        lambda: program([store(Atomic("add", "rw", u32(0), u32(1), expected=u32(0)))]),
        [
            (
                "V026",
                "body[0].value.expected",
                "atomic 'add' on 'rw' has an expected value; only 'cas' takes one",
                "drop expected=..., or use op 'cas'",
            )
        ],
    ),
    (
        "V027",
        lambda: program([If(gid().lt(u32(4)), [Barrier()]), Loop("k", u32(0), lid(), [Barrier()])]),
        [
            (
                "V027",
                "body[0].then[0]",
                f"Barrier under the If at body[0], whose condition is {V027_WHY}",
                V027_IF_FIX,
            ),
            (
                "V027",
                "body[1].body[0]",
                f"Barrier under the Loop at body[1], whose bounds are {V027_WHY}",
                V027_LOOP_FIX,
            ),
        ],
    ),
    (
        "V028",
        lambda: program([If(lid().eq(u32(0)), [Return()]), Barrier()]),
        [
            (
                "V028",
                "body[1]",
                "Barrier can run after the divergent Return at body[0].then[0]",
                V028_FIX,
            )
        ],
    ),
    (
        "V029",
        lambda: program(
            [
                nested(MAX_STMT_DEPTH + 1, lambda _, body: If(True, body)),
                nested(MAX_STMT_DEPTH + 1, lambda n, body: Loop(f"k{n}", u32(0), u32(1), body)),
                nested(MAX_STMT_DEPTH + 1, lambda _, body: Block(body)),
            ]
        ),
        [
            (
                "V029",
                f"body[{i}]" + f".{field}[0]" * MAX_STMT_DEPTH,
                f"{kind} is nested {MAX_STMT_DEPTH + 1} levels deep (limit {MAX_STMT_DEPTH})",
                "flatten the nesting: hoist conditions into Let variables or split the program",
            )
            for i, kind, field in ((0, "If", "then"), (1, "Loop", "body"), (2, "Block", "body"))
        ],
    ),
    (
        "V030",
        lambda: program([store(chain(MAX_EXPR_DEPTH + 1))]),
        [("V030", "body[0].value" + ".a" * MAX_EXPR_DEPTH, *V030)],
    ),
    (
        "V031",
        lambda: program([store(u32(1))] * (MAX_NODES // 3 + 1)),  # 3 nodes a statement
        [V031],
    ),
    (
        "V032",
        lambda: program([AlienStmt(), store(AlienExpr())]),
        [
            (
                "V032",
                "body[0]",
                "AlienStmt is not an IR node this version knows",
                "build the program only from the node classes in vyre_async.ir",
            ),
            (
                "V032",
                "body[1].value",
                "AlienExpr is not an IR node this version knows",
                "build the program only from the node classes in vyre_async.ir",
            ),
        ],
    ),
    (
        "V033",
        lambda: program(
            [Let(BAD, u32(0))], [BufferDecl(BAD, 0, Access.READ, DType.U32)], op_id=BAD
        ),
        [
            (
                "V033",
                path,
                f"{what} {'a' * 16!r} is not valid Unicode (surrogates not allowed)",
                "use a name without lone surrogate code points",
            )
            for path, what in (
                ("buffers[0]", "buffer name"),
                ("op_id", "op id"),
                ("body[0]", "variable name"),
            )
        ],
    ),
    (
        "V034",
        lambda: program([Loop("k", u32(0), u32(2), [GridBarrier()])]),
        [
            (
                "V034",
                "body[0].body[0]",
                "GridBarrier inside an If, Loop or Block; it must be a statement of the "
                "program body itself",
                "move the GridBarrier to the top level of the body (every lane must reach it)",
            )
        ],
    ),
    (
        "V035",
        lambda: program([Let("t", gid()), GridBarrier(), GridBarrier(), store(Var("t"))]),
        [
            (
                "V035",
                "body[3].value",
                "variable 't' was declared before the GridBarrier at body[1] and is used "
                "after it; variables do not live across a grid barrier",
                "store it to a buffer before the barrier and Load it after, or compute 't' "
                "again after the barrier with Let('t', ...)",
            )
        ],
    ),
    (
        "V036",
        lambda: program([GridBarrier(), Return()]),
        [
            (
                "V036",
                "body[1]",
                "Return in a program with a GridBarrier: every lane must reach every grid "
                "barrier, so no lane may end early",
                "guard the work with If(condition, [...]) instead of returning (for example "
                "If(gid() < n, [...]) in each phase)",
            )
        ],
    ),
]


def test_docs_catalog_titles_are_the_codes_titles() -> None:
    """docs/validation.md's catalog gives each code the title DIAGNOSTIC_CODES does."""
    rows = re.findall(r"^\| (V\d{3}) \| ([^|]+) \|", DOCS.read_text(encoding="utf-8"), re.M)

    assert [(code, title.strip()) for code, title in rows] == list(DIAGNOSTIC_CODES.items())


def test_catalog_covers_every_code() -> None:
    """Every code of DIAGNOSTIC_CODES has a case with its full text below."""
    assert [code for code, _, _ in CATALOG] == list(DIAGNOSTIC_CODES)


@pytest.mark.parametrize(("code", "build", "expected"), CATALOG, ids=[c for c, _, _ in CATALOG])
def test_each_code_reads_as_documented(code: str, build: Build, expected: list[Seen]) -> None:
    """Each code is reported with its exact path, message (observed values) and Fix."""
    assert {c for c, _, _, _ in expected} == {code}
    assert seen(build()) == expected


# Further texts: each user of a buffer, each site of a name ---------------------------

VARIANTS = [
    pytest.param(
        lambda: program([store(Load("missing", u32(0))), store(BufLen("gone"))]),
        [v009("Load", "missing", "body[0].value"), v009("BufLen", "gone", "body[1].value")],
        id="V009-load-buflen",
    ),
    pytest.param(
        lambda: program([store(Atomic("add", "missing", u32(0), u32(1)))]),
        [v009("Atomic", "missing", "body[0].value")],
        id="V009-atomic",
    ),
    pytest.param(
        lambda: program([Store("missing", u32(0), u32(1))], []),
        [v009("Store", "missing", declared="none")],
        id="V009-no-buffers",
    ),
    pytest.param(  # the list names the first eight declared buffers, in binding order
        lambda: program(
            [Store("missing", u32(0), u32(1))],
            [BufferDecl(f"b{i}", i, Access.READ, DType.U32) for i in range(10)],
        ),
        [v009("Store", "missing", declared=", ".join(repr(f"b{i}") for i in range(8)))],
        id="V009-first-eight",
    ),
    pytest.param(  # each root expression of a statement carries its own path
        lambda: program(
            [
                Let("x", u32(0)),
                Assign("x", Var("v1")),
                Store("out", Var("v2"), u32(1)),
                If(Var("v3"), [], [store(Var("v4"))]),
                Loop("i", Var("v5"), Var("v6"), []),
            ]
        ),
        [
            v010("v1", "body[1].value"),
            v010("v2", "body[2].index"),
            v010("v3", "body[3].cond"),
            v010("v4", "body[3].orelse[0].value"),
            v010("v5", "body[4].start"),
            v010("v6", "body[4].end"),
        ],
        id="V010-roots",
    ),
    pytest.param(  # the name is cut to 16 characters; the size counts UTF-8 bytes, not chars
        lambda: program([], [BufferDecl("é" * 129, 0, Access.READ, DType.U32)]),
        [
            (
                "V008",
                "buffers[0]",
                f"buffer name {'é' * 16!r}... is 258 UTF-8 bytes (limit {MAX_NAME_BYTES})",
                f"use a name of at most {MAX_NAME_BYTES} bytes",
            )
        ],
        id="V008-bytes",
    ),
    pytest.param(
        lambda: program([], workgroup_size=(MAX_WORKGROUP_LANES + 1, 1, 1)),
        [
            (
                "V004",
                "workgroup_size",
                f"workgroup ({MAX_WORKGROUP_LANES + 1}, 1, 1) has {MAX_WORKGROUP_LANES + 1} lanes "
                f"(limit {MAX_WORKGROUP_LANES})",
                f"use a workgroup of at most {MAX_WORKGROUP_LANES} lanes, e.g. (256, 1, 1)",
            )
        ],
        id="V004-limit+1",
    ),
]


@pytest.mark.parametrize(("build", "expected"), VARIANTS)
def test_variant_reads_as_documented(build: Build, expected: list[Seen]) -> None:
    """Each variant names its user, its path and its observed values."""
    assert seen(build()) == expected


# Limits: the limit itself is allowed -------------------------------------------------

AT_LIMIT = [
    pytest.param(
        lambda: program(
            [], [BufferDecl(f"b{i}", i, Access.READ, DType.U32) for i in range(MAX_BUFFERS)]
        ),
        id="buffers",
    ),
    pytest.param(
        lambda: program(
            [Let("v" * MAX_NAME_BYTES, u32(0)), Let("é" * (MAX_NAME_BYTES // 2), u32(0))],
            [BufferDecl("n" * MAX_NAME_BYTES, 0, Access.READ, DType.U32)],
            op_id="o" * MAX_NAME_BYTES,
        ),
        id="name-bytes",
    ),
    pytest.param(lambda: program([], workgroup_size=(MAX_WORKGROUP_LANES, 1, 1)), id="lanes-x"),
    pytest.param(lambda: program([], workgroup_size=(8, 8, 16)), id="lanes-xyz"),
    pytest.param(
        lambda: program(
            [],
            [
                BufferDecl("w1", 0, Access.WORKGROUP, DType.U32, MAX_WORKGROUP_BYTES // 8),
                BufferDecl("w2", 1, Access.WORKGROUP, DType.F32, MAX_WORKGROUP_BYTES // 8),
            ],
        ),
        id="workgroup-bytes",
    ),
]


@pytest.mark.parametrize("build", AT_LIMIT)
def test_a_program_at_a_limit_is_valid(build: Build) -> None:
    """A limit is inclusive (ir.md: product <= 1024, memory <= 48 KiB, ...)."""
    assert validate(build()) == []


# Expression depth through every child of every expression ----------------------------

SLOTS: list[tuple[str, Callable[[int], Stmt]]] = [
    ("a", lambda n: store(Bin("add", chain(n), u32(1)))),
    ("b", lambda n: store(Bin("add", u32(1), chain(n)))),
    ("a", lambda n: store(Un("not", chain(n)))),
    ("cond", lambda n: store(Select(chain(n), u32(1), u32(2)))),
    ("if_true", lambda n: store(Select(True, chain(n), u32(2)))),
    ("if_false", lambda n: store(Select(True, u32(1), chain(n)))),
    ("value", lambda n: store(Cast(DType.U32, chain(n)))),
    ("index", lambda n: store(Load("src", chain(n)))),
    ("a", lambda n: fstore(Fma(chain(n, DType.F32), f32(1.0), f32(2.0)))),
    ("b", lambda n: fstore(Fma(f32(1.0), chain(n, DType.F32), f32(2.0)))),
    ("c", lambda n: fstore(Fma(f32(1.0), f32(2.0), chain(n, DType.F32)))),
    ("index", lambda n: store(Atomic("add", "rw", chain(n), u32(1)))),
    ("value", lambda n: store(Atomic("add", "rw", u32(0), chain(n)))),
    ("expected", lambda n: store(Atomic("cas", "rw", u32(0), u32(1), expected=chain(n)))),
]
SLOT_IDS = [f"{i}-{slot}" for i, (slot, _) in enumerate(SLOTS)]


@pytest.mark.parametrize(("slot", "build"), SLOTS, ids=SLOT_IDS)
def test_expression_depth_counts_through_every_child(
    slot: str, build: Callable[[int], Stmt]
) -> None:
    """Each child is one level below its parent: the limit is valid, one more is V030."""
    # The statement's root expression is at depth 1 and the child at depth 2, so a
    # chain of n levels in the child reaches depth n + 1.
    assert validate(program([build(MAX_EXPR_DEPTH - 1)])) == []
    assert seen(program([build(MAX_EXPR_DEPTH)])) == [
        ("V030", f"body[0].value.{slot}" + ".a" * (MAX_EXPR_DEPTH - 1), *V030)
    ]


# Node count through every statement and expression -----------------------------------

NODE_CASES: list[tuple[list[Stmt], Stmt, int]] = [
    # (prefix, repeated statement, its node count)
    ([], If(True, [Return()]), 3),
    ([], Loop("i", u32(0), u32(1), [Return()]), 4),
    ([], Block([Return()]), 2),
    ([Let("x", u32(0))], Assign("x", u32(1)), 2),
    ([], store(Cast(DType.U32, f32(1.0))), 4),
    ([], store(Load("src", u32(0))), 4),
    ([], store(Un("not", u32(1))), 4),
    ([], store(Select(True, u32(1), u32(2))), 6),
    ([], fstore(Fma(f32(1.0), f32(2.0), f32(3.0))), 6),
    ([], store(Atomic("add", "rw", u32(0), u32(1))), 5),
    ([], store(Atomic("cas", "rw", u32(0), u32(1), expected=u32(0))), 6),
]
NODE_IDS = ["if", "loop", "block", "assign", "cast", "load", "un", "select", "fma", "atomic", "cas"]


def _filled(prefix: list[Stmt], stmt: Stmt, size: int, total: int) -> Program:
    """Return ``prefix`` + copies of ``stmt`` + Returns, ``total`` nodes in all."""
    used = 2 * len(prefix)  # each prefix statement is a Let of a literal: 2 nodes
    copies = (total - used) // size
    return program([*prefix, *[stmt] * copies, *[Return()] * (total - used - copies * size)])


@pytest.mark.parametrize(("prefix", "stmt", "size"), NODE_CASES, ids=NODE_IDS)
def test_node_count_includes_every_child(prefix: list[Stmt], stmt: Stmt, size: int) -> None:
    """One node over MAX_NODES is V031, whatever statements and expressions hold the nodes."""
    assert seen(_filled(prefix, stmt, size, MAX_NODES + 1)) == [V031]


def test_exactly_max_nodes_is_valid() -> None:
    """MAX_NODES nodes are allowed (the limit is inclusive), each node counted once."""
    prefix: list[Stmt] = [Let("x", u32(0))]
    mixed = [*prefix, *(stmt for _, stmt, _ in NODE_CASES)]
    used = 2 + sum(size for _, _, size in NODE_CASES)
    atomic = store(Atomic("add", "rw", u32(0), u32(1)))  # 5 nodes, no expected value
    copies = (MAX_NODES - used) // 5
    body = [*mixed, *[atomic] * copies, *[Return()] * (MAX_NODES - used - 5 * copies)]

    assert validate(program(body)) == []
    assert seen(program([*body, Return()])) == [V031]


# The dtype each expression passes on -------------------------------------------------

U32_INTO_FOUT = (
    "Store of a u32 value into 'fout', a f32 buffer",
    "cast the value: Cast(DType.F32, ...)",
)

TYPED: list[tuple[str, list[Stmt], Expr]] = [
    # (id, statements before, a u32 expression stored into the f32 buffer fout)
    ("buflen", [], BufLen("src")),
    ("builtin", [], gid()),
    ("cast", [], Cast(DType.U32, f32(1.0))),
    ("load", [], Load("src", u32(0))),
    ("var", [Let("x", u32(0))], Var("x")),
    ("select", [], Select(True, u32(1), u32(2))),
    ("atomic", [], Atomic("add", "rw", u32(0), u32(1))),
]


@pytest.mark.parametrize(
    ("before", "value"), [(b, v) for _, b, v in TYPED], ids=[i for i, _, _ in TYPED]
)
def test_expression_dtype_reaches_the_store_check(before: list[Stmt], value: Expr) -> None:
    """BufLen, builtins, Cast, Load, Var, Select and Atomic values are u32 (ir.md)."""
    path = f"body[{len(before)}].value"
    assert seen(program([*before, fstore(value)])) == [("V014", path, *U32_INTO_FOUT)]


def test_loop_variable_and_fma_dtypes_reach_the_store_check() -> None:
    """A loop variable is u32 and an Fma is f32."""
    body = [
        Loop("i", u32(0), u32(2), [fstore(Var("i"))]),
        store(Fma(f32(1.0), f32(2.0), f32(3.0))),
    ]

    assert seen(program(body)) == [
        ("V014", "body[0].body[0].value", *U32_INTO_FOUT),
        (
            "V014",
            "body[1].value",
            "Store of a f32 value into 'out', a u32 buffer",
            "cast the value: Cast(DType.U32, ...)",
        ),
    ]


UNKNOWN_STAYS_ONE = [
    pytest.param(
        [Let("t", Select(True, Var("nope"), u32(1)))],
        [v010("nope", "body[0].value.if_true")],
        id="select-one-arm-unknown",
    ),
    pytest.param(
        [Let("t", Select(True, u32(1), i32(1))), Assign("t", f32(1.0))],
        [
            (
                "V020",
                "body[0].value",
                "Select arms differ: u32 vs i32",
                "cast one arm: Cast(DType.U32, ...)",
            )
        ],
        id="select-arms-differ",
    ),
    pytest.param(
        [Let("t", Load("missing", u32(0))), Assign("t", f32(1.0))],
        [v009("Load", "missing", "body[0].value")],
        id="load-missing-buffer",
    ),
]


@pytest.mark.parametrize(("body", "expected"), UNKNOWN_STAYS_ONE)
def test_an_unknown_dtype_gives_one_diagnostic(body: list[Stmt], expected: list[Seen]) -> None:
    """docs: where a type error leaves a dtype unknown, dependent checks are skipped."""
    assert seen(program(body)) == expected


# Uniformity ---------------------------------------------------------------------------


def test_assign_under_uniform_if_inside_divergent_if_is_divergent() -> None:
    """Divergent control reaches everything nested inside it, through a uniform If too."""
    body = [
        Let("f", u32(0)),
        If(gid().lt(u32(4)), [If(True, [Assign("f", u32(1))])]),
        If(Var("f").eq(u32(1)), [Barrier()]),
    ]

    assert seen(program(body)) == [
        (
            "V027",
            "body[2].then[0]",
            f"Barrier under the If at body[2], whose condition is {V027_WHY}",
            V027_IF_FIX,
        )
    ]


@pytest.mark.parametrize("field", ["a", "b", "c"])
def test_fma_of_a_divergent_operand_is_divergent(field: str) -> None:
    """An Fma is divergent when any one of its three operands is."""
    operands: dict[str, Expr] = {name: f32(1.0) for name in ("a", "b", "c")}
    operands[field] = Cast(DType.F32, gid())
    cond = Fma(operands["a"], operands["b"], operands["c"]).gt(f32(0.0))

    assert seen(program([If(cond, [Barrier()])])) == [
        (
            "V027",
            "body[0].then[0]",
            f"Barrier under the If at body[0], whose condition is {V027_WHY}",
            V027_IF_FIX,
        )
    ]


def test_a_uniform_return_before_a_divergent_one_is_skipped() -> None:
    """V028 names the first *divergent* Return, even after a uniform one."""
    body = [If(wgid().eq(u32(0)), [Return()]), If(lid().eq(u32(0)), [Return()]), Barrier()]

    assert seen(program(body)) == [
        (
            "V028",
            "body[2]",
            "Barrier can run after the divergent Return at body[1].then[0]",
            V028_FIX,
        )
    ]


def test_one_barrier_breaking_both_rules_reports_v027_then_v028() -> None:
    """A barrier under divergent control after a divergent Return gets both codes."""
    body = [
        If(lid().eq(u32(0)), [Return()]),
        If(gid().lt(u32(4)), [Barrier()]),
        store(Var("nope")),
    ]

    assert seen(program(body)) == [
        (
            "V027",
            "body[1].then[0]",
            f"Barrier under the If at body[1], whose condition is {V027_WHY}",
            V027_IF_FIX,
        ),
        (
            "V028",
            "body[1].then[0]",
            "Barrier can run after the divergent Return at body[0].then[0]",
            V028_FIX,
        ),
        v010("nope", "body[2].value"),
    ]


# The raising form ----------------------------------------------------------------------


def test_validate_of_a_non_program_says_how_to_build_one() -> None:
    """validate() names the type it got and its Fix says how to build a Program."""
    with pytest.raises(InvalidProgram) as info:
        validate("not a program")  # type: ignore[arg-type]

    assert str(info.value) == (
        "validate() takes a Program, got str\n"
        "Fix: build the kernel with Program(buffers, workgroup_size, body)"
    )


def test_validate_or_raise_with_one_diagnostic() -> None:
    """One diagnostic: its line, then its own Fix once."""
    with pytest.raises(InvalidProgram) as info:
        validate_or_raise(program([Store("src", u32(0), u32(1))]))

    assert str(info.value) == (
        "program breaks 1 validation rule:\n"
        "V013 at body[0]: Store to READ buffer 'src'\n"
        "Fix: declare 'src' as Access.READ_WRITE, or store into a WRITE buffer"
    )


def test_validate_or_raise_with_several_diagnostics() -> None:
    """Several diagnostics: one line each (with its Fix), then the shared Fix line."""
    p = program([Store("src", u32(0), u32(1)), store(Var("nope"))])

    with pytest.raises(InvalidProgram) as info:
        validate_or_raise(p)

    assert str(info.value) == (
        "program breaks 2 validation rules:\n"
        "V013 at body[0]: Store to READ buffer 'src' Fix: declare 'src' as Access.READ_WRITE, "
        "or store into a WRITE buffer\n"
        "V010 at body[1].value: variable 'nope' is not declared in this scope "
        "Fix: introduce it first with Let('nope', value) in this or an enclosing scope\n"
        "Fix: apply the Fix of each line above, starting with the first"
    )
    assert info.value.diagnostics == tuple(validate(p))  # type: ignore[attr-defined]
