"""Issue 26, defect 7: the example service under hostile requests and settings.

Against the real server (uvicorn in a subprocess, as in ``test_service.py``):
a body nested 100 000 deep, unknown routes and methods, ``true`` as a number,
empty arrays sent as JSON and as raw bytes, and new ``Host`` values meant to
grow ``/metrics``. And the service's settings: a size that is not a whole
number >= 1, a backend that is not installed, a trace spec it cannot read or
write to: each stops the start with a message and a Fix, not a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.service.test_service import EXAMPLES, RAW, Server

httpx = pytest.importorskip("httpx", reason="the service extra is not installed")


def _refusal(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert body["message"] and body["fix"], body
    return body


@pytest.fixture(scope="module")
def server() -> Any:
    running = Server()
    yield running
    assert running.stop(), "the service did not stop gracefully"


def test_a_body_nested_past_any_use_is_a_400_not_a_500(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/v1/run/xor",
        content=b"[" * 100_000,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    _refusal(response, 400)
    assert "Traceback" not in response.text


def test_unknown_routes_and_methods_get_json_with_a_fix(server: Server) -> None:
    missing = _refusal(httpx.get(f"{server.url}/v1/nothing", timeout=10), 404)
    assert missing["error"] == "NotFound" and "/v1/run/{program}" in missing["fix"]
    wrong = _refusal(httpx.get(f"{server.url}/v1/run/xor", timeout=10), 405)
    assert wrong["error"] == "MethodNotAllowed" and "POST" in wrong["fix"]
    program = _refusal(httpx.post(f"{server.url}/v1/run/nope", json={}, timeout=10), 404)
    assert "xor" in program["fix"]


@pytest.mark.parametrize(
    "inputs", [[[True, 1], [1, 2]], [[1, 2], [False, 0]], [[True], [1]], [[1.5, 2], [1, 2]]]
)
def test_booleans_and_fractions_are_not_u32(server: Server, inputs: list[Any]) -> None:
    body = _refusal(httpx.post(f"{server.url}/v1/run/xor", json={"inputs": inputs}), 400)
    assert "u32" in body["message"]


def test_empty_arrays_get_one_message_as_json_and_as_raw_bytes(server: Server) -> None:
    as_json = _refusal(httpx.post(f"{server.url}/v1/run/xor", json={"inputs": [[], []]}), 400)
    as_raw = _refusal(
        httpx.post(
            f"{server.url}/v1/run/xor",
            content=b"",
            headers={**RAW, "X-Vyre-Counts": "0,0", "X-Vyre-Dtypes": "u32,u32"},
        ),
        400,
    )
    assert as_json["message"] == as_raw["message"] == "input is empty"


def test_no_client_can_add_metric_series_through_the_host_header(server: Server) -> None:
    def series() -> set[str]:  # the HTTP middleware's series (vyre's are by op id)
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        return {line.split(" ")[0] for line in text.splitlines() if line.startswith("http_")}

    ok = {"inputs": [[1, 2], [3, 4]]}
    httpx.post(f"{server.url}/v1/run/xor", json=ok, headers={"Host": "warm-up.example"})
    before = series()
    assert before  # (the SDK is installed: there are HTTP series to grow)
    for index in range(20):
        response = httpx.post(
            f"{server.url}/v1/run/xor", json=ok, headers={"Host": f"h{index}.attacker.example"}
        )
        assert response.status_code == 200
    after = series()
    assert not any("attacker" in s for s in after)
    assert len(after) == len(before), sorted(after - before)[:5]


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("VYRE_SERVICE_MAX_ELEMENTS", "abc", None),
        ("VYRE_SERVICE_MAX_ELEMENTS", "-1", None),
        ("VYRE_SERVICE_MAX_ELEMENTS", "0", None),
        ("VYRE_SERVICE_MAX_BODY_BYTES", "1e6", None),
        ("VYRE_SERVICE_MAX_BODY_BYTES", "-5", None),
        ("VYRE_BACKEND", "nope", "is not an installed backend"),
        ("VYRE_SERVICE_TRACE", "bogus", "is not a trace spec"),
        ("VYRE_SERVICE_TRACE", "file:/proc/nope/x", "cannot write spans"),
    ],
)
def test_a_bad_setting_stops_the_start_with_a_message_and_a_fix(
    name: str, value: str, says: str | None
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(EXAMPLES)!r}); import service",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, name: value},
    )
    assert done.returncode == 1, done.stderr[-2000:]
    if says is None:  # a size: the one message of every size setting, and what to set
        says, fix = f"{name} must be a whole number >= 1, got {value!r}", "Fix: set"
    else:
        fix = "Fix:"
    assert says in done.stderr and fix in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
