"""What the CUDA code generator promises that earlier tests left open (found by mutation testing).

Issue 28 ran mutmut over ``vyre_cupy/codegen.py``; these tests kill its survivors by
asserting what a user of `vyre_cupy.generate` observes:

- i32 and bool constants, bool casts and nested statements (``If``/else, ``Loop``,
  ``Block``), compiled and run on the CPU emulator (one small build), give the
  values written in the test and the reference engine's;
- every error `generate` raises for a program that did not validate, and for a
  bad entry name, with its whole message and its Fix;
- `sanitize` (names in comments): unsafe characters, the 48-character cut;
- `KernelSource.path_of_line` and ``line_paths``: one entry per line, IR paths of
  nested statements, as a compile error reports them (`compile_failed`);
- ``uses_barrier`` and the batch kernel, the header comment, and the identifier
  scheme of the module docstring (``b0``, ``s0``, ``v0``, ``t0`` counting up).

Mutants whose code no user can tell from the original are listed with the
reason in the mutation run's equivalents file, not here.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from tests.cupy.emulator import build_emulator, request_for
from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Barrier,
    Block,
    BufferDecl,
    Cast,
    Const,
    DType,
    Expr,
    If,
    Let,
    Load,
    Loop,
    Program,
    Select,
    Store,
    Var,
    f32,
    gid,
    i32,
    lid,
    u32,
)
from vyre_async.ir.expr import Bin, Un
from vyre_async.ir.ops import BinOp, UnOp
from vyre_async.ir.stmt import Stmt
from vyre_cupy.codegen import KernelSource, generate, sanitize
from vyre_cupy.compile import SOURCE_NAME, compile_failed
from vyre_reference import execute

_VALIDATE_FIX = "run vyre_async.ir.validate(program) and fix what it lists"
#: An IR path as `line_paths` holds them: ``body[i]`` then ``.then|.orelse|.body[j]`` steps.
_IR_PATH = re.compile(r"body\[\d+\](?:\.(?:then|orelse|body)\[\d+\])*")

TRUE, FALSE = Const(DType.BOOL, True), Const(DType.BOOL, False)


def _kernel(source: str) -> str:
    """The plain kernel: after the prelude, before the batch kernel (if any)."""
    return source.split("#endif /* VYRE_CUDA_PRELUDE */", 1)[1].split("/* batch kernel:", 1)[0]


def _reported_statement(kernel: KernelSource, line: int) -> str | None:
    """The IR statement a compile error at ``line`` is reported against (None: none named)."""
    error = compile_failed(kernel, f"{SOURCE_NAME}({line}): error: something", ["-x"])
    found = re.search(r"\(generated from IR statement (\S+)\)", str(error))
    return found[1] if found else None


# Constants, bool casts and nested statements, run -----------------------------------------
def _constants_program() -> Program:
    """Stores of i32 and bool constants and of bool casts (bitwise ops on the cast results)."""
    one = u32(1)
    return Program(
        [
            BufferDecl("ints", 0, Access.WRITE, DType.I32, 8),
            BufferDecl("words", 1, Access.WRITE, DType.U32, 4),
            BufferDecl("floats", 2, Access.WRITE, DType.F32, 2),
            BufferDecl("flags", 3, Access.WRITE, DType.BOOL, 6),
        ],
        1,
        [
            Store("ints", u32(0), i32(-62)),
            Store("ints", u32(1), i32(-(2**31))),
            Store("ints", u32(2), i32(0)),
            Store("ints", u32(3), i32(2**31 - 1)),
            Store("ints", u32(4), i32(-(2**31)) ^ i32(-1)),
            Store("ints", u32(5), Cast(DType.I32, TRUE) | i32(6)),
            Store("ints", u32(6), Cast(DType.I32, FALSE) ^ i32(-62)),
            Store("ints", u32(7), Select(TRUE, i32(-1), i32(1)) & i32(-(2**31))),
            Store("words", u32(0), Cast(DType.U32, TRUE) | u32(8)),
            Store("words", u32(1), Cast(DType.U32, FALSE) ^ u32(3)),
            Store("words", u32(2), (Cast(DType.U32, TRUE) << u32(4)) + one),
            Store("words", u32(3), Select(FALSE, u32(10), u32(20))),
            Store("floats", u32(0), Cast(DType.F32, TRUE)),
            Store("floats", u32(1), Cast(DType.F32, FALSE) + f32(0.5)),
            Store("flags", u32(0), TRUE),
            Store("flags", u32(1), FALSE),
            Store("flags", u32(2), TRUE.land(FALSE.lor(TRUE))),
            Store("flags", u32(3), Select(FALSE, TRUE, FALSE)),
            If(TRUE, [Store("flags", u32(4), TRUE)]),
            If(FALSE, [Store("flags", u32(5), TRUE)]),
        ],
        op_id="mutants.constants",
    )


def _nested_program() -> Program:
    """One store per statement kind: top level, then, else, loop body and block body."""
    g = gid()
    return Program(
        [
            BufferDecl("src", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 8),
        ],
        4,
        [
            Store("out", u32(0), u32(11)),
            Store("out", u32(1), u32(12)),
            If(
                Load("src", g).eq(u32(0)),
                [Store("out", u32(2), u32(13))],
                [Store("out", u32(3), u32(14))],
            ),
            Loop("i", u32(0), u32(2), [Store("out", Var("i") + u32(4), u32(15))]),
            Block([Store("out", u32(6), u32(16))]),
        ],
    )


def test_constants_casts_and_nested_statements_run_like_the_reference() -> None:
    constants, nested = _constants_program(), _nested_program()
    src = np.array([0, 5, 0, 7], dtype=np.uint32)
    emulator = build_emulator([constants, nested]).wait()
    results = emulator.run([request_for(0, constants, []), request_for(1, nested, [src])])
    ints, words, floats, flags = results[0].outputs
    assert ints.tolist() == [-62, -(2**31), 0, 2**31 - 1, 2**31 - 1, 7, -62, -(2**31)]
    assert words.tolist() == [9, 3, 17, 20]
    assert floats.tolist() == [1.0, 0.5]
    assert flags.tolist() == [True, False, True, False, True, False]
    assert results[1].outputs[0].tolist() == [11, 12, 13, 14, 15, 15, 16, 0]
    for program, inputs, result in ((constants, [], results[0]), (nested, [src], results[1])):
        want = execute(program, inputs)
        for got, expected in zip(result.outputs, want, strict=True):
            assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


def test_bool_and_i32_constants_are_spelled_as_c_literals() -> None:
    code = _kernel(generate(_constants_program()).source)
    assert "VY_STORE(&b3[0x00000000u], (true ? 1u : 0u))" in code
    assert "VY_STORE(&b3[0x00000001u], (false ? 1u : 0u))" in code
    assert "if (true) {" in code and "if (false) {" in code
    # -62 stays -62, whether parenthesised or not (only -2**31 needs another spelling).
    assert re.search(r"VY_STORE\(&b0\[0x00000000u\], \(?-62\)?\);", code)


# Errors of generate ------------------------------------------------------------------------
class _Alien(Expr):
    """An expression node the IR does not know (validate reports V032)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Alien()"


