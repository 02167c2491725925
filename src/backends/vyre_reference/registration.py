"""Entry-point registration of the reference backend; imports nothing but the record."""

from __future__ import annotations

from vyre_async._exports import public_dir as _public_dir
from vyre_async.registry import BackendRegistration

__all__ = ["REGISTRATION"]
__dir__ = _public_dir(__name__)

REGISTRATION = BackendRegistration(
    id="reference",
    factory="vyre_reference.backend:ReferenceBackend",
    precedence=1000,
    dispatches=True,
    is_reference=True,
)
