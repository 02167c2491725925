"""Ray's exceptions become vyre-async errors here, and nowhere else."""

from __future__ import annotations

from typing import Any

from vyre_async.errors import (
    BackendError,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    UnsupportedFeature,
)

__all__ = ["UnknownProgram", "not_installed", "translate"]


class UnknownProgram(Exception):
    """Raised by a worker asked to run a program it has not been sent (a restarted worker)."""

    def __init__(self, digest: bytes) -> None:
        super().__init__(digest.hex())
        self.digest = digest

    def __reduce__(self) -> tuple[type[UnknownProgram], tuple[bytes]]:
        return (UnknownProgram, (self.digest,))  # it crosses processes inside Ray's error


def not_installed(cause: BaseException) -> UnsupportedFeature:
    """The error for a machine without Ray."""
    error = UnsupportedFeature(
        f"the 'ray' backend needs Ray, which is not installed ({type(cause).__name__}: {cause})",
        fix="pip install 'vyre-async[ray]'",
        backend_id="ray",
        cause="no-ray",
    )
    error.__cause__ = cause
    return error


def translate(exc: BaseException, *, doing: str) -> BackendError:
    """Return the vyre-async error for an exception Ray raised while ``doing``.

    A worker's own `BackendError` comes back as itself (same class and code);
    a worker that died and could not be replaced in time is `DeviceLost`; a
    full object store is `DeviceOutOfMemory`; anything else is `DispatchFailed`
    naming what happened. The Ray exception is the cause.
    """
    import ray.exceptions as rex

    if isinstance(exc, BackendError):
        return exc
    cause: Any = getattr(exc, "cause", None)
    if isinstance(exc, rex.RayTaskError) and isinstance(cause, BackendError):
        return cause
    error: BackendError
    if isinstance(exc, rex.ObjectStoreFullError | rex.OutOfMemoryError):
        error = DeviceOutOfMemory(
            f"the Ray cluster ran out of memory while {doing}: {exc}",
            fix="send smaller inputs per dispatch, or give the cluster more object store "
            "memory (ray start --object-store-memory)",
        )
    elif isinstance(exc, rex.RayActorError | rex.WorkerCrashedError | rex.NodeDiedError):
        error = DeviceLost(
            f"a Ray worker died while {doing} and the dispatch could not be retried: "
            f"{type(exc).__name__}",
            fix="retry the dispatch: the pool replaces dead workers; check the workers' "
            "logs (ray logs) for why they died",
        )
    else:
        detail = cause if cause is not None else exc
        error = DispatchFailed(
            f"the Ray worker failed while {doing}: {type(detail).__name__}: {detail}",
            fix="inspect the chained exception; check the Ray cluster (ray status)",
        )
    error.__cause__ = exc
    return error
