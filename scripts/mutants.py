#!/usr/bin/env python3
"""Plant known bugs one at a time and check that the tests meant to catch each one do.

Each `Mutant` is one small, realistic bug: an exact text replacement in one file
of the repository (code or docs) and the pytest node ids that must fail with it.
For every mutant the script copies the repository's files (those git tracks or
would track: ``git ls-files -co --exclude-standard``) into a temporary folder,
plants the bug there (the working tree is never touched), runs the named tests
against that copy and records whether every one of them failed (a pytest plugin
records the failed node ids; a named folder counts as caught on any failure).
The same tests are first run on an unchanged copy, where they must all pass.

    python scripts/mutants.py            # every mutant; exit status 1 if one survives
    python scripts/mutants.py -k shift   # the mutants whose name contains "shift"
    python scripts/mutants.py --list     # names, files and tests, nothing run
    python scripts/mutants.py --jobs 1   # one at a time (default: two, each in its own copy)

Progress goes to stderr, one line per mutant as each ends, then the count caught and the time
taken; the summary is one JSON object on
stdout (per mutant: caught or not, the tests that failed, seconds). A mutant whose
``old`` text no longer appears exactly once is reported as ``stale`` (fix the
mutant after a refactor; it fails the run too).

The catalogue started from issue 18: twenty bugs planted in 0.1.0 of which five
survived the suite; each of those five (and its neighbours) is here with the test
added to catch it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``old`` (which must occur exactly once) by ``new`` in ``path``."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


V = "tests/ir/test_validate.py::"
ID = "tests/driver/test_identity.py::"
P = "tests/driver/test_pending.py::"
PF = "tests/policies/test_prefetch.py::"
PROM = "tests/telemetry/test_prometheus_exposition.py::"
DIFF = (
    "tests/reference/test_differential.py::test_every_enumerated_case_matches_the_slow_interpreter"
)
TIMELINE = "tests/test_timeline.py::test_any_trace_becomes_a_timeline_perfetto_nests_as_meant"
WGPU = "tests/wgpu/test_wgpu_backend.py::"
WGPU_DIFF = "tests/wgpu/test_wgpu_differential.py::"
TABLE = "tests/telemetry/test_attribute_table.py::test_every_documented_attribute_is_on_a_span_and_no_other[asyncio]"  # noqa: E501

#: The operator edge cases (runtime and constant shift counts) and the corpus, in the
#: emulator and on the fake device: every prelude helper runs there under UBSan.
EMULATED_OPERATORS = (
    "tests/cupy/test_emulation_corpus.py::test_every_operator_on_edge_values_matches_the_reference",
    "tests/cupy/test_emulation_corpus.py::test_every_corpus_case_is_byte_identical",
    "tests/cupy/test_cupy_fake_device.py::test_gpu_every_operator_on_edge_values",
)

MUTANTS: tuple[Mutant, ...] = (
    # 1. Validator: a rule checked for one buffer kind and not another.
    Mutant(
        "validator-v006-write-only",
        "src/vyre_async/ir/validate.py",
        "if decl.count == 0 and decl.access in (Access.WRITE, Access.WORKGROUP):",
        "if decl.count == 0 and decl.access is Access.WRITE:",
        (
            V + "test_rule_per_buffer_kind[V006-WORKGROUP]",
            V + "test_zero_count_buffer_is_refused_before_it_runs[workgroup]",
        ),
        "V006 forgot WORKGROUP buffers: a zero-sized shared array validated",
    ),
    Mutant(
        "validator-v013-read-only-kinds",
        "src/vyre_async/ir/validate.py",
        "_READ_ONLY = (Access.READ, Access.UNIFORM)",
        "_READ_ONLY = (Access.READ,)",
        (
            V + "test_rule_per_buffer_kind[V013-UNIFORM]",
            V + "test_rule_per_buffer_kind[V014-UNIFORM]",
        ),
        "stores into UNIFORM buffers accepted",
    ),
    Mutant(
        "validator-v023-workgroup-atomics",
        "src/vyre_async/ir/validate.py",
        "if decl.dtype is DType.U32 and (storage or decl.access is Access.WORKGROUP):",
        "if decl.dtype is DType.U32 and storage:",
        (V + "test_rule_per_buffer_kind[V023-WORKGROUP]",),
        "atomics on u32 WORKGROUP buffers refused",
    ),
    Mutant(
        "validator-v027-uniform-loads",
        "src/vyre_async/ir/validate.py",
        "index.uni if decl.access is Access.UNIFORM else _DIVERGENT",
        "index.uni if decl.access in (Access.UNIFORM, Access.READ) else _DIVERGENT",
        (V + "test_rule_per_buffer_kind[V027-READ]",),
        "loads from READ buffers treated as uniform: a divergent barrier validated",
    ),
    # 2. Cache identity: an input left out of the key.
    Mutant(
        "identity-without-compiler",
        "src/vyre_async/_cache/identity.py",
        "            device_fingerprint.encode(),\n            compiler.encode(),\n",
        "            device_fingerprint.encode(),\n",
        (
            ID + "test_each_input_changes_the_identity[compiler version]",
            ID + "test_each_input_changes_the_identity[compiler target]",
            ID + "test_a_backend_hook_changes_its_identities[compiler fingerprint]",
            ID
            + "test_a_disk_entry_from_another_compiler_or_device_is_not_loaded[compiler fingerprint]",  # noqa: E501
            "tests/cupy/test_cupy_identity.py::test_an_entry_from_another_nvrtc_is_not_loaded[nvrtc version]",  # noqa: E501
            "tests/cupy/test_cupy_identity.py::test_an_entry_from_another_nvrtc_is_not_loaded[target architecture]",  # noqa: E501
        ),
        "two NVRTC versions or targets shared one key: another compiler's cubin loaded",
    ),
    Mutant(
        "identity-backend-skips-compiler",
        "src/vyre_async/_store.py",
        "            compiler=backend.compiler_fingerprint(),\n",
        "",
        (
            ID + "test_a_backend_hook_changes_its_identities[compiler fingerprint]",
            ID
            + "test_a_disk_entry_from_another_compiler_or_device_is_not_loaded[compiler fingerprint]",  # noqa: E501
        ),
        "the backend never passes its compiler fingerprint to the identity",
    ),
    Mutant(
        "identity-without-backend-version",
        "src/vyre_async/_cache/identity.py",
        "            backend_version.encode(),\n",
        "",
        (
            ID + "test_each_input_changes_the_identity[backend version]",
            ID + "test_backend_id_and_version_change_its_identities",
        ),
        "a new backend version reuses pipelines built by the old one",
    ),
    Mutant(
        "identity-without-options",
        "src/vyre_async/_cache/identity.py",
        "program_digest = program.kernel_digest(compile_options)",
        "program_digest = program.kernel_digest()",
        (
            ID + "test_each_input_changes_the_identity[compile options]",
            ID + "test_a_disk_entry_from_another_compiler_or_device_is_not_loaded[compile options]",
        ),
        "compile options left out of the key",
    ),
    Mutant(
        "identity-fixed-key-version",
        "src/vyre_async/_cache/identity.py",
        'b"vyre-pipeline-v%d" % CACHE_KEY_VERSION',
        'b"vyre-pipeline-v1"',
        (ID + "test_the_key_version_changes_the_identity",),
        "bumping CACHE_KEY_VERSION changes nothing",
    ),
    # 3. Timeouts counted from the await instead of from dispatch().
    Mutant(
        "timeout-from-await",
        "src/vyre_async/_pending.py",
        "loop.call_later(core.remaining(), _set_future, waiter.future)",
        "loop.call_later(math.inf if core.timeout is None else core.timeout, _set_future, "
        "waiter.future)",
        (P + "test_a_late_await_keeps_the_deadline_of_dispatch[asyncio]",),
        "a timeout awaited late (asyncio) waits its whole length again from the await",
    ),
    Mutant(
        "timeout-from-await-trio",
        "src/vyre_async/_pending.py",
        "trio.move_on_at(trio.current_time() + core.remaining())",
        "trio.move_on_at(trio.current_time() + (core.timeout or math.inf))",
        (P + "test_a_late_await_keeps_the_deadline_of_dispatch[trio]",),
        "a timeout awaited late (trio) waits its whole length again from the await",
    ),
    Mutant(
        "timeout-from-result",
        "src/vyre_async/_pending.py",
        "woken = _wait(waiter.event, min(limit, core.remaining()))",
        "woken = _wait(waiter.event, min(limit, to_seconds(core.timeout or math.inf)))",
        (
            P + "test_a_late_result_keeps_the_deadline_of_dispatch[None]",
            P + "test_a_late_result_keeps_the_deadline_of_dispatch[60.0]",
        ),
        "result() waits the whole timeout again from the call",
    ),
    Mutant(
        "timeout-from-enqueue",
        "src/vyre_async/_frontend.py",
        "timeout=cfg.timeout, label=cfg.label, created=call.called",
        "timeout=cfg.timeout, label=cfg.label",
        (P + "test_the_deadline_counts_compilation_in_dispatch",),
        "the deadline starts after compilation, not at dispatch()",
    ),
    # 4. Cancelled awaits leave their waker on the dispatch.
    Mutant(
        "waker-kept-on-cancel",
        "src/vyre_async/_pending.py",
        "        core.remove_waiter(waiter)\n        hook = core.record.on_await_cancelled\n",
        "        hook = core.record.on_await_cancelled\n",
        (
            P + "test_cancelled_awaits_leave_no_wakers_behind[asyncio]",
            P + "test_cancelled_awaits_leave_no_wakers_behind[trio]",
            P + "test_cancelled_awaits_among_live_ones_remove_only_their_own_waker[asyncio]",
        ),
        "100 cancelled awaits left 100 wakers",
    ),
    # 5. A span attribute key that drifted from the docs.
    Mutant(
        "span-key-misspelt-in-code",
        "src/vyre_async/telemetry/_spans.py",
        'final["vyre.queue.time_s"] = queue_s',
        'final["vyre.queue_time_s"] = queue_s',
        (TABLE,),
        "the documented vyre.queue.time_s was never set",
    ),
    Mutant(
        "span-key-misspelt-in-docs",
        "docs/tracing.md",
        "| `vyre.copy.staging` | dispatch |",
        "| `vyre.copy.stage` | dispatch |",
        (TABLE,),
        "the docs name a key no span carries",
    ),
    Mutant(
        "span-key-undocumented",
        "src/backends/vyre_cupy/launch.py",
        'attributes["vyre.copy.staging"] = "pinned"',
        'attributes["vyre.copy.staging"] = "pinned"\n        attributes["vyre.copy.bytes"] = 0',
        (TABLE,),
        "a new attribute shipped without a line in the docs",
    ),
    # 6. CUDA prelude: undefined behaviour that x86 hides (the emulator runs under UBSan).
    *(
        Mutant(
            f"prelude-{name}",
            "src/backends/vyre_cupy/prelude.py",
            old,
            new,
            EMULATED_OPERATORS,
            why,
        )
        for name, old, new, why in (
            (
                "shl-u32-unmasked",
                "vy_shl_u32(unsigned a, unsigned b) { return a << (b & 31u); }",
                "vy_shl_u32(unsigned a, unsigned b) { return a << b; }",
                "u32 shl by >= 32: x86 masks the count, a GPU gives 0",
            ),
            (
                "shr-u32-unmasked",
                "vy_shr_u32(unsigned a, unsigned b) { return a >> (b & 31u); }",
                "vy_shr_u32(unsigned a, unsigned b) { return a >> b; }",
                "u32 shr by >= 32",
            ),
            (
                "shl-i32-unmasked",
                "return (int)((unsigned)a << ((unsigned)b & 31u)); }",
                "return (int)((unsigned)a << (unsigned)b); }",
                "i32 shl by >= 32 or a negative count",
            ),
            (
                "shr-i32-unmasked",
                "vy_shr_i32(int a, int b) { return a >> ((unsigned)b & 31u); }",
                "vy_shr_i32(int a, int b) { return a >> b; }",
                "i32 shr by >= 32 or a negative count",
            ),
            (
                "add-i32-signed-overflow",
                "vy_add_i32(int a, int b) { return (int)((unsigned)a + (unsigned)b); }",
                "vy_add_i32(int a, int b) { return a + b; }",
                "i32 add in signed arithmetic: overflow is undefined (NVRTC may assume it away)",
            ),
        )
    ),
    Mutant(
        "cupy-fingerprint-without-prelude",
        "src/backends/vyre_cupy/backend.py",
        'f"vyre_cupy codegen {CODEGEN_VERSION}; prelude {PRELUDE_DIGEST}"',
        'f"vyre_cupy codegen {CODEGEN_VERSION}"',
        (
            "tests/cupy/test_cupy_identity.py::"
            "test_the_prelude_text_is_part_of_the_compiler_fingerprint",
        ),
        "an edited prelude without a version bump loads kernels built with the old one",
    ),
    Mutant(
        "compile-not-shared",
        "src/vyre_async/_store.py",
        "            running = self._compiling.get(digest)\n",
        "            running = None\n",
        (
            PF + "test_concurrent_compiles_of_one_identity_share_one_build",
            PF + "test_concurrent_compile_errors_reach_every_waiter",
            PF + "test_a_dispatch_racing_the_prefetcher_waits_for_its_compile[asyncio]",
        ),
        "concurrent compiles of one pipeline each build it",
    ),
    # 7. Shape prediction: the deterministic test still sees a prefetcher that does nothing.
    Mutant(
        "prefetch-never-scheduled",
        "src/vyre_async/_frontend.py",
        "            prefetcher.schedule(job)\n",
        "            pass\n",
        (
            PF + "test_cyclic_workload_prefetches_every_pipeline_after_warm_up[asyncio]",
            PF + "test_cyclic_workload_prefetches_every_pipeline_after_warm_up[trio]",
        ),
        "predictions made but never compiled in the background",
    ),
    # 8. Hot-path short cuts (issue 14) must lose nothing they skip.
    Mutant(
        "steady-run-not-in-history",
        "src/vyre_async/_prefetch.py",
        "            self._history.repeat(fp, run)\n",
        "",
        (PF + "test_steady_repeats_count_and_predict_exactly_as_one_by_one_bookkeeping[128-8]",),
        "a steady run's repeats never reach the shape history (predictions drift after it)",
    ),
    Mutant(
        "spin-beside-other-work",
        "src/backends/vyre_cupy/launch.py",
        "            or self.ctx.bridge.in_flight > 1  # others' work: the loop has better to do\n",
        "",
        ("tests/cupy/test_cupy_polling.py::test_a_poll_does_not_spin_otherwise[others-in-flight]",),
        "an awaiting loop spins on one launch while others are in flight",
    ),
    # Neighbours in other layers, sampled for the same kind of gap.
    Mutant(
        "reference-loop-start-view",
        "src/backends/vyre_reference/compile.py",
        "            if start_alias:\n                first = _own(first)\n",
        "",
        (
            "tests/reference/test_corpus.py::"
            "test_case[loop_start_loaded_from_memory_the_body_writes]",
            "tests/reference/test_corpus.py::"
            "test_case[loop_start_loaded_from_memory_the_body_writes_single_lane_workgroups]",
        ),
        "a loop start loaded from memory stays a view: atomics in the body move the counter",
    ),
    Mutant(
        "reference-ctz-of-zero",
        "src/backends/vyre_reference/arith.py",
        "np.where(length == 0, 32, length - 1)",
        "np.where(length == 0, 31, length - 1)",
        (
            "tests/reference/test_arith.py::test_unary_ops[ctz-u32]",
            "tests/reference/test_corpus.py::test_case[u32_bit_counts]",
        ),
        "ctz(0) is 31 instead of 32",
    ),
    Mutant(
        "reference-u32-division-by-zero",
        "src/backends/vyre_reference/arith.py",
        "np.where(zero, _U32_MAX, q)",
        "np.where(zero, _ZERO_U32, q)",
        (
            "tests/reference/test_arith.py::test_binary_ops[div-u32]",
            "tests/reference/test_corpus.py::test_case[u32_div_mod]",
        ),
        "u32 x / 0 gives 0 instead of 0xFFFFFFFF",
    ),
    Mutant(
        "arms-write-after-read-missed",
        "src/vyre_async/policies/arms.py",
        "    if b.writes:\n        war = a.reads & b.writes",
        "    if b.writes and False:\n        war = a.reads & b.writes",
        ("tests/policies/test_arms.py::test_reason_is_not_symmetric_but_the_answer_is",),
        "an arm overwriting what an earlier arm reads runs beside it",
    ),
    Mutant(
        "wire-select-arms-swapped",
        "src/vyre_async/ir/wire.py",
        "return Select(cond, if_true, self.expr(sub))",
        "return Select(cond, self.expr(sub), if_true)",
        ("tests/ir/test_wire.py::test_round_trip_is_exact",),
        "decoding swaps the arms of Select",
    ),
    # (disk-checksum-ignored and disk-key-ignored were here: mutmut makes those bugs itself,
    # `!=` turned `==` on the same lines, and scripts/mutation.py's cache run kills them.)
    Mutant(
        "pending-taken-twice",
        "src/vyre_async/_pending.py",
        "            if self.taken:\n",
        "            if False:\n",
        (P + "test_result_can_be_taken_once[asyncio]",),
        "a result can be taken twice",
    ),
    Mutant(
        "poll-leaves-its-claim-open",
        "src/backends/vyre_cupy/completion.py",
        "waiting[0] = _CLAIMED  # it leaves the queue once finished",
        "pass",
        (
            "tests/cupy/test_cupy_polling.py::"
            "test_the_thread_does_not_finish_a_watch_while_a_poll_finishes_the_one_before",
        ),
        "a watch a poll is finishing stays claimable: the bridge thread finishes it again",
    ),
    Mutant(
        "thread-leaves-its-claim-open",
        "src/backends/vyre_cupy/completion.py",
        "                queue[0] = _CLAIMED\n",
        "                pass\n",
        (
            "tests/cupy/test_cupy_polling.py::"
            "test_a_poll_does_not_finish_a_watch_while_the_thread_finishes_the_one_before",
        ),
        "a watch the bridge thread is finishing stays claimable: a poll finishes it again",
    ),
    Mutant(
        "cached-lane-value-writable",
        "src/backends/vyre_reference/lanes.py",
        "        result.flags.writeable = False\n",
        "",
        ("tests/reference/test_fast_paths.py",),
        "a lane set's cached value is adopted as a buffer and changed by a later store",
    ),
    Mutant(
        "uniform-bound-unwrapped",
        "src/backends/vyre_reference/compile.py",
        "return value.c % _MOD if value.is_uniform else None",
        "return value.c if value.is_uniform else None",
        ("tests/reference/test_fast_paths.py",),
        "a constant reached by wrapping bounds a comparison unwrapped",
    ),
    # The reference engine's fast paths (issue 28): a value left a view of buffer memory, or
    # an index window cut short. mutmut cannot make these (it does not drop a call it keeps
    # the value of); the differential generators were built to catch them.
    Mutant(
        "reference-let-keeps-a-view",
        "src/backends/vyre_reference/compile.py",
        "frame.env[name] = _own(fn(frame))",
        "frame.env[name] = fn(frame)",
        (DIFF + "[alias]",),
        "a let of a value read from a writable buffer (through a cast) changes with a later store",
    ),
    Mutant(
        "reference-assign-keeps-a-view",
        "src/backends/vyre_reference/compile.py",
        "env[name] = _own(new) if alias else new",
        "env[name] = new",
        (DIFF + "[alias]",),
        "an assigned value read from a writable buffer changes with a later store",
    ),
    Mutant(
        "reference-atomic-statement-load-keeps-a-view",
        "src/backends/vyre_reference/compile.py",
        "return _own(reader(frame.lanes, frame.state.arrays[buffer], index_fn(frame)))",
        "return reader(frame.lanes, frame.state.arrays[buffer], index_fn(frame))",
        (DIFF + "[alias]",),
        "a load in a statement with an atomic sees the atomic's write to the same buffer",
    ),
    Mutant(
        "reference-workgroup-window-rounded-down",
        "src/backends/vyre_reference/memory.py",
        "hi = min(nl, -(-(count - off) // b)) if count > off else 0",
        "hi = min(nl, (count - off) // b) if count > off else 0",
        (DIFF + "[index]",),
        "a strided workgroup window drops its last lane at odd sizes (reads 0 there)",
    ),
    # 9. Formats read back by real parsers (issue 28): Prometheus text, OTLP/JSON, Perfetto.
    Mutant(
        "prometheus-buckets-not-cumulative",
        "src/vyre_async/telemetry/_prometheus.py",
        "running += count",
        "running = count",
        (PROM + "test_dispatch_metrics_parse_with_several_metrics_and_label_sets[asyncio]",),
        "each bucket held its own count, not the running total (survived before issue 28)",
    ),
    Mutant(
        "prometheus-backslash-unescaped",
        "src/vyre_async/telemetry/_prometheus.py",
        'return value.replace("\\\\", "\\\\\\\\")',
        "return value",
        (PROM + "test_dispatch_metrics_parse_with_several_metrics_and_label_sets[asyncio]",),
        "a backslash in a label value (a program's op_id) written as is",
    ),
    Mutant(
        "prometheus-colliding-labels-repeated",
        "src/vyre_async/telemetry/_prometheus.py",
        'items = [(k, ";".join(v)) for k, v in merged.items()]',
        "items = [(k, x) for k, v in merged.items() for x in v]",
        (PROM + "test_label_names_that_collide_or_are_reserved_give_valid_text",),
        "attributes a.b and a_b became two a_b labels: the parser refuses the line",
    ),
    Mutant(
        "otlp-json-ids-base64",
        "src/vyre_async/tracing.py",
        "                _hex_ids(span)\n",
        "                pass\n",
        ("tests/telemetry/test_export.py::test_file_export_is_valid_otlp_json",),
        "span ids written as protobuf's base64, not OTLP/JSON's hex",
    ),
    Mutant(
        "otlp-json-enum-names",
        "src/vyre_async/tracing.py",
        "use_integers_for_enums=True",
        "use_integers_for_enums=False",
        ("tests/telemetry/test_export.py::test_file_export_is_valid_otlp_json",),
        "span kinds written by name: OTLP/JSON requires integers",
    ),
    Mutant(
        "timeline-child-overflows-its-parent",
        "src/vyre_async/timeline.py",
        "inside = child.end_ns <= end and (child.start_ns < end or start == end)",
        "inside = child.start_ns < end or start == end",
        (TIMELINE,),
        "a child ending after its parent shares its track: Perfetto drops the slice",
    ),
    # The WebGPU backend (issue 30), on lavapipe: skipped, and so not caught, without it.
    Mutant(
        "wgpu-slice-forgets-a-variable",
        "src/backends/vyre_wgpu/codegen.py",
        'self.line(f"vy_state[vy_rec + {index}u] = {_to_word(dtype, cname)};")',
        'self.line(f"vy_state[vy_rec + {index}u] = 0u;") if dtype is DType.F32 else '
        'self.line(f"vy_state[vy_rec + {index}u] = {_to_word(dtype, cname)};")',
        (WGPU + "test_resumed_lanes_keep_every_variable_and_branch",),
        "a lane suspended by lavapipe's loop cap resumes with an f32 variable lost",
    ),
    Mutant(
        "wgpu-fma-without-sticky-bit",
        "src/backends/vyre_wgpu/prelude.py",
        "if (back.x != x.x || back.y != x.y) { r.x = r.x | 1u; }",
        "",
        (WGPU_DIFF + "test_fma_rounds_once",),
        "Fma's smaller addend loses its shifted-out bits: ties round the wrong way",
    ),
    Mutant(
        "wgpu-wide-grid-without-offsets",
        "src/backends/vyre_wgpu/backend.py",
        "words[shader.info_words - 8 : shader.info_words - 5] = base",
        "pass",
        (WGPU + "test_a_grid_wider_than_the_adapter_allows_runs_as_several_launches",),
        "every launch of a split grid believes it starts at workgroup 0",
    ),
    Mutant(
        "registry-prefers-a-cpu-device",
        "src/vyre_async/_registry.py",
        "if backend.capabilities().cpu_device:",
        "if False:",
        ("tests/test_registry.py::test_preferred_never_picks_a_cpu_device",),
        "lavapipe under wgpu presented as the machine's GPU by acquire_preferred_backend",
    ),
    Mutant(
        "reference-grid-barrier-keeps-workgroup-memory",
        "src/backends/vyre_reference/compile.py",
        "                return self._grid_barrier()",
        "                return None",
        (
            "tests/ir/test_split.py::test_the_corpus_grid_programs_split_into_what_they_compute"
            "[grid_barrier_workgroup_memory_is_zero_after]",
        ),
        "the reference keeps a phase's workgroup memory past a GridBarrier (the IR zeroes it)",
    ),
    Mutant(
        "validate-variables-live-across-a-grid-barrier",
        "src/vyre_async/ir/validate.py",
        "        for name in self._scopes.close_top():",
        "        for name in ():",
        ("tests/ir/test_validate.py::test_rule_is_reported_at_the_offending_node[V035]",),
        "a variable declared before a GridBarrier stays in scope past it (no split carries it)",
    ),
    Mutant(
        "split-loses-the-first-phase",
        "src/vyre_async/ir/split.py",
        "kept = [part for part in parts if part] or [[]]",
        "kept = [part for part in parts[1:] if part] or [[]]",
        (
            "tests/ir/test_split.py::test_the_corpus_grid_programs_split_into_what_they_compute"
            "[grid_barrier_many_phases]",
        ),
        "split_at_grid_barriers drops the statements before the first barrier",
    ),
    Mutant(
        "fused-launch-planned-with-the-pipelines-program",
        "src/vyre_async/_fusion.py",
        "launch = front.plan(pipeline, inputs, config, fused.program)",
        "launch = front.plan(pipeline, inputs, config)",
        (
            "tests/driver/test_fusion.py::"
            "test_fused_programs_of_one_body_keep_their_own_buffer_counts",
        ),
        "a fused batch of xors of another length gets the cached fused program's counts",
    ),
    Mutant(
        "graph-fused-enqueue-failure-raises-past-started-launches",
        "src/vyre_async/_fusion.py",
        "        if decision is not None:\n            raise\n",
        "        raise\n",
        (
            "tests/policies/test_graph_fusion.py::"
            "test_an_enqueue_failing_partway_waits_for_the_launch_that_started[asyncio-auto]",
        ),
        "a graph layer's enqueue failure fails a running fused launch's arms and frees its buffers",
    ),
    Mutant(
        "timeline-zero-length-phase-kept",
        "src/vyre_async/timeline.py",
        "if p_start == p_end:",
        "if False:",
        (TIMELINE,),
        "a zero-length phase nests under a neighbouring phase or leaves its dispatch",
    ),
    Mutant(
        "timeline-lane-reused-at-a-zero-length-slice",
        "src/vyre_async/timeline.py",
        "if busy_until < start_ns or (busy_until == start_ns and not zero):",
        "if busy_until <= start_ns:",
        (TIMELINE,),
        "two zero-length slices at one instant on one lane: Perfetto nests one in the other",
    ),
)


def _tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if (ROOT / line).is_file()]


def _copy(files: Sequence[str], dest: Path) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


#: A pytest plugin written into each copy: it appends the node id of every failed
#: test phase or collection to the file named by $VYRE_MUTANT_FAILURES, whatever
#: the output looks like (colours, odd characters in ids).
_REPORTER = """
import os


