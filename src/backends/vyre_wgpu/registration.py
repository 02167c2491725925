"""Entry-point registration of the WebGPU backend; imports nothing but the record (never wgpu)."""

from __future__ import annotations

from vyre_async.abc import BackendRegistration
from vyre_async.abc import public_dir as _public_dir

__all__ = ["REGISTRATION"]
__dir__ = _public_dir(__name__)

REGISTRATION = BackendRegistration(
    id="wgpu",
    factory="vyre_wgpu.backend:create_backend",
    precedence=20,  # after cupy on an NVIDIA machine
    dispatches=True,
    is_reference=False,
    probe="vyre_wgpu.backend:probe",  # imports wgpu and lists adapters; opens no device
)
