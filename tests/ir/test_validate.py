"""Tests for `vyre_async.ir.validate`: one broken program per diagnostic code, valid
programs, the uniformity analysis, limits, the raising form and the docs catalog."""

from __future__ import annotations

import pickle
import re
from collections.abc import Sequence
from dataclasses import FrozenInstanceError, dataclass
from pathlib import Path

import pytest

from vyre_async.errors import ErrorCode, InvalidProgram
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
    Diagnostic,
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
    nwg,
    u32,
    validate,
    validate_or_raise,
    wgid,
)
from vyre_async.ir.limits import (
    MAX_BUFFERS,
    MAX_EXPR_DEPTH,
    MAX_NAME_BYTES,
    MAX_STMT_DEPTH,
    MAX_WORKGROUP_BYTES,
)
from vyre_async.ir.validate import DIAGNOSTIC_CODES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "validation.md"

SRC = BufferDecl("src", 0, Access.READ, DType.U32)
OUT = BufferDecl("out", 1, Access.WRITE, DType.U32, 64)
FOUT = BufferDecl("fout", 2, Access.WRITE, DType.F32, 64)
RW = BufferDecl("rw", 3, Access.READ_WRITE, DType.U32)
PARAMS = BufferDecl("params", 4, Access.UNIFORM, DType.U32)
TILE = BufferDecl("tile", 5, Access.WORKGROUP, DType.U32, 64)
COUNTER = BufferDecl("counter", 6, Access.WORKGROUP, DType.U32, 1)
ALL = (SRC, OUT, FOUT, RW, PARAMS, TILE, COUNTER)


def program(
    body: Sequence[Stmt],
    buffers: Sequence[BufferDecl] = ALL,
    workgroup_size: int | tuple[int, ...] = 64,
    op_id: str = "",
) -> Program:
    return Program(tuple(buffers), workgroup_size, tuple(body), op_id)


def store(value: Expr) -> Store:
    return Store("out", u32(0), value)


def nested_ifs(levels: int, inner: Sequence[Stmt]) -> Stmt:
    stmt = If(True, list(inner))
    for _ in range(levels - 1):
        stmt = If(True, [stmt])
    return stmt


def deep_expr(levels: int) -> Expr:
    """Return an expression ``levels`` deep whose deepest branch is always ``.a``."""
    expr: Expr = u32(0)
    for _ in range(levels - 1):
        expr = expr + u32(1)
    return expr


class AlienStmt(Stmt):
    __slots__ = ()


@dataclass(frozen=True)
class Rule:
    code: str
    path: str
    program: Program


