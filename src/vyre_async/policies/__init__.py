"""Dispatch policies: pure, backend-neutral decisions over plain data.

No program walks and no device calls happen here. Backends and the driver feed
these functions measured numbers (calibration, binding plans, histories) and act
on their typed verdicts; every verdict carries a short machine-readable
``reason`` that the driver records on the dispatch span. The rules, thresholds
and tie-breaks are those of the policy specification (``docs/policies.md``).

The names load from their submodules on first use (PEP 562): importing one
policy module, as the driver's hot path does, does not import the others.
"""

from vyre_async._lazy import lazy_exports as _lazy_exports

__all__ = [
    "ARM_CONCURRENCY_REASONS",
    "ARM_REASONS",
    "COPY_REASONS",
    "HIT_RATE_WINDOW",
    "INLINE_ALIGN",
    "INLINE_BUDGET_DISABLED",
    "INLINE_BUDGET_LARGE",
    "INLINE_BUDGET_SMALL",
    "MIN_ARM_OVERLAP_BPS",
    "MIN_RESIDENT_GAIN_BPS",
    "RESIDENCY_REASONS",
    "SHAPE_HISTORY_CAPACITY",
    "SPECULATION_MIN_CONFIDENCE_BPS",
    "SPECULATION_MIN_HITS",
    "ArmConcurrencyVerdict",
    "ArmConflict",
    "ArmPlan",
    "ArmSummary",
    "ArmVerdict",
    "CommandReuseVerdict",
    "CopyVerdict",
    "ExecutionModeVerdict",
    "ParamInliningVerdict",
    "PersistentVerdict",
    "ResidencyVerdict",
    "RollingHitRate",
    "ShapeHistory",
    "SpeculationVerdict",
    "can_dispatch_concurrently",
    "can_overlap_copy_with_kernel",
    "decide_arm_concurrency",
    "decide_command_reuse",
    "decide_param_inlining",
    "decide_persistent_kernel",
    "decide_residency",
    "decide_speculation",
    "layer_arms",
    "layer_dag",
    "plan_arms",
    "select_primary_execution_mode",
]

#: Public name -> the submodule defining it.
_SOURCES = {
    "ARM_CONCURRENCY_REASONS": "concurrency",
    "ARM_REASONS": "arms",
    "ArmConcurrencyVerdict": "concurrency",
    "ArmConflict": "arms",
    "ArmPlan": "arms",
    "ArmSummary": "arms",
    "ArmVerdict": "arms",
    "COPY_REASONS": "overlap",
    "CommandReuseVerdict": "launch",
    "CopyVerdict": "overlap",
    "ExecutionModeVerdict": "launch",
    "HIT_RATE_WINDOW": "shapes",
    "INLINE_ALIGN": "params",
    "INLINE_BUDGET_DISABLED": "params",
    "INLINE_BUDGET_LARGE": "params",
    "INLINE_BUDGET_SMALL": "params",
    "MIN_ARM_OVERLAP_BPS": "concurrency",
    "MIN_RESIDENT_GAIN_BPS": "residency",
    "ParamInliningVerdict": "params",
    "PersistentVerdict": "launch",
    "RESIDENCY_REASONS": "residency",
    "ResidencyVerdict": "residency",
    "RollingHitRate": "shapes",
    "SHAPE_HISTORY_CAPACITY": "shapes",
    "SPECULATION_MIN_CONFIDENCE_BPS": "speculation",
    "SPECULATION_MIN_HITS": "speculation",
    "ShapeHistory": "shapes",
    "SpeculationVerdict": "speculation",
    "can_dispatch_concurrently": "arms",
    "can_overlap_copy_with_kernel": "overlap",
    "decide_arm_concurrency": "concurrency",
    "decide_command_reuse": "launch",
    "decide_param_inlining": "params",
    "decide_persistent_kernel": "launch",
    "decide_residency": "residency",
    "decide_speculation": "speculation",
    "layer_arms": "arms",
    "layer_dag": "arms",
    "plan_arms": "arms",
    "select_primary_execution_mode": "launch",
}
__getattr__, __dir__ = _lazy_exports(__name__, _SOURCES, __all__)
