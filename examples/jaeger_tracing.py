"""A service-like async loop whose request spans contain vyre dispatch spans.

Each "request" opens its own span, does a little host work, awaits one or two
GPU dispatches and answers. Export the trace to Jaeger (or any OTLP collector):

    docker run --rm -p 16686:16686 -p 4318:4318 jaegertracing/jaeger:latest
    OTEL_SERVICE_NAME=vyre-example .venv/bin/python examples/jaeger_tracing.py --trace otlp

then open http://localhost:16686 and pick the service. Without Jaeger, write a
file that a Jaeger UI (1.55+) can load and look at it:

    .venv/bin/python examples/jaeger_tracing.py --trace file:traces.jsonl
"""

from __future__ import annotations

import argparse
import random

import anyio
import numpy as np
from opentelemetry import trace

from vyre_async import DispatchConfig, acquire_preferred_backend
from vyre_async.programs import histogram, saxpy
from vyre_async.tracing import configure_tracing

tracer = trace.get_tracer("examples.jaeger_tracing")


async def handle(backend: object, request_id: int) -> float:
    """One request: a histogram of its payload, then a saxpy over the counts."""
    rng = np.random.default_rng(request_id)
    with tracer.start_as_current_span("handle_request") as span:
        span.set_attribute("request.id", request_id)
        payload = rng.integers(0, 1 << 16, size=random.choice([1 << 12, 1 << 16]), dtype=np.uint32)
        hist = np.zeros(256, np.uint32)
        (counts,) = await backend.dispatch(  # type: ignore[attr-defined]
            histogram(), [payload, hist], DispatchConfig(label=f"hist-{request_id}")
        )
        x = counts.astype(np.float32)
        (scaled,) = await backend.dispatch(  # type: ignore[attr-defined]
            saxpy(256), [x, np.ones(256, np.float32), np.array([0.5], np.float32)]
        )
        return float(scaled.sum())


async def serve(requests: int, concurrency: int) -> None:
    backend = acquire_preferred_backend(allow_reference=True)
    limiter = anyio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with limiter:
            await handle(backend, i)

    async with anyio.create_task_group() as tg:
        for i in range(requests):
            tg.start_soon(one, i)
    print(f"served {requests} requests on the {backend.id!r} backend")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trace", default="console", help="none, console, otlp or file:PATH")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    provider = configure_tracing(args.trace, service_name="vyre-example")
    try:
        anyio.run(serve, args.requests, args.concurrency)
    finally:
        if provider is not None:
            provider.shutdown()  # flush batched spans before exiting


if __name__ == "__main__":
    main()
