"""Pipeline cache identity: every input that changes compiled code changes the key.

A compiled pipeline may be reused only where the same compiler would have
produced it for the same device. A key that leaves one input out loads a
kernel built for something else: a mutation sample dropped the compiler
fingerprint and two NVRTC versions shared one disk entry. So each input is
changed alone, through `pipeline_identity` and through a backend, and the disk
cache is checked to refuse an entry written under another compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from vyre_async import DiskPipelineCache, DispatchConfig
from vyre_async._cache import identity as identity_module
from vyre_async._cache.identity import PipelineIdentity, classify_miss, pipeline_identity
from vyre_async.ir import Access, BufferDecl, DType, Program, Store, gid, u32
from vyre_async.programs import elementwise_xor, histogram, saxpy

XOR = elementwise_xor(64)
BASE: dict[str, Any] = {
    "backend_id": "cupy",
    "backend_version": "0.2.0",
    "device_fingerprint": "NVIDIA H100 sm_90; driver 13000; runtime 13000",
    "compiler": "nvrtc 13.0; --fmad=false -arch=sm_90",
    "compile_options": {"fast_math": False},
}


def _identity(
    program: Program = XOR, config: DispatchConfig | None = None, **changes: Any
) -> PipelineIdentity:
    return pipeline_identity(program, config, **{**BASE, **changes})


# Each input alone: (name, change, the component of the identity it lives in).
CHANGES: list[tuple[str, dict[str, Any], str]] = [
    ("backend id", {"backend_id": "reference"}, "device"),
    ("backend version", {"backend_version": "0.2.1"}, "device"),
    ("device fingerprint", {"device_fingerprint": "NVIDIA H200 sm_90"}, "device"),
    ("compiler version", {"compiler": "nvrtc 13.1; --fmad=false -arch=sm_90"}, "device"),
    ("compiler target", {"compiler": "nvrtc 13.0; --fmad=false -arch=sm_100"}, "device"),
    ("compile options", {"compile_options": {"fast_math": True}}, "program"),
    ("compile option added", {"compile_options": {"fast_math": False, "x": 1}}, "program"),
]


@pytest.mark.parametrize(
    ("change", "component"), [c[1:] for c in CHANGES], ids=[c[0] for c in CHANGES]
)
def test_each_input_changes_the_identity(change: dict[str, Any], component: str) -> None:
    base, changed = _identity(), _identity(**change)

    assert changed.digest != base.digest and changed.hex != base.hex
    parts = {"program": "program_digest", "policy": "policy_digest", "device": "device_digest"}
    for part, field in parts.items():
        same = getattr(changed, field) == getattr(base, field)
        assert same is (part != component), f"{field} should change only for {component}"
    reason = {"program": "program_changed", "device": "device_changed"}[component]
    assert classify_miss(changed, [base]) == reason


@pytest.mark.parametrize(
    "config",
    [
        DispatchConfig(ulp_budget=1),
        DispatchConfig(ulp_budget=0),
        DispatchConfig(workgroup_override=(32, 1, 1)),
    ],
    ids=["ulp_budget=1", "ulp_budget=0", "workgroup_override"],
)
def test_each_code_changing_config_field_changes_the_identity(config: DispatchConfig) -> None:
    base, changed = _identity(), _identity(config=config)

    assert changed.digest != base.digest
    assert changed.policy_digest != base.policy_digest
    assert (changed.program_digest, changed.device_digest) == (
        base.program_digest,
        base.device_digest,
    )
    assert classify_miss(changed, [base]) == "policy_changed"


def test_the_program_changes_the_identity() -> None:
    base, changed = _identity(), _identity(program=saxpy(64))

    assert changed.digest != base.digest and changed.program_digest != base.program_digest
    assert classify_miss(changed, [base]) == "program_changed"


def test_the_key_version_changes_the_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _identity()
    monkeypatch.setattr(identity_module, "CACHE_KEY_VERSION", identity_module.CACHE_KEY_VERSION + 1)
    changed = _identity()

    assert changed.digest != base.digest
    # Only the outer digest: the components are compared by classify_miss as before.
    assert (changed.program_digest, changed.policy_digest, changed.device_digest) == (
        base.program_digest,
        base.policy_digest,
        base.device_digest,
    )


def test_what_does_not_change_code_keeps_the_identity() -> None:
    base = _identity()
    # Launch-time settings, labels and timeouts do not change the kernel.
    unchanged = _identity(
        config=DispatchConfig(timeout=3, label="x", profile="p", grid_override=(4, 1, 1))
    )
    assert unchanged == base
    # Nor do buffer sizes of non-WORKGROUP buffers (they reach the kernel at launch).
    assert _identity(program=elementwise_xor(1024)).digest == base.digest
    # Nor the order compile options were given in.
    two = {"a": 1, "b": 2}
    assert _identity(compile_options=two) == _identity(compile_options=dict(reversed(two.items())))


def test_workgroup_buffer_size_changes_the_identity() -> None:
    def tiled(count: int) -> Program:
        buffers = (
            BufferDecl("out", 0, Access.WRITE, DType.U32, 64),
            BufferDecl("tile", 1, Access.WORKGROUP, DType.U32, count),
        )
        return Program(buffers, 64, (Store("out", gid(), u32(1)),))

    assert _identity(program=tiled(64)).digest != _identity(program=tiled(128)).digest


# Through a backend: the identity a backend computes uses each of its hooks ------------


class CompilerBackend(BytesBackend):
    """A test backend whose compiler fingerprint and compile options can be set."""

    def __init__(
        self,
        *,
        compiler: str = "cc 1.0",
        options: Mapping[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.compiler = compiler
        self.options = dict(options or {})

    def compiler_fingerprint(self) -> str:
        return self.compiler

    def compile_options(self, config: DispatchConfig) -> Mapping[str, object]:
        return self.options


BACKEND_CHANGES: list[tuple[str, dict[str, Any]]] = [
    ("device fingerprint", {"fingerprint": "host-b"}),
    ("compiler fingerprint", {"compiler": "cc 1.1"}),
    ("compile options", {"options": {"fast_math": True}}),
]


@pytest.mark.parametrize(
    "change", [c[1] for c in BACKEND_CHANGES], ids=[c[0] for c in BACKEND_CHANGES]
)
def test_a_backend_hook_changes_its_identities(change: dict[str, Any]) -> None:
    assert backend_of(CompilerBackend, **change).pipeline_identity(XOR) != backend_of(
        CompilerBackend
    ).pipeline_identity(XOR)


def test_backend_id_and_version_change_its_identities() -> None:
    class Other(CompilerBackend):
        id = "bytes-test-2"

    class Newer(CompilerBackend):
        version = "1.1"

    base = backend_of(CompilerBackend).pipeline_identity(XOR)
    assert backend_of(Other).pipeline_identity(XOR) != base
    assert backend_of(Newer).pipeline_identity(XOR) != base


@pytest.mark.parametrize(
    "change", [c[1] for c in BACKEND_CHANGES], ids=[c[0] for c in BACKEND_CHANGES]
)
def test_a_disk_entry_from_another_compiler_or_device_is_not_loaded(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    backend_of(CompilerBackend, disk_cache=DiskPipelineCache(tmp_path)).compile(histogram())
    same = backend_of(CompilerBackend, disk_cache=DiskPipelineCache(tmp_path))
    assert same.compile(histogram()).source == "disk" and same.executor.builds == 0

    other = backend_of(CompilerBackend, disk_cache=DiskPipelineCache(tmp_path), **change)
    pipeline = other.compile(histogram())

    assert (pipeline.source, other.executor.builds, other.executor.loads) == ("compiled", 1, 0)
    assert DiskPipelineCache(tmp_path).info().entries == 2  # each compiler keeps its own
