"""Issue 26, defects 4 and 5: no span is lost silently, no span processor breaks a dispatch."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vyre_async import InvalidProgram
from vyre_async.tracing import OtlpJsonFileExporter


def _demo(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vyre_async.cli", "demo", "--tasks", "2", "--per-task", "1", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )


def test_demo_with_a_trace_file_that_is_a_directory_fails_at_start(tmp_path: Path) -> None:
    done = _demo("--trace", f"file:{tmp_path}", cwd=tmp_path)
    assert done.returncode == 1
    assert "cannot write spans to" in done.stderr and "Fix:" in done.stderr
    assert "dispatches:" not in done.stdout  # refused before any work


def test_demo_with_a_trace_file_that_cannot_be_created_fails_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = _demo("--trace", f"file:{blocker / 'spans.jsonl'}", cwd=tmp_path)
    assert done.returncode == 1
    assert "cannot write spans to" in done.stderr and "Fix:" in done.stderr


@pytest.mark.parametrize("name", ["", "bad\0name"])
def test_a_trace_path_no_file_system_accepts_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidProgram, match="Fix:"):
        OtlpJsonFileExporter(tmp_path / "sub" / name if name else tmp_path)


def test_a_failed_write_counts_and_reports_what_it_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = OtlpJsonFileExporter(tmp_path / "spans.jsonl")

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "open", full_disk)
    monkeypatch.setattr("vyre_async.tracing.spans_to_otlp_json", lambda spans: {})
    with caplog.at_level(logging.WARNING, logger="vyre_async.tracing"):
        for _ in range(3):
            exporter.export([object(), object()])  # type: ignore[list-item]
    assert exporter.dropped == 6
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # the first failure, not one per batch
    assert "could not write 2 span(s)" in warnings[0] and "No space left" in warnings[0]


_PROCESSORS = """
import threading
import numpy as np
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from vyre_async import acquire_backend
from vyre_async.programs import elementwise_xor

class Raises(SpanProcessor):
    def __init__(self, at):
        self.at = at
    def on_start(self, span, parent_context=None):
        if self.at == "start":
            raise RuntimeError("on_start bug")
    def on_end(self, span):
        if self.at == "end":
            raise RuntimeError("on_end bug")

reported = []
threading.excepthook = lambda args: reported.append(str(args.exc_value))
provider = TracerProvider()
provider.add_span_processor(Raises(AT))
trace.set_tracer_provider(provider)
backend = acquire_backend("reference")
a = np.arange(64, dtype=np.uint32)
ok = sum(
    int((backend.dispatch_sync(elementwise_xor(64), [a, a ^ np.uint32(i)])[0] == i).all())
    for i in range(20)
)
print(ok, len(reported), sorted(set(reported)))
"""


@pytest.mark.parametrize("at", ["start", "end"])
def test_a_span_processor_that_raises_never_breaks_a_dispatch(at: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROCESSORS.replace("AT", repr(at))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ok, count, messages = done.stdout.split(" ", 2)
    assert ok == "20"  # every dispatch returned its exact result
    assert count == "20" and messages.strip() == f"['on_{at} bug']"  # each failure reported


_CANCELLED = """
import threading
import anyio, numpy as np
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from vyre_async import acquire_backend
from vyre_async.testing.test_contract import spin

class EndRaises(SpanProcessor):
    def on_end(self, span):
        raise RuntimeError("on_end bug")

reported = []
threading.excepthook = lambda args: reported.append(str(args.exc_value))
provider = TracerProvider()
provider.add_span_processor(EndRaises())
trace.set_tracer_provider(provider)
backend = acquire_backend("reference")

async def main():
    pending = backend.dispatch(spin(), [np.array([3_000_000], np.uint32)])
    with anyio.move_on_after(0.05) as scope:
        await pending  # cancelled: the span ends here, with the processor's fault
    return "cancelled cleanly" if scope.cancelled_caught else "not cancelled"

print(anyio.run(main), reported)
"""


def test_a_span_processor_failing_at_a_cancelled_await_is_reported_not_raised() -> None:
    # Found by the soak: the span of a dispatch whose await is cancelled ends in the
    # awaiting task; a processor raising there escaped into that task.
    done = subprocess.run(
        [sys.executable, "-c", _CANCELLED],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "cancelled cleanly ['on_end bug']"
