"""Application-side trace export: ``--trace none|console|otlp|file:PATH``.

The library itself only uses ``opentelemetry-api``; this module is what the
CLI and the examples call to install an SDK tracer provider. It needs the
``telemetry`` extra (``pip install vyre-async[telemetry]``): opentelemetry-sdk
and the OTLP/HTTP exporter.

- ``console``: spans printed to stdout as they end.
- ``otlp``: OTLP/HTTP (protobuf) to ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``$OTEL_EXPORTER_OTLP_ENDPOINT``, default ``http://localhost:4318`` —
  Jaeger's OTLP port. All standard ``OTEL_EXPORTER_OTLP_*`` variables apply.
- ``file:PATH``: OTLP-JSON, one ``{"resourceSpans": [...]}`` object per line,
  with hex trace and span ids, which a Jaeger UI (1.55 or newer) can load.

``OTEL_SERVICE_NAME`` (and ``OTEL_RESOURCE_ATTRIBUTES``) name the service.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vyre_async.errors import UnsupportedFeature

try:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
except ImportError as exc:  # pragma: no cover - the dev and telemetry extras have the SDK
    raise UnsupportedFeature(
        "vyre_async.tracing needs the OpenTelemetry SDK, which is not installed",
        fix="pip install 'vyre-async[telemetry]'",
    ) from exc

__all__ = ["OtlpJsonFileExporter", "TRACE_CHOICES", "configure_tracing", "spans_to_otlp_json"]

TRACE_CHOICES = ("none", "console", "otlp", "file:PATH")


def configure_tracing(spec: str, *, service_name: str = "vyre-async") -> TracerProvider | None:
    """Install a global SDK tracer provider exporting as ``spec`` says; return it.

    Call ``provider.shutdown()`` before exiting to flush batched spans. ``"none"``
    installs nothing and returns None.

    Args:
        spec: ``"none"``, ``"console"``, ``"otlp"`` or ``"file:PATH"``.
        service_name: Used when ``OTEL_SERVICE_NAME`` is not set.

    Raises:
        ValueError: an unknown ``spec``.
        UnsupportedFeature: the SDK or the OTLP exporter is not installed.
    """
    if spec == "none":
        return None
    if spec not in ("console", "otlp") and not (spec.startswith("file:") and len(spec) > 5):
        raise ValueError(f"--trace must be one of {', '.join(TRACE_CHOICES)}, got {spec!r}")
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter: SpanExporter
    if spec == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif spec == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # pragma: no cover
            raise UnsupportedFeature(
                "--trace otlp needs opentelemetry-exporter-otlp-proto-http",
                fix="pip install 'vyre-async[telemetry]'",
            ) from exc
        exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    else:
        exporter = OtlpJsonFileExporter(spec[5:])
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """Return SDK ``ReadableSpan``s as an OTLP-JSON ``{"resourceSpans": [...]}`` object.

    Follows the OTLP/JSON encoding: lowerCamelCase keys, enums as integers and
    trace/span ids as hex strings (not protobuf's base64).
    """
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    document: dict[str, Any] = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return document


def _hex_ids(record: dict[str, Any]) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        if record.get(key):
            record[key] = base64.b64decode(record[key]).hex()


class OtlpJsonFileExporter(SpanExporter):
    """An SDK span exporter appending OTLP-JSON lines to a file (Jaeger UI can load it)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append one line holding ``spans``."""
        try:
            line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":"))
            with self._lock, self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release: every export opens and closes the file."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Every export is already written."""
        return True
