"""`Program`: one SPMD kernel — buffers, workgroup shape and a body run once per lane."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidProgram
from vyre_async.ir.stmt import Body, Stmt, as_body
from vyre_async.ir.types import Access, BufferDecl

__all__ = ["Program"]
__dir__ = _public_dir(__name__)


def _workgroup(value: object) -> tuple[int, int, int]:
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        axes: tuple[object, ...] = (int(value),)
    elif isinstance(value, tuple | list):
        axes = tuple(value)
    else:
        raise InvalidProgram(
            f"workgroup_size must be an int or a tuple of 1 to 3 ints, got {value!r}",
            fix="pass e.g. 64 or (16, 16)",
        )
    if not 1 <= len(axes) <= 3 or any(
        isinstance(a, bool) or not isinstance(a, int | np.integer) or not 0 <= a <= 0xFFFF_FFFF
        for a in axes
    ):
        raise InvalidProgram(
            f"workgroup_size must hold 1 to 3 non-negative ints, got {value!r}",
            fix="pass e.g. 64 or (16, 16)",
        )
    x, y, z = (*(int(a) for a in axes), 1, 1)[:3]  # type: ignore[call-overload]
    return (x, y, z)


@dataclass(frozen=True, slots=True, init=False)
class Program:
    """One SPMD kernel of the IR. Immutable, hashable, deterministic to serialise.

    Args:
        buffers: The `BufferDecl` list; kept sorted by binding (then name), so the
            order they are given in does not matter.
        workgroup_size: Lanes per workgroup, an int or a 1- to 3-tuple
            (normalised to 3 axes).
        body: The statements every lane runs.
        op_id: Optional identity of the operation (cache lanes and traces only).

    Raises:
        InvalidProgram: a field has the wrong Python type. Semantic rules are
            checked by `validate`, not here.
    """

    buffers: tuple[BufferDecl, ...]
    workgroup_size: tuple[int, int, int]
    body: tuple[Stmt, ...]
    op_id: str = ""
    _memo: dict[str, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def __init__(
        self,
        buffers: Iterable[BufferDecl],
        workgroup_size: int | Sequence[int],
        body: Body,
        op_id: str = "",
    ) -> None:
        decls = tuple(buffers) if isinstance(buffers, Iterable) else buffers
        if not isinstance(decls, tuple) or not all(isinstance(b, BufferDecl) for b in decls):
            raise InvalidProgram(
                f"buffers must be BufferDecl items, got {buffers!r}",
                fix="declare each buffer with BufferDecl(name, binding, access, dtype, count)",
            )
        if not isinstance(op_id, str):
            raise InvalidProgram(f"op_id must be a str, got {op_id!r}", fix="pass a str")
        object.__setattr__(self, "buffers", tuple(sorted(decls, key=_buffer_key)))
        object.__setattr__(self, "workgroup_size", _workgroup(workgroup_size))
        object.__setattr__(self, "body", as_body(body, where="Program.body"))
        object.__setattr__(self, "op_id", op_id)
        object.__setattr__(self, "_memo", {})

    @property
    def memo(self) -> dict[str, Any]:
        """Facts derived from this immutable program, cached per instance by the driver.

        Keys are namespaced by the module that computes them (``"graph.resident_variant"``);
        a value is computed once and never changes. Not part of equality, hashing or the
        wire form.
        """
        return self._memo

    # Identity -------------------------------------------------------------------
    def __hash__(self) -> int:
        cached = self._memo.get("hash")
        if cached is None:
            cached = hash((self.buffers, self.workgroup_size, self.body, self.op_id))
            self._memo["hash"] = cached
        return int(cached)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Program, (self.buffers, self.workgroup_size, self.body, self.op_id))

    def to_wire(self) -> bytes:
        """Return the canonical wire form (header, blake3 digest, body); cached."""
        from vyre_async.ir.wire import encode_program

        wire = self._memo.get("wire")
        if wire is None:
            wire = encode_program(self)
            self._memo["wire"] = wire
        return bytes(wire)

    @classmethod
    def from_wire(cls, data: bytes | bytearray | memoryview) -> Program:
        """Decode a program from its wire form.

        Raises:
            InvalidProgram: the bytes are malformed, truncated, tampered with or of
                an unknown version (never any other exception).
        """
        from vyre_async.ir.wire import decode_program

        return decode_program(data)

    def fingerprint(self) -> bytes:
        """Return the 32-byte blake3 digest of the canonical body; cached."""
        from vyre_async.ir.wire import fingerprint

        fp = self._memo.get("fingerprint")
        if fp is None:
            fp = fingerprint(self)
            self._memo["fingerprint"] = fp
        return bytes(fp)

    def kernel_digest(self, options: Mapping[str, object] | None = None) -> bytes:
        """Return the 32-byte pipeline-cache digest of this program.

        The digest covers the canonical body with the count of every
        non-``WORKGROUP`` buffer zeroed (sizes reach kernels at launch, so
        resizing never recompiles) plus the sorted compile ``options``.
        """
        from vyre_async.ir.wire import kernel_digest

        return kernel_digest(self, options)

    # Walks ----------------------------------------------------------------------
    def buffer(self, name: str) -> BufferDecl:
        """Return the buffer called ``name``.

        Raises:
            KeyError: no buffer has that name.
        """
        for decl in self.buffers:
            if decl.name == name:
                return decl
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[BufferDecl, ...]:
        """Buffers a dispatch takes inputs for (READ, UNIFORM, READ_WRITE), in binding order."""
        return self._select("inputs", lambda b: b.access.is_input)

    @property
    def outputs(self) -> tuple[BufferDecl, ...]:
        """Buffers a dispatch returns (WRITE, READ_WRITE), in binding order."""
        return self._select("outputs", lambda b: b.access.is_output)

    @property
    def workgroup_buffers(self) -> tuple[BufferDecl, ...]:
        """Per-workgroup shared buffers, in binding order."""
        return self._select("workgroup_buffers", lambda b: b.access is Access.WORKGROUP)

    def _select(self, key: str, keep: Callable[[BufferDecl], bool]) -> tuple[BufferDecl, ...]:
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = tuple(b for b in self.buffers if keep(b))
        return cast(tuple[BufferDecl, ...], found)

    @property
    def lanes_per_workgroup(self) -> int:
        """The product of the workgroup axes."""
        x, y, z = self.workgroup_size
        return x * y * z

    def __repr__(self) -> str:
        op = f", op_id={self.op_id!r}" if self.op_id else ""
        return f"Program({list(self.buffers)!r}, {self.workgroup_size!r}, {list(self.body)!r}{op})"


def _buffer_key(decl: BufferDecl) -> tuple[int, str, str, str, int]:
    # Total order, so even invalid programs (duplicate bindings/names) round-trip.
    return (decl.binding, decl.name, decl.access.value, decl.dtype.value, decl.count)
