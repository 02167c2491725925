"""Entry-point registration of the reference backend; imports nothing but the record."""

from __future__ import annotations

from vyre_async.registry import BackendRegistration

__all__ = ["REGISTRATION"]

REGISTRATION = BackendRegistration(
    id="reference",
    factory="vyre_reference.backend:ReferenceBackend",
    precedence=1000,
    dispatches=True,
    is_reference=True,
)
