"""Entry-point registration of the Ray backend; imports nothing but the record (never Ray)."""

from __future__ import annotations

from vyre_async.abc import BackendRegistration
from vyre_async.abc import public_dir as _public_dir

__all__ = ["REGISTRATION"]
__dir__ = _public_dir(__name__)

REGISTRATION = BackendRegistration(
    id="ray",
    factory="vyre_ray.backend:create_backend",
    precedence=50,
    dispatches=True,
    is_reference=False,
    remote=True,  # never picked by acquire_preferred_backend: asked for by id only
    probe="vyre_ray.backend:probe",  # Ray installed, a cluster named; connects to nothing
)
