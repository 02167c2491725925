"""A dead OTLP collector costs seconds, not half a minute, at shutdown.

Each scenario runs in a subprocess: a tracer provider is global and can be
installed once per process. The endpoint is a 127.0.0.1 port nothing listens
on, so every export attempt is refused at once and only the exporter's retry
backoff (bounded by its timeout) takes time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from vyre_async.errors import ErrorCode, InvalidProgram

SCRIPT = textwrap.dedent(
    """
    import json, time
    from opentelemetry import trace
    from vyre_async.tracing import configure_tracing

    provider = configure_tracing("otlp", **KWARGS)
    tracer = trace.get_tracer("dead-collector")
    for i in range(5):
        with tracer.start_as_current_span(f"request-{i}"):
            pass
    start = time.perf_counter()
    provider.shutdown()
    print(json.dumps({"shutdown_s": time.perf_counter() - start}))
    """
)


@pytest.fixture
def dead_endpoint() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


def _shutdown_seconds(
    endpoint: str, env: dict[str, str] | None = None, **kwargs: object
) -> tuple[float, float]:
    """Run SCRIPT against ``endpoint``; return (provider.shutdown() s, whole subprocess s)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    clean["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("KWARGS", repr(kwargs))],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    wall = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    shutdown = float(json.loads(out.stdout.strip().splitlines()[-1])["shutdown_s"])
    return shutdown, wall


def test_shutdown_with_a_dead_collector_is_prompt(dead_endpoint: str) -> None:
    shutdown, wall = _shutdown_seconds(dead_endpoint)
    # The default bound is 2 s per export; the SDK's own default (10 s of retries
    # with backoff 1 + 2 + 4 s) makes this about 7 s.
    assert shutdown < 4.0, f"provider.shutdown() took {shutdown:.2f} s"
    assert wall < 10.0, f"the subprocess took {wall:.2f} s"


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"]
)
def test_timeout_environment_variable_still_wins(dead_endpoint: str, variable: str) -> None:
    # 4 s of retries waits about 1 + 2 s (never under 2.4 s with the SDK's 20 %
    # jitter); the 2 s default would stop after about 1 s.
    shutdown, _ = _shutdown_seconds(dead_endpoint, {variable: "4"})
    assert 2.0 <= shutdown < 8.0, f"provider.shutdown() took {shutdown:.2f} s"


def test_environment_variable_wins_over_the_argument(dead_endpoint: str) -> None:
    shutdown, _ = _shutdown_seconds(
        dead_endpoint, {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.2"}, export_timeout_s=30.0
    )
    assert shutdown < 2.0, f"provider.shutdown() took {shutdown:.2f} s"


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "2", True])
def test_bad_export_timeout_is_invalid_program(bad: object) -> None:
    from vyre_async.tracing import configure_tracing

    with pytest.raises(InvalidProgram) as info:
        configure_tracing("otlp", export_timeout_s=bad)  # type: ignore[arg-type]
    assert info.value.code is ErrorCode.INVALID_PROGRAM
    assert "Fix:" in str(info.value)


def test_many_queued_batches_cost_about_one_failed_export(dead_endpoint: str) -> None:
    """Shutdown drains every queued batch; each used to spend ~1 s failing on its own."""
    script = SCRIPT.replace("range(5)", "range(2500)")  # 5 batches of 512 spans
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    clean["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = dead_endpoint
    out = subprocess.run(
        [sys.executable, "-c", script.replace("KWARGS", "{}")],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    shutdown = float(json.loads(out.stdout.strip().splitlines()[-1])["shutdown_s"])
    assert shutdown < 4.0, f"provider.shutdown() took {shutdown:.2f} s"
    assert "dropping span batches" in out.stderr


def test_only_the_timeout_variable_the_exporter_reads_is_checked(dead_endpoint: str) -> None:
    # The exporter reads the traces variable and falls back to the general one only
    # when it is unset: a general 0 beside a good traces value is never used.
    shutdown, _ = _shutdown_seconds(
        dead_endpoint,
        {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.2", "OTEL_EXPORTER_OTLP_TIMEOUT": "0"},
    )
    assert shutdown < 2.0, f"provider.shutdown() took {shutdown:.2f} s"


def test_the_traces_timeout_variable_is_checked_before_the_general_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vyre_async.tracing import configure_tracing

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    with pytest.raises(InvalidProgram, match="OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='0'") as info:
        configure_tracing("otlp")
    assert "above 0" in str(info.value)
