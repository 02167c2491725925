"""`vyre_async.tracing` in this process: what configure_tracing installs, and what it exports.

tests/telemetry/test_export.py runs whole services in subprocesses; these tests
call the module directly (issue 28: the mutation run only sees code run in
process). configure_tracing installs a global tracer provider, which the
OpenTelemetry API allows once per process: the ``installed`` fixture gives each
test an empty slot and puts the session's provider back afterwards. Spans are
made with the providers' own tracers, never by a dispatch, so the library's
cached tracer never meets these providers.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Link
from opentelemetry.util._once import Once

from tests.otlp_receiver import Receiver, parse_otlp_json
from vyre_async import telemetry, tracing
from vyre_async.errors import InvalidProgram, UnsupportedFeature
from vyre_async.tracing import (
    OtlpJsonFileExporter,
    _SkipAfterFailure,
    configure_tracing,
    spans_to_otlp_json,
)

_SPEC_FIX = "Fix: choose none, console, otlp or file:PATH (for example file:traces.jsonl)"
_OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every OTEL_* variable unset (each test sets the ones it is about), in a folder of its own.

    (A relative trace file, such as a mutant may make, lands in ``tmp_path``.)
    """
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[TracerProvider]]:
    """An empty global tracer provider slot; providers appended here are shut down after."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    detail = telemetry.trace_detail()
    providers: list[TracerProvider] = []
    yield providers
    for provider in providers:
        provider.shutdown()
    telemetry.set_trace_detail(detail)


def _configure(providers: list[TracerProvider], spec: str, **kwargs: Any) -> TracerProvider:
    provider = configure_tracing(spec, **kwargs)
    assert isinstance(provider, TracerProvider)
    providers.append(provider)
    return provider


def _processors(provider: TracerProvider) -> list[Any]:
    """The span processors a provider runs (the SDK keeps no public list of them)."""
    return list(provider._active_span_processor._span_processors)


def _batch(provider: TracerProvider) -> BatchSpanProcessor:
    (processor,) = _processors(provider)
    assert isinstance(processor, BatchSpanProcessor)
    return processor


def _export_timeout_ms(processor: BatchSpanProcessor) -> float:
    return float(processor._batch_processor._export_timeout_millis)


def _otlp(provider: TracerProvider) -> tuple[_SkipAfterFailure, OTLPSpanExporter]:
    exporter = _batch(provider).span_exporter
    assert isinstance(exporter, _SkipAfterFailure)
    assert isinstance(exporter.inner, OTLPSpanExporter)
    return exporter, exporter.inner


def _otlp_timeout_s(exporter: OTLPSpanExporter) -> float:
    """The deadline of one OTLP export, retries included, as the exporter resolved it."""
    return float(exporter._client._timeout)


def _service(provider: TracerProvider) -> object:
    return provider.resource.attributes.get(SERVICE_NAME)


def _ended_spans() -> list[ReadableSpan]:
    """A parent and a child linked to a third span, ended, from a provider of their own."""
    tracer = TracerProvider(resource=Resource.create({SERVICE_NAME: "spans"})).get_tracer("t")
    other = tracer.start_span("other")
    other.end()
    parent = tracer.start_span("parent")
    child = tracer.start_span(
        "child",
        context=trace.set_span_in_context(parent),
        links=[Link(other.get_span_context(), {"why": "because"})],
    )
    child.end()
    parent.end()
    return [parent, child]  # type: ignore[list-item]


# --- configure_tracing: arguments and errors -------------------------------------------------


def test_none_installs_nothing_but_sets_the_detail(installed: list[TracerProvider]) -> None:
    assert configure_tracing("none", detail="phases") is None
    assert telemetry.trace_detail() == "phases"
    assert trace._TRACER_PROVIDER is None


def test_a_spec_that_is_not_a_str_is_refused_with_its_fix() -> None:
    with pytest.raises(InvalidProgram) as info:
        configure_tracing(None)  # type: ignore[arg-type]
    assert str(info.value) == f"the trace spec must be a str, got None\n{_SPEC_FIX}"


@pytest.mark.parametrize("spec", ["file:", "CONSOLE", "jaeger", "file"])
def test_an_unknown_spec_is_refused_with_the_choices(spec: str) -> None:
    with pytest.raises(InvalidProgram) as info:
        configure_tracing(spec)
    assert str(info.value) == (
        f"--trace must be one of none, console, otlp, file:PATH, got {spec!r}\n{_SPEC_FIX}"
    )


@pytest.mark.parametrize("bad", [0, -1.5])
def test_a_bad_export_timeout_names_the_argument_and_an_example(bad: float) -> None:
    with pytest.raises(InvalidProgram) as info:
        configure_tracing("otlp", export_timeout_s=bad)
    assert str(info.value) == (
        f"export_timeout_s must be a finite number of seconds above 0, got {bad!r}\n"
        "Fix: pass e.g. export_timeout_s=2.0"
    )


# --- what each spec installs -----------------------------------------------------------------


def test_console_prints_each_span_as_it_ends(
    installed: list[TracerProvider], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(tracing, "ConsoleSpanExporter", lambda: ConsoleSpanExporter(out=out))
    provider = _configure(installed, "console")
    assert trace.get_tracer_provider() is provider
    (processor,) = _processors(provider)
    assert isinstance(processor, SimpleSpanProcessor)
    provider.get_tracer("t").start_span("printed-at-once").end()
    printed = json.loads(out.getvalue())  # (printed before the provider is shut down)
    assert printed["name"] == "printed-at-once"
    assert printed["resource"]["attributes"]["service.name"] == "vyre-async"
    assert list(tmp_path.iterdir()) == []


def test_file_installs_a_batch_processor_writing_otlp_json_lines(
    installed: list[TracerProvider], tmp_path: Path
) -> None:
    path = tmp_path / "spans.jsonl"
    provider = _configure(installed, f"file:{path}")
    assert trace.get_tracer_provider() is provider
    processor = _batch(provider)
    assert isinstance(processor.span_exporter, OtlpJsonFileExporter)
    assert _export_timeout_ms(processor) == 2000.0  # export_timeout_s=2.0 by default
    assert _service(provider) == "vyre-async"
    assert path.read_text() == ""  # opened at start
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("request"):
        tracer.start_span("inner").end()
    assert provider.force_flush() is True
    (line,) = path.read_text().splitlines()
    request = parse_otlp_json(line)
    (resource_spans,) = request.resource_spans
    services = [a.value.string_value for a in resource_spans.resource.attributes]
    assert "vyre-async" in services
    names = [s.name for s in resource_spans.scope_spans[0].spans]
    assert sorted(names) == ["inner", "request"]


def test_a_one_letter_relative_file_is_a_path_in_the_working_folder(
    installed: list[TracerProvider], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    provider = _configure(installed, "file:x")
    provider.get_tracer("t").start_span("s").end()
    provider.force_flush()
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
    assert "resourceSpans" in (tmp_path / "x").read_text()


def test_the_export_timeout_goes_to_the_batch_processor(
    installed: list[TracerProvider], tmp_path: Path
) -> None:
    provider = _configure(installed, f"file:{tmp_path / 's.jsonl'}", export_timeout_s=1.5)
    assert _export_timeout_ms(_batch(provider)) == 1500.0


def test_the_bsp_timeout_variable_wins_over_the_argument(
    installed: list[TracerProvider], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "4000")
    provider = _configure(installed, f"file:{tmp_path / 's.jsonl'}", export_timeout_s=1.5)
    assert _export_timeout_ms(_batch(provider)) == 4000.0


def test_a_refused_bsp_setting_names_the_variables_and_the_fix(
    installed: list[TracerProvider], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "-5")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    with pytest.raises(InvalidProgram) as info:
        configure_tracing(f"file:{tmp_path / 's.jsonl'}")
    message, _, fix = str(info.value).partition("\nFix: ")
    assert fix == "set each OTEL_BSP_* variable to a positive whole number, or unset it"
    reason, _, environment = message.partition(" (environment: ")
    assert reason.startswith("the batch span processor refused its settings: ")
    assert "max_queue_size" in reason  # (the SDK's own words)
    assert environment.endswith(")")
    assert ast.literal_eval(environment[:-1]) == {
        "OTEL_BSP_MAX_QUEUE_SIZE": "-5",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def test_the_service_name_argument_names_the_resource(
    installed: list[TracerProvider], tmp_path: Path
) -> None:
    provider = _configure(installed, f"file:{tmp_path / 's.jsonl'}", service_name="shop")
    assert _service(provider) == "shop"


def test_otel_service_name_wins_over_the_argument(
    installed: list[TracerProvider], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    provider = _configure(installed, f"file:{tmp_path / 's.jsonl'}", service_name="shop")
    assert _service(provider) == "from-env"


def test_otlp_installs_a_batched_exporter_with_the_export_timeout(
    installed: list[TracerProvider],
) -> None:
    provider = _configure(installed, "otlp")
    assert trace.get_tracer_provider() is provider
    skipper, exporter = _otlp(provider)
    assert skipper.pause_s == 5.0
    assert _otlp_timeout_s(exporter) == 2.0  # export_timeout_s=2.0 by default
    assert _export_timeout_ms(_batch(provider)) == 2000.0
    assert _service(provider) == "vyre-async"


def test_otlp_takes_the_export_timeout_argument(installed: list[TracerProvider]) -> None:
    provider = _configure(installed, "otlp", export_timeout_s=0.25)
    assert _otlp_timeout_s(_otlp(provider)[1]) == 0.25
    assert _export_timeout_ms(_batch(provider)) == 250.0


@pytest.mark.parametrize(
    ("name", "value", "seconds"),
    [
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0.5", 0.5),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "7", 7.0),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1000000", 1e6),
        # Not a number: the exporter warns and uses its default, 10 s.
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", 10.0),
    ],
)
def test_a_usable_timeout_variable_wins_over_the_argument(
    installed: list[TracerProvider],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
    seconds: float,
) -> None:
    monkeypatch.setenv(name, value)
    provider = _configure(installed, "otlp", export_timeout_s=3.0)
    assert _otlp_timeout_s(_otlp(provider)[1]) == seconds
    assert _export_timeout_ms(_batch(provider)) == 3000.0


def test_a_timeout_variable_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1000001")
    with pytest.raises(InvalidProgram) as info:
        configure_tracing("otlp")
    assert str(info.value) == (
        "OTEL_EXPORTER_OTLP_TIMEOUT='1000001' is not a usable timeout: every export would "
        "fail at once\nFix: set OTEL_EXPORTER_OTLP_TIMEOUT to a number of seconds above 0 "
        "and at most 1e+06 (e.g. 10), or unset it"
    )


def test_otlp_without_the_exporter_package_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, _OTLP_MODULE, None)  # (import fails)
    with pytest.raises(UnsupportedFeature) as info:
        configure_tracing("otlp")
    assert str(info.value) == (
        "--trace otlp needs opentelemetry-exporter-otlp-proto-http\n"
        "Fix: pip install 'vyre-async[telemetry]'"
    )


def test_otlp_spans_reach_the_collector_named_by_the_environment(
    installed: list[TracerProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.url}/v1/traces")
        provider = _configure(installed, "otlp", service_name="checkout")
        provider.get_tracer("t").start_span("sent").end()
        assert provider.force_flush() is True
        assert [(span.name, service) for span, service in receiver.spans()] == [
            ("sent", "checkout")
        ]
        assert [path for path, _, _ in receiver.requests] == ["/v1/traces"]
    finally:
        receiver.close()


# --- spans_to_otlp_json ----------------------------------------------------------------------


def test_no_spans_is_an_empty_document() -> None:
    assert spans_to_otlp_json([]) == {}


def test_ids_are_hex_enums_integers_links_included() -> None:
    parent, child = _ended_spans()
    document = spans_to_otlp_json([parent, child])
    parse_otlp_json(json.dumps(document))
    (resource_spans,) = document["resourceSpans"]
    (scope_spans,) = resource_spans["scopeSpans"]
    written = {span["name"]: span for span in scope_spans["spans"]}
    p, c = parent.get_span_context(), child.get_span_context()
    assert p is not None and c is not None
    assert written["parent"]["traceId"] == format(p.trace_id, "032x")
    assert written["parent"]["spanId"] == format(p.span_id, "016x")
    assert "parentSpanId" not in written["parent"]
    assert written["child"]["traceId"] == format(c.trace_id, "032x")
    assert written["child"]["spanId"] == format(c.span_id, "016x")
    assert written["child"]["parentSpanId"] == format(p.span_id, "016x")
    assert written["child"]["kind"] == 1  # SPAN_KIND_INTERNAL, as an integer
    (link,) = written["child"]["links"]
    (linked,) = child.links
    assert link["traceId"] == format(linked.context.trace_id, "032x")
    assert link["spanId"] == format(linked.context.span_id, "016x")
    assert link["attributes"] == [{"key": "why", "value": {"stringValue": "because"}}]


# --- OtlpJsonFileExporter --------------------------------------------------------------------


def test_the_file_and_its_folders_are_made_at_start(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "spans.jsonl"
    exporter = OtlpJsonFileExporter(path)
    assert path.read_text() == ""
    assert exporter.dropped == 0
    OtlpJsonFileExporter(path)  # (again: the folders exist now)
    OtlpJsonFileExporter(str(tmp_path / "top.jsonl"))  # (in a folder that exists)
    assert (tmp_path / "top.jsonl").exists()


def test_a_folder_is_refused_with_the_reason_and_a_fix(tmp_path: Path) -> None:
    with pytest.raises(InvalidProgram) as info:
        OtlpJsonFileExporter(str(tmp_path))
    assert str(info.value) == (
        f"cannot write spans to {str(tmp_path)!r}: IsADirectoryError: [Errno 21] Is a "
        f"directory: {str(tmp_path)!r}\n"
        "Fix: choose a file in a folder you can write to, e.g. file:traces.jsonl"
    )


def test_each_export_appends_one_compact_line(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text('{"earlier":1}\n')
    exporter = OtlpJsonFileExporter(path)
    parent, child = _ended_spans()
    assert exporter.export([parent]) is SpanExportResult.SUCCESS
    assert exporter.export([child]) is SpanExportResult.SUCCESS
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    earlier, first, second = text.split("\n")[:-1]
    assert earlier == '{"earlier":1}'
    for line, span in ((first, parent), (second, child)):
        assert line == json.dumps(json.loads(line), separators=(",", ":"))  # compact
        assert json.loads(line) == spans_to_otlp_json([span])
        parse_otlp_json(line)
    assert exporter.dropped == 0
    assert exporter.force_flush() is True
    exporter.shutdown()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a full disk)")
def test_writes_to_a_full_disk_are_counted_and_logged_per_thousand(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = OtlpJsonFileExporter("/dev/full")
    (span,) = _ended_spans()[:1]
    sizes = [1, 998, 1, 1, 999, 1]
    with caplog.at_level(logging.WARNING, logger="vyre_async.tracing"):
        results = [exporter.export([span] * n) for n in sizes]
    assert results == [SpanExportResult.FAILURE] * len(sizes)
    assert exporter.dropped == 2001
    assert [r.getMessage() for r in caplog.records if r.name == "vyre_async.tracing"] == [
        f"could not write {n} span(s) to /dev/full (OSError: [Errno 28] No space left on "
        f"device); {total} dropped so far"
        for n, total in [(1, 1), (1, 1000), (999, 2000)]
    ]


# --- _SkipAfterFailure (the OTLP exporter's wrapper) -----------------------------------------


class _Inner(SpanExporter):
    def __init__(self, *results: SpanExportResult) -> None:
        self.results = list(results)
        self.batches: list[list[Any]] = []
        self.flushes: list[object] = []
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append(list(spans))
        return self.results.pop(0)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self.flushes.append(timeout_millis)
        return False

    def shutdown(self) -> None:
        self.shut = True


class _Clock:
    now = 0.5  # (a monotonic clock's zero is anywhere: it may read 0.5)

    @classmethod
    def monotonic(cls) -> float:
        return cls.now


def test_a_failed_export_pauses_exports_and_counts_what_is_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tracing, "time", _Clock)
    monkeypatch.setattr(_Clock, "now", 0.5)
    ok, failed = SpanExportResult.SUCCESS, SpanExportResult.FAILURE
    inner = _Inner(ok, failed, ok, failed)
    exporter = _SkipAfterFailure(inner, pause_s=5.0)
    assert exporter.dropped_spans == 0
    a, b, c = object(), object(), object()
    with caplog.at_level(logging.WARNING, logger="vyre_async.tracing"):
        assert exporter.export([a, b]) is ok  # type: ignore[list-item]
        assert inner.batches == [[a, b]]
        assert exporter.dropped_spans == 0 and caplog.records == []

        _Clock.now = 100.0
        assert exporter.export([a, b, c]) is failed  # type: ignore[list-item]
        assert exporter.dropped_spans == 3
        _Clock.now = 104.9  # paused: dropped without trying
        assert exporter.export([a]) is failed  # type: ignore[list-item]
        assert len(inner.batches) == 2 and exporter.dropped_spans == 4

        _Clock.now = 105.0  # the pause is over
        assert exporter.export([b]) is ok  # type: ignore[list-item]
        assert inner.batches[-1] == [b] and exporter.dropped_spans == 4
        assert exporter.export([a, c]) is failed  # type: ignore[list-item]
        assert exporter.dropped_spans == 6
    assert [r.getMessage() for r in caplog.records] == [
        f"trace export failed ({n} span(s) dropped so far); dropping span batches for the "
        "next 5 s (is the OTLP collector running and reachable?)"
        for n in (3, 6)
    ]


def test_flush_and_shutdown_reach_the_wrapped_exporter() -> None:
    inner = _Inner()
    exporter = _SkipAfterFailure(inner, pause_s=5.0)
    assert exporter.force_flush() is False  # (the wrapped exporter's answer)
    assert exporter.force_flush(1234) is False
    assert inner.flushes == [30_000, 1234]
    exporter.shutdown()
    assert inner.shut
