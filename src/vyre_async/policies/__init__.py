"""Dispatch policies: pure, backend-neutral decisions over plain data.

No program walks and no device calls happen here. Backends and the driver feed
these functions measured numbers (calibration, binding plans, histories) and act
on their typed verdicts; every verdict carries a short machine-readable
``reason`` that the driver records on the dispatch span. The rules, thresholds
and tie-breaks are those of the policy specification (``docs/policies.md``).
"""

from vyre_async.policies.arms import (
    ARM_REASONS,
    ArmConflict,
    ArmPlan,
    ArmSummary,
    ArmVerdict,
    can_dispatch_concurrently,
    layer_arms,
    layer_dag,
    plan_arms,
)
from vyre_async.policies.concurrency import (
    ARM_CONCURRENCY_REASONS,
    MIN_ARM_OVERLAP_BPS,
    ArmConcurrencyVerdict,
    decide_arm_concurrency,
)
from vyre_async.policies.launch import (
    CommandReuseVerdict,
    ExecutionModeVerdict,
    PersistentVerdict,
    decide_command_reuse,
    decide_persistent_kernel,
    select_primary_execution_mode,
)
from vyre_async.policies.overlap import COPY_REASONS, CopyVerdict, can_overlap_copy_with_kernel
from vyre_async.policies.params import (
    INLINE_ALIGN,
    INLINE_BUDGET_DISABLED,
    INLINE_BUDGET_LARGE,
    INLINE_BUDGET_SMALL,
    ParamInliningVerdict,
    decide_param_inlining,
)
from vyre_async.policies.residency import (
    MIN_RESIDENT_GAIN_BPS,
    RESIDENCY_REASONS,
    ResidencyVerdict,
    decide_residency,
)
from vyre_async.policies.shapes import (
    HIT_RATE_WINDOW,
    SHAPE_HISTORY_CAPACITY,
    RollingHitRate,
    ShapeHistory,
)
from vyre_async.policies.speculation import (
    SPECULATION_MIN_CONFIDENCE_BPS,
    SPECULATION_MIN_HITS,
    SpeculationVerdict,
    decide_speculation,
)

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