def _record(nodeid):
    with open(os.environ["VYRE_MUTANT_FAILURES"], "a", encoding="utf-8") as out:
        out.write(nodeid + "\\n")


def pytest_runtest_logreport(report):
    if report.failed:
        _record(report.nodeid)


def pytest_collectreport(report):
    if report.failed:
        _record(report.nodeid or "<collection>")
"""


def _env(copy: Path) -> dict[str, str]:
    """The environment that makes Python import vyre from ``copy`` (ahead of the install)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(copy / "src"), str(copy / "src" / "backends")])
    return env


def _run_tests(copy: Path, tests: Sequence[str], timeout: float) -> tuple[int, set[str], str]:
    """Run ``tests`` in ``copy``; return (exit status, failed node ids, output tail)."""
    (copy / "_vyre_mutant_reporter.py").write_text(_REPORTER)
    failures = copy / "_vyre_mutant_failures.txt"
    failures.write_text("")
    env = _env(copy)
    env["VYRE_MUTANT_FAILURES"] = str(failures)
    env.pop("PYTEST_ADDOPTS", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "_vyre_mutant_reporter", "--color=no", *tests]
    try:
        proc = subprocess.run(
            command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        return -1, set(), f"timed out after {timeout} s\n{out[-2000:]}"
    failed = set(failures.read_text(encoding="utf-8").splitlines())
    return proc.returncode, failed, (proc.stdout + proc.stderr)[-3000:]


def _imports_from(copy: Path) -> bool:
    env = _env(copy)
    probe = "import vyre_async, vyre_cupy, vyre_reference as r; print(vyre_async.__file__)"
    probe += "; print(vyre_cupy.__file__); print(r.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=copy, env=env, capture_output=True, text=True
    )
    return out.returncode == 0 and all(
        Path(line).resolve().is_relative_to(copy.resolve()) for line in out.stdout.split()
    )


