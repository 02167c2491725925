"""The pool member: a Ray actor holding one local backend with warm caches.

Imported in the worker processes (and by `vyre_ray.backend` when it builds
the pool); it imports Ray. Each worker keeps the programs it was sent by
fingerprint (least recently used dropped beyond `PROGRAMS_KEPT`), so a caller
ships a program's wire bytes once per worker. A worker asked to run a program
it does not know (it was restarted, and the retried call carried no bytes)
raises `vyre_ray.errors.UnknownProgram`; the caller sends them again.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from opentelemetry import context, propagate

from vyre_async.abc import DispatchConfig, acquire_backend, acquire_preferred_backend
from vyre_async.abc import public_dir as _public_dir
from vyre_async.ir.program import Program
from vyre_ray.errors import UnknownProgram

__all__ = ["PROGRAMS_KEPT", "Worker"]
__dir__ = _public_dir(__name__)

#: Programs a worker keeps by fingerprint (and so pipelines its backend keeps warm).
PROGRAMS_KEPT = 256


class Worker:
    """One worker of a `vyre_ray.RayExecutor` pool (run as an async Ray actor).

    Args:
        inner: The id of the local backend to hold, or None for
            ``acquire_preferred_backend(allow_reference=True)`` (never ``ray``:
            remote backends are never preferred).
        index: This worker's place in the pool.
        trace: A ``configure_tracing`` spec for this worker's own spans
            (``"otlp"``, ``"file:PATH"``), or None to export nothing from here.
    """

    def __init__(self, inner: str | None, index: int, trace: str | None = None) -> None:
        logging.getLogger("ray").setLevel(logging.ERROR)
        self.index = index
        self.provider: Any = None
        if trace:
            from vyre_async.abc import configure_tracing

            self.provider = configure_tracing(trace, service_name=f"vyre-ray-worker-{index}")
        self.backend = (
            acquire_backend(inner) if inner else acquire_preferred_backend(allow_reference=True)
        )
        self.programs: OrderedDict[bytes, Program] = OrderedDict()
        self.in_flight = 0
        self.finished = 0

    def describe(self) -> dict[str, Any]:
        """What the caller's `RayExecutor.workers` reports about this worker."""
        import ray

        return {
            "index": self.index,
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "inner": self.backend.id,
            "device": self.backend.device_fingerprint(),
            "capabilities": self.backend.capabilities(),
            "cached_programs": len(self.programs),
            "in_flight": self.in_flight,
            "finished": self.finished,
        }

    async def run(
        self,
        digest: bytes,
        wire: bytes | None,
        inputs: Sequence[np.ndarray],
        config: DispatchConfig,
        carrier: Mapping[str, str] | None,
    ) -> list[np.ndarray]:
        """Dispatch the program ``digest`` (decoded from ``wire`` when sent) on this worker."""
        program = self.programs.get(digest)
        if program is None:
            if wire is None:
                raise UnknownProgram(digest)
            program = Program.from_wire(wire)
            self.programs[digest] = program
            if len(self.programs) > PROGRAMS_KEPT:
                self.programs.popitem(last=False)
        else:
            self.programs.move_to_end(digest)
        # The caller's span is the parent of this worker's dispatch span.
        token = context.attach(propagate.extract(carrier)) if carrier else None
        try:
            pending = self.backend.dispatch(program, list(inputs), config)
        finally:
            if token is not None:
                context.detach(token)
        self.in_flight += 1
        try:
            return await pending
        finally:
            self.in_flight -= 1
            self.finished += 1

    def flush_telemetry(self) -> bool:
        """Export this worker's finished spans now (tests, shutdown)."""
        if self.provider is None:
            return True
        return bool(self.provider.force_flush())
