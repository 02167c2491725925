"""Verdicts land on real exported spans (an OpenTelemetry SDK in a fresh process).

The SDK's tracer provider can be set once per process and the telemetry tests
own it, so this check runs its workload in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, anyio, numpy as np
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    from vyre_async import compile
    from vyre_async._graph import ArmGraph
    from vyre_async.programs import elementwise_xor
    from vyre_reference import reference_backend

    async def main():
        backend = reference_backend()
        graph = ArmGraph(label="spans")
        for name in ("x", "y", "p", "q"):
            graph.resource(name, "u32", 64)
        xor = elementwise_xor(64)
        graph.arm(xor, {"a": "x", "b": "y", "out": "p"}, label="first")
        graph.arm(xor, {"a": "p", "b": "y", "out": "q"}, label="second")
        await graph.run(backend, outputs=["q"])
        pipeline = compile(backend, xor)
        for pending in pipeline.dispatch_batch([[np.zeros(64, np.uint32)] * 2] * 3):
            await pending

    anyio.run(main)
    spans = [
        {
            "name": s.name,
            "id": s.context.span_id,
            "parent": s.parent.span_id if s.parent else None,
            "attributes": {k: v for k, v in (s.attributes or {}).items()},
        }
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps(spans, default=list))
    """
)


def test_graph_prefetch_and_mode_verdicts_are_on_the_exported_spans(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    # This checkout's code, not whichever one the environment installed.
    source = os.pathsep.join([str(root / "src"), str(root / "src" / "backends")])
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={"VYRE_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": source},
    )
    spans = json.loads(out.stdout)
    graph = [s for s in spans if s["name"] == "vyre.graph"]
    dispatches = [s for s in spans if s["name"] == "vyre.dispatch"]
    assert len(graph) == 1 and len(dispatches) == 5
    g = graph[0]
    assert g["attributes"]["vyre.graph.layers"] == 2
    assert g["attributes"]["vyre.graph.joins"] == 1
    assert g["attributes"]["vyre.graph.residency"] == "resident"
    # not calibrated (a fresh cache): today's default, resident buffers
    assert g["attributes"]["vyre.policy.residency"] == "resident"
    assert g["attributes"]["vyre.policy.residency.reason"] == "uncalibrated"
    assert g["attributes"]["vyre.graph.joins_on"] == "device"
    assert g["attributes"]["vyre.policy.execution_mode.reason"] == "unsupported_by_backend"
    arms = [s for s in dispatches if s["parent"] == g["id"]]
    assert [a["attributes"]["vyre.arm.label"] for a in arms] == ["first", "second"]
    first, second = (a["attributes"] for a in arms)
    assert first["vyre.policy.arm.layer"] == 0 and "vyre.policy.arm.reason" not in first
    assert second["vyre.policy.arm.layer"] == 1
    assert second["vyre.policy.arm.reason"] == "read_after_write"
    assert second["vyre.policy.arm.after"] == 0
    batch = [s["attributes"] for s in dispatches if s["parent"] is None]
    assert len(batch) == 3
    assert all(a["vyre.policy.execution_mode"] == "plain" for a in batch)
    assert all(a["vyre.policy.execution_mode.reason"] == "unsupported_by_backend" for a in batch)
    # The graph's arms ran xor's resident variant (its WRITE buffer made READ_WRITE:
    # another shape), then the batch ran xor three times: shapes v, v, x, x, x.
    # After v, v the history predicts v (the first x misses); after v, v, x it
    # predicts nothing (no pattern); after v, v, x, x it predicts x (a hit).
    variant, plain = (
        {a["attributes"]["vyre.program.fingerprint"] for a in arms},
        {a["vyre.program.fingerprint"] for a in batch},
    )
    assert len(variant) == len(plain) == 1 and variant != plain
    scored = [s["attributes"] for s in dispatches if "vyre.prefetch.hit" in s["attributes"]]
    assert [(a["vyre.prefetch.hit"], a["vyre.prefetch.hit_rate"]) for a in scored] == [
        (False, 0.0),
        (True, 0.5),
    ]