def _judge(mutant: Mutant, files: Sequence[str], tmp: Path, timeout: float) -> dict[str, object]:
    """Plant ``mutant`` in a copy of its own under ``tmp``, run its tests, return its entry."""
    copy = tmp / mutant.name
    _copy(files, copy)
    target = copy / mutant.path
    text = target.read_text()
    count = text.count(mutant.old)
    started = time.perf_counter()
    failed: set[str] = set()
    if count != 1:
        verdict, tail = "stale", f"{mutant.old!r} occurs {count} times"
    else:
        target.write_text(text.replace(mutant.old, mutant.new))
        status, failed, tail = _run_tests(copy, mutant.tests, timeout)
        named = {t for t in mutant.tests if "::" in t}  # folders: any failure counts
        is_caught = status == 1 and bool(failed) and named <= failed
        verdict = "caught" if is_caught else "survived"
    seconds = round(time.perf_counter() - started, 1)
    shutil.rmtree(copy, ignore_errors=True)
    missed = sorted({t for t in mutant.tests if "::" in t} - failed)
    lines = [f"{mutant.name}: {verdict} ({seconds} s)"]
    if verdict != "caught":
        lines.append(f"  ({mutant.why}) not failing: {missed}\n{tail}")
    print("\n".join(lines), file=sys.stderr, flush=True)
    entry: dict[str, object] = {
        "name": mutant.name,
        "path": mutant.path,
        "verdict": verdict,
        "seconds": seconds,
        "failed": sorted(failed),
        "missed": missed,
    }
    if verdict != "caught":
        entry["output_tail"] = tail
    return entry


