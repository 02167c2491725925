"""Entry-point registration of the CUDA backend; imports nothing but the record (never CuPy)."""

from __future__ import annotations

from vyre_async.registry import BackendRegistration

__all__ = ["REGISTRATION"]

REGISTRATION = BackendRegistration(
    id="cupy",
    factory="vyre_cupy.backend:create_backend",
    precedence=10,
    dispatches=True,
    is_reference=False,
)
