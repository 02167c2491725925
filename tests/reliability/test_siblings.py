"""Issue 26: siblings of the defects it named, found by a probe of the code after they were fixed.

Each test names the defect it is a sibling of. Every one of these raised a raw
Python exception, accepted a value it then failed on, or took one spelling of a
value where a neighbour took another; each now holds the rule its defect set.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests.helpers import backend_of
from vyre_async import (
    BackendRegistration,
    ConformanceCase,
    DiskPipelineCache,
    DispatchConfig,
    InvalidProgram,
    ShadowBackend,
    acquire_backend,
    assert_conformance,
    compile,
    telemetry,
)
from vyre_async._calibration import Calibration, CalibrationStore, calibration_key
from vyre_async._graph import ArmGraph
from vyre_async._pending import PendingDispatch, wait_for_callbacks
from vyre_async.ir import Const, DType, i32, u32
from vyre_async.programs import elementwise_xor
from vyre_reference import ReferenceExecutor, reference_backend

A = np.arange(8, dtype=np.uint32)


def _refused(call: Any) -> InvalidProgram:
    with pytest.raises(InvalidProgram, match="Fix:") as info:
        call()
    return info.value


# Defect 9 (one rule): waits take any real number, of any size ------------------------
@pytest.mark.parametrize(
    "timeout", [np.float32(5), np.int64(5), Fraction(5), 1e10, math.inf, 10**400]
)
def test_result_takes_the_timeouts_dispatch_config_takes(timeout: Any) -> None:
    pending = acquire_backend("reference").dispatch(elementwise_xor(8), [A, A])
    assert pending.result(timeout=timeout)[0].tolist() == [0] * 8


def test_waits_on_callbacks_and_prefetches_take_any_size_and_refuse_non_numbers() -> None:
    for huge in (1e10, math.inf, 10**400):
        # A fresh callback per value, held until the wait began: each value is
        # checked by a real wait, never one with nothing pending.
        pending, completer = PendingDispatch.create()
        gate, ran = threading.Event(), threading.Event()
        pending.add_done_callback(lambda _, gate=gate, ran=ran: gate.wait(10) and ran.set())
        completer.resolve([A])
        threading.Timer(0.05, gate.set).start()
        assert wait_for_callbacks(huge)
        assert ran.is_set(), huge  # it returned once the held callback had run
    backend = reference_backend()
    assert backend.prefetcher is not None and backend.prefetcher.drain(1e10)
    for bad in ("abc", "1", [1]):
        _refused(lambda bad=bad: wait_for_callbacks(bad))
        _refused(lambda bad=bad: backend.prefetcher.drain(bad))  # type: ignore[union-attr]
    anyio.run(backend.aclose)


@pytest.mark.parametrize(
    ("field", "value", "kept"),
    [("ulp_budget", np.int64(2), 2), ("max_output_bytes", np.int32(64), 64),
     ("fixpoint_iterations", np.uint8(3), 3)],
)  # fmt: skip
def test_config_counts_take_numpy_integers_as_the_overrides_do(
    field: str, value: Any, kept: int
) -> None:
    config = DispatchConfig(**{field: value})
    assert getattr(config, field) == kept and type(getattr(config, field)) is int


def test_config_modes_refuse_arrays_with_a_fix() -> None:
    _refused(lambda: DispatchConfig(speculation=np.array(["auto", "x"])))  # type: ignore[arg-type]


def test_ir_integer_constants_take_numpy_integers_and_bools_only_bools() -> None:
    assert u32(np.uint32(5)).value == 5 and i32(np.int64(-5)).value == -5
    assert Const(DType.BOOL, np.bool_(True)).value is True
    for bad in (np.float32(1.0), 1.0, np.array([1, 0])):
        _refused(lambda bad=bad: Const(DType.BOOL, bad))
    _refused(lambda: u32(np.bool_(True)))


def test_upload_and_alloc_take_the_same_labels() -> None:
    backend = acquire_backend("reference")
    for call in (
        lambda: backend.upload(A, label=123),  # type: ignore[arg-type]
        lambda: backend.upload(A.tobytes(), label=123),  # type: ignore[arg-type]
        lambda: backend.alloc("u32", 4, label=123),  # type: ignore[arg-type]
    ):
        _refused(call)


# Defect 8 (raw exceptions) ------------------------------------------------------------
@pytest.mark.parametrize("precedence", [None, "x", float("nan"), True])
def test_a_bad_precedence_is_refused_before_it_breaks_every_lookup(precedence: Any) -> None:
    _refused(lambda: BackendRegistration(id="bad", factory="a:b", precedence=precedence))


@pytest.mark.parametrize("make", [DiskPipelineCache, CalibrationStore])
def test_a_root_with_no_file_system_name_is_refused(make: Any) -> None:
    _refused(lambda: make("\ud800"))


def test_the_calibration_store_refuses_keys_without_utf8_and_skips_damaged_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CalibrationStore(tmp_path)
    _refused(lambda: store.load("\ud800", "1", "x"))
    _refused(lambda: store.load(None, "1", "x"))  # type: ignore[arg-type]
    key = calibration_key("reference", "1", "cpu")
    (tmp_path / f"{key}.json").write_text(
        '{"format_version": 2, "backend_id": "reference", "backend_version": "1", '
        '"device_fingerprint": "cpu", "launch_ns": 1, "measured_at": 1' + "0" * 400 + "}"
    )
    with caplog.at_level(logging.WARNING, logger="vyre_async._calibration"):
        assert store.load("reference", "1", "cpu") is None
        assert store.entries() == []
    assert "unreadable" in caplog.text
    with pytest.raises(ValueError, match="finite"):
        Calibration(backend_id="r", backend_version="1", device_fingerprint="c", launch_ns=1,
                    measured_at=10**400)  # fmt: skip


def test_arm_graph_arguments_are_checked_with_a_fix() -> None:
    graph = ArmGraph(label="t")
    graph.resource("x", "u32", 8)
    graph.resource("y", "u32", 8)
    xor = elementwise_xor(8)
    backend = acquire_backend("reference")
    _refused(lambda: graph.arm(xor, {"a": ["x"], "b": "x", "out": "y"}))  # type: ignore[dict-item]
    _refused(lambda: graph.arm(xor, {"a": "x", "b": "x", "out": "y"}, label=5))  # type: ignore[arg-type]
    graph.arm(xor, {"a": "x", "b": "x", "out": "y"})
    for call in (
        lambda: graph.run(None),  # type: ignore[arg-type]
        lambda: graph.run(backend, [["z"]]),  # type: ignore[list-item]
        lambda: graph.run(backend, values=[1]),  # type: ignore[arg-type]
        lambda: graph.run(backend, residency=np.array(["auto"])),  # type: ignore[arg-type]
    ):
        _refused(lambda call=call: anyio.run(call))


def test_shadow_and_conformance_arguments_are_checked() -> None:
    primary, reference = reference_backend(), acquire_backend("reference")
    _refused(lambda: ShadowBackend(primary, reference, seed=[1]))  # type: ignore[arg-type]
    half = ShadowBackend(primary, reference, sample_rate=np.float32(0.5))
    assert half.executor.sample_rate == 0.5
    quarter = ShadowBackend(primary, reference, sample_rate=Fraction(1, 4))
    assert quarter.executor.sample_rate == 0.25
    _refused(lambda: assert_conformance(primary, reference, iter([])))  # proves nothing
    _refused(lambda: assert_conformance(primary, reference, [None]))  # type: ignore[list-item]
    _refused(lambda: assert_conformance(primary, reference, "ab"))  # type: ignore[arg-type]
    case = ConformanceCase(label="xor", program=elementwise_xor(8), inputs=[A, A])
    _refused(lambda: assert_conformance(None, reference, [case]))  # type: ignore[arg-type]
    assert_conformance(primary, reference, iter([case]))  # an iterator of one case: checked
    anyio.run(primary.aclose)


def test_other_raw_errors_are_invalid_programs(tmp_path: Path) -> None:
    backend = acquire_backend("reference")
    _refused(lambda: compile(None, elementwise_xor(8)))  # type: ignore[arg-type]
    _refused(lambda: backend.pipeline_identity(elementwise_xor(8), "x"))  # type: ignore[arg-type]
    _refused(lambda: backend.pipeline_identity("xor"))  # type: ignore[arg-type]
    cache = DiskPipelineCache(tmp_path / "cache")
    for payload in (None, "s", np.zeros(3)):
        _refused(lambda payload=payload: cache.put("0" * 64, payload))  # type: ignore[arg-type]


def test_trace_detail_and_the_telemetry_switch_refuse_what_they_cannot_read() -> None:
    _refused(lambda: telemetry.set_trace_detail(5))  # type: ignore[arg-type]
    _refused(lambda: telemetry.set_enabled("off"))  # type: ignore[arg-type]  # (read as True!)
    code = "import vyre_async.telemetry as t; print(t.is_enabled())"
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "VYRE_TELEMETRY": "disabled"},
    )  # fmt: skip
    # said (never silently on), yet no import fails over it, even under -W error
    assert done.returncode == 0 and done.stdout.strip() == "True"
    assert "VYRE_TELEMETRY='disabled'" in done.stderr and "Fix:" in done.stderr


@pytest.mark.parametrize("value", ["-5", "0", "inf", "1e12", "nan"])
def test_an_otlp_timeout_that_is_not_positive_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from vyre_async.tracing import configure_tracing

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", value)
    error = _refused(lambda: configure_tracing("otlp"))
    assert "OTEL_EXPORTER_OTLP_TIMEOUT" in str(error)


def test_a_failed_otlp_export_counts_its_spans_dropped() -> None:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from vyre_async.tracing import _SkipAfterFailure

    class Dead(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.FAILURE

    exporter = _SkipAfterFailure(Dead(), pause_s=5.0)
    exporter.export([object()] * 50)  # type: ignore[list-item]
    exporter.export([object()] * 3)  # type: ignore[list-item]  # (paused: dropped)
    assert exporter.dropped_spans == 53


def test_the_prefetcher_checks_its_settings_and_never_keeps_a_dead_worker() -> None:
    from vyre_async._prefetch import Prefetcher

    store = reference_backend(prefetch=False).store
    for kwargs in ({"max_queue": None}, {"capacity": 0}, {"window": "x"}, {"idle_s": "x"},
                   {"idle_s": -1}, {"idle_s": float("nan")}):  # fmt: skip
        _refused(lambda kwargs=kwargs: Prefetcher(store, **kwargs))
    assert Prefetcher(store, idle_s=1e300).idle_s == 86_400.0  # (a wait the clock can time)


def test_a_slow_on_divergence_never_holds_up_the_caller() -> None:
    # on_divergence blocks until released (not a sleep to outlast): the result must
    # come back while it is still blocked, however slow this machine is.
    release, finished = threading.Event(), threading.Event()

    def slow(_: object) -> None:
        release.wait(30)
        finished.set()

    class Wrong(ReferenceExecutor):
        def enqueue(self, launch: Any) -> None:
            launch.completer.resolve([np.full(8, 99, np.uint32)])  # settles at once, wrongly

    # The reference runs on a worker (never inline): its comparison comes later still.
    primary, reference = backend_of(Wrong), reference_backend(inline_ns=0)
    shadow = ShadowBackend(primary, reference, sample_rate=1.0, on_divergence=slow)
    started = time.monotonic()
    out = shadow.dispatch(elementwise_xor(8), [A, A]).result(timeout=10)
    took = time.monotonic() - started
    assert not finished.is_set()  # served while on_divergence had not returned
    assert out[0].tolist() == [99] * 8  # the primary's answer, served at once
    assert took < 0.5
    release.set()
    anyio.run(shadow.flush)  # every comparison of the dispatches sampled so far
    assert finished.is_set()
    assert shadow.executor.stats.compared == shadow.executor.stats.divergences == 1
    for backend in (primary, reference):
        anyio.run(backend.aclose)
