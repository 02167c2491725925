"""Unit tests of the CUDA code generator: sanitisation, SSA evaluation, ABI, helpers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.conformance.corpus import cases
from tests.cupy.conftest import Toolchain
from tests.cupy.emulator import request_for
from tests.cupy.unit_programs import HOSTILE_NAMES, hostile_program
from vyre_async.errors import InvalidProgram
from vyre_async.ir import (
    Access,
    Atomic,
    BufferDecl,
    DType,
    If,
    Let,
    Load,
    Program,
    Select,
    Store,
    Var,
    f32,
    gid,
    u32,
)
from vyre_async.programs import elementwise_xor, saxpy, standard_workloads
from vyre_cupy import CODEGEN_VERSION, generate, sanitize
from vyre_cupy.prelude import PRELUDE

_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def _code(source: str) -> str:
    """Return ``source`` without its comments."""
    return _COMMENT.sub("", source)


def _kernel(source: str) -> str:
    """The plain kernel: after the prelude, before the batch kernel (if any)."""
    return source.split("#endif /* VYRE_CUDA_PRELUDE */", 1)[1].split("/* batch kernel:", 1)[0]


def _batch(source: str) -> str:
    return source.split("/* batch kernel:", 1)[1]


# Sanitisation -------------------------------------------------------------------------
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_sanitize_keeps_only_comment_safe_characters(name: str) -> None:
    clean = sanitize(name)
    assert re.fullmatch(r"[A-Za-z0-9_.\-?]*", clean), clean
    assert "*/" not in clean and "/*" not in clean and "\\" not in clean
    assert len(clean) <= 48


def test_hostile_names_never_reach_the_source() -> None:
    source = generate(hostile_program()).source
    assert source.isascii()
    for fragment in ("system(", "rm -rf", "#define int", "#include", "ψ", "\u200b", "*/ "):
        assert fragment not in source
    # Comments open and close in pairs: nothing a name contains can end one early...
    assert source.count("/*") == source.count("*/")
    assert "\\\n" not in source
    # ...and outside comments, names change nothing: the code equals that of a tame twin.
    tame = hostile_program(tuple(f"name{i}" for i in range(len(HOSTILE_NAMES))), op_id="x")
    assert _code(source) == _code(generate(tame).source)


def test_hostile_program_still_runs_correctly(toolchain: Toolchain) -> None:
    index = next(i for i, o in enumerate(toolchain.ops) if o.name == "hostile-names")
    case = toolchain.ops[index]
    [result] = toolchain.ops_build.wait().run([request_for(index, case.program, case.inputs)])
    assert result.outputs[0].tolist() == [3 * ((i + 1) % 8) + 3 for i in range(8)]
    assert result.outputs[1].tolist() == [7] * 8


def test_entry_name_must_be_a_c_identifier() -> None:
    program = elementwise_xor(4)
    assert "void my_kernel_2(" in generate(program, entry="my_kernel_2").source
    for bad in ("2x", "a b", "x;y", "", "é", "a" * 65):
        with pytest.raises(InvalidProgram) as info:
            generate(program, entry=bad)
        assert "Fix:" in str(info.value)


# ABI -------------------------------------------------------------------------------------
def test_abi_one_pointer_per_storage_buffer_then_lengths() -> None:
    kernel = generate(saxpy(16))
    names = [p.name for p in kernel.params]
    assert names == ["x", "y", "alpha", "out"]
    code = _code(kernel.source)
    start = code.index('extern "C" __global__ void vyre_main(')
    signature = code[start : code.index(") {", start)]
    params = [p.strip() for p in signature.split("(", 1)[1].split(",")]
    assert params == [
        "const float* __restrict__ b0",
        "const float* __restrict__ b1",
        "const float* __restrict__ b2",
        "float* __restrict__ b3",
        "const unsigned* __restrict__ vy_lens",
    ]
    assert kernel.shared_bytes == 0 and not kernel.uses_barrier


def test_one_source_serves_every_buffer_size() -> None:
    # Counts of non-workgroup buffers reach the kernel through vy_lens, never as literals.
    assert generate(saxpy(16)).source == generate(saxpy(1 << 20)).source
    assert generate(elementwise_xor(3)).source == generate(elementwise_xor(4096)).source


def test_workgroup_buffers_are_zeroed_shared_arrays() -> None:
    workload = next(w for w in standard_workloads() if w.name == "histogram")
    kernel = generate(workload.program)
    code = _kernel(kernel.source)
    assert "__shared__ unsigned s0[256];" in code
    zero = code.index("s0[vy_i] = 0;")
    assert code.index("__syncthreads();", zero) < code.index("VY_LOAD")
    assert kernel.shared_bytes == 1024 and kernel.uses_barrier


def test_guards_on_every_access() -> None:
    program = Program(
        [
            BufferDecl("a", 0, Access.READ, DType.F32),
            BufferDecl("flags", 1, Access.READ, DType.BOOL),
            BufferDecl("acc", 2, Access.READ_WRITE, DType.U32, 4),
            BufferDecl("out", 3, Access.WRITE, DType.BOOL, 4),
        ],
        4,
        [
            Let("v", Load("a", gid())),
            Let("o", Atomic("max", "acc", gid(), u32(3))),
            Store("out", gid(), Load("flags", gid())),
        ],
    )
    code = _kernel(generate(program).source).replace("(blockIdx.x * blockDim.x + threadIdx.x)", "g")
    assert "(g < n0) ? VY_LOAD(&b0[g]) : 0.0f" in code
    assert "(g < n2) ? atomicMax(VY_ATOMIC(&b2[g]), 0x00000003u) : 0u" in code
    assert "(g < n1) && (VY_LOAD(&b1[g]) != 0u)" in code
    assert re.search(r"if \(g < n3\) VY_STORE\(&b3\[g\], \(t\d+ \? 1u : 0u\)\);", code)


# SSA evaluation ---------------------------------------------------------------------------
def test_select_arms_and_land_operands_are_evaluated_before_use() -> None:
    program = Program(
        [BufferDecl("acc", 0, Access.READ_WRITE, DType.U32, 4)],
        1,
        [
            Let(
                "s",
                Select(
                    Atomic("add", "acc", 0, 1).eq(u32(0)),
                    Atomic("add", "acc", 1, 1),
                    Atomic("add", "acc", 2, 1),
                ),
            ),
            If(
                Atomic("add", "acc", 3, 1).ne(u32(0)).land(Var("s").eq(u32(0))),
                [Store("acc", u32(0), u32(9))],
            ),
        ],
    )
    code = _kernel(generate(program).source)
    lines = code.splitlines()
    atomics = [i for i, line in enumerate(lines) if "atomicAdd" in line]
    select = next(i for i, line in enumerate(lines) if " ? t" in line and "atomic" not in line)
    land = next(i for i, line in enumerate(lines) if "&&" in line)
    assert len(atomics) == 4
    assert atomics[:3] == sorted(atomics[:3]) and atomics[2] < select < atomics[3] < land
    # Every temporary is a const assigned exactly once.
    temps = re.findall(r"const \w+ (t\d+) =", code)
    assert len(temps) == len(set(temps)) > 8


def test_ssa_program_runs_both_arms(toolchain: Toolchain) -> None:
    index = next(i for i, o in enumerate(toolchain.ops) if o.name == "ssa-both-arms")
    case = toolchain.ops[index]
    [result] = toolchain.ops_build.wait().run([request_for(index, case.program, case.inputs)])
    acc, seen = result.outputs
    initial = np.arange(32, dtype=np.uint32).reshape(8, 4)
    final = acc.reshape(8, 4)
    assert (final[:, :3] - initial[:, :3]).tolist() == [[1, 10, 100]] * 8  # both arms, both sides
    assert (final[:, 3] == (initial[:, 3] | 0x40)).all()
    assert seen.tolist() == [int(initial[g, g % 2]) + 1000 for g in range(8)]


def test_loop_bounds_are_snapshots(toolchain: Toolchain) -> None:
    index = next(i for i, o in enumerate(toolchain.ops) if o.name == "loop-bounds-once")
    case = toolchain.ops[index]
    [result] = toolchain.ops_build.wait().run([request_for(index, case.program, case.inputs)])
    assert result.outputs[0].tolist() == [sum(range(g, g + 5)) for g in range(4)]


def test_oob_atomics_return_zero(toolchain: Toolchain) -> None:
    index = next(i for i, o in enumerate(toolchain.ops) if o.name == "oob-atomics")
    case = toolchain.ops[index]
    [result] = toolchain.ops_build.wait().run([request_for(index, case.program, case.inputs)])
    cell, out, _ = result.outputs
    assert cell.tolist() == [3, 4]
    assert out.tolist() == [1] * 8
    assert result.outputs[2].tolist() == [0] + [5] * 7  # lane 0 returned first


# Helpers and constants ----------------------------------------------------------------
@pytest.mark.parametrize(
    "helper",
    [
        "vy_div_u32",
        "vy_mod_u32",
        "vy_shl_u32",
        "vy_shr_u32",
        "vy_add_i32",
        "vy_sub_i32",
        "vy_mul_i32",
        "vy_neg_i32",
        "vy_div_i32",
        "vy_mod_i32",
        "vy_shl_i32",
        "vy_shr_i32",
        "vy_popc",
        "vy_clz",
        "vy_ctz",
        "vy_fmin",
        "vy_fmax",
        "vy_exp",
        "vy_log",
        "vy_sin",
        "vy_cos",
        "vy_tanh",
        "vy_rsqrt",
        "vy_f2u",
        "vy_f2i",
    ],
)
def test_every_helper_is_defined_once_in_the_prelude(helper: str) -> None:
    assert len(re.findall(rf"VY_FN \w+ {helper}\(", PRELUDE)) == 1
    # Every helper is exercised: the operator table runs each on edge values (ir.md rules).


def test_no_fast_math_constructs() -> None:
    # Only the IEEE-exact _rn intrinsics appear; no fast-math __expf/__fdividef etc.
    sources = "\n".join(generate(c.program).source for c in cases() if c.error is None)
    for fast in ("__expf", "__logf", "__sinf", "__cosf", "__fdividef", "__powf", "rsqrtf"):
        assert fast not in sources
    assert "__fmaf_rn(" in sources and "__fmul_rn(" in sources


def test_constants_keep_their_exact_bits() -> None:
    program = Program(
        [BufferDecl("out", 0, Access.WRITE, DType.F32, 1)],
        1,
        [Store("out", u32(0), (Load("out", u32(0)) + f32(-0.0)) * f32(float("nan")))],
    )
    code = _kernel(generate(program).source)
    assert "__uint_as_float(0x80000000u)" in code and "__uint_as_float(0x7FC00000u)" in code


def test_line_paths_point_to_ir_statements() -> None:
    kernel = generate(elementwise_xor(8))
    lines = kernel.source.splitlines()
    store = next(i for i, line in enumerate(lines) if "VY_STORE(&" in line)
    assert kernel.path_of_line(store + 1) == "body[1].then[0]"
    assert kernel.path_of_line(1) == ""
    assert kernel.path_of_line(10**6) == ""


def test_header_names_the_codegen_version() -> None:
    assert f"codegen {CODEGEN_VERSION}" in generate(elementwise_xor(4)).source


# The emulator's race detector (what the property test relies on) ------------------------
def test_race_detector_flags_exactly_the_racy_probes(toolchain: Toolchain) -> None:
    base = len(toolchain.ops)
    requests = [
        request_for(
            base + k,
            program,
            [np.zeros(d.count or 8, np.uint32) for d in program.inputs],
            trace=True,
        )
        for k, (_, program, _) in enumerate(toolchain.probes)
    ]
    results = toolchain.ops_build.wait().run(requests)
    verdicts = {name: r.racy for (name, _, _), r in zip(toolchain.probes, results, strict=True)}
    assert verdicts == {name: racy for name, _, racy in toolchain.probes}


def test_the_batch_kernel_ends_a_task_with_goto_and_rebinds_every_buffer() -> None:
    from tests.cupy.unit_programs import early_return

    kernel = generate(early_return())
    assert kernel.batch_entry == "vyre_main_batch" and not kernel.uses_barrier
    batch = _batch(kernel.source)
    assert "return;" not in batch and batch.count("goto vy_next;") == 2
    assert "vy_next:;" in batch and "blockIdx.x; vy_task < vy_tasks; vy_task += gridDim.x" in batch
    assert "b0 = (unsigned*)((char*)vy_p0 + vy_item * vy_stride)" in batch
    assert "blockIdx.x * blockDim.x" not in batch  # workgroup ids come from the task
    assert "return;" in _kernel(kernel.source)  # the plain kernel keeps its returns
    assert generate(elementwise_xor(4)).batch_entry is not None
    with_barrier = [c.program for c in cases() if c.error is None and "barrier" in c.name]
    assert with_barrier and all(generate(p).batch_entry is None for p in with_barrier)
