"""Entry-point registration of the CUDA backend; imports nothing but the record (never CuPy)."""

from __future__ import annotations

from vyre_async.abc import BackendRegistration
from vyre_async.abc import public_dir as _public_dir

__all__ = ["REGISTRATION"]
__dir__ = _public_dir(__name__)

REGISTRATION = BackendRegistration(
    id="cupy",
    factory="vyre_cupy.backend:create_backend",
    precedence=10,
    dispatches=True,
    is_reference=False,
    probe="vyre_cupy.device:probe",  # imports CuPy and asks the driver; builds nothing
)
