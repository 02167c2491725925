"""The records a dispatch is planned into: `Launch` (one call) and `LaunchTemplate` (its shape).

The dispatch front end (`vyre_async.frontend`) builds them; an executor's
``enqueue`` receives the `Launch` (`vyre_async.abc`). Plain data, below every
engine module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vyre_async._exports import public_dir as _public_dir
from vyre_async.config import DispatchConfig
from vyre_async.ir.program import Program
from vyre_async.pending import DispatchCompleter, PendingDispatch
from vyre_async.plan import BindingPlan
from vyre_async.resident import ResidentBuffer

__all__ = ["Launch", "LaunchTemplate"]
__dir__ = _public_dir(__name__)


class Launch:
    """Everything a backend's ``enqueue`` hook needs to run one dispatch (read-only).

    Attributes:
        pipeline: The compiled pipeline. Its ``program`` may differ from
            ``plan.program`` in buffer counts (one pipeline serves every size);
            use ``plan.program`` and ``plan.counts`` for sizes.
        plan: Binding plan: the dispatched program, geometry and every buffer's count.
        inputs: One item per input buffer: a private flat host array (the
            caller's own array, of any shape, for a backend whose
            ``copies_inputs`` is True), or a `ResidentBuffer` of this backend.
        config: The dispatch config.
        pending: The pending result handed to the caller.
        completer: Settles ``pending``; call exactly one of ``resolve``/``fail``.
        compile_s: Compile time this dispatch waited for.
        template: The `LaunchTemplate` of this launch shape.
        shape: What the executor's ``plan_shape`` hook returned for this launch
            shape (called once per shape; None by default).
        resident: True when any input is a `ResidentBuffer` (False: host arrays only).
    """

    __slots__ = (
        "compile_s",
        "completer",
        "config",
        "inputs",
        "pending",
        "pipeline",
        "plan",
        "resident",
        "shape",
        "template",
    )

    def __init__(
        self,
        pipeline: Any,
        plan: BindingPlan,
        inputs: tuple[np.ndarray | ResidentBuffer, ...],
        config: DispatchConfig,
        pending: PendingDispatch,
        completer: DispatchCompleter,
        compile_s: float,
        template: LaunchTemplate | None = None,
        resident: bool | None = None,
        shape: Any = None,
    ) -> None:
        self.pipeline = pipeline
        self.plan = plan
        self.inputs = inputs
        self.config = config
        self.pending = pending
        self.completer = completer
        self.compile_s = compile_s
        self.template = template
        self.shape = shape
        self.resident = (
            any(isinstance(item, ResidentBuffer) for item in inputs)
            if resident is None
            else resident
        )

    def __repr__(self) -> str:
        return f"<Launch {self.plan.program.op_id or 'program'} {self.plan.geometry}>"


class LaunchTemplate:
    """What one launch shape (program, config, input sizes) fixes for every dispatch of it.

    Attributes:
        program: The dispatched program.
        config: The dispatch config.
        plan: The binding plan.
        shape: ``(native, executor's plan_shape result)``: what the executor derived
            from this shape, for the pipeline artifact it was derived from (None
            until the first launch).
        telemetry: What `vyre_async.telemetry` derives from the shape (span
            attributes, metric labels), built on the first recorded dispatch.
    """

    __slots__ = ("config", "fingerprint", "plan", "program", "shape", "telemetry")

    def __init__(self, program: Program, config: DispatchConfig, plan: BindingPlan) -> None:
        self.program = program
        self.config = config
        self.plan = plan
        self.shape: tuple[Any, Any] | None = None
        self.telemetry: Any = None
        #: The shape fingerprint the prefetcher records (kept: built once per shape).
        self.fingerprint: tuple[bytes, tuple[int, int, int], tuple[int, int, int]] | None = None