def _rules() -> list[Rule]:
    wg = BufferDecl("a", 0, Access.WORKGROUP, DType.U32, MAX_WORKGROUP_BYTES // 8 + 1)
    wg2 = BufferDecl("b", 1, Access.WORKGROUP, DType.U32, MAX_WORKGROUP_BYTES // 8)
    many = [BufferDecl(f"b{i}", i, Access.READ, DType.U32) for i in range(MAX_BUFFERS + 1)]
    long_name = "n" * (MAX_NAME_BYTES + 1)
    return [
        Rule(
            "V001",
            "buffers[1]",
            program([], [SRC, BufferDecl("src", 1, Access.READ, DType.U32)]),
        ),
        Rule(
            "V002",
            "buffers[1]",
            program([], [SRC, BufferDecl("other", 0, Access.READ, DType.U32)]),
        ),
        Rule("V003", "workgroup_size[1]", program([], workgroup_size=(64, 0, 1))),
        Rule("V004", "workgroup_size", program([], workgroup_size=(64, 32))),
        Rule("V005", "buffers[1]", program([], [wg, wg2])),
        Rule("V006", "buffers[0]", program([], [BufferDecl("o", 0, Access.WRITE, DType.U32)])),
        Rule("V007", "buffers", program([], many)),
        Rule("V008", "buffers[0]", program([], [BufferDecl(long_name, 0, Access.READ, DType.U32)])),
        Rule("V009", "body[0]", program([Store("missing", u32(0), u32(1))])),
        Rule("V010", "body[0].value", program([store(Var("nope"))])),
        Rule("V011", "body[1]", program([Let("x", u32(0)), Let("x", u32(1))])),
        Rule(
            "V012",
            "body[0].body[0]",
            program([Loop("i", u32(0), u32(4), [Assign("i", u32(0))])]),
        ),
        Rule("V013", "body[0]", program([Store("src", u32(0), u32(1))])),
        Rule("V014", "body[0].value", program([store(f32(1.0))])),
        Rule("V015", "body[0].value", program([store(Bin("add", u32(1), i32(1)))])),
        Rule("V016", "body[0].value", program([store(Un("sqrt", u32(4)))])),
        Rule("V017", "body[0].index", program([Store("out", i32(0), u32(1))])),
        Rule("V018", "body[0].start", program([Loop("i", i32(0), u32(4), [])])),
        Rule("V019", "body[0].cond", program([If(f32(1.0), [])])),
        Rule("V020", "body[0].value", program([store(Select(True, u32(1), i32(1)))])),
        Rule(
            "V021",
            "body[0].value.b",
            program([Store("fout", u32(0), Fma(f32(1.0), u32(2), f32(3.0)))]),
        ),
        Rule("V022", "body[1].value", program([Let("x", u32(0)), Assign("x", f32(1.0))])),
        Rule("V023", "body[0].value", program([Let("t", Atomic("add", "src", u32(0), u32(1)))])),
        Rule(
            "V024",
            "body[0].value.value",
            program([Let("t", Atomic("add", "rw", u32(0), i32(1)))]),
        ),
        Rule("V025", "body[0].value", program([Let("t", Atomic("cas", "rw", u32(0), u32(1)))])),
        Rule(
            "V026",
            "body[0].value.expected",
            program([Let("t", Atomic("add", "rw", u32(0), u32(1), expected=u32(0)))]),
        ),
        Rule("V027", "body[0].then[0]", program([If(gid().lt(u32(4)), [Barrier()])])),
        Rule(
            "V028",
            "body[1]",
            program([If(lid().eq(u32(0)), [Return()]), Barrier()]),
        ),
        Rule(
            "V029",
            "body[0]" + ".then[0]" * MAX_STMT_DEPTH,
            program([nested_ifs(MAX_STMT_DEPTH + 1, [])]),
        ),
        Rule(
            "V030",
            "body[0].value" + ".a" * MAX_EXPR_DEPTH,
            program([store(deep_expr(MAX_EXPR_DEPTH + 1))]),
        ),
        # Store + index + value = 3 nodes per statement.
        Rule("V031", "body", program([Store("out", u32(0), u32(1))] * 33_334)),
        Rule("V032", "body[0]", program([AlienStmt()])),
        Rule("V033", "body[0]", program([Let("x\ud800", u32(0))])),
        Rule("V034", "body[0].body[0]", program([Block([GridBarrier()])])),
        Rule(
            "V035",
            "body[2].value",
            program([Let("x", u32(1)), GridBarrier(), store(Var("x"))]),
        ),
        Rule("V036", "body[0].then[0]", program([If(gid().lt(u32(4)), [Return()]), GridBarrier()])),
    ]


RULES = _rules()


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_is_reported_at_the_offending_node(rule: Rule) -> None:
    diagnostics = validate(rule.program)

    assert [d.code for d in diagnostics] == [rule.code]
    (diag,) = diagnostics
    assert isinstance(diag, Diagnostic)
    assert diag.path == rule.path
    assert diag.message
    assert diag.fix
    assert "Fix:" in str(diag)
    assert str(diag).startswith(f"{rule.code} at {rule.path}: ")


def test_every_code_has_a_rule_test() -> None:
    assert {r.code for r in RULES} == set(DIAGNOSTIC_CODES)


def test_codes_are_stable_and_titled() -> None:
    assert list(DIAGNOSTIC_CODES) == [f"V{i:03d}" for i in range(1, len(DIAGNOSTIC_CODES) + 1)]
    assert all(title and "\n" not in title for title in DIAGNOSTIC_CODES.values())


def test_docs_catalog_lists_exactly_the_codes() -> None:
    documented = set(re.findall(r"\bV\d{3}\b", DOCS.read_text(encoding="utf-8")))
    assert documented == set(DIAGNOSTIC_CODES)


# Further cases of single rules -------------------------------------------------------

MORE_CASES = [
    pytest.param([store(Load("missing", u32(0)))], "V009", "body[0].value", id="load"),
    pytest.param([store(BufLen("missing"))], "V009", "body[0].value", id="buflen"),
    pytest.param(
        [Let("t", Atomic("add", "missing", u32(0), u32(1)))],
        "V009",
        "body[0].value",
        id="atomic-missing",
    ),
    pytest.param([Assign("nope", u32(1))], "V010", "body[0]", id="assign-undeclared"),
    pytest.param(
        [If(True, [Let("t", u32(1))]), store(Var("t"))],
        "V010",
        "body[1].value",
        id="if-scope-ends",
    ),
    pytest.param(
        [Block([Let("t", u32(1))]), store(Var("t"))], "V010", "body[1].value", id="block-scope"
    ),
    pytest.param(
        [Loop("i", u32(0), u32(2), []), store(Var("i"))], "V010", "body[1].value", id="loop-var"
    ),
    pytest.param(
        [Loop("i", u32(0), u32(2), [Let("i", u32(1))])],
        "V011",
        "body[0].body[0]",
        id="let-loop-var",
    ),
    pytest.param(
        [Let("i", u32(0)), Loop("i", u32(0), u32(2), [])], "V011", "body[1]", id="loop-shadows"
    ),
    pytest.param(
        [Let("x", u32(0)), If(True, [Block([Let("x", u32(1))])])],
        "V011",
        "body[1].then[0].body[0]",
        id="nested-shadow",
    ),
    pytest.param([Let("v" * (MAX_NAME_BYTES + 1), u32(0))], "V008", "body[0]", id="var-name"),
    pytest.param([Store("params", u32(0), u32(1))], "V013", "body[0]", id="store-uniform"),
    pytest.param([store(Un("neg", True))], "V016", "body[0].value", id="neg-bool"),
    pytest.param(
        [store(Cast(DType.U32, Bin("and", f32(1), f32(2))))],
        "V016",
        "body[0].value.value",
        id="and-f32",
    ),
    pytest.param(
        [store(Cast(DType.U32, Bin("land", u32(1), u32(1))))],
        "V016",
        "body[0].value.value",
        id="land-u32",
    ),
    pytest.param([store(Load("src", f32(0.0)))], "V017", "body[0].value.index", id="load-index"),
    pytest.param(
        [Let("t", Atomic("add", "rw", i32(0), u32(1)))],
        "V017",
        "body[0].value.index",
        id="atomic-index",
    ),
    pytest.param([Loop("i", u32(0), f32(4.0), [])], "V018", "body[0].end", id="loop-end"),
    pytest.param(
        [store(Select(i32(1), u32(1), u32(2)))], "V019", "body[0].value.cond", id="select-i32"
    ),
    pytest.param(
        [Let("t", Atomic("cas", "rw", u32(0), u32(1), expected=f32(0.0)))],
        "V024",
        "body[0].value.expected",
        id="cas-expected-dtype",
    ),
    pytest.param(
        [Let("t", Atomic("add", "out", u32(0), u32(1)))], "V023", "body[0].value", id="write"
    ),
    pytest.param(
        [Let("t", Atomic("add", "params", u32(0), u32(1)))], "V023", "body[0].value", id="uniform"
    ),
    pytest.param(
        [Let("t", Atomic("max", "fout", u32(0), u32(1)))], "V023", "body[0].value", id="f32"
    ),
]


@pytest.mark.parametrize(("body", "code", "path"), MORE_CASES)
def test_rule_variants(body: list[Stmt], code: str, path: str) -> None:
    diagnostics = validate(program(body))

    assert [(d.code, d.path) for d in diagnostics] == [(code, path)]


def test_op_id_too_long() -> None:
    (diag,) = validate(program([], op_id="o" * (MAX_NAME_BYTES + 1)))

    assert (diag.code, diag.path) == ("V008", "op_id")


def test_message_shows_observed_values() -> None:
    (diag,) = validate(program([store(Bin("add", u32(1), i32(1)))]))

    assert diag.message == "operands of 'add' differ: u32 vs i32"
    assert diag.fix == "cast one side: Cast(DType.U32, ...)"


# Valid programs -----------------------------------------------------------------------

VALID = [
    pytest.param(
        [
            Let("i", gid()),
            If(
                Var("i").lt(BufLen("src")),
                [Store("out", Var("i"), Load("src", Var("i")) * u32(2))],
            ),
        ],
        id="elementwise",
    ),
    pytest.param(
        [
            Let("l", lid()),
            Store("tile", Var("l"), Load("src", gid())),
            Barrier(),
            Store("out", gid(), Load("tile", (Var("l") + u32(1)) % u32(64))),
            Barrier(),
        ],
        id="top-level-barriers",
    ),
    pytest.param(
        [Loop("k", u32(0), u32(4), [Store("tile", lid(), Var("k")), Barrier()])],
        id="loop-literal-bounds",
    ),
    pytest.param(
        [
            Let("n", Load("params", u32(0))),
            Loop("k", u32(0), Var("n"), [Barrier()]),
            Loop("k", u32(0), BufLen("src"), [Barrier()]),
            Loop("k", wgid(), nwg(), [Loop("j", Var("k"), u32(8), [Barrier()])]),
        ],
        id="loop-uniform-bounds",
    ),
    pytest.param(
        [
            If(wgid().lt(BufLen("src")), [Barrier()]),
            If(nwg().gt(u32(1)), [Barrier()], [Barrier()]),
            If(Load("params", wgid()), [Barrier()]),
        ],
        id="uniform-if",
    ),
    pytest.param(
        [
            If(gid().lt(u32(4)), [Let("t", u32(1)), store(Var("t"))], [Let("t", u32(2))]),
            Block([Let("t", f32(3.0))]),
            Loop("i", u32(0), u32(2), [Let("t", i32(1))]),
            Loop("i", u32(0), u32(2), []),
            Let("t", u32(4)),
            Loop("j", u32(0), Var("t"), [Barrier()]),
        ],
        id="sibling-scopes",
    ),
    pytest.param(
        [
            Let("old", Atomic("add", "counter", u32(0), u32(1))),
            Let("cas", Atomic("cas", "rw", gid(), u32(1), expected=u32(0))),
            Barrier(),
            If(lid().eq(u32(0)), [Store("out", wgid(), Load("counter", u32(0)))]),
        ],
        id="workgroup-atomics",
    ),
    pytest.param(
        [If(wgid().eq(u32(0)), [Return()]), Barrier(), If(gid().gt(u32(9)), [Return()])],
        id="uniform-return-and-return-after-barrier",
    ),
    pytest.param(
        [
            Let("n", u32(0)),
            Loop("k", u32(0), u32(4), [Assign("n", Var("n") + Var("k"))]),
            Loop("j", u32(0), Var("n"), [Barrier()]),
        ],
        id="uniform-loop-carried-variable",
    ),
    pytest.param(
        [
            Let("x", f32(2.0)),
            Assign("x", Fma(Var("x"), f32(3.0), Un("sqrt", Var("x")))),
            Store("fout", u32(0), Select(Var("x").gt(f32(1.0)), Var("x"), f32(0.0))),
            Store("out", u32(1), Cast(DType.U32, Var("x").eq(f32(6.0)))),
            Store("out", u32(2), Un("popcount", u32(7)) + Bin("mulhi", u32(3), u32(5))),
            Let("b", Bin("land", True, Un("lnot", False))),
            If(Var("b"), [], [Return()]),
        ],
        id="typed-expressions",
    ),
    pytest.param(
        [nested_ifs(MAX_STMT_DEPTH, [store(deep_expr(MAX_EXPR_DEPTH))])],
        id="depth-limits-inclusive",
    ),
]


@pytest.mark.parametrize("body", VALID)
def test_valid_programs_give_no_diagnostics(body: list[Stmt]) -> None:
    assert validate(program(body)) == []


# Uniformity ---------------------------------------------------------------------------

DIVERGENT_BARRIERS = [
    pytest.param(
        [Loop("k", u32(0), gid(), [Barrier()])], "V027", "body[0].body[0]", id="loop-gid-bound"
    ),
    pytest.param(
        [Let("n", lid()), If(Var("n").eq(u32(0)), [Barrier()])],
        "V027",
        "body[1].then[0]",
        id="variable-from-lid",
    ),
    pytest.param(
        [
            Let("f", u32(0)),
            If(gid().lt(u32(4)), [Assign("f", u32(1))]),
            If(Var("f").eq(u32(1)), [Barrier()]),
        ],
        "V027",
        "body[2].then[0]",
        id="assigned-under-divergent-control",
    ),
    pytest.param(
        [
            Let("a", u32(0)),
            Let("b", u32(0)),
            Loop(
                "k",
                u32(0),
                u32(4),
                [If(Var("b").eq(u32(1)), [Barrier()]), Assign("b", Var("a")), Assign("a", gid())],
            ),
        ],
        "V027",
        "body[2].body[0].then[0]",
        id="loop-carried-fixpoint",
    ),
    pytest.param(
        [Loop("k", u32(0), lid(), [Let("j", Var("k")), If(Var("j"), [Barrier()])])],
        "V027",
        "body[0].body[1].then[0]",
        id="nested-under-divergent-loop",
    ),
    pytest.param([If(Load("src", u32(0)), [Barrier()])], "V027", "body[0].then[0]", id="read-load"),
    pytest.param(
        [If(Load("params", gid()), [Barrier()])], "V027", "body[0].then[0]", id="uniform-load-gid"
    ),
    pytest.param(
        [Let("o", Atomic("add", "counter", u32(0), u32(1))), If(Var("o"), [Barrier()])],
        "V027",
        "body[1].then[0]",
        id="atomic-result",
    ),
    pytest.param(
        [If(Select(lid(), True, False), [Barrier()])], "V027", "body[0].then[0]", id="select"
    ),
    pytest.param(
        [Loop("k", u32(0), u32(4), [Barrier(), If(lid().eq(u32(0)), [Return()])])],
        "V028",
        "body[0].body[0]",
        id="return-later-in-loop",
    ),
    pytest.param(
        [
            Loop(
                "k",
                u32(0),
                u32(4),
                [Barrier(), Loop("j", u32(0), u32(2), [If(lid(), [Return()])])],
            )
        ],
        "V028",
        "body[0].body[0]",
        id="return-in-inner-loop",
    ),
    pytest.param(
        [If(gid(), [Block([Return()])]), Loop("k", u32(0), u32(2), [Barrier()])],
        "V028",
        "body[1].body[0]",
        id="return-before-loop",
    ),
]


@pytest.mark.parametrize(("body", "code", "path"), DIVERGENT_BARRIERS)
def test_divergent_barriers(body: list[Stmt], code: str, path: str) -> None:
    diagnostics = validate(program(body))

    assert [(d.code, d.path) for d in diagnostics] == [(code, path)]


def test_divergent_barrier_names_the_outermost_divergent_if() -> None:
    body = [If(gid().lt(u32(4)), [If(True, [Barrier()])])]

    (diag,) = validate(program(body))

    assert diag.path == "body[0].then[0].then[0]"
    assert "the If at body[0]," in diag.message


def test_diagnostics_are_collected_in_program_order() -> None:
    body = [
        Store("src", u32(0), u32(1)),
        If(gid(), [Barrier(), store(Var("nope"))]),
        Let("x", Bin("add", u32(1), f32(1.0))),
        Assign("x", u32(2)),
    ]
    p = program(body, [*ALL, BufferDecl("src", 9, Access.READ, DType.U32)], (0, 1, 1))

    got = [(d.code, d.path) for d in validate(p)]

    assert got == [
        ("V001", "buffers[7]"),
        ("V003", "workgroup_size[0]"),
        ("V013", "body[0]"),
        ("V027", "body[1].then[0]"),
        ("V010", "body[1].then[1].value"),
        ("V015", "body[2].value"),
    ]


def test_unknown_dtype_does_not_cascade() -> None:
    body = [Store("fout", u32(0), Un("sqrt", Bin("add", u32(1), f32(2.0))) * f32(2.0))]

    assert [d.code for d in validate(program(body))] == ["V015"]


# Limits -------------------------------------------------------------------------------


def test_200_deep_expression_reports_depth_once() -> None:
    diagnostics = validate(program([store(deep_expr(200))]))

    assert [d.code for d in diagnostics] == ["V030"]


def test_100_deep_if_reports_depth_once() -> None:
    diagnostics = validate(program([nested_ifs(100, [store(deep_expr(200))])]))

    assert [d.code for d in diagnostics] == ["V029"]


def test_shared_subtrees_are_counted_without_hanging() -> None:
    expr: Expr = u32(1)
    for _ in range(64):
        expr = expr + expr  # 2**65 nodes once unfolded

    diagnostics = validate(program([store(expr)]))

    assert [(d.code, d.path) for d in diagnostics] == [("V031", "body")]


# Raising form, memo, records --------------------------------------------------------


def test_validate_or_raise_returns_a_valid_program() -> None:
    p = program([store(u32(1))])

    assert validate_or_raise(p) is p


def test_validate_or_raise_says_one_rules_fix_once() -> None:
    p = program([Store("src", u32(0), u32(1))])

    with pytest.raises(InvalidProgram) as info:
        validate_or_raise(p)

    (only,) = info.value.diagnostics  # type: ignore[attr-defined]
    text = str(info.value)
    assert text.count("Fix:") == 1
    assert text.splitlines() == [
        "program breaks 1 validation rule:",
        f"{only.code} at {only.path}: {only.message}",
        f"Fix: {only.fix}",
    ]


def test_validate_or_raise_lists_every_diagnostic() -> None:
    p = program([Store("src", u32(0), u32(1)), store(Var("nope"))])

    with pytest.raises(InvalidProgram) as info:
        validate_or_raise(p)

    err = info.value
    assert isinstance(err, ValueError)
    assert err.code == ErrorCode.InvalidProgram
    diagnostics = err.diagnostics  # type: ignore[attr-defined]
    assert isinstance(diagnostics, tuple)
    assert [d.code for d in diagnostics] == ["V013", "V010"]
    lines = str(err).splitlines()
    assert lines[1:3] == [str(d) for d in diagnostics]
    assert lines[-1].startswith("Fix: ")
    restored = pickle.loads(pickle.dumps(err))
    assert restored.diagnostics == diagnostics
    assert str(restored) == str(err)


def test_verdict_is_memoised_on_the_program() -> None:
    p = program([store(Var("nope"))])

    first = validate(p)
    first.clear()

    assert isinstance(p._memo["diagnostics"], tuple)
    assert [d.code for d in validate(p)] == ["V010"]
    p._memo["diagnostics"] = ()
    assert validate(p) == []
    assert validate_or_raise(p) is p


def test_validate_rejects_non_programs() -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        validate("not a program")  # type: ignore[arg-type]


def test_diagnostic_is_a_frozen_keyword_record() -> None:
    diag = Diagnostic(code="V010", path="body[0]", message="m", fix="f")

    assert str(diag) == "V010 at body[0]: m Fix: f"
    with pytest.raises(FrozenInstanceError):
        diag.code = "V011"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Diagnostic("V010", "body[0]", "m", "f")  # type: ignore[call-arg]


# Every rule that depends on a buffer's kind, once per kind ----------------------------
#
# A rule checked for one access kind and forgotten for another passes every test that
# only tries the first: V006 once covered WRITE but not WORKGROUP, so a zero-sized
# shared array validated, ran silently on the reference engine and broke nvcc. Each
# rule below is tried with a buffer of every `Access` kind, and the table must cover
# every (rule, kind) pair.

KIND_RULES = ("V001", "V002", "V005", "V006", "V008", "V013", "V014", "V023", "V027")
BIG = MAX_WORKGROUP_BYTES // 4 + 1  # u32 elements: one more than workgroup memory holds
_WRITABLE = (Access.WRITE, Access.READ_WRITE, Access.WORKGROUP)


def _kind_program(rule: str, access: Access) -> Program:
    """Return a program breaking ``rule`` with one buffer ``b`` of kind ``access``."""
    counted = access in (Access.WRITE, Access.WORKGROUP)
    b = BufferDecl("b", 9, access, DType.U32, 4 if counted else 0)
    with_b = (*ALL[:5], b)  # no WORKGROUP buffers of the shared table: V005 is b's alone
    if rule == "V001":
        return program([], [SRC, BufferDecl("src", 9, access, DType.U32, 4)])
    if rule == "V002":
        return program([], [SRC, BufferDecl("b", 0, access, DType.U32, 4)])
    if rule == "V005":
        return program([], [BufferDecl("b", 9, access, DType.U32, BIG)])
    if rule == "V006":
        return program([], [BufferDecl("b", 9, access, DType.U32, 0)])
    if rule == "V008":
        long_name = "n" * (MAX_NAME_BYTES + 1)
        return program([], [BufferDecl(long_name, 9, access, DType.U32, 4)])
    if rule == "V013":
        return program([Store("b", u32(0), u32(1))], with_b)
    if rule == "V014":
        return program([Store("b", u32(0), f32(1.0))], with_b)
    if rule == "V023":
        return program([Let("t", Atomic("add", "b", u32(0), u32(1)))], with_b)
    assert rule == "V027"  # a barrier under a condition read from b: uniform only if UNIFORM
    return program([If(Load("b", u32(0)).ne(u32(0)), [Barrier()])], with_b)


def _kind_expectation(rule: str, access: Access) -> list[str]:
    """The diagnostics ``_kind_program(rule, access)`` must give, per ir.md."""
    if rule in ("V001", "V002", "V008"):
        breaks = True
    elif rule == "V005":
        breaks = access is Access.WORKGROUP
    elif rule == "V006":
        breaks = access in (Access.WRITE, Access.WORKGROUP)
    elif rule == "V013":
        breaks = access in (Access.READ, Access.UNIFORM)
    elif rule == "V014":  # a store into a read-only kind is V013 first, then V014 as well
        return ["V013", "V014"] if access not in _WRITABLE else ["V014"]
    elif rule == "V023":
        breaks = access not in (Access.READ_WRITE, Access.WORKGROUP)
    else:
        breaks = access is not Access.UNIFORM
    return [rule] if breaks else []


KIND_CASES = [
    pytest.param(rule, access, id=f"{rule}-{access.name}")
    for rule in KIND_RULES
    for access in Access
]


@pytest.mark.parametrize(("rule", "access"), KIND_CASES)
def test_rule_per_buffer_kind(rule: str, access: Access) -> None:
    diagnostics = validate(_kind_program(rule, access))

    assert [d.code for d in diagnostics] == _kind_expectation(rule, access)


def test_every_rule_titled_after_buffers_is_in_the_kind_table() -> None:
    # A new rule whose title names a buffer or a kind needs its cases per kind above.
    kind_words = {a.name for a in Access} | {"read-only", "buffer"}
    buffer_rules = {
        code
        for code, title in DIAGNOSTIC_CODES.items()
        if any(w in title for w in kind_words) and code not in ("V007", "V009")
    }
    assert buffer_rules <= set(KIND_RULES), sorted(buffer_rules - set(KIND_RULES))


@pytest.mark.parametrize("access", [Access.WRITE, Access.WORKGROUP])
def test_zero_count_buffer_is_refused_before_it_runs(access: Access) -> None:
    from vyre_reference import execute, reference_backend

    bad = program(
        [Store("b", lid(), u32(1)), Store("out", lid(), Load("b", lid()))],
        [OUT, BufferDecl("b", 9, access, DType.U32, 0)],
    )
    with pytest.raises(InvalidProgram, match="V006") as info:
        execute(bad, [])
    assert info.value.code is ErrorCode.InvalidProgram
    with pytest.raises(InvalidProgram, match="V006"):
        reference_backend().dispatch(bad, [])  # refused before any worker starts


# Grid barriers ------------------------------------------------------------------------


def test_a_grid_barrier_under_if_or_loop_is_reported_where_it_is() -> None:
    prog = program(
        [
            If(wgid().eq(u32(0)), [GridBarrier()]),
            Loop("k", u32(0), u32(2), [GridBarrier()]),
        ]
    )
    assert [(d.code, d.path) for d in validate(prog)] == [
        ("V034", "body[0].then[0]"),
        ("V034", "body[1].body[0]"),
    ]


def test_variables_may_be_declared_again_after_a_grid_barrier() -> None:
    prog = program(
        [
            Let("x", gid()),
            store(Var("x")),
            GridBarrier(),
            Let("x", gid() + u32(1)),
            store(Var("x")),
            GridBarrier(),
            GridBarrier(),
        ]
    )
    assert validate(prog) == []


def test_an_assignment_across_a_grid_barrier_is_reported_with_its_barrier() -> None:
    prog = program([Let("x", u32(1)), GridBarrier(), Assign("x", u32(2))])
    (diag,) = validate(prog)
    assert (diag.code, diag.path) == ("V035", "body[2]")
    assert "GridBarrier at body[1]" in diag.message
    assert "store it to a buffer" in diag.fix


def test_a_variable_of_an_inner_scope_is_undeclared_not_expired() -> None:
    prog = program([Block([Let("x", u32(1))]), GridBarrier(), store(Var("x"))])
    assert [d.code for d in validate(prog)] == ["V010"]


def test_every_return_of_a_grid_barrier_program_is_reported_in_program_order() -> None:
    prog = program([If(lid().eq(u32(0)), [Return()]), GridBarrier(), Block([Return()]), Barrier()])
    assert [(d.code, d.path) for d in validate(prog)] == [
        ("V036", "body[0].then[0]"),
        ("V036", "body[2].body[0]"),
        ("V028", "body[3]"),
    ]
