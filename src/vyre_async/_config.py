"""`DispatchConfig`: per-dispatch options, frozen and validated on construction."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, fields
from typing import Literal

from vyre_async._arguments import real_number, whole_number
from vyre_async._exports import public_dir as _public_dir
from vyre_async._plan import normalize_axes
from vyre_async.errors import InvalidArgument
from vyre_async.ir.limits import MAX_WORKGROUP_LANES

__all__ = ["MAX_OUTPUT_BYTES_ENV", "DispatchConfig", "Mode", "default_max_output_bytes"]
__dir__ = _public_dir(__name__)

Mode = Literal["auto", "force", "disable"]
_MODES = ("auto", "force", "disable")
# Fields that do not change what runs, only how it is reported or bounded in time.
_NOT_SHAPE = frozenset({"timeout", "label"})


#: The environment variable that sets `default_max_output_bytes`.
MAX_OUTPUT_BYTES_ENV = "VYRE_MAX_OUTPUT_BYTES"
#: The host's limit when its memory size cannot be read.
_FALLBACK_MAX_OUTPUT_BYTES = 4 << 30


def default_max_output_bytes() -> int:
    """The most output bytes one dispatch (or batch) may have when its config sets no limit.

    ``VYRE_MAX_OUTPUT_BYTES`` when set, else half of this machine's physical
    memory (4 GiB where that cannot be read). Outputs come back as host arrays:
    past this a dispatch would have the process killed for memory instead of
    failing with an error.

    Raises:
        InvalidArgument: ``VYRE_MAX_OUTPUT_BYTES`` is not a whole number >= 0.
    """
    raw = os.environ.get(MAX_OUTPUT_BYTES_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value < 0:
            raise InvalidArgument(
                f"{MAX_OUTPUT_BYTES_ENV} must be a whole number of bytes >= 0, got {raw!r}",
                fix=f"set {MAX_OUTPUT_BYTES_ENV}=17179869184 (16 GiB, say) or unset it",
            )
        return value
    return _half_the_host()


@functools.cache
def _half_the_host() -> int:
    """Half this machine's physical memory (read once), or the fallback."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) // 2
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
        return _FALLBACK_MAX_OUTPUT_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchConfig:
    """Options for one dispatch. Derive variants with `dataclasses.replace`.

    Attributes:
        profile: Free-form tag of the conformance or stress profile; recorded on
            the dispatch span as ``vyre.profile``.
        ulp_budget: Largest ULP difference tolerated on transcendental F32 ops
            (``None`` = the default budget of 2). Part of the pipeline cache key.
        timeout: Seconds from ``dispatch()`` (queueing included) after which the
            result raises `DispatchTimeout`. ``None`` (or ``math.inf``) waits forever;
            any positive number is accepted, however large.
        label: Debug label, shown in spans and errors.
        max_output_bytes: Largest total output size of the dispatch (of a whole
            batch, for `CompiledPipeline.dispatch_batch`); larger raises
            `InvalidProgram` before anything is allocated. ``None``: the host's
            limit, `default_max_output_bytes` (half of the machine's memory),
            past which the dispatch is refused with `DeviceOutOfMemory`.
        workgroup_override: Replaces the program's workgroup shape (at most 1024
            lanes, the IR's limit; a dispatch also checks it against the backend's
            ``max_workgroup_size``). Part of the pipeline cache key.
        grid_override: Workgroups per axis; inferred when ``None``.
        fixpoint_iterations: Launch this many times back to back with buffers
            carried over (``None`` = 1; 0 is rejected).
        speculation: Shape-prediction prefetch (``backend.prefetcher``) for this
            dispatch: ``"auto"`` records its shape and compiles the predicted next
            pipeline in the background when the backend has a prefetcher;
            ``"disable"`` does neither; ``"force"`` is ``"auto"`` but raises
            `UnsupportedFeature` on a backend built with ``prefetch=False``.
        persistent_thread: Persistent-kernel execution: ``"auto"``, ``"force"`` or
            ``"disable"``.
        cooperative: Request a cooperative (grid-sync) launch; rejected with
            `UnsupportedFeature` by backends without grid sync.

    Raises:
        InvalidArgument: a field is out of range; the message says which and how to fix it.
    """

    profile: str | None = None
    ulp_budget: int | None = None
    timeout: float | None = None
    label: str | None = None
    max_output_bytes: int | None = None
    workgroup_override: tuple[int, int, int] | None = None
    grid_override: tuple[int, int, int] | None = None
    fixpoint_iterations: int | None = None
    speculation: Mode = "auto"
    persistent_thread: Mode = "auto"
    cooperative: bool = False

    def __post_init__(self) -> None:
        if self.ulp_budget is not None:
            budget = _count("ulp_budget", self.ulp_budget, "ulp_budget=2", maximum=255)
            object.__setattr__(self, "ulp_budget", budget)
        if self.timeout is not None:
            seconds = real_number(self.timeout)  # (kept as a float)
            if not seconds > 0:  # False for NaN too
                raise _bad(
                    f"timeout must be a positive number of seconds, got {self.timeout!r}",
                    "timeout=1.0",
                )
            object.__setattr__(self, "timeout", seconds)
        if self.max_output_bytes is not None:
            limit = _count("max_output_bytes", self.max_output_bytes, "max_output_bytes=1 << 20")
            object.__setattr__(self, "max_output_bytes", limit)
        for name in ("workgroup_override", "grid_override"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, normalize_axes(value, name))
        wg = self.workgroup_override
        if wg is not None and min(wg) < 1:
            raise _bad(
                f"workgroup_override axes must be >= 1, got {wg}", "workgroup_override=(64, 1, 1)"
            )
        if wg is not None and wg[0] * wg[1] * wg[2] > MAX_WORKGROUP_LANES:
            raise _bad(
                f"workgroup_override {wg} has {wg[0] * wg[1] * wg[2]} lanes per workgroup, over "
                f"the IR's limit of {MAX_WORKGROUP_LANES} (a backend may allow fewer: "
                "backend.capabilities().max_workgroup_size)",
                "workgroup_override=(256, 1, 1)",
            )
        if self.fixpoint_iterations is not None:
            iterations = _count(
                "fixpoint_iterations", self.fixpoint_iterations, "fixpoint_iterations=4", minimum=1
            )
            object.__setattr__(self, "fixpoint_iterations", iterations)
        for name in ("speculation", "persistent_thread"):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in _MODES:
                raise _bad(
                    f"{name} must be one of {_MODES}, got {getattr(self, name)!r}", f'{name}="auto"'
                )
        if not isinstance(self.cooperative, bool):
            raise _bad(f"cooperative must be a bool, got {self.cooperative!r}", "cooperative=False")
        for name in ("profile", "label"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise _bad(f"{name} must be a str or None, got {value!r}", f'{name}="..."')

    @property
    def iterations(self) -> int:
        """The number of launches (``fixpoint_iterations`` with ``None`` read as 1)."""
        return 1 if self.fixpoint_iterations is None else self.fixpoint_iterations

    def launch_shape(self) -> tuple[object, ...]:
        """Return the fields that decide what runs: equal for configs of the same launch shape.

        Everything but ``timeout`` and ``label`` counts; ``fixpoint_iterations``
        ``None`` equals 1.
        """
        return tuple(
            self.iterations if f.name == "fixpoint_iterations" else getattr(self, f.name)
            for f in fields(self)
            if f.name not in _NOT_SHAPE
        )

    def same_launch_shape(self, other: DispatchConfig) -> bool:
        """Return True when ``other`` differs from this config at most in timeout and label."""
        return self.launch_shape() == other.launch_shape()


def _count(
    name: str, value: object, example: str, minimum: int = 0, maximum: int | None = None
) -> int:
    """A count or size of the config: an int or numpy integer (not a bool) within bounds."""
    return whole_number(
        f"DispatchConfig: {name}",
        value,
        example=f"DispatchConfig({example})",
        minimum=minimum,
        maximum=maximum,
    )


def _bad(message: str, example: str) -> InvalidArgument:
    return InvalidArgument(f"DispatchConfig: {message}", fix=f"pass e.g. DispatchConfig({example})")
