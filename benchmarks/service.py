"""The example service under load: vyre-async in the handler vs numpy in the handler.

Prints one JSON object. Starts ``examples/service.py`` under uvicorn on
127.0.0.1 (a free port; reference backend, no tracing; stopped with SIGTERM by
its pid), then, in interleaved rounds, sends ``--requests`` requests from
``--clients`` concurrent httpx clients to ``POST /v1/run/xor`` (the work
dispatched through vyre-async) and to ``POST /v1/numpy/xor`` (the same answer
computed with numpy in the handler), JSON bodies of ``--n`` u32 elements each
(and raw bodies with ``--raw``). Reports requests/s and p50/p99 latency per
endpoint (medians over rounds). Every answer is checked.

    python benchmarks/service.py [--rounds 5] [--requests 1024] [--clients 64] [--n 256]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "service:app", "--app-dir", str(EXAMPLES),
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"],
        env={**os.environ, "VYRE_BACKEND": "reference", "VYRE_SERVICE_TRACE": "none"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the service did not start")


async def load(url: str, path: str, args: argparse.Namespace) -> dict[str, float]:
    """``args.requests`` requests from ``args.clients`` clients: requests/s, p50, p99."""
    latencies: list[float] = []
    per_client = args.requests // args.clients
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**32, args.n, dtype=np.uint32)
    b = rng.integers(0, 2**32, args.n, dtype=np.uint32)
    want = a ^ b
    body: dict[str, Any]
    if args.raw:
        body = {
            "content": a.tobytes() + b.tobytes(),
            "headers": {
                "Content-Type": "application/octet-stream",
                "X-Vyre-Counts": f"{args.n},{args.n}",
            },
        }
    else:
        body = {"json": {"inputs": [a.tolist(), b.tolist()]}}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            for _ in range(per_client):
                started = time.perf_counter()
                response = await http.post(path, **body)
                latencies.append(time.perf_counter() - started)
                got = (
                    np.frombuffer(response.content, np.uint32)
                    if args.raw
                    else np.array(response.json()["outputs"][0], np.uint32)
                )
                if response.status_code != 200 or not np.array_equal(got, want):
                    raise SystemExit(f"wrong answer from {path}: {response.status_code}")

    started = time.perf_counter()
    async with anyio.create_task_group() as tasks:
        for _ in range(args.clients):
            tasks.start_soon(client)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests_per_s": len(latencies) / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1e3,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    process, url = start()
    try:
        endpoints = {"vyre": "/v1/run/xor", "numpy": "/v1/numpy/xor"}
        for path in endpoints.values():  # warm: compile, connections
            await load(url, path, argparse.Namespace(**{**vars(args), "requests": args.clients}))
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in endpoints}
        for r in range(args.rounds):
            order = list(endpoints.items())
            for name, path in order if r % 2 == 0 else reversed(order):
                rounds[name].append(await load(url, path, args))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    results = {
        name: {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]}
        for name, runs in rounds.items()
    }
    results["vyre_over_numpy"] = {
        "requests_per_s": round(
            results["vyre"]["requests_per_s"] / results["numpy"]["requests_per_s"], 3
        ),
        "p50": round(results["vyre"]["p50_ms"] / results["numpy"]["p50_ms"], 3),
    }
    return {
        "benchmark": "service",
        "workload": f"POST xor of {args.n} u32 elements ({'raw' if args.raw else 'JSON'}), "
        f"{args.requests} requests from {args.clients} clients per round",
        "results": results,
        "rounds": args.rounds,
        "backend": "reference",
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}, "
        f"{os.cpu_count()} CPUs",
        "date": datetime.date.today().isoformat(),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--raw", action="store_true", help="raw little-endian bodies, not JSON")
    print(json.dumps(anyio.run(main, parser.parse_args())))
