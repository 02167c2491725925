"""Application-side trace export: ``--trace none|console|otlp|file:PATH``.

The library itself only uses ``opentelemetry-api``; this module is what the
CLI and the examples call to install an SDK tracer provider. It needs the
``telemetry`` extra (``pip install vyre-async[telemetry]``): opentelemetry-sdk
and the OTLP/HTTP exporter.

- ``console``: spans printed to stdout as they end.
- ``otlp``: OTLP/HTTP (protobuf) to ``$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``$OTEL_EXPORTER_OTLP_ENDPOINT``, default ``http://localhost:4318`` —
  Jaeger's OTLP port. All standard ``OTEL_EXPORTER_OTLP_*`` variables apply.
  One export (retries included) gives up after ``export_timeout_s`` (2 s)
  unless ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` / ``OTEL_EXPORTER_OTLP_TIMEOUT``
  say otherwise; after a failed export, batches are dropped without trying for
  5 s. A dead collector delays ``provider.shutdown()`` by about one failed
  export, not the SDK's default of 10 s of retries for every queued batch.
- ``file:PATH``: OTLP-JSON, one ``{"resourceSpans": [...]}`` object per line,
  with hex trace and span ids, which a Jaeger UI (1.55 or newer) can load.

``OTEL_SERVICE_NAME`` (and ``OTEL_RESOURCE_ATTRIBUTES``) name the service.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vyre_async import telemetry
from vyre_async._arguments import duration
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument, UnsupportedFeature

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
__dir__ = _public_dir(__name__)

TRACE_CHOICES = ("none", "console", "otlp", "file:PATH")


_TIMEOUT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
#: The longest OTLP export timeout the exporter can time (longer overflows its clock).
_MAX_EXPORT_TIMEOUT_S = 1e6


def configure_tracing(
    spec: str,
    *,
    service_name: str = "vyre-async",
    export_timeout_s: float = 2.0,
    detail: str | None = None,
) -> TracerProvider | None:
    """Install a global SDK tracer provider exporting as ``spec`` says; return it.

    Call ``provider.shutdown()`` before exiting to flush batched spans. ``"none"``
    installs nothing and returns None.

    Args:
        spec: ``"none"``, ``"console"``, ``"otlp"`` or ``"file:PATH"``.
        service_name: Used when ``OTEL_SERVICE_NAME`` is not set.
        export_timeout_s: How long one OTLP export may take, retries and their
            backoff included, before its batch is dropped; also given to the
            batch span processor as its export timeout. With an unreachable
            collector, ``provider.shutdown()`` waits up to this long per queued
            batch of 512 spans (with 2 s, about 1 s when the connection is
            refused outright: the exporter's next backoff, 2 s, would overrun
            the deadline). After a failed OTLP export, batches are dropped
            without a connection attempt for the next 5 s (a warning is
            logged), so a dead collector costs about one failed export at
            shutdown however many batches are queued.
            ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` or ``OTEL_EXPORTER_OTLP_TIMEOUT``
            (seconds, as the installed exporter reads them) win over it, and
            ``OTEL_BSP_EXPORT_TIMEOUT`` over the processor's value.
        detail: How much of each dispatch the trace shows
            (`vyre_async.telemetry.set_trace_detail`): ``"span"``, one span per
            dispatch with its phase durations as attributes, or ``"phases"``,
            the phases also as child spans. None (the default) keeps what
            ``VYRE_TRACE_DETAIL`` chose (``"span"`` when unset).

    Raises:
        InvalidArgument: an unknown ``spec`` or ``detail``, or ``export_timeout_s``
            not a positive finite number of seconds (also a ``ValueError``).
        UnsupportedFeature: the SDK or the OTLP exporter is not installed.
    """
    export_timeout_s = duration(
        "export_timeout_s", export_timeout_s, positive=True, example="export_timeout_s=2.0"
    )
    if not isinstance(spec, str):
        raise InvalidArgument(
            f"the trace spec must be a str, got {spec!r}",
            fix="choose none, console, otlp or file:PATH (for example file:traces.jsonl)",
        )
    if detail is not None:
        telemetry.set_trace_detail(detail)
    if spec == "none":
        return None
    if spec not in ("console", "otlp") and not (spec.startswith("file:") and len(spec) > 5):
        raise InvalidArgument(
            f"--trace must be one of {', '.join(TRACE_CHOICES)}, got {spec!r}",
            fix="choose none, console, otlp or file:PATH (for example file:traces.jsonl)",
        )
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
        # The exporter's timeout is one deadline for the request and its retries
        # (backoff 1, 2, 4 s ... stops when the next wait would pass it). None
        # lets the exporter read the OTEL_* timeout variables itself.
        # The exporter reads the traces variable, else the general one (as here): a
        # number it takes and then fails every export on is refused now.
        name = next((n for n in _TIMEOUT_VARIABLES if os.environ.get(n)), None)
        user_set = name is not None
        if name is not None:
            raw = os.environ[name]
            try:
                seconds = float(raw)
            except ValueError:  # not a number: the exporter warns and uses its default
                seconds = 10.0
            if not 0 < seconds <= _MAX_EXPORT_TIMEOUT_S:  # (False for NaN and infinity)
                raise InvalidArgument(
                    f"{name}={raw!r} is not a usable timeout: every export would fail at once",
                    fix=f"set {name} to a number of seconds above 0 and at most "
                    f"{_MAX_EXPORT_TIMEOUT_S:g} (e.g. 10), or unset it",
                )
        exporter = _SkipAfterFailure(
            OTLPSpanExporter(timeout=None if user_set else float(export_timeout_s)),
            pause_s=_PAUSE_AFTER_FAILURE_S,
        )
        provider.add_span_processor(_batch_processor(exporter, export_timeout_s))
    else:
        exporter = OtlpJsonFileExporter(spec[5:])
        provider.add_span_processor(_batch_processor(exporter, export_timeout_s))
    trace.set_tracer_provider(provider)
    return provider


#: Seconds batches are dropped without trying after an OTLP export failed.
_PAUSE_AFTER_FAILURE_S = 5.0
_log = logging.getLogger("vyre_async.tracing")


class _SkipAfterFailure(SpanExporter):
    """Wrap an exporter: after a failed export, drop batches without trying for ``pause_s``.

    The OTLP exporter spends its whole timeout on every batch while the
    collector is unreachable; with a queue of batches to drain at shutdown that
    added up to tens of seconds. Dropped batches are counted and logged.
    """

    def __init__(self, inner: SpanExporter, *, pause_s: float) -> None:
        self.inner = inner
        self.pause_s = pause_s
        self.dropped_spans = 0
        self._resume_at = 0.0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the wrapped exporter unless a recent export failed."""
        with self._lock:
            paused = time.monotonic() < self._resume_at
            if paused:
                self.dropped_spans += len(spans)
        if paused:
            return SpanExportResult.FAILURE
        result = self.inner.export(spans)
        if result is not SpanExportResult.SUCCESS:
            with self._lock:
                self._resume_at = time.monotonic() + self.pause_s
                self.dropped_spans += len(spans)  # (the failed batch is lost too)
                dropped = self.dropped_spans
            _log.warning(
                "trace export failed (%d span(s) dropped so far); dropping span batches for "
                "the next %.0f s (is the OTLP collector running and reachable?)",
                dropped,
                self.pause_s,
            )
        return result

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the wrapped exporter."""
        return self.inner.force_flush(timeout_millis)


def _batch_processor(exporter: SpanExporter, export_timeout_s: float) -> BatchSpanProcessor:
    """Return a batch processor whose export timeout is ``export_timeout_s``.

    ``OTEL_BSP_EXPORT_TIMEOUT`` wins when set. (opentelemetry-sdk 1.45 stores
    this timeout without applying it; the exporter's own timeout is the bound.)
    """
    timeout_ms = None if os.environ.get("OTEL_BSP_EXPORT_TIMEOUT") else export_timeout_s * 1000
    try:
        return BatchSpanProcessor(exporter, export_timeout_millis=timeout_ms)
    except ValueError as exc:  # the SDK validates the OTEL_BSP_* variables it reads
        settings = {k: v for k, v in os.environ.items() if k.startswith("OTEL_BSP_")}
        raise InvalidArgument(
            f"the batch span processor refused its settings: {exc} (environment: {settings})",
            fix="set each OTEL_BSP_* variable to a positive whole number, or unset it",
        ) from exc


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
    """An SDK span exporter appending OTLP-JSON lines to a file (Jaeger UI can load it).

    The file is opened for appending once here, so a path that cannot be written
    (a directory, a read-only place) is refused at start. A later write that
    fails (a full disk, the file removed from a read-only folder) drops that
    batch: the spans are counted in ``dropped``, and the first failure and every
    thousandth dropped span after it are logged as warnings on
    ``vyre_async.tracing``, never silently.

    Raises:
        InvalidArgument: spans cannot be written to ``path``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        #: Spans that could not be written.
        self.dropped = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8"):
                pass
        except (OSError, ValueError) as exc:
            raise InvalidArgument(
                f"cannot write spans to {str(path)!r}: {type(exc).__name__}: {exc}",
                fix="choose a file in a folder you can write to, e.g. file:traces.jsonl",
            ) from exc

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append one line holding ``spans``."""
        try:
            line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":"))
            with self._lock, self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        except OSError as exc:
            with self._lock:
                before, self.dropped = self.dropped, self.dropped + len(spans)
            if before == 0 or before // 1000 != self.dropped // 1000:
                _log.warning(
                    "could not write %d span(s) to %s (%s: %s); %d dropped so far",
                    len(spans),
                    self.path,
                    type(exc).__name__,
                    exc,
                    self.dropped,
                )
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release: every export opens and closes the file."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Every export is already written."""
        return True
