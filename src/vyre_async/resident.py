"""`ResidentBuffer`: a handle to memory that lives on a backend between dispatches."""

from __future__ import annotations

import itertools
from typing import Any

from vyre_async.errors import InvalidProgram
from vyre_async.ir.types import DType

__all__ = ["ResidentBuffer"]

_ids = itertools.count(1)


class ResidentBuffer:
    """A typed buffer resident on one backend (device memory on GPUs, host memory on CPUs).

    Created by ``backend.upload`` or ``backend.alloc``; pass it as a dispatch input
    instead of an array to avoid a copy; read it with ``backend.download``;
    release it with ``backend.free``. A handle is only valid on the backend that
    made it.
    """

    __slots__ = ("_freed", "_native", "backend_id", "count", "dtype", "id", "label")

    def __init__(
        self, *, backend_id: str, dtype: DType, count: int, native: Any, label: str | None = None
    ) -> None:
        self.backend_id = backend_id
        self.dtype = dtype
        self.count = count
        self.label = label
        self.id = next(_ids)
        self._native = native
        self._freed = False

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.count * 4

    @property
    def freed(self) -> bool:
        """True once the buffer was freed."""
        return self._freed

    def native(self, backend_id: str) -> Any:
        """Return the backend's own storage object (for the owning backend only).

        Raises:
            InvalidProgram: the buffer belongs to another backend or was freed.
        """
        if backend_id != self.backend_id:
            raise InvalidProgram(
                f"resident buffer #{self.id} belongs to backend {self.backend_id!r}, "
                f"not {backend_id!r}",
                fix="download it and pass the array, or upload it to this backend",
            )
        if self._freed:
            raise InvalidProgram(
                f"resident buffer #{self.id} was freed", fix="upload or alloc a new buffer"
            )
        return self._native

    def _release(self) -> Any:
        native, self._native, self._freed = self._native, None, True
        return native

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        name = f" {self.label!r}" if self.label else ""
        shape = f"{self.dtype.value}[{self.count}]"
        return f"<ResidentBuffer #{self.id}{name} {shape} on {self.backend_id}{state}>"
