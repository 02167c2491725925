"""Spans leave the process: OTLP/HTTP to a real receiver, and OTLP-JSON files.

Each scenario runs in a subprocess because a tracer provider is global and can
be installed once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.otlp_receiver import Receiver, parse_otlp_json
from vyre_async.errors import ErrorCode, InvalidProgram

SERVICE = textwrap.dedent(
    """
    import anyio, numpy as np
    from opentelemetry import trace
    from vyre_async import acquire_backend
    from vyre_async.programs import elementwise_xor
    from vyre_async.tracing import configure_tracing

    provider = configure_tracing(SPEC)
    tracer = trace.get_tracer("service")
    backend = acquire_backend("reference")

    async def handle(i):
        with tracer.start_as_current_span(f"request-{i}"):
            await backend.dispatch(elementwise_xor(64), [np.full(64, i, np.uint32)] * 2)

    async def main():
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(handle, i)

    anyio.run(main)
    provider.shutdown()
    """
)


def _run(spec: str, env: dict[str, str]) -> None:
    code = SERVICE.replace("SPEC", repr(spec))
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def _spans_from_request(body: bytes) -> list[tuple[str, bytes, bytes, bytes, str]]:
    request = ExportTraceServiceRequest.FromString(body)
    found = []
    for rs in request.resource_spans:
        service = next(
            a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
        )
        for ss in rs.scope_spans:
            for s in ss.spans:
                found.append((s.name, s.trace_id, s.span_id, s.parent_span_id, service))
    return found


def test_otlp_http_export_reaches_a_receiver_with_parent_links(receiver: Receiver) -> None:
    _run(
        "otlp",
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "vyre-e2e",
            "VYRE_TRACE_DETAIL": "phases",  # the phase child spans travel too
        },
    )
    assert receiver.requests, "the exporter sent nothing"
    path, content_type, _ = receiver.requests[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    spans = [s for _, _, body in receiver.requests for s in _spans_from_request(body)]
    requests = {
        name: (trace_id, span_id)
        for name, trace_id, span_id, _, _ in spans
        if name.startswith("request-")
    }
    dispatches = [s for s in spans if s[0] == "vyre.dispatch"]
    assert len(requests) == 5 and len(dispatches) == 5
    assert {s[4] for s in spans} == {"vyre-e2e"}
    by_parent = {parent: (trace_id, span_id) for _, trace_id, span_id, parent, _ in dispatches}
    for trace_id, span_id in requests.values():
        assert by_parent[span_id][0] == trace_id  # same trace, parented under its request
    dispatch_ids = {s[2] for s in dispatches}
    children = [s for s in spans if s[3] in dispatch_ids]
    assert {s[0] for s in children} >= {"vyre.launch"}


def test_file_export_is_valid_otlp_json(tmp_path: Path) -> None:
    target = tmp_path / "traces" / "vyre.jsonl"
    _run(f"file:{target}", {"OTEL_SERVICE_NAME": "vyre-file"})
    lines = target.read_text().splitlines()
    assert lines
    spans = []
    for line in lines:  # each line a whole OTLP/JSON export, proto-exact (see parse_otlp_json)
        for rs in parse_otlp_json(line).resource_spans:
            attrs = {a.key: a.value for a in rs.resource.attributes}
            assert attrs["service.name"].string_value == "vyre-file"
            for ss in rs.scope_spans:
                spans += ss.spans
    dispatches = [s for s in spans if s.name == "vyre.dispatch"]
    assert len(dispatches) == 5
    for s in spans:
        assert len(s.trace_id) == 16 and any(s.trace_id)  # (hex in the file: 16 bytes)
        assert len(s.span_id) == 8 and any(s.span_id)
        assert s.kind == Span.SPAN_KIND_INTERNAL
        assert s.end_time_unix_nano >= s.start_time_unix_nano > 0
    by_id = {s.span_id: s for s in spans}
    for d in dispatches:
        parent = by_id[d.parent_span_id]
        assert parent.name.startswith("request-") and parent.trace_id == d.trace_id
        keys = {a.key for a in d.attributes}
        assert {"vyre.backend.id", "vyre.program.fingerprint", "vyre.device.time_s"} <= keys


def test_cli_demo_writes_a_trace_file(tmp_path: Path) -> None:
    target = tmp_path / "demo.jsonl"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vyre_async.cli",
            "demo",
            "--tasks",
            "2",
            "--per-task",
            "3",
            "--trace",
            f"file:{target}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    names = [
        s.name
        for line in target.read_text().splitlines()
        for rs in parse_otlp_json(line).resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
    ]
    assert names.count("vyre.dispatch") == 6


def test_bad_trace_spec_is_a_usage_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "vyre_async.cli", "demo", "--trace", "jaeger"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "file:PATH" in out.stderr
    from vyre_async.tracing import configure_tracing

    with pytest.raises(ValueError, match="file:PATH") as info:
        configure_tracing("zipkin")
    assert isinstance(info.value, InvalidProgram)  # a BackendError that is also a ValueError
    assert info.value.code is ErrorCode.INVALID_PROGRAM and "Fix:" in str(info.value)
    assert configure_tracing("none") is None


def test_configure_tracing_sets_the_detail_and_refuses_an_unknown_one() -> None:
    from vyre_async import telemetry
    from vyre_async.tracing import configure_tracing

    try:
        assert configure_tracing("none", detail="phases") is None
        assert telemetry.trace_detail() == "phases"
        with pytest.raises(InvalidProgram, match="unknown tracing detail") as info:
            configure_tracing("none", detail="all")
        assert "Fix:" in str(info.value)
        assert telemetry.trace_detail() == "phases"  # unchanged by the refused call
        assert configure_tracing("none") is None  # None keeps what was chosen
        assert telemetry.trace_detail() == "phases"
    finally:
        telemetry.set_trace_detail("span")
