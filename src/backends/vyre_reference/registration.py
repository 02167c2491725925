"""Entry-point registration of the reference backend; imports nothing but the record."""

from __future__ import annotations

from vyre_async.abc import BackendRegistration
from vyre_async.abc import public_dir as _public_dir

__all__ = ["REGISTRATION"]
__dir__ = _public_dir(__name__)

REGISTRATION = BackendRegistration(
    id="reference",
    factory="vyre_reference.backend:reference_backend",
    precedence=1000,
    dispatches=True,
    is_reference=True,
)
