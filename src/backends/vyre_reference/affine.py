"""Lane-affine U32 values: ``c + Σ wg[k]·wgid(k) + Σ lid[k]·lid(k)`` kept symbolic.

Builtins (``gid``, ``lid``, ``wgid``) and what a kernel computes from them with
``+ - *`` and uniform values stay in this form instead of becoming arrays, so
the engine can answer "is ``gid < n`` true on every lane?" from bounds, and turn
``x[gid]`` into a slice (a view) instead of a gather. Coefficients are exact
Python integers; the value *is* the integer reduced modulo 2**32, which is what
`LaneSet.materialize` produces when an array is finally needed.
"""

from __future__ import annotations

from dataclasses import dataclass

from vyre_async.abc import public_dir as _public_dir

__all__ = ["Affine", "AXES_ZERO"]
__dir__ = _public_dir(__name__)

AXES_ZERO: tuple[int, int, int] = (0, 0, 0)
_REDUCE_AT = 1 << 40
_MOD = 1 << 32


def _axes(x: tuple[int, int, int], y: tuple[int, int, int], k: int) -> tuple[int, int, int]:
    return (x[0] + k * y[0], x[1] + k * y[1], x[2] + k * y[2])


@dataclass(frozen=True, slots=True)
class Affine:
    """A U32 lane value that is affine in the workgroup and local ids.

    Attributes:
        c: Constant term.
        wg: Coefficients of ``wgid(0..2)``.
        lid: Coefficients of ``lid(0..2)``.
    """

    c: int
    wg: tuple[int, int, int] = AXES_ZERO
    lid: tuple[int, int, int] = AXES_ZERO

    @staticmethod
    def make(c: int, wg: tuple[int, int, int], lid: tuple[int, int, int]) -> Affine:
        """Return the value, reducing the terms modulo 2**32 once they grow large."""
        if max(abs(c), *map(abs, wg), *map(abs, lid)) >= _REDUCE_AT:
            c %= _MOD
            wg = (wg[0] % _MOD, wg[1] % _MOD, wg[2] % _MOD)
            lid = (lid[0] % _MOD, lid[1] % _MOD, lid[2] % _MOD)
        return Affine(c, wg, lid)

    @property
    def is_uniform(self) -> bool:
        """True when no lane id contributes (the value is the constant ``c``)."""
        return self.wg == AXES_ZERO and self.lid == AXES_ZERO

    @property
    def lid_only(self) -> bool:
        """True when the value does not depend on the workgroup id."""
        return self.wg == AXES_ZERO

    def add(self, other: Affine | int, sign: int = 1) -> Affine:
        """Return ``self + sign * other``."""
        if isinstance(other, Affine):
            return Affine.make(
                self.c + sign * other.c,
                _axes(self.wg, other.wg, sign),
                _axes(self.lid, other.lid, sign),
            )
        return Affine.make(self.c + sign * other, self.wg, self.lid)

    def scale(self, k: int) -> Affine:
        """Return ``self * k``."""
        return Affine.make(
            self.c * k,
            (self.wg[0] * k, self.wg[1] * k, self.wg[2] * k),
            (self.lid[0] * k, self.lid[1] * k, self.lid[2] * k),
        )

    def rsub(self, k: int) -> Affine:
        """Return ``k - self``."""
        return self.scale(-1).add(k)

    def linear(
        self, grid: tuple[int, int, int], workgroup: tuple[int, int, int]
    ) -> tuple[int, int, int] | None:
        """Return ``(c, a, b)`` with value ``c + a·W + b·L`` in linear ids, or None.

        ``W`` is the linear workgroup index and ``L`` the linear local index. The
        form exists when every axis that contributes is the only axis of its
        kind with extent > 1 (then that id *is* the linear index).
        """
        a = _linear_coef(self.wg, grid)
        b = _linear_coef(self.lid, workgroup)
        if a is None or b is None:
            return None
        return (self.c, a, b)


def _linear_coef(coefs: tuple[int, int, int], extent: tuple[int, int, int]) -> int | None:
    used = [k for k in range(3) if coefs[k]]
    if not used:
        return 0
    if len(used) > 1:
        return None
    k = used[0]
    others = 1
    for j in range(3):
        if j != k:
            others *= extent[j]
    if others != 1:
        return None
    return coefs[k]
