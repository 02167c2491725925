"""An arm graph: independent arms run together, dependent arms wait, one ``await``.

Seven programs ("arms") share named graph resources. The driver derives what
each arm reads and writes from its bindings, layers the arms so that every
layer holds mutually independent arms, runs each layer's arms concurrently
(worker threads on the reference backend, one stream each on a GPU backend)
where the backend's calibration says concurrency pays, else one after another
(the report says which, and why), keeps the resources in resident buffers or
as host arrays as the residency policy decides from the same calibration (the
reference backend's "resident" buffers are host arrays the engine copies, so
there it measures them slower and the graph uses host arrays; the report says
so), and returns the requested resources with a report: the layers, which
arms ran together, why each later arm had to wait, streams, timing and the
execution mode chosen for the repeated submission.

    .venv/bin/python examples/megakernel_arms.py            # reference backend
    .venv/bin/python examples/megakernel_arms.py --backend cupy --size 4194304
    .venv/bin/python examples/megakernel_arms.py --timeline arms.json   # for ui.perfetto.dev

With ``--timeline PATH`` every dispatch and graph is traced (with the phase
detail) and the trace is written as Chrome trace-event JSON: open it in
https://ui.perfetto.dev to see the layers' arms side by side.

The result is checked against running the arms one by one in submission order,
and the two are timed in interleaved rounds (medians reported).
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import numpy as np

from vyre_async import ArmGraph, GraphResult, VyreBackend, acquire_backend, calibration_for
from vyre_async.programs import elementwise_xor, histogram, saxpy


def build(n: int, seed: int = 0) -> ArmGraph:
    """The graph: encrypt/whiten/count/scale in parallel, then mix, then count and re-key."""
    rng = np.random.default_rng(seed)
    graph = ArmGraph(label="megakernel-arms")
    for name in ("data", "key", "mask"):
        graph.resource(name, "u32", n, initial=rng.integers(0, 2**32, n, dtype=np.uint32))
    for name in ("cipher", "white", "mixed"):
        graph.resource(name, "u32", n)
    graph.resource("hist_data", "u32", 256)
    graph.resource("hist_mixed", "u32", 256)
    graph.resource("x", "f32", n, initial=rng.standard_normal(n, dtype=np.float32))
    graph.resource("y", "f32", n, initial=rng.standard_normal(n, dtype=np.float32))
    graph.resource("alpha", "f32", 1, initial=np.array([0.5], np.float32))
    graph.resource("scaled", "f32", n)

    xor, hist = elementwise_xor(n), histogram()
    graph.arm(xor, {"a": "data", "b": "key", "out": "cipher"}, label="encrypt")
    graph.arm(xor, {"a": "mask", "b": "key", "out": "white"}, label="whiten")
    graph.arm(hist, {"data": "data", "hist": "hist_data"}, label="count-data")
    graph.arm(saxpy(n), {"x": "x", "y": "y", "alpha": "alpha", "out": "scaled"}, label="scale")
    graph.arm(xor, {"a": "cipher", "b": "white", "out": "mixed"}, label="mix")
    graph.arm(hist, {"data": "mixed", "hist": "hist_mixed"}, label="count-mixed")
    graph.arm(xor, {"a": "mixed", "b": "data", "out": "key"}, label="rekey")
    return graph


async def sequential(backend: VyreBackend, graph: ArmGraph) -> dict[str, np.ndarray]:
    """Run the arms one at a time in submission order (the semantics the graph keeps)."""
    state = {name: res.contents() for name, res in graph.resources.items()}
    for arm in graph.arms:
        inputs = [state[arm.resource_of(d.name)] for d in arm.program.inputs]
        outputs = await backend.dispatch(arm.program, inputs, arm.config)
        for decl, output in zip(arm.program.outputs, outputs, strict=True):
            state[arm.resource_of(decl.name)] = output
    return state


def show(result: GraphResult) -> None:
    report = result.report
    print(report.describe())
    print("concurrency:")
    for number, layer in enumerate(report.layers):
        arms = [report.arms[i] for i in layer]
        streams = {a.label: a.stream for a in arms if a.stream is not None}
        where = f" on streams {streams}" if streams else " (worker threads / inline)"
        verdict = report.concurrency[number]
        if len(arms) == 1:
            how = "alone"
        elif verdict.concurrent:
            how = f"in flight together ({verdict.reason})"
        else:
            how = f"one after another ({verdict.reason})"
        print(f"  layer {number}: {len(arms)} arm(s) {how}{where}")
    placement = report.residency_verdict
    if placement is not None:
        saving = (
            f", est. {placement.savings_ns / 1e6:+.2f} ms if resident"
            if placement.savings_ns
            else ""
        )
        print(f"residency: {placement.kind} ({placement.reason}{saving})")
    print("why arms waited:")
    for arm in report.arms:
        for conflict in arm.conflicts:
            earlier = report.arms[conflict.earlier].label
            slots = sorted(map(str, conflict.slots))
            print(f"  {arm.label} after {earlier}: {conflict.reason} on {slots}")


async def main(args: argparse.Namespace) -> None:
    provider = None
    if args.timeline:
        from vyre_async.tracing import configure_tracing

        spans_file = f"{args.timeline}.otlp.jsonl"
        provider = configure_tracing(f"file:{spans_file}", detail="phases")
    backend = acquire_backend(args.backend)
    # Measure once per device (cached on disk): the concurrency and residency verdicts read it.
    calibration = await anyio.to_thread.run_sync(lambda: calibration_for(backend, measure=True))
    graph = build(args.size)
    outputs = ["key", "hist_data", "hist_mixed", "scaled"]
    await graph.run(backend, outputs=outputs)  # warm-up: compile every pipeline once
    await sequential(backend, graph)
    graph_times: list[float] = []
    sequential_times: list[float] = []
    result = None
    for _ in range(args.rounds):  # interleaved, so both see the same machine load
        started = time.perf_counter()
        result = await graph.run(backend, outputs=outputs)
        graph_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        expected = await sequential(backend, graph)
        sequential_times.append(time.perf_counter() - started)
        for name in outputs:
            assert np.array_equal(result.outputs[name], expected[name]), name
    assert result is not None
    show(result)
    overlap = None if calibration is None else calibration.concurrent_overlap_bps
    gain = None if calibration is None else calibration.resident_gain_bps
    print(
        "calibrated arm overlap: "
        + ("not measured" if overlap is None else f"{overlap / 100:+.0f} %")
        + "; resident gain: "
        + ("not measured" if gain is None else f"{gain / 100:+.0f} %")
    )
    graph_ms = statistics.median(graph_times) * 1e3
    sequential_ms = statistics.median(sequential_times) * 1e3
    print(
        f"graph: {graph_ms:.1f} ms in {len(result.report.layers)} layers; "
        f"one by one: {sequential_ms:.1f} ms (medians of {args.rounds} interleaved rounds, "
        f"ratio {graph_ms / sequential_ms:.2f}); outputs identical"
    )
    mode = result.report.execution.mode
    print(
        f"submission #{result.report.submission}: execution mode {mode.kind}"
        + (f" ({mode.reason})" if mode.reason else "")
    )
    await backend.shutdown()
    if provider is not None:
        from vyre_async.timeline import convert

        provider.shutdown()  # flushes the spans to the file
        timeline = convert(spans_file, args.timeline)
        print(
            f"timeline: {timeline.spans} spans, {timeline.events} slices on {timeline.tracks} "
            f"tracks -> {args.timeline} (open it in https://ui.perfetto.dev)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="reference", help="backend id (default reference)")
    parser.add_argument("--size", type=int, default=1 << 21, help="elements per buffer")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument(
        "--timeline", default=None, metavar="PATH", help="write a Perfetto timeline of the run"
    )
    anyio.run(main, parser.parse_args())
