"""Value types, buffer access modes and buffer declarations of the Program IR."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram

__all__ = ["Access", "BufferDecl", "DType", "as_dtype"]
__dir__ = _public_dir(__name__)

_U32_MAX = 0xFFFF_FFFF


class DType(StrEnum):
    """Scalar element types. ``BOOL`` is stored as a 32-bit word holding 0 or 1.

    Attributes:
        numpy: The numpy dtype that holds this type in memory (``BOOL`` → ``uint32``);
            a plain attribute of each member, read on every dispatch.
    """

    U32 = "u32"
    I32 = "i32"
    F32 = "f32"
    BOOL = "bool"

    numpy: np.dtype[np.generic]  # (set below, per member: not an enum member)

    @property
    def itemsize(self) -> int:
        """Bytes per element in buffers: always 4."""
        return 4

    def __repr__(self) -> str:
        return f"DType.{self.name}"


_NUMPY: dict[DType, np.dtype[np.generic]] = {
    DType.U32: np.dtype("<u4"),
    DType.I32: np.dtype("<i4"),
    DType.F32: np.dtype("<f4"),
    DType.BOOL: np.dtype("<u4"),
}
for _member in DType:
    _member.numpy = _NUMPY[_member]
del _member


class Access(StrEnum):
    """How a program may use a buffer; decides whether it is an input, an output or shared."""

    READ = "read"
    READ_WRITE = "read_write"
    UNIFORM = "uniform"
    WRITE = "write"
    WORKGROUP = "workgroup"

    @property
    def is_input(self) -> bool:
        """True for buffers whose initial contents come from the dispatch inputs."""
        return self in (Access.READ, Access.UNIFORM, Access.READ_WRITE)

    @property
    def is_output(self) -> bool:
        """True for buffers whose final contents are returned by a dispatch."""
        return self in (Access.WRITE, Access.READ_WRITE)

    @property
    def is_writable(self) -> bool:
        """True for buffers a program may `Store` into."""
        return self in (Access.WRITE, Access.READ_WRITE, Access.WORKGROUP)

    def __repr__(self) -> str:
        return f"Access.{self.name}"


_E = TypeVar("_E", bound=StrEnum)


def _enum(kind: type[_E], value: object, what: str) -> _E:
    try:
        return kind(value)  # type: ignore[arg-type]
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        article = "an" if kind.__name__[0] in "AEIO" else "a"  # an Access, a UnOp
        raise InvalidProgram(
            f"{what} {value!r} is not {article} {kind.__name__}",
            fix=f"use one of {choices}",
        ) from None


def as_dtype(value: object, what: str = "buffer dtype") -> DType:
    """Return ``value`` (a `DType` or its name, ``"u32"``) as a `DType`.

    Raises:
        InvalidProgram: it names no dtype; the message lists the choices.
    """
    return _enum(DType, value, what)


@dataclass(frozen=True, slots=True, init=False)
class BufferDecl:
    """One buffer of a program.

    Args:
        name: Unique name, used by `Load`, `Store`, `BufLen` and `Atomic`.
        binding: Unique binding slot; a program keeps its buffers sorted by it.
        access: `Access` mode (a string such as ``"read"`` is accepted).
        dtype: Element `DType` (a string such as ``"u32"`` is accepted).
        count: Element count; ``0`` means "sized at dispatch time from the input".
            ``WRITE`` and ``WORKGROUP`` buffers need ``count > 0`` (a validation rule).

    Raises:
        InvalidProgram: a field has the wrong Python type or is out of range.
    """

    name: str
    binding: int
    access: Access
    dtype: DType
    count: int = 0

    def __init__(
        self, name: str, binding: int, access: Access | str, dtype: DType | str, count: int = 0
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidProgram(
                f"buffer name must be a non-empty str, got {name!r}",
                fix="name buffers with strings",
            )
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "access", _enum(Access, access, "buffer access"))
        object.__setattr__(self, "dtype", _enum(DType, dtype, "buffer dtype"))
        for field_name, value in (("binding", binding), ("count", count)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise InvalidProgram(
                    f"buffer {name!r}: {field_name} must be an int, got {value!r}",
                    fix=f"pass an integer {field_name}",
                )
            value = int(value)
            if not 0 <= value <= _U32_MAX:
                raise InvalidProgram(
                    f"buffer {name!r}: {field_name} {value} is outside 0..{_U32_MAX}",
                    fix=f"use a {field_name} that fits in an unsigned 32-bit integer",
                )
            object.__setattr__(self, field_name, value)

    @property
    def nbytes(self) -> int:
        """Declared size in bytes (0 for runtime-sized buffers)."""
        return self.count * 4

    @property
    def is_runtime_sized(self) -> bool:
        """True when the element count comes from the dispatch input."""
        return self.count == 0

    def __repr__(self) -> str:
        count = f", {self.count}" if self.count else ""
        return (
            f"BufferDecl({self.name!r}, {self.binding}, Access.{self.access.name}, "
            f"DType.{self.dtype.name}{count})"
        )
