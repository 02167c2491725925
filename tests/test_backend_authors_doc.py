"""docs/backend-authors.md: its complete backend runs as written, through the seam alone.

The first ``python`` block of the guide is a whole module: a null device that
settles every dispatch from its own thread. It is written to a file and run in
a fresh interpreter (its ``__main__`` dispatches once on asyncio), imported to
run more dispatches (a timeout, a batch, close with work queued), and checked to
import nothing of vyre-async but ``abc``, ``ir`` and ``errors``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import anyio
import numpy as np
import pytest

from tests.test_structure import vyre_imports, within_the_seam
from vyre_async import DispatchConfig, DispatchTimeout, VyreBackend, acquire_backend
from vyre_async._registry import BackendRegistration, register_backend
from vyre_async.programs import elementwise_xor

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "backend-authors.md"


def example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert blocks, "docs/backend-authors.md has no python block"
    return str(blocks[0])


@pytest.fixture(scope="module")
def null_device(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    path = tmp_path_factory.mktemp("guide") / "null_device.py"
    path.write_text(example())
    spec = importlib.util.spec_from_file_location("null_device", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.__file__ = str(path)
    return module


def test_the_example_imports_only_the_seam() -> None:
    imports = vyre_imports(example().split('if __name__ == "__main__":')[0])
    assert imports == {"vyre_async.abc", "vyre_async.errors", "vyre_async.ir"}
    assert all(within_the_seam(m) for m in imports)


def test_the_example_runs_as_written(null_device: ModuleType) -> None:
    out = subprocess.run(
        [sys.executable, str(null_device.__file__)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["null [0, 0, 0, 0, 0, 0, 0, 0]"]


def test_the_null_device_settles_from_its_thread_and_closes(null_device: ModuleType) -> None:
    async def main() -> None:
        backend = VyreBackend(null_device.NullExecutor(), prefetch=False)
        program = elementwise_xor(64)
        a = np.arange(64, dtype=np.uint32)
        pendings = [backend.dispatch(program, [a, a]) for _ in range(32)]
        for pending in pendings:
            assert (await pending)[0].tolist() == [0] * 64
        batch = backend.compile(program).dispatch_batch([[a, a]] * 4)
        assert [len((await p)[0]) for p in batch] == [64] * 4
        await backend.aclose()
        assert not backend.executor._device.is_alive()  # (its thread ended in close)

    anyio.run(main)


@pytest.mark.usefixtures("isolated")
def test_the_null_device_through_the_registry(null_device: ModuleType) -> None:
    register_backend(BackendRegistration(id="null", factory=null_device.NullExecutor), replace=True)
    backend = acquire_backend("null")
    assert isinstance(backend, VyreBackend) and backend.id == "null"
    a = np.arange(8, dtype=np.uint32)
    assert backend.dispatch_sync(elementwise_xor(8), [a, a])[0].tolist() == [0] * 8
    anyio.run(backend.aclose)


def test_a_dispatch_past_its_timeout_is_dropped_and_the_device_goes_on(
    null_device: ModuleType,
) -> None:
    class Held(null_device.NullExecutor):  # type: ignore[name-defined,misc]
        """The null device, busy until ``gate`` opens."""

        def __init__(self) -> None:
            self.gate = threading.Event()
            super().__init__()

        def _run(self) -> None:
            self.gate.wait(10)
            super()._run()

    executor = Held()
    backend = VyreBackend(executor, prefetch=False)
    a = np.arange(8, dtype=np.uint32)
    late = backend.dispatch(elementwise_xor(8), [a, a], DispatchConfig(timeout=0.05))
    with pytest.raises(DispatchTimeout):
        late.result(timeout=10)
    assert late.timing is not None and late.timing.queue_s is None  # never started
    executor.gate.set()
    assert backend.dispatch_sync(elementwise_xor(8), [a, a])[0].tolist() == [0] * 8
    anyio.run(backend.aclose)
