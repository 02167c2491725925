"""The parts of an arm graph: its resources, its arms and their read/write summaries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from vyre_async._config import DispatchConfig
from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import (
    host_out_of_memory,
)
from vyre_async.ir.expr import Atomic
from vyre_async.ir.program import Program
from vyre_async.ir.types import DType
from vyre_async.ir.walk import iter_exprs
from vyre_async.policies.arms import ArmSummary

if TYPE_CHECKING:
    pass

__all__ = ["Arm", "GraphResource", "Residency", "summarize_arm"]
__dir__ = _public_dir(__name__)

Residency = Literal["auto", "resident", "host"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphResource:
    """One named buffer of an arm graph.

    Attributes:
        name: The resource name arms bind to.
        dtype: Element type.
        count: Element count.
        initial: Initial contents (a read-only private copy), or None for zeros.
    """

    name: str
    dtype: DType
    count: int
    initial: np.ndarray | None

    def contents(self) -> np.ndarray:
        """Return a new array with the initial contents.

        Raises:
            DeviceOutOfMemory: the host could not hold it.
        """
        try:
            if self.initial is None:
                return np.zeros(self.count, self.dtype.numpy)
            return self.initial.copy()
        except MemoryError as exc:
            raise host_out_of_memory(4 * self.count, f"creating resource {self.name!r}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class Arm:
    """One program of an arm graph, with its buffers bound to graph resources.

    Attributes:
        index: Submission order (0-based).
        label: A name for reports and spans.
        program: The program.
        bindings: ``(buffer name, resource name)`` pairs, in the program's buffer order.
        config: The dispatch config, or None for the default.
        summary: The resources it reads and writes.
    """

    index: int
    label: str
    program: Program
    bindings: tuple[tuple[str, str], ...]
    config: DispatchConfig | None
    summary: ArmSummary

    def resource_of(self, buffer: str) -> str:
        """Return the resource bound to ``buffer``.

        Raises:
            KeyError: the buffer is not bound.
        """
        for name, resource in self.bindings:
            if name == buffer:
                return resource
        raise KeyError(buffer)


def _atomic_targets(program: Program) -> frozenset[str]:
    cached = program.memo.get("graph.atomic_targets")
    if cached is None:
        cached = frozenset(e.buffer for e in iter_exprs(program.body) if isinstance(e, Atomic))
        program.memo["graph.atomic_targets"] = cached
    return frozenset(cached)


def summarize_arm(program: Program, bindings: Mapping[str, str]) -> ArmSummary:
    """Return the resources an arm reads and writes, from its binding plan.

    READ and UNIFORM buffers read their resource, WRITE buffers write it,
    READ_WRITE buffers do both, and atomic targets count as both.

    Args:
        program: The arm's program.
        bindings: Buffer name → resource name, for every bound buffer.

    Returns:
        The summary over resource names.
    """
    atomics = _atomic_targets(program)
    reads: set[str] = set()
    writes: set[str] = set()
    for decl in program.buffers:
        resource = bindings.get(decl.name)
        if resource is None:
            continue
        if decl.access.is_input or decl.name in atomics:
            reads.add(resource)
        if decl.access.is_output or decl.name in atomics:
            writes.add(resource)
    return ArmSummary(frozenset(reads), frozenset(writes))
