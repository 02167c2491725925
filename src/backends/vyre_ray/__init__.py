"""vyre-async's distributed backend (id ``"ray"``): a pool of Ray actors, one local backend each.

Importing this package imports no Ray; `RayExecutor`, `create_backend` and `local_backend` are
loaded on first use. See ``docs/distributed.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vyre_async.abc import public_dir as _public_dir

if TYPE_CHECKING:
    from vyre_ray.backend import RayExecutor, WorkerInfo, create_backend, local_backend

__all__ = ["RayExecutor", "WorkerInfo", "create_backend", "local_backend"]
__dir__ = _public_dir(__name__)


def __getattr__(name: str) -> Any:
    if name in __all__:
        from vyre_ray import backend

        return getattr(backend, name)
    raise AttributeError(f"module 'vyre_ray' has no attribute {name!r}")
