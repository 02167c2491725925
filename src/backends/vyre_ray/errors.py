"""Ray's exceptions become vyre-async errors here, and nowhere else."""

from __future__ import annotations

from vyre_async.abc import public_dir as _public_dir
from vyre_async.errors import (
    BackendError,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    UnsupportedFeature,
)

__all__ = ["UnknownProgram", "cause_of", "not_installed", "translate"]
__dir__ = _public_dir(__name__)


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


def cause_of(exc: BaseException) -> BaseException:
    """The exception a worker raised, for Ray's wrapper of it (else ``exc`` itself)."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return exc


def translate(exc: BaseException, *, doing: str) -> BackendError:
    """Return the vyre-async error for an exception Ray raised while ``doing``.

    A worker's own `BackendError` comes back as itself (same class and code;
    Ray's future raises it wrapped in a class derived from both, which is
    unwrapped here); a worker that died, or a node lost with its objects, and
    could not be replaced in time is `DeviceLost`; a full object store or disk
    is `DeviceOutOfMemory`; anything else is `DispatchFailed` naming what
    happened. The Ray exception is the cause.
    """
    import ray.exceptions as rex

    cause = cause_of(exc)
    if isinstance(cause, BackendError) and not isinstance(cause, rex.RayError):
        return cause
    error: BackendError
    if isinstance(exc, rex.ObjectStoreFullError | rex.OutOfMemoryError | rex.OutOfDiskError):
        error = DeviceOutOfMemory(
            f"the Ray cluster ran out of memory while {doing}: {type(exc).__name__}",
            fix="send smaller inputs per dispatch, or give the cluster more object store "
            "memory (ray start --object-store-memory) or disk",
        )
    elif isinstance(
        exc,
        rex.RayActorError
        | rex.WorkerCrashedError
        | rex.NodeDiedError
        | rex.ObjectLostError
        | rex.GetTimeoutError,
    ):
        error = DeviceLost(
            f"a Ray worker died or did not answer while {doing}: {type(exc).__name__}",
            fix="retry: the pool replaces dead workers; check the cluster (ray status) and "
            "the workers' logs (ray logs) for why",
        )
    else:  # (a worker's exception comes wrapped by Ray; anything else failed here)
        what = f"the Ray worker failed while {doing}" if cause is not exc else f"{doing} failed"
        error = DispatchFailed(
            f"{what}: {type(cause).__name__}: {cause}",
            fix="inspect the chained exception; check the Ray cluster (ray status)",
        )
    error.__cause__ = exc
    return error
