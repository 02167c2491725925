"""The example service (``examples/service.py``) with real parts: uvicorn, httpx, OTLP.

The real server runs in a subprocess on 127.0.0.1 (a free port), is stopped
with SIGTERM by its own pid, and its spans go to an in-test OTLP/HTTP receiver.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from tests.otlp_receiver import Receiver

httpx = pytest.importorskip("httpx", reason="the service extra is not installed")
pytest.importorskip("uvicorn", reason="the service extra is not installed")
pytest.importorskip("starlette", reason="the service extra is not installed")

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RAW = {"Content-Type": "application/octet-stream"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # (httpx's client; the server is uvicorn's own loop)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """The example service under uvicorn, in a subprocess of its own."""

    def __init__(self, **env: str) -> None:
        self.graceful: bool | None = None
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="vyre-service-", suffix=".log")[1])
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "service:app", "--app-dir", str(EXAMPLES),
             "--host", "127.0.0.1", "--port", str(self.port),
             "--timeout-graceful-shutdown", "30", "--no-access-log"],
            env={**os.environ, "VYRE_BACKEND": "reference", **env},
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the service did not start")
            time.sleep(0.1)

    def stop(self) -> bool:
        """SIGTERM by pid; True when the shutdown was graceful (SIGKILL only if it hangs).

        Graceful: the application's shutdown (the backend closed, spans exported)
        completed. uvicorn re-raises the signal it caught, so its exit status
        is -SIGTERM either way.
        """
        if self.graceful is not None:  # stopped already
            return self.graceful
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            return False
        finally:
            self.log.close()
        log = self.log_path.read_text()
        self.log_path.unlink(missing_ok=True)
        self.graceful = "Application shutdown complete" in log and self.process.returncode in (
            0,
            -signal.SIGTERM,
        )
        return self.graceful


async def test_1000_requests_from_64_clients_hostile_ones_and_the_trace(
    receiver: Receiver,
) -> None:
    server = Server(
        VYRE_SERVICE_TRACE="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
        VYRE_SERVICE_MAX_ELEMENTS="100000",
    )
    stopped = False
    try:
        wrong: list[str] = []
        done = [0]

        async def client(k: int) -> None:
            rng = np.random.default_rng(k)
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
                for i in range(16):
                    if i % 2:  # raw saxpy
                        x = rng.standard_normal(2048).astype(np.float32)
                        y = rng.standard_normal(2048).astype(np.float32)
                        alpha = np.array([1.5], np.float32)
                        response = await http.post(
                            "/v1/run/saxpy",
                            content=x.tobytes() + y.tobytes() + alpha.tobytes(),
                            headers={**RAW, "X-Vyre-Counts": "2048,2048,1",
                                     "X-Vyre-Dtypes": "f32,f32,f32"},
                        )  # fmt: skip
                        got = np.frombuffer(response.content, np.float32)
                        want = (np.float32(1.5) * x + y).astype(np.float32)
                    else:  # JSON xor
                        n = int(rng.integers(1, 300))
                        a = rng.integers(0, 2**32, n, dtype=np.uint32)
                        b = rng.integers(0, 2**32, n, dtype=np.uint32)
                        response = await http.post(
                            "/v1/run/xor", json={"inputs": [a.tolist(), b.tolist()]}
                        )
                        got = np.array(response.json()["outputs"][0], np.uint32)
                        want = a ^ b
                    if response.status_code != 200 or not np.array_equal(got, want):
                        wrong.append(f"{k}/{i}: {response.status_code}")
                    done[0] += 1

        async with anyio.create_task_group() as tasks:
            for k in range(64):
                tasks.start_soon(client, k)
        assert done[0] == 1024 and not wrong, wrong[:5]

        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            hostile = [
                (http.post("/v1/run/xor", content=b"{not json"), 400),
                (http.post("/v1/run/xor", json={"inputs": [[1, -2], [3, 4]]}), 400),
                (http.post("/v1/run/xor", json={"inputs": [[1.5], [2]]}), 400),
                (http.post("/v1/run/xor", json={"inputs": [[1, 2]]}), 400),
                (http.post("/v1/run/xor", json={"inputs": [list(range(100_001))] * 2}), 413),
                (
                    http.post(
                        "/v1/run/xor", content=b"\0" * 12, headers={**RAW, "X-Vyre-Counts": "2,2"}
                    ),
                    400,
                ),
                (
                    http.post(
                        "/v1/run/xor",
                        content=b"\0" * 16,
                        headers={**RAW, "X-Vyre-Counts": "2,2", "X-Vyre-Dtypes": "f32,f32"},
                    ),
                    400,
                ),
                (http.post("/v1/run/nothing", json={}), 404),
                (http.post("/v1/run/xor", content=b'{"inputs": [[NaN], [1]]}'), 400),
                (http.post("/v1/run/saxpy", content=b'{"inputs": [[1e39], [1]], "alpha": 1}'), 400),
                (http.post("/v1/run/saxpy", json={"inputs": [[1], [1]]}), 400),  # no alpha
                (http.post("/v1/run/xor", json={"inputs": [[], []]}), 400),
                (http.post("/v1/run/xor", content=b"[1, 2]"), 400),  # JSON, not an object
                (
                    http.post(
                        "/v1/run/xor", content=b"\0" * 8, headers={**RAW, "X-Vyre-Counts": "-2,4"}
                    ),
                    400,
                ),
                (
                    http.post(
                        "/v1/run/xor",
                        content=b"\0" * 8,
                        headers={**RAW, "X-Vyre-Counts": "99999999999,1"},
                    ),
                    400,
                ),
                (
                    http.post(
                        "/v1/run/saxpy",
                        content=b"\0" * 8,
                        headers={**RAW, "X-Vyre-Counts": "1,1,0"},
                    ),
                    400,
                ),  # alpha count
                (
                    http.post(
                        "/v1/numpy/saxpy",
                        content=b"\0" * 8,
                        headers={**RAW, "X-Vyre-Counts": "1,1,0"},
                    ),
                    400,
                ),
            ]
            for call, status in hostile:
                response = await call
                assert response.status_code == status, response.text
                body = response.json()
                assert body["message"] and body["fix"]
            response = await http.post("/v1/run/xor", json={"inputs": [[1, 2], [3]]})
            assert response.status_code == 400 and "differ in length" in response.text
            big = {"inputs": [[3e38], [3e38]], "alpha": 2.0}  # f32 overflow: Infinity
            response = await http.post("/v1/run/saxpy", json=big)
            assert response.status_code == 422 and "raw bytes" in response.json()["fix"]
            # Still serving, right after.
            response = await http.post("/v1/run/xor", json={"inputs": [[1, 2], [3, 3]]})
            assert response.status_code == 200 and response.json()["outputs"] == [[2, 1]]
            health = (await http.get("/health")).json()
            assert health == {"status": "ok", "backend": "reference", "device": health["device"]}
            assert "vyre_dispatch_count_total" in (await http.get("/metrics")).text

        assert server.stop()  # graceful: its spans are flushed at shutdown
        stopped = True
        spans = [span for span, _ in receiver.spans()]
        servers = {s.span_id: s for s in spans if s.kind == 2}  # SPAN_KIND_SERVER
        dispatches = [s for s in spans if s.name == "vyre.dispatch"]
        assert len(dispatches) == 1026  # 1 024, the overflowing saxpy, the last valid one
        for span in dispatches:  # each under its own request's HTTP server span
            parent = servers.get(span.parent_span_id)
            assert parent is not None, "a dispatch span not under an HTTP server span"
            assert parent.trace_id == span.trace_id and parent.name.startswith("POST /v1/run/")
        # and every request is a root: none nested under another request's spans
        assert all(not s.parent_span_id for s in servers.values())
    finally:
        if not stopped:
            server.stop()


async def test_a_graceful_stop_loses_no_request_in_flight() -> None:
    server = Server()
    try:
        n = 1 << 20
        a = np.arange(n, dtype=np.uint32)
        results: list[tuple[int, bool, float]] = []

        async def sent(request: Any) -> None:  # httpx: the request is going out
            return None

        async def held_by_server(http: Any) -> int:
            """Requests the server is running now (OpenTelemetry's active-requests gauge)."""
            text = (await http.get("/metrics")).text
            return sum(
                int(float(line.rsplit(" ", 1)[1]))
                for line in text.splitlines()
                if line.startswith("http_server_active_requests{") and 'method="POST"' in line
            )

        async def request(k: int) -> None:
            b = np.full(n, k, np.uint32)
            async with httpx.AsyncClient(
                base_url=server.url, timeout=120, event_hooks={"request": [sent]}
            ) as http:
                response = await http.post(
                    "/v1/run/xor",
                    content=a.tobytes() + b.tobytes(),
                    headers={**RAW, "X-Vyre-Counts": f"{n},{n}"},
                )
            ok = response.status_code == 200 and np.array_equal(
                np.frombuffer(response.content, np.uint32), a ^ b
            )
            results.append((k, ok, time.monotonic()))

        stop_at = [0.0]

        async def stop_soon() -> None:
            # SIGTERM once every request reached the server (running there, or answered):
            # a request still connecting would be refused, which a stop may do.
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                with anyio.fail_after(60):
                    while await held_by_server(http) + len(results) < 24:  # noqa: ASYNC110
                        await anyio.sleep(0.005)
            stop_at[0] = time.monotonic()
            server.process.send_signal(signal.SIGTERM)

        async with anyio.create_task_group() as tasks:
            for k in range(24):
                tasks.start_soon(request, k)
            tasks.start_soon(stop_soon)
        assert len(results) == 24 and all(ok for _, ok, _ in results), results
        assert any(t > stop_at[0] for _, _, t in results)  # some were in flight at SIGTERM
        assert server.stop()
    finally:
        server.stop()


def test_driver_faults_are_5xx_and_refusals_4xx_with_the_message_and_fix() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import service
    finally:
        sys.path.remove(str(EXAMPLES))
    from vyre_async import (
        BackendClosed,
        DeviceLost,
        DeviceOutOfMemory,
        DispatchFailed,
        DispatchTimeout,
        InvalidProgram,
        UnsupportedFeature,
    )

    for error, status in (
        (InvalidProgram("bad input", fix="send good input"), 400),
        (UnsupportedFeature("no f16 here", fix="use f32"), 422),
        (DeviceLost("the device is gone", fix="restart"), 503),
        (BackendClosed("closing", fix="retry later"), 503),
        (DispatchFailed("the kernel failed", fix="report it"), 500),
        (DispatchTimeout("too slow", fix="raise the timeout"), 504),
        (DeviceOutOfMemory("no memory", fix="smaller"), 503),
    ):
        response = service._driver_error(error)
        assert response.status_code == status, error
        body = json.loads(bytes(response.body))
        assert body["error"] == type(error).__name__ and body["code"] == int(error.code)
        assert body["fix"] == error.message.rpartition("\nFix: ")[2] and body["message"]
