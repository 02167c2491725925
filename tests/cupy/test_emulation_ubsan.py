"""The emulator runs under UBSan: undefined behaviour in a kernel fails the suite, clearly.

x86 masks shift counts in hardware, so ``a << 32`` computes ``a`` there and the
IR's answer (count & 31) comes out by accident; a GPU does not mask (PTX ``shl``
clamps). Each test here plants one piece of undefined behaviour in the
generated source (a mutated prelude helper or codegen guard), builds it with
the emulator's real flags and checks that the batch runner refuses it — naming
UBSan's message, the prelude helper or kernel, the program and the launch —
and that the fake device's in-process library reports it without taking pytest
down. They fail if the sanitizer is switched off or loses a check group.
The op-table test checks the ``*.const-rhs`` cases keep their shift counts
literal in the generated code.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np
import pytest

from tests.cupy import emulator, fake_cupy
from tests.cupy.emulator import BuildJob, build_emulator, request_for
from tests.cupy.fake_cupy import FakeDevice, take_sanitizer_reports
from tests.cupy.op_table import CONST_RHS, OpCase, op_cases
from vyre_async.ir import (
    Access,
    Barrier,
    BinOp,
    BufferDecl,
    DType,
    Load,
    Program,
    Store,
    gid,
    lid,
)
from vyre_cupy.codegen import DEFAULT_ENTRY, KernelSource, generate


def _case(name: str) -> OpCase:
    return next(c for c in op_cases() if c.name == name)


def _shared_overrun() -> OpCase:
    """Eight lanes store to a 4-word workgroup array (the codegen guard keeps 4..7 out)."""
    program = Program(
        [
            BufferDecl("src", 0, Access.READ, DType.U32),
            BufferDecl("out", 1, Access.WRITE, DType.U32, 8),
            BufferDecl("tile", 2, Access.WORKGROUP, DType.U32, 4),
        ],
        8,
        [
            Store("tile", lid(), Load("src", gid())),
            Barrier(),
            Store("out", gid(), Load("tile", lid())),
        ],
        op_id="ubsan.shared-overrun",
    )
    return OpCase("shared-overrun", program, (np.arange(8, dtype=np.uint32),))


@dataclasses.dataclass(frozen=True)
class Planted:
    """One piece of undefined behaviour: ``pattern`` -> ``replacement`` in the generated C."""

    name: str
    pattern: str  # a regular expression
    replacement: str
    case: Callable[[], OpCase]
    message: str  # a regular expression UBSan's report must match
    where: str


PLANTED = [
    Planted(
        "shl-u32-unmasked",
        re.escape("return a << (b & 31u);"),
        "return a << b;",
        lambda: _case("shl.u32.const-rhs"),
        r"shift exponent \d+ is too large for 32-bit type 'unsigned int'",
        "prelude helper vy_shl_u32",
    ),
    Planted(
        "shr-i32-unmasked",
        re.escape("return a >> ((unsigned)b & 31u);"),
        "return a >> b;",
        lambda: _case("shr.i32.const-rhs"),
        r"shift exponent -?\d+ is (negative|too large)",
        "prelude helper vy_shr_i32",
    ),
    Planted(
        "add-i32-signed",
        re.escape("return (int)((unsigned)a + (unsigned)b);"),
        "return a + b;",
        lambda: _case("add.i32"),
        r"signed integer overflow",
        "prelude helper vy_add_i32",
    ),
    Planted(
        "f2i-unclamped",
        re.escape("VY_FN int vy_f2i(float x) {"),
        "VY_FN int vy_f2i(float x) { return (int)x;",
        lambda: _case("cast.f32.i32"),
        r"outside the range of representable values of type 'int'",
        "prelude helper vy_f2i",
    ),
    Planted(
        "shared-store-unguarded",
        r"if \([\w.]+ < 4u\) (VY_STORE\(&s0\[)",
        r"\1",
        _shared_overrun,
        r"index \d+ out of bounds for type 'unsigned int ?\[4\]'",
        "kernel k1 (program ubsan.shared-overrun)",
    ),
]


def _plant(monkeypatch: pytest.MonkeyPatch, planted: Planted, target: Program) -> list[int]:
    """Make the emulator build its kernels from mutated source (the real codegen, then ``sub``).

    Returns a list that receives how often the pattern matched in ``target``'s kernel.
    """
    matched: list[int] = []

    def mutated(program: Program, *, entry: str = DEFAULT_ENTRY) -> KernelSource:
        kernel = generate(program, entry=entry)
        source, count = re.subn(planted.pattern, planted.replacement, kernel.source)
        if program is target:
            matched.append(count)
        return dataclasses.replace(kernel, source=source)

    monkeypatch.setattr(emulator, "generate", mutated)
    return matched


Built = tuple[BuildJob, list[OpCase], list[int]]


@pytest.fixture(scope="module")
def planted_builds() -> dict[str, Built]:
    """Start every mutated batch-runner build at once: ``xor.u32`` (k0), then the victim (k1)."""
    builds = {}
    for planted in PLANTED:
        cases = [_case("xor.u32"), planted.case()]
        with pytest.MonkeyPatch.context() as patch:  # the sources are generated before Popen
            matched = _plant(patch, planted, cases[1].program)
            builds[planted.name] = (build_emulator([c.program for c in cases]), cases, matched)
    return builds


@pytest.mark.parametrize("planted", PLANTED, ids=lambda p: p.name)
def test_the_batch_runner_stops_at_undefined_behaviour(
    planted_builds: dict[str, Built], planted: Planted
) -> None:
    build, cases, matched = planted_builds[planted.name]
    assert matched and all(matched), f"{planted.pattern!r} is not in the generated source"
    requests = [request_for(k, c.program, c.inputs) for k, c in enumerate(cases)]
    with pytest.raises(AssertionError, match="undefined behaviour") as info:
        build.wait().run(requests)
    text = str(info.value)
    assert re.search(planted.message, text), text
    assert f"in {planted.where} at unit.cpp:" in text, text
    assert f"launch 1 of 2: kernel k1 (program {cases[1].program.op_id})" in text, text


def test_the_fake_device_logs_undefined_behaviour_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = _case("shl.u32.const-rhs")
    matched = _plant(monkeypatch, PLANTED[0], case.program)
    library = build_emulator([case.program], library=True).wait().binary
    assert matched == [1], f"{PLANTED[0].pattern!r} is not in the generated source"
    device = FakeDevice(library, [case.program])
    (values,) = case.inputs
    out = np.zeros(values.size * len(CONST_RHS[BinOp.SHL, DType.U32]), np.uint32)
    lens = np.array([values.size, out.size], np.uint32)
    assert take_sanitizer_reports() == []
    pointers = [values.ctypes.data, out.ctypes.data, lens.ctypes.data]
    device.launch(0, False, (1, 1, 1), (64, 1, 1), pointers)
    reports = take_sanitizer_reports()
    assert reports, "the planted shift by 32 was not reported"
    assert re.search(PLANTED[0].message, reports[0]), reports
    assert "in prelude helper vy_shl_u32 at unit.cpp:" in reports[0], reports
    assert "during a launch of k0 (program optable.shl.u32.const-rhs)" in reports[0], reports
    assert device.launches == 1  # the launch finished: the test process is still here


def test_reports_left_after_a_test_phase_fail_it() -> None:
    with fake_cupy._UBSAN.lock:
        fake_cupy._UBSAN.reports.append("UBSan: planted report -- in kernel k9")
    with pytest.raises(pytest.fail.Exception, match="planted report -- in kernel k9"):
        fake_cupy.fail_on_sanitizer_reports()
    assert take_sanitizer_reports() == []


def test_shift_counts_and_divisors_are_literals_in_the_generated_kernels() -> None:
    cases = {c.name: c for c in op_cases()}
    assert {(op.value, dt.value) for op, dt in CONST_RHS} >= {
        ("shl", "u32"),
        ("shr", "u32"),
        ("shl", "i32"),
        ("shr", "i32"),
    }
    for (op, dtype), constants in CONST_RHS.items():
        if op.value in ("shl", "shr"):
            assert {32, 33} <= set(constants) and (0xFFFF_FFFF in constants or -1 in constants)
        source = generate(cases[f"{op.value}.{dtype.value}.const-rhs"].program).source
        operands = re.findall(rf"vy_{op.value}_{dtype.value}\(\w+, ([^;]+)\);", source)
        # the plain kernel and the batch kernel: each constant once, as a C literal
        assert len(operands) == 2 * len(constants), operands
        assert not [o for o in operands if re.match(r"[tv]\d", o)], operands
