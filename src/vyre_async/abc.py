"""The backend authors' seam: `Executor`, and everything an executor is handed or returns.

A backend is an `Executor`: target mechanics only (compile, enqueue, memory,
completion). `vyre_async.VyreBackend` wraps one and owns everything else —
validation, the pipeline caches, launch planning, the prefetcher, telemetry,
the lifecycle and every user-facing method::

    backend = VyreBackend(MyExecutor(), prefetch=False)
    outputs = await backend.dispatch(program, inputs)

An executor sets ``id`` and implements `Executor.enqueue`; every other hook
has a conservative default. ``docs/backend-authors.md`` builds a complete one
that imports only this module, `vyre_async.ir` and `vyre_async.errors`, which
is all a backend package needs (a structure test holds the shipped backends
to that).

What this module exports besides `Executor`:

* what the hooks receive and return: `Launch` (one planned dispatch),
  `DispatchCompleter` (settles it exactly once), `PendingDispatch`,
  `BindingPlan` / `LaunchGeometry`, `DispatchConfig`, `BackendCapabilities`,
  `ResidentBuffer` (with `upload_request` / `alloc_request` / `check_buffer`,
  which check a resident-buffer call's arguments);
* registration: `BackendRegistration` (an entry point of the group
  ``vyre_async.backends`` names one), and `acquire_backend` /
  `acquire_preferred_backend` for a worker process that serves another backend;
* planning and settling helpers: `plan_dispatch`, `normalize_inputs` and
  `HostInput` (plan a program outside a dispatch, as the reference engine's
  own entry point does), `settle_hook` and `defer_to_callbacks` (act on a
  pending dispatch's outcome from the settling thread, or from the callback
  thread), `configure_tracing` (a worker process's own tracer);
* `VyreBackend` itself and `DiskPipelineCache` (loaded on first use), for a
  package's factory function and for private probe backends, and
  `default_cache_root` (where a backend keeps its driver's own caches);
* the shared, backend-neutral helpers backends use: `poll_until`,
  `whole_number` and `duration` (they refuse a bad setting with
  `InvalidArgument`, the error a backend raises for one too), the
  calibration probes (`Calibration`, `measure_host_costs`, ..., and
  `elementwise_xor`, the program they time), the execution-mode verdict of a
  batch (`ExecutionDecision`, `annotate_mode`), the copy-overlap policy, and
  `public_dir` / `lazy_exports` for a package's own ``__dir__``.
  The heavier of these load on first use (PEP 562): a registration module
  that imports `BackendRegistration` from here loads no policy, no probe and
  no GPU library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vyre_async._arguments import duration, whole_number
from vyre_async._capabilities import FEATURES, BackendCapabilities
from vyre_async._config import DispatchConfig
from vyre_async._executor import Executor, Launch, poll_until
from vyre_async._exports import public_dir
from vyre_async._lazy import lazy_exports
from vyre_async._pending import DispatchCompleter, PendingDispatch, defer_to_callbacks, settle_hook
from vyre_async._plan import (
    BindingPlan,
    HostInput,
    LaunchGeometry,
    normalize_inputs,
    plan_dispatch,
)
from vyre_async._registry import BackendRegistration, acquire_backend, acquire_preferred_backend
from vyre_async._resident import ResidentBuffer, alloc_request, check_buffer, upload_request
from vyre_async._version import __version__
from vyre_async.errors import InvalidArgument
from vyre_async.ir.ops import CORE_OPS

if TYPE_CHECKING:  # (loaded on first use: `__getattr__` below)
    from vyre_async._backend import VyreBackend
    from vyre_async._cache.disk import DiskPipelineCache, default_cache_root
    from vyre_async._calibration import (
        Calibration,
        measure_arm_overlap,
        measure_batch_costs,
        measure_fusion_gain,
        measure_host_costs,
        measure_resident_gain,
    )
    from vyre_async._execution import ExecutionDecision, annotate_mode
    from vyre_async.policies.arms import ArmSummary
    from vyre_async.policies.overlap import CopyVerdict, can_overlap_copy_with_kernel
    from vyre_async.programs import elementwise_xor
    from vyre_async.tracing import configure_tracing

__all__ = [
    "CORE_OPS",
    "DRIVER_VERSION",
    "FEATURES",
    "ArmSummary",
    "BackendCapabilities",
    "BackendRegistration",
    "BindingPlan",
    "Calibration",
    "CopyVerdict",
    "DiskPipelineCache",
    "DispatchCompleter",
    "DispatchConfig",
    "ExecutionDecision",
    "Executor",
    "HostInput",
    "InvalidArgument",
    "Launch",
    "LaunchGeometry",
    "PendingDispatch",
    "ResidentBuffer",
    "VyreBackend",
    "acquire_backend",
    "acquire_preferred_backend",
    "alloc_request",
    "annotate_mode",
    "can_overlap_copy_with_kernel",
    "check_buffer",
    "configure_tracing",
    "default_cache_root",
    "defer_to_callbacks",
    "duration",
    "elementwise_xor",
    "lazy_exports",
    "measure_arm_overlap",
    "measure_batch_costs",
    "measure_host_costs",
    "measure_fusion_gain",
    "measure_resident_gain",
    "normalize_inputs",
    "plan_dispatch",
    "poll_until",
    "public_dir",
    "settle_hook",
    "upload_request",
    "whole_number",
]

#: The vyre-async release this seam belongs to (a backend shipped with it reports it).
DRIVER_VERSION = __version__

# Loaded on first use: each pulls in a policy module or numpy-heavy probes.
_LAZY = {
    "Calibration": "vyre_async._calibration",
    "measure_host_costs": "vyre_async._calibration",
    "measure_batch_costs": "vyre_async._calibration",
    "measure_arm_overlap": "vyre_async._calibration",
    "measure_fusion_gain": "vyre_async._calibration",
    "measure_resident_gain": "vyre_async._calibration",
    "ExecutionDecision": "vyre_async._execution",
    "VyreBackend": "vyre_async._backend",
    "DiskPipelineCache": "vyre_async._cache.disk",
    "default_cache_root": "vyre_async._cache.disk",
    "elementwise_xor": "vyre_async.programs",
    "configure_tracing": "vyre_async.tracing",
    "annotate_mode": "vyre_async._execution",
    "ArmSummary": "vyre_async.policies.arms",
    "CopyVerdict": "vyre_async.policies.overlap",
    "can_overlap_copy_with_kernel": "vyre_async.policies.overlap",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