class _AlienStmt(Stmt):
    """A statement node the IR does not know (validate reports V032)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "AlienStmt()"


def _out(*body: Stmt) -> Program:
    return Program([BufferDecl("out", 0, Access.WRITE, DType.U32, 4)], 1, list(body))


@pytest.mark.parametrize(
    ("program", "message", "fix"),
    [
        (
            _out(Let("x", Bin(BinOp.AND, f32(1.0), f32(2.0)))),
            "and is not defined on f32",
            _VALIDATE_FIX,
        ),
        (
            _out(Let("x", Bin(BinOp.LAND, u32(1), u32(2)))),
            "land is not defined on u32",
            _VALIDATE_FIX,
        ),
        (
            _out(Let("x", Bin(BinOp.MULHI, i32(1), i32(2)))),
            "mulhi is not defined on i32",
            _VALIDATE_FIX,
        ),
        (_out(Let("x", Un(UnOp.LNOT, u32(1)))), "lnot is not defined on u32", _VALIDATE_FIX),
        (_out(Let("x", Un(UnOp.SQRT, i32(1)))), "sqrt is not defined on i32", _VALIDATE_FIX),
        (
            _out(Let("a", u32(0)), Store("out", u32(0), Var("ghost"))),
            "variable 'ghost' is not declared at body[1]",
            _VALIDATE_FIX,
        ),
        (
            _out(If(TRUE, [Let("a", u32(0)), Store("nope", u32(0), u32(1))])),
            "buffer 'nope' is not declared at body[0].then[1]",
            _VALIDATE_FIX,
        ),
        (
            # A loop variable ends with its loop, however deep the loop is nested.
            _out(If(TRUE, [Loop("i", u32(0), u32(2), []), Store("out", u32(0), Var("i"))])),
            "variable 'i' is not declared at body[0].then[1]",
            _VALIDATE_FIX,
        ),
        (
            _out(Let("x", _Alien())),
            "unknown expression Alien() at body[0]",
            "build programs from vyre_async.ir expressions",
        ),
        (
            _out(Let("x", u32(1)), _AlienStmt()),
            "unknown statement AlienStmt() at body[1]",
            "build programs from vyre_async.ir statements",
        ),
    ],
)
def test_a_program_that_did_not_validate_is_refused_with_the_validator_as_fix(
    program: Program, message: str, fix: str
) -> None:
    with pytest.raises(InvalidProgram) as info:
        generate(program)
    assert str(info.value) == f"{message}\nFix: {fix}"


@pytest.mark.parametrize("entry", ["2x", "a b", "", "a" * 65])
def test_a_bad_entry_name_is_refused_with_an_example(entry: str) -> None:
    with pytest.raises(InvalidProgram) as info:
        generate(_out(), entry=entry)
    assert str(info.value) == (
        f"kernel entry name {entry!r} is not a C identifier of at most 64 characters\n"
        "Fix: pass an entry such as 'vyre_main' (letters, digits and '_', not starting "
        "with a digit)"
    )


# Names in comments -----------------------------------------------------------------------
def test_sanitize_replaces_each_unsafe_character_by_one_question_mark() -> None:
    assert sanitize("a b*/c\nd") == "a?b??c?d"
    assert sanitize("ok_name-1.2") == "ok_name-1.2"


def test_sanitize_cuts_names_longer_than_48_characters_to_48() -> None:
    assert sanitize("a" * 48) == "a" * 48
    assert sanitize("b" * 49) == "b" * 45 + "..."
    assert sanitize("c" * 200) == "c" * 45 + "..."
    assert sanitize("é" * 60) == "?" * 45 + "..."
    long_name = "x" * 30 + "y" * 30
    program = Program(
        [BufferDecl(long_name, 0, Access.WRITE, DType.U32, 1)], 1, [Let("q r", u32(1))]
    )
    source = generate(program).source
    assert f"/* {'x' * 30}{'y' * 15}...: write u32 */" in source
    assert "/* q?r */" in source


# Line paths and reported locations ---------------------------------------------------------
def test_path_of_line_reads_line_paths_one_based() -> None:
    kernel = generate(_out(Store("out", u32(0), u32(1))))
    paths = tuple(f"p{n}" for n in range(1, 6))
    custom = dataclasses.replace(kernel, line_paths=paths)
    assert [custom.path_of_line(n) for n in range(7)] == ["", *paths, ""]


def test_compile_errors_name_the_statement_of_each_line() -> None:
    kernel = generate(_nested_program())
    lines = kernel.source.splitlines()
    # One entry per line of the unit (the batch kernel's too), and one after its last newline.
    assert kernel.batch_entry is not None
    assert len(kernel.line_paths) == kernel.source.count("\n") + 1 == len(lines) + 1
    head = lines.index('extern "C" __global__ void vyre_main(') + 1
    end = lines.index("}", head) + 1  # the plain kernel's closing brace
    stores = {
        "0x0000000Bu": "body[0]",
        "0x0000000Cu": "body[1]",
        "0x0000000Du": "body[2].then[0]",
        "0x0000000Eu": "body[2].orelse[0]",
        "0x0000000Fu": "body[3].body[0]",
        "0x00000010u": "body[4].body[0]",
    }
    for value, path in stores.items():
        line = next(n for n in range(head, end) if lines[n - 1].endswith(f"], {value});"))
        assert kernel.path_of_line(line) == path
        assert _reported_statement(kernel, line) == path
    stripped = [line.strip() for line in lines]
    assert _reported_statement(kernel, stripped.index("else {") + 1) == "body[2]"
    assert _reported_statement(kernel, stripped.index("{") + 1) == "body[4]"
    # Every line of the body (braces included) comes from a statement...
    body = [n for n in range(head, end) if kernel.path_of_line(n)]
    assert body == list(range(body[0], end))
    for n in body:
        assert _IR_PATH.fullmatch(kernel.path_of_line(n)), (n, kernel.path_of_line(n))
    # ...the head, the closing brace and the whole batch kernel from none.
    assert all(kernel.path_of_line(n) == "" for n in range(end, len(lines) + 2))
    assert _reported_statement(kernel, end) is None
    in_batch = next(n for n in range(end, len(lines)) if lines[n - 1].endswith("], 0x0000000Du);"))
    assert _reported_statement(kernel, in_batch) is None


# Barriers, shared memory and the batch kernel ------------------------------------------------
def test_barriers_or_shared_memory_mean_no_batch_kernel() -> None:
    g = gid()
    barrier_only = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.U32, 4)],
        4,
        [Store("out", g, u32(1)), Barrier(), Store("out", g, u32(2))],
    )
    shared_only = Program(
        [
            BufferDecl("out", 0, Access.WRITE, DType.U32, 4),
            BufferDecl("tile", 1, Access.WORKGROUP, DType.U32, 4),
        ],
        4,
        [Store("out", g, Load("tile", lid()))],
    )
    for program in (barrier_only, shared_only):
        kernel = generate(program)
        assert kernel.uses_barrier is True and kernel.batch_entry is None
        assert "/* batch kernel" not in kernel.source
    plain = generate(_out(Store("out", u32(0), u32(1))))
    assert plain.uses_barrier is False and plain.batch_entry == "vyre_main_batch"


# Header and identifiers --------------------------------------------------------------------
def test_the_header_names_the_program() -> None:
    named = Program([BufferDecl("out", 0, Access.WRITE, DType.U32, 1)], 1, [], op_id="lib.op v2")
    assert "; program lib.op?v2; workgroup (1, 1, 1) */" in generate(named).source
    unnamed = _out()
    assert "; program -; workgroup (1, 1, 1) */" in generate(unnamed).source


def _identifiers_program() -> Program:
    g = gid()
    return Program(
        [
            BufferDecl("a", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("t1", 2, Access.WORKGROUP, DType.U32, 4),
            BufferDecl("t2", 3, Access.WORKGROUP, DType.F32, 4),
            BufferDecl("t3", 4, Access.WORKGROUP, DType.U32, 4),
        ],
        4,
        [
            Let("x", Load("a", g) + u32(1)),
            Let("y", Var("x") * u32(3)),
            Store("t1", lid(), Var("y")),
            Store("t3", lid(), Load("t1", lid())),
            Barrier(),
            Loop("i", u32(0), Var("x"), [Let("z", Var("i") + Var("y"))]),
            Let("w", Cast(DType.U32, Load("t2", lid())) + Load("t3", lid())),
            Store("out", g, Var("w")),
        ],
    )


def test_identifiers_count_up_from_zero_as_documented() -> None:
    code = _kernel(generate(_identifiers_program()).source)
    temps = [int(t) for t in re.findall(r"const \w+ t(\d+) =", code)]
    assert temps == list(range(len(temps))) and len(temps) > 8
    variables = [int(v) for v in re.findall(r"\b(?:unsigned|int|float|bool) v(\d+) =", code)]
    assert variables == [0, 1, 2, 3, 4]
    assert "__shared__ unsigned s0[4]; /* t1: workgroup u32 */" in code
    assert "__shared__ float s1[4]; /* t2: workgroup f32 */" in code
    assert "__shared__ unsigned s2[4]; /* t3: workgroup u32 */" in code
    assert re.findall(r"\b[bs]\d+\b(?=\[vy_i\])", code) == ["s0", "s1", "s2"]
    # The loop variable's program name is on its for line.
    assert re.search(r"for \(unsigned v2 = t\d+; v2 < t\d+; \+\+v2\) \{ /\* i \*/$", code, re.M)
    # Parameters are b0, b1 in binding order.
    assert "const unsigned* __restrict__ b0 /* a: read u32 */," in code
    assert "unsigned* __restrict__ b1 /* out: write u32 */," in code
