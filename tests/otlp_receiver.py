"""An in-test OTLP/HTTP receiver on 127.0.0.1: what exporters sent it, and the spans in it.

Tests that export spans to a real endpoint (the OTLP exporter, a Ray worker,
the example service) import the ``receiver`` fixture from here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


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
