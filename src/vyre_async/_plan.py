"""Binding plans and launch geometry: backend-neutral decisions made before every launch.

Given a program and what the caller passed, decide which buffer gets which
input, every buffer's element count, and the grid. Backends execute the plan;
they never re-derive it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.errors import InvalidArgument, InvalidProgram, host_out_of_memory
from vyre_async.ir.program import Program
from vyre_async.ir.types import Access, BufferDecl, DType
from vyre_async.ir.walk import uses_atomics

__all__ = [
    "BindingPlan",
    "LaunchGeometry",
    "check_buffer_bytes",
    "check_input_count",
    "infer_grid",
    "normalize_axes",
    "normalize_input",
    "normalize_inputs",
    "plan_dispatch",
]
__dir__ = _public_dir(__name__)

HostInput = np.ndarray | bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchGeometry:
    """Grid (workgroups per axis) and workgroup shape (lanes per axis) of one launch.

    Attributes:
        grid: Workgroups per axis.
        workgroup: Lanes per axis of one workgroup.
        workgroups: Total number of workgroups (computed once, like ``lanes``).
        lanes: Total number of lanes launched (computed once: backends ask per dispatch).
    """

    grid: tuple[int, int, int]
    workgroup: tuple[int, int, int]
    workgroups: int = field(init=False, repr=False, compare=False)
    lanes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        grid = self.grid
        object.__setattr__(self, "workgroups", grid[0] * grid[1] * grid[2])
        object.__setattr__(self, "lanes", self.workgroups * self.lanes_per_workgroup)

    @property
    def lanes_per_workgroup(self) -> int:
        """Lanes in one workgroup."""
        return self.workgroup[0] * self.workgroup[1] * self.workgroup[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class BindingPlan:
    """Everything a backend needs to bind buffers and launch one dispatch.

    Attributes:
        program: The program being dispatched.
        geometry: The launch geometry.
        counts: Element count of every buffer, in ``program.buffers`` order.
        inputs: Buffers fed from the inputs, in input order.
        outputs: Buffers returned, in output order.
    """

    program: Program
    geometry: LaunchGeometry
    counts: tuple[int, ...]
    inputs: tuple[BufferDecl, ...]
    outputs: tuple[BufferDecl, ...]
    #: Bytes of input data the dispatch consumes.
    bytes_in: int = 0
    #: Bytes of output data the dispatch returns.
    bytes_out: int = 0

    def count_of(self, name: str) -> int:
        """Return the element count bound to the buffer called ``name``."""
        for decl, count in zip(self.program.buffers, self.counts, strict=True):
            if decl.name == name:
                return count
        raise KeyError(name)


def normalize_axes(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    """Return ``value`` (an int or 1 to 3 ints) as three non-negative axes.

    Raises:
        InvalidArgument: the value is not 1 to 3 non-negative integers.
    """
    if isinstance(value, int | np.integer):
        axes: tuple[object, ...] = (value,)
    elif isinstance(value, tuple | list):
        axes = tuple(value)
    else:  # floats, strings, None inside, generators: say what is accepted
        axes = ()
    if not 1 <= len(axes) <= 3 or any(
        isinstance(a, bool) or not isinstance(a, int | np.integer) or a < 0 for a in axes
    ):
        raise InvalidArgument(
            f"{what} must be an int or 1 to 3 non-negative ints, got {value!r}",
            fix=f"pass {what} like 64 or (8, 8, 1)",
        )
    x, y, z = (*(int(a) for a in axes), 1, 1)[:3]  # type: ignore[call-overload]
    return (x, y, z)


def normalize_inputs(program: Program, inputs: Sequence[HostInput]) -> list[np.ndarray]:
    """Check host inputs against ``program`` and return private, flat, typed copies.

    Each input is a numpy array of the buffer's dtype (any shape; it is
    flattened; BOOL buffers take ``uint32`` or ``bool``) or a bytes-like object
    holding little-endian 32-bit words. The returned arrays never alias caller memory.

    Raises:
        InvalidProgram: wrong number of inputs, wrong dtype, a byte length that is
            not a multiple of 4, or a size that differs from a buffer's static count.
    """
    decls = program.inputs
    check_input_count(program, inputs)
    return [normalize_input(decl, value) for decl, value in zip(decls, inputs, strict=True)]


def normalize_input(decl: BufferDecl, value: object) -> np.ndarray:
    """Return one host input for buffer ``decl`` as a private, flat, typed copy.

    Raises:
        InvalidProgram: wrong dtype, a byte length that is not a multiple of 4, a
            size that differs from the buffer's static count, or not an array/bytes.
    """
    want = decl.dtype.numpy
    try:
        if isinstance(value, bytes | bytearray | memoryview):
            raw = memoryview(value)
            if not raw.c_contiguous:  # a strided view: copy its bytes out in order
                raw = memoryview(raw.tobytes())
            raw = raw.cast("B")
            if raw.nbytes % 4:
                raise InvalidProgram(
                    f"input for buffer {decl.name!r} has {raw.nbytes} bytes, not a multiple of 4",
                    fix="pass whole 32-bit little-endian words",
                )
            array = np.frombuffer(raw, dtype=want).copy()
        elif isinstance(value, np.ndarray):
            if decl.dtype is DType.BOOL and value.dtype == np.bool_:
                array = value.astype(want).reshape(-1)
            elif value.dtype.newbyteorder("<") != want or value.dtype.kind != want.kind:
                raise InvalidProgram(
                    f"input for buffer {decl.name!r} ({decl.dtype.value}) has dtype {value.dtype}",
                    fix=f"convert it first: array.astype(numpy.{want.name})",
                )
            else:
                array = np.array(value, dtype=want, copy=True, order="C").reshape(-1)
        else:
            raise InvalidProgram(
                f"input for buffer {decl.name!r} is a {type(value).__name__}",
                fix="pass a numpy array or a bytes-like object",
            )
    except MemoryError as exc:
        size = 4 * value.size if isinstance(value, np.ndarray) else memoryview(value).nbytes  # type: ignore[arg-type]
        raise host_out_of_memory(size, f"copying the input for buffer {decl.name!r}") from exc
    if decl.count and array.size != decl.count:
        raise InvalidProgram(
            f"input for buffer {decl.name!r} has {array.size} elements; the buffer declares "
            f"count={decl.count}",
            fix=f"pass exactly {decl.count} elements, or declare the buffer with count=0",
        )
    return array


def check_buffer_bytes(nbytes: int, max_bytes: int, what: str) -> None:
    """Refuse a buffer of ``nbytes`` over a backend's ``max_storage_buffer_bytes`` (0: no limit).

    Raises:
        InvalidProgram: ``nbytes > max_bytes``; ``what`` names the buffer in the message.
    """
    if max_bytes and nbytes > max_bytes:
        raise InvalidProgram(
            f"{what} has {nbytes} bytes, over the backend's largest buffer ({max_bytes} bytes)",
            fix=f"use at most {max_bytes // 4} elements per buffer (split the data over "
            "several buffers or dispatches)",
        )


def check_input_count(program: Program, inputs: Sequence[object]) -> None:
    """Check that ``inputs`` is a list or tuple with one item per input buffer of ``program``.

    Raises:
        InvalidProgram: a single array (or None, a generator, a dict...) was passed
            instead of a list, or the count differs.
    """
    decls = program.inputs
    if not isinstance(inputs, list | tuple):  # the common case costs one isinstance
        if isinstance(inputs, np.ndarray | bytes | bytearray | memoryview):
            raise InvalidProgram(
                "inputs must be a sequence with one item per input buffer, got a single "
                f"{type(inputs).__name__}",
                fix="wrap it in a list: dispatch(program, [array])",
            )
        if not isinstance(inputs, Sequence) or isinstance(inputs, str):
            raise InvalidProgram(
                "inputs must be a list or tuple with one item per input buffer, got a "
                f"{type(inputs).__name__}",
                fix="pass a list in binding order: dispatch(program, [a, b]) "
                "(dispatch(program, []) for a program without inputs)",
            )
    if len(inputs) != len(decls):
        names = ", ".join(f"{d.name}:{d.dtype.value}" for d in decls) or "none"
        raise InvalidProgram(
            f"program {program.op_id or '<unnamed>'} takes {len(decls)} input(s) ({names}), "
            f"got {len(inputs)}",
            fix="pass one input per READ, UNIFORM and READ_WRITE buffer, in binding order",
        )


def infer_grid(
    program: Program,
    counts: Sequence[int],
    *,
    workgroup: tuple[int, int, int],
    grid_override: int | Sequence[int] | None = None,
) -> tuple[int, int, int]:
    """Return the grid for a launch (the IR specification's launch-geometry rule).

    ``grid_override`` wins when given. Otherwise, for a 1-D workgroup, ``n`` is
    the largest count among output buffers (among all non-workgroup buffers when
    the program uses workgroup memory or atomics) and the grid is
    ``(ceil(n / workgroup[0]), 1, 1)``.

    Raises:
        InvalidProgram: a multi-dimensional workgroup without ``grid_override``.
    """
    if grid_override is not None:
        return normalize_axes(grid_override, "grid_override")
    if workgroup[1] != 1 or workgroup[2] != 1:
        raise InvalidProgram(
            f"workgroup {workgroup} is multi-dimensional, so the grid cannot be inferred",
            fix="pass DispatchConfig(grid_override=(gx, gy, gz))",
        )
    wide = bool(program.workgroup_buffers) or uses_atomics(program)
    sized = [
        count
        for decl, count in zip(program.buffers, counts, strict=True)
        if decl.access is not Access.WORKGROUP and (wide or decl.access.is_output)
    ]
    n = max(sized, default=0)
    return (math.ceil(n / workgroup[0]), 1, 1)


def plan_dispatch(
    program: Program,
    input_counts: Sequence[int],
    *,
    grid_override: int | Sequence[int] | None = None,
    workgroup_override: int | Sequence[int] | None = None,
) -> BindingPlan:
    """Return the binding plan for dispatching ``program`` on inputs of the given sizes.

    Args:
        program: A validated program.
        input_counts: Element count of each input, in input order.
        grid_override: Workgroups per axis; inferred when None.
        workgroup_override: Replaces the program's workgroup shape when given.

    Raises:
        InvalidProgram: wrong number of inputs, a grid that cannot be inferred, or
            more than 2**32 lanes on an axis (``gid`` is a u32).
        InvalidArgument: a ``grid_override`` or ``workgroup_override`` that is not
            1 to 3 non-negative ints.
    """
    memo_key = (
        "plan",
        tuple(input_counts),
        _axes_key(grid_override),
        _axes_key(workgroup_override),
    )
    plans: dict[object, BindingPlan] = program.memo.setdefault("plans", {})
    cached = plans.get(memo_key)
    if cached is not None:
        return cached
    inputs = program.inputs
    if len(input_counts) != len(inputs):
        raise InvalidProgram(
            f"program takes {len(inputs)} input(s), got {len(input_counts)}",
            fix="pass one input per READ, UNIFORM and READ_WRITE buffer, in binding order",
        )
    given = dict(zip((d.name for d in inputs), input_counts, strict=True))
    counts = tuple(
        given.get(d.name, d.count) if d.access.is_input else d.count for d in program.buffers
    )
    workgroup = (
        program.workgroup_size
        if workgroup_override is None
        else normalize_axes(workgroup_override, "workgroup_override")
    )
    grid = infer_grid(program, counts, workgroup=workgroup, grid_override=grid_override)
    for axis in range(3):
        if grid[axis] * workgroup[axis] > _GID_LIMIT:
            raise InvalidProgram(
                f"grid {grid} x workgroup {workgroup} has {grid[axis] * workgroup[axis]} lanes "
                f"on axis {axis}; global invocation ids are u32, so at most {_GID_LIMIT}",
                fix="use a smaller grid_override (or spread the work over several axes "
                "or dispatches)",
            )
    plan = BindingPlan(
        program=program,
        geometry=LaunchGeometry(grid=grid, workgroup=workgroup),
        counts=counts,
        inputs=inputs,
        outputs=program.outputs,
        bytes_in=4
        * sum(c for d, c in zip(program.buffers, counts, strict=True) if d.access.is_input),
        bytes_out=4
        * sum(c for d, c in zip(program.buffers, counts, strict=True) if d.access.is_output),
    )
    if len(plans) >= _PLAN_MEMO:
        plans.clear()
    plans[memo_key] = plan
    return plan


_PLAN_MEMO = 64
#: Lanes per axis of one launch: ``gid`` is a u32 per axis.
_GID_LIMIT = 1 << 32


def _axes_key(value: int | Sequence[int] | None) -> object:
    if value is None or isinstance(value, int | np.integer):
        return value
    if isinstance(value, tuple | list) and all(isinstance(a, int | np.integer) for a in value):
        return tuple(value)
    return object()  # not ints (1.5, [[1]]): a key no plan has; normalize_axes refuses it below
