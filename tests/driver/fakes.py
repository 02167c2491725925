"""A minimal executor for testing the backend-neutral driver machinery.

It "compiles" a program to its wire bytes (so the disk cache has real bytes to
store) and answers every dispatch inline with the outputs as initialised:
zeros for WRITE buffers, the input for READ_WRITE buffers. It computes nothing.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from vyre_async._capabilities import BackendCapabilities
from vyre_async._config import DispatchConfig
from vyre_async._pipeline import Launch
from vyre_async._resident import ResidentBuffer
from vyre_async.abc import Executor
from vyre_async.ir import Access, Program


class BytesBackend(Executor):
    id = "bytes-test"
    version = "1.0"

    def __init__(self, *, fingerprint: str = "host-a", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fingerprint = fingerprint
        self.builds = 0
        self.loads = 0
        self.launches: list[Launch] = []

    def device_fingerprint(self) -> str:
        return self.fingerprint

    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(max_workgroup_size=(1024, 1024, 64), max_workgroup_lanes=1024)

    def build_pipeline(self, program: Program, config: DispatchConfig) -> Any:
        self.builds += 1
        return program.to_wire()

    def serialize_pipeline(self, native: Any) -> bytes | None:
        return bytes(native)

    def load_pipeline(self, payload: bytes, program: Program, config: DispatchConfig) -> Any:
        self.loads += 1
        assert Program.from_wire(payload) == program
        return payload

    def enqueue(self, launch: Launch) -> None:
        self.launches.append(launch)
        outputs = []
        inputs = dict(zip((d.name for d in launch.plan.inputs), launch.inputs, strict=True))
        for decl in launch.plan.outputs:
            if decl.access is Access.READ_WRITE:
                value = inputs[decl.name]
                assert not isinstance(value, ResidentBuffer)
                outputs.append(value.copy())
            else:
                outputs.append(np.zeros(launch.plan.count_of(decl.name), decl.dtype.numpy))
        launch.completer.mark_started()
        launch.completer.resolve(outputs, device_s=0.0, compile_s=launch.compile_s)


class DelayBackend(BytesBackend):
    """Completes every dispatch from one worker thread after ``delay`` seconds, like a device.

    Records ``vyre.wait`` and ``vyre.launch`` phases and a ``vyre.stream`` attribute.
    """

    id = "delay-test"

    def __init__(self, delay: float = 0.001, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self._queue: queue.SimpleQueue[tuple[Launch, int] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._serve, daemon=True)
        self._worker.start()

    def enqueue(self, launch: Launch) -> None:
        self._queue.put((launch, time.time_ns()))

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            launch, enqueued_ns = item
            started = time.time_ns()
            launch.completer.mark_started()
            launch.completer.record_phase("vyre.wait", enqueued_ns, started)
            time.sleep(self.delay)
            outputs = [
                np.zeros(launch.plan.count_of(d.name), d.dtype.numpy) for d in launch.plan.outputs
            ]
            launch.completer.record_phase("vyre.launch", started, time.time_ns())
            launch.completer.annotate("vyre.stream", 1)
            launch.completer.resolve(outputs, device_s=self.delay)

    def stop(self) -> None:
        """End the worker thread (after the dispatches queued so far)."""
        self._queue.put(None)
        self._worker.join()

    async def close(self, timeout: float) -> None:
        self._queue.put(None)  # the worker ends after what is queued (a daemon: never waited)