def check(mutants: Sequence[Mutant], timeout: float, jobs: int = 1) -> dict[str, object]:
    """Judge every mutant, ``jobs`` at a time (each in a copy of its own); catalogue order."""
    files = _tracked_files()
    with tempfile.TemporaryDirectory(prefix="vyre-mutants-") as tmp:
        base = Path(tmp) / "base"
        _copy(files, base)
        if not _imports_from(base):
            raise SystemExit("the copy's sources are not the ones imported: is PYTHONPATH ignored?")
        every = sorted({t for m in mutants for t in m.tests})
        started = time.perf_counter()
        # The baseline in ``jobs`` parts at once, each in a pytest of its own.
        parts = [every[i :: max(1, jobs)] for i in range(max(1, jobs)) if every[i:]]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            runs = list(pool.map(lambda part: _run_tests(base, part, timeout), parts))
        status = next((run[0] for run in runs if run[0] != 0), 0)
        print(f"baseline: {len(every)} tests, exit {status}", file=sys.stderr)
        if status != 0:
            tail = next(run[2] for run in runs if run[0] != 0)
            raise SystemExit(f"the tests fail without any planted bug:\n{tail}")
        baseline_s = time.perf_counter() - started
        # Each pytest run is one process on one core: two at once use both of CI's
        # cores (every copy and temporary file is the mutant's own).
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            results = list(pool.map(lambda m: _judge(m, files, Path(tmp), timeout), mutants))
    caught = sum(r["verdict"] == "caught" for r in results)
    return {
        "mutants": len(results),
        "caught": caught,
        "jobs": max(1, jobs),
        "baseline_s": round(baseline_s, 1),
        "results": results,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default="", help="only mutants whose name contains this")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="mutants judged at once (default: 2, or 1 on one core)",
    )
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if args.k in m.name]
    if not chosen:
        parser.error(f"no mutant name contains {args.k!r}")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.why}")
            for t in m.tests:
                print(f"    {t}")
        return 0
    started = time.perf_counter()
    summary = check(chosen, args.timeout, args.jobs)
    minutes, seconds = divmod(round(time.perf_counter() - started), 60)
    print(
        f"mutants: {summary['caught']} of {summary['mutants']} caught in {minutes} min {seconds} s",
        file=sys.stderr,
    )
    print(json.dumps(summary, indent=2))
    return 0 if summary["caught"] == summary["mutants"] else 1


if __name__ == "__main__":
    sys.exit(main())
