"""An in-test OTLP/HTTP receiver on 127.0.0.1, and the decoders of what OTLP exports hold.

Tests that export spans to a real endpoint (the OTLP exporter, a Ray worker,
the example service) import the ``receiver`` fixture from here. Every export is
decoded with the OpenTelemetry protobuf definitions (``opentelemetry-proto``):
request bodies with ``ExportTraceServiceRequest.FromString``, OTLP-JSON lines
with `parse_otlp_json` (``google.protobuf.json_format.Parse``, unknown fields
refused), never by hand.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

#: The OTLP/JSON id fields, and their length in bytes.
_ID_BYTES = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def parse_otlp_json(line: str) -> Any:
    """Decode one OTLP/JSON trace export into an ``ExportTraceServiceRequest`` and back.

    OTLP/JSON is protobuf's JSON mapping with one documented difference
    (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding): trace
    and span ids are hex strings (any case), not base64. They are checked (32 or
    16 hex digits), turned into base64 and the document parsed by
    ``json_format.Parse`` with unknown fields refused: a misspelt key or a value
    of the wrong type fails the parse. The message is then written back
    (``MessageToDict``: integer enums, as OTLP/JSON requires, and no default
    values; ids in hex) and must equal the line's document, so an enum given by
    name or anything dropped, renamed or re-typed on the way fails too.
    """
    from google.protobuf.json_format import MessageToDict, Parse
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    document = json.loads(line)
    as_proto = json.loads(line)
    for record, written in zip(_id_records(as_proto), _id_records(document), strict=True):
        for key, size in _ID_BYTES.items():
            if key in record:
                value = record[key]
                assert isinstance(value, str) and len(value) == 2 * size, (key, value)
                assert re.fullmatch("[0-9a-fA-F]+", value), (key, value)
                record[key] = base64.b64encode(bytes.fromhex(value)).decode()
                written[key] = value.lower()  # (compared with what MessageToDict writes)
    request = Parse(json.dumps(as_proto), ExportTraceServiceRequest(), ignore_unknown_fields=False)
    back = MessageToDict(request, use_integers_for_enums=True)
    for record in _id_records(back):
        for key in _ID_BYTES:
            if key in record:
                record[key] = base64.b64decode(record[key]).hex()
    assert back == document, "the OTLP-JSON line does not round-trip through the proto message"
    return request


def _id_records(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The spans and span links of an OTLP/JSON trace document (where ids are)."""
    for resource_spans in document.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                yield span
                yield from span.get("links", ())


class Receiver:
    """A running receiver: its ``url``, and each request as ``(path, content type, body)``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def spans(self) -> list[tuple[Any, str]]:
        """Every span received, with its resource's ``service.name``."""
        # Imported here, not at module level: every session's conftest imports this
        # module, and the GPU machine's environment has no opentelemetry-proto.
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        found = []
        for _, _, body in self.requests:
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in rs.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for ss in rs.scope_spans:
                    found += [(span, service) for span in ss.spans]
        return found

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()
