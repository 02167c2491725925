"""Pipeline cache identity: what must match for a compiled pipeline to be reused.

identity = blake3(key version, kernel digest of the program, policy digest of the
config fields that change code, backend id and version, device fingerprint,
compiler version and options). Any part changing is a miss whose reason says
which part changed.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import blake3

from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async.ir.program import Program

__all__ = [
    "CACHE_KEY_VERSION",
    "MISS_REASONS",
    "PipelineIdentity",
    "classify_miss",
    "pipeline_identity",
    "policy_digest",
]
__dir__ = _public_dir(__name__)

#: Bump when anything about how identities are computed changes.
CACHE_KEY_VERSION = 1
#: Every reason a lookup can miss, in the order they are tested.
MISS_REASONS = ("empty", "program_changed", "policy_changed", "device_changed", "absent")


def _frame(*parts: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(p)) + p for p in parts)


@dataclass(frozen=True, slots=True)
class PipelineIdentity:
    """The cache identity of one compiled pipeline and its three components."""

    program_digest: bytes
    policy_digest: bytes
    device_digest: bytes
    digest: bytes

    @property
    def hex(self) -> str:
        """The identity digest as 64 hex characters (the disk cache file name)."""
        return self.digest.hex()


def policy_digest(config: DispatchConfig | None) -> bytes:
    """Return the digest of the config fields that change generated code.

    Only ``ulp_budget`` and ``workgroup_override`` count; each is hashed with a
    presence flag so ``None`` and an explicit value differ.
    """
    cfg = config or DispatchConfig()
    return _policy_digest(cfg.ulp_budget, cfg.workgroup_override)


@functools.lru_cache(maxsize=256)
def _policy_digest(ulp_budget: int | None, workgroup: tuple[int, int, int] | None) -> bytes:
    # Memoised: every dispatch needs it, and only these two fields matter.
    ulp = b"\0" if ulp_budget is None else b"\1" + struct.pack("<B", ulp_budget)
    wg = b"\0" if workgroup is None else b"\1" + struct.pack("<3I", *workgroup)
    return blake3.blake3(_frame(b"vyre-policy-v1", ulp, wg)).digest()


def pipeline_identity(
    program: Program,
    config: DispatchConfig | None,
    *,
    backend_id: str,
    backend_version: str,
    device_fingerprint: str = "",
    compiler: str = "",
    compile_options: Mapping[str, object] | None = None,
) -> PipelineIdentity:
    """Return the cache identity of ``program`` compiled under ``config`` by one backend."""
    program_digest = program.kernel_digest(compile_options)
    policy = policy_digest(config)
    device = blake3.blake3(
        _frame(
            b"vyre-device-v1",
            backend_id.encode(),
            backend_version.encode(),
            device_fingerprint.encode(),
            compiler.encode(),
        )
    ).digest()
    digest = blake3.blake3(
        _frame(b"vyre-pipeline-v%d" % CACHE_KEY_VERSION, program_digest, policy, device)
    ).digest()
    return PipelineIdentity(program_digest, policy, device, digest)


def classify_miss(wanted: PipelineIdentity, cached: Iterable[PipelineIdentity]) -> str:
    """Return why ``wanted`` is not among ``cached`` (one of `MISS_REASONS`)."""
    entries = list(cached)
    if not entries:
        return "empty"
    same_program = [e for e in entries if e.program_digest == wanted.program_digest]
    if not same_program:
        return "program_changed"
    same_policy = [e for e in same_program if e.policy_digest == wanted.policy_digest]
    if not same_policy:
        return "policy_changed"
    if not any(e.device_digest == wanted.device_digest for e in same_policy):
        return "device_changed"
    return "absent"
