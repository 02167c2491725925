"""The native artifact of a compiled pipeline (`CudaKernel`) and its per-shape records.

Plain data, below every module that launches anything:

- `CudaKernel`: the generated source, the NVRTC output and the loaded
  functions, plus two per-shape caches filled by the modules above:
  ``templates`` (`KernelLayout` by buffer counts, built by
  `vyre_cupy.launch.template_for`) and ``graphs`` (`CapturedGraph` by launch
  shape, built by `vyre_cupy.batch`);
- `KernelLayout`: everything about a launch of the kernel that depends only
  on its buffer counts — the arena layout, the ``vy_lens`` bytes, which input
  goes where, the kernel-argument offsets, where each output is read back, the
  static span attributes of its copy — so a warm dispatch rebuilds none of it;
- `OutputSlot`: where one output sits in the pinned readback;
- `GridKernel`: the native artifact of a program with grid barriers (one
  `CudaKernel` per segment, and the cooperative kernel), and `GridShape`: how
  one launch shape of it runs, decided once (`vyre_cupy.grid`).

Imports only the code generator, the compiler's record and the arena layout
(never CuPy, never the modules that launch).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vyre_async.abc import public_dir as _public_dir
from vyre_cupy.codegen import KernelSource
from vyre_cupy.compile import CompiledKernel
from vyre_cupy.layout import ArenaLayout

__all__ = ["CapturedGraph", "CudaKernel", "GridKernel", "GridShape", "KernelLayout", "OutputSlot"]
__dir__ = _public_dir(__name__)


@dataclass(frozen=True, slots=True)
class OutputSlot:
    """One output buffer of a launch: its dtype, element count and readback byte offset."""

    dtype: np.dtype[Any]
    count: int
    readback: int


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelLayout:
    """What every launch of one kernel with one set of buffer counts shares.

    Built once per (kernel, counts) by `vyre_cupy.launch.template_for` and kept
    on `CudaKernel.templates`. Describes a launch whose inputs all come from the
    host (resident inputs change the layout: those launches plan their own).

    Attributes:
        counts: Element count of each kernel parameter (the ``vy_lens`` values).
        lens: ``counts`` as the ``vy_lens`` bytes (u32 words).
        inputs: Per kernel parameter, the index of its input in ``launch.inputs``
            (None for WRITE buffers).
        layout: The arena layout (all inputs from the host).
        uploads: ``(input index, staging offset, bytes)`` of each non-empty host input.
        arg_offsets: Arena byte offset of each kernel parameter (the pointer
            arguments are the arena's base plus these; ``vy_lens`` is the base).
        outputs: Where each of the plan's outputs is read back, in output order.
        readback_at: Byte offset of the readback region in the pinned buffer
            that also holds the staging (one pinned allocation per launch).
        pinned_bytes: Size of that pinned buffer.
        copy_attributes: The span attributes of the upload into a private arena
            (`vyre_cupy.launch.annotate_copy`).
        dtypes: Per entry of ``uploads``, the numpy dtype of its buffer.
        spare: Finished launches' arena + pinned staging, ready for the next launch
            of this shape (`vyre_cupy.launch.Staging`; small shapes only, a few kept).
        stream_attributes: Per stream index, ``copy_attributes`` plus ``vyre.stream``.
        ends: ``[lo, hi]``: seconds after its enqueue between which the newest
            launch of this shape that an awaiting loop polled was seen to end (its
            last "not yet" and its "done"); ``[0.0, 0.0]`` until one was seen.
            Where the next launch's poll spins (`vyre_cupy.launch.Flight.poll`).
    """

    counts: tuple[int, ...]
    lens: bytes
    inputs: tuple[int | None, ...]
    layout: ArenaLayout
    uploads: tuple[tuple[int, int, int], ...]
    arg_offsets: tuple[int, ...]
    outputs: tuple[OutputSlot, ...]
    readback_at: int
    pinned_bytes: int
    copy_attributes: Mapping[str, str]
    dtypes: tuple[np.dtype[Any], ...] = ()
    spare: deque[Any] = field(default_factory=deque, compare=False)
    stream_attributes: list[Mapping[str, str | int]] = field(default_factory=list, compare=False)
    ends: list[float] = field(default_factory=lambda: [0.0, 0.0], compare=False)


@dataclass(eq=False)
class CapturedGraph:
    """One launch shape captured as a CUDA graph (memset + kernel launches) on a fixed arena.

    Attributes:
        graph: CuPy's executable graph (``stream.end_capture()``).
        arena: The device arena every replay uses.
        layout: The arena's layout.
        record_ns: Host nanoseconds the capture and instantiation took.
        last_done: Event after the newest replay's readback (the next replay waits on it).
        lock: Held while one replay is enqueued (keeps ``last_done`` a recorded event).
    """

    graph: Any
    arena: Any
    layout: ArenaLayout
    record_ns: int
    last_done: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True, slots=True)
class CudaKernel:
    """The native artifact of a `CompiledPipeline` on this backend.

    Attributes:
        source: The generated CUDA C and its launch ABI.
        compiled: The NVRTC output (what the disk cache stores).
        function: The loaded, launchable CuPy kernel function.
        batch: The batch (persistent) kernel of the same module, or None when the
            program has barriers or shared memory (``source.batch_entry`` is None).
        graphs: Captured CUDA graphs of this kernel, by launch shape (command reuse).
        templates: Launch templates of this kernel, by the plan's buffer counts.
    """

    source: KernelSource
    compiled: CompiledKernel
    function: Any
    batch: Any = None
    graphs: OrderedDict[Any, CapturedGraph] = field(default_factory=OrderedDict, compare=False)
    templates: dict[tuple[int, ...], KernelLayout] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class GridKernel:
    """The native artifact of a program with grid barriers (`vyre_async.ir.GridBarrier`).

    Cached by the driver under the original program's identity, like a `CudaKernel`.

    Attributes:
        segments: One kernel per segment of `vyre_async.split_at_grid_barriers`,
            in order; they share the program's buffers, so one `KernelLayout`
            (kept on ``segments[0].templates``) serves them all.
        cooperative: The whole program as ONE kernel synchronising the grid with
            cooperative groups, or None (see ``reason``).
        reason: Why there is no cooperative kernel: ``""`` (there is one, or the
            program has one segment), ``"no_cooperative_launch"`` (the device
            has none) or ``"cooperative_kernel_failed"`` (NVRTC rejected it).
        note: ``reason`` for people (NVRTC's first words, for a failed compile).
        occupancy: Blocks of the cooperative kernel one SM holds, by workgroup
            lanes (asked once per lane count, when a launch shape is planned).
    """

    segments: tuple[CudaKernel, ...]
    cooperative: CudaKernel | None = None
    reason: str = ""
    note: str = ""
    occupancy: dict[int, int | None] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class GridShape:
    """How one launch shape of a grid-barrier program runs (`vyre_cupy.grid.plan_grid`).

    Attributes:
        layout: The launch's `KernelLayout` (the segments' shared one).
        cooperative: True: one cooperative launch; False: one launch per segment.
        kernel: What the launch path runs: a `CudaKernel` whose ``function``
            launches the segments in order, or the cooperative kernel, on the
            dispatch's stream (`vyre_cupy.grid.SegmentRun`).
        functions: The launched functions, in order (the cooperative kernel's alone).
        segments: How many segments the program has.
        blocks: Workgroups in the grid.
        resident: Workgroups of the cooperative kernel the device holds at once
            (blocks per SM times SMs; 0 when unknown or without one).
        attributes: The span attributes of every dispatch of the shape.
    """

    layout: KernelLayout
    cooperative: bool
    kernel: CudaKernel
    functions: tuple[Any, ...]
    segments: int
    blocks: int
    resident: int
    attributes: Mapping[str, str | int]
