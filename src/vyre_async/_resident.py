"""`ResidentBuffer`: a handle to memory that lives on a backend between dispatches.

Also the argument checks every backend's ``upload`` and ``alloc`` share
(`upload_request`, `alloc_request`), so a bad dtype, count or size is the same
clear error on every backend.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from vyre_async._arguments import dtype_argument, whole_number
from vyre_async._exports import public_dir as _public_dir
from vyre_async._plan import check_buffer_bytes, normalize_input
from vyre_async.errors import InvalidArgument, InvalidProgram, host_out_of_memory
from vyre_async.ir.types import Access, BufferDecl, DType

__all__ = ["ResidentBuffer", "alloc_request", "check_buffer", "upload_request"]
__dir__ = _public_dir(__name__)

_ids = itertools.count(1)


class ResidentBuffer:
    """A typed buffer resident on one backend (device memory on GPUs, host memory on CPUs).

    Created by ``backend.upload`` or ``backend.alloc``; pass it as a dispatch input
    instead of an array to avoid a copy; read it with ``backend.download``;
    release it with ``backend.free``. A handle belongs to the backend *instance*
    that made it: another instance, even of the same backend id, refuses it.
    """

    __slots__ = ("_freed", "_native", "_owner", "backend_id", "count", "dtype", "id", "label")

    def __init__(
        self, *, owner: Any, dtype: DType, count: int, native: Any, label: str | None = None
    ) -> None:
        self._owner = owner
        self.backend_id: str = owner.id
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

    def belongs_to(self, backend: object) -> bool:
        """Return True when ``backend`` (an instance) made this buffer."""
        return backend is self._owner

    def native(self, backend: object) -> Any:
        """Return the backend's own storage object (for the owning backend instance only).

        Args:
            backend: The backend instance asking (``self`` inside a backend).

        Raises:
            InvalidProgram: the buffer belongs to another backend instance or was freed.
        """
        if backend is not self._owner:
            other = getattr(backend, "id", type(backend).__name__)
            where = "another instance of that backend" if other == self.backend_id else repr(other)
            raise InvalidProgram(
                f"resident buffer #{self.id} belongs to a {self.backend_id!r} backend instance, "
                f"not to {where}",
                fix="download it from the backend that made it and pass the array, or upload "
                "it to this backend",
            )
        if self._freed:
            raise InvalidProgram(
                f"resident buffer #{self.id} was freed", fix="upload or alloc a new buffer"
            )
        return self._native

    def release(self, backend: object) -> Any:
        """Mark the buffer freed and return its storage (for the owning backend's ``free``).

        Releasing twice returns None the second time.

        Raises:
            InvalidProgram: ``backend`` is not the instance that made the buffer.
        """
        if backend is not self._owner:
            raise InvalidProgram(
                f"resident buffer #{self.id} belongs to another backend instance",
                fix="free it with the backend that made it",
            )
        native, self._native, self._freed = self._native, None, True
        return native

    def __repr__(self) -> str:
        state = " freed" if self._freed else ""
        name = f" {self.label!r}" if self.label else ""
        shape = f"{self.dtype.value}[{self.count}]"
        return f"<ResidentBuffer #{self.id}{name} {shape} on {self.backend_id}{state}>"


def check_buffer(buffer: object, operation: str) -> ResidentBuffer:
    """Return ``buffer`` if it is a `ResidentBuffer`, for ``download``/``free`` and the like.

    Raises:
        InvalidArgument: it is anything else.
    """
    if not isinstance(buffer, ResidentBuffer):
        raise InvalidArgument(
            f"{operation} takes a ResidentBuffer (from backend.upload or backend.alloc), "
            f"got a {type(buffer).__name__}",
            fix=f"pass the buffer upload() or alloc() returned to {operation}()",
        )
    return buffer


def check_label(label: object, what: str) -> None:
    """A resident buffer's label is a str or None (one rule for ``upload`` and ``alloc``).

    Raises:
        InvalidArgument: it is anything else.
    """
    if label is not None and not isinstance(label, str):
        raise InvalidArgument(
            f"{what} label must be a str or None, got {label!r}", fix='pass e.g. label="weights"'
        )


def alloc_request(
    dtype: object, count: object, *, max_bytes: int, label: object = None
) -> tuple[DType, int]:
    """Check ``backend.alloc`` arguments; return the dtype and the element count.

    Args:
        dtype: A `DType` or its name (``"u32"``).
        count: Elements, an int >= 0.
        max_bytes: The backend's ``max_storage_buffer_bytes`` (0: not reported, no limit).
        label: The buffer's label: a str or None.

    Raises:
        InvalidArgument: an unknown dtype, a count that is not an int >= 0, or a
            label that is not a str.
        InvalidProgram: a buffer over ``max_bytes``.
    """
    check_label(label, "alloc")
    kind = dtype_argument("alloc dtype", dtype)
    elements = whole_number("alloc count", count, example="alloc('u32', 1024)")
    check_buffer_bytes(4 * elements, max_bytes, f"a buffer of {elements} elements")
    return kind, elements


def upload_request(
    data: object, *, label: str | None, max_bytes: int, copy: bool = True
) -> tuple[DType, np.ndarray]:
    """Check ``backend.upload`` data; return its dtype and a flat host array of it.

    numpy arrays keep their dtype (uint32, int32, float32, bool); bytes-like
    data holds little-endian u32 words.

    Args:
        data: What the caller passed.
        label: The buffer's label (shown in errors).
        max_bytes: The backend's ``max_storage_buffer_bytes`` (0: no limit).
        copy: Return a private copy (a backend that keeps the array); False may
            return a view of a caller's contiguous array (a backend that copies
            it to the device at once). Bytes-like data is always copied.

    Raises:
        InvalidProgram: an unsupported dtype or type, bytes not made of 4-byte
            words, or data over ``max_bytes`` (checked before anything is copied).
        InvalidArgument: a label that is not a str.
        DeviceOutOfMemory: the host could not hold the copy.
    """
    check_label(label, "upload")
    if isinstance(data, np.ndarray):
        dtype = _array_dtype(data)
        check_buffer_bytes(4 * data.size, max_bytes, "the upload")
        try:
            flat = np.array(data, dtype=dtype.numpy, copy=True if copy else None, order="C")
            return dtype, flat.reshape(-1)
        except MemoryError as exc:
            raise host_out_of_memory(4 * data.size, "copying the upload") from exc
    if isinstance(data, bytes | bytearray | memoryview):
        check_buffer_bytes(memoryview(data).nbytes, max_bytes, "the upload")
    decl = BufferDecl(label or "upload", 0, Access.READ, DType.U32)
    return DType.U32, normalize_input(decl, data)


def _array_dtype(array: np.ndarray) -> DType:
    # Either byte order, as dispatch() takes it: the copy below converts the values.
    native = array.dtype.newbyteorder("=")
    for dtype in (DType.U32, DType.I32, DType.F32):
        if native == dtype.numpy:
            return dtype
    if array.dtype == np.bool_:
        return DType.BOOL
    raise InvalidProgram(
        f"cannot upload an array of dtype {array.dtype}",
        fix="convert it to uint32, int32, float32 or bool first",
    )
