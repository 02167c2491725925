"""Arm graphs: several programs sharing named buffers, submitted with one ``await``.

Declare graph resources (named, typed buffers) and arms (programs whose buffers
are bound to resources), then ``result = await graph.run(backend, outputs=[...])``:

1. each arm's read/write summary is derived from its binding plan (READ and
   UNIFORM buffers read their resource, WRITE buffers write it, READ_WRITE
   buffers do both, atomic targets count as both);
2. the arms are layered by arm independence (`vyre_async.policies.plan_arms`):
   every layer holds mutually independent arms, every conflict crosses layers;
3. with every resource resident (the default where the backend has resident
   buffers), every arm is submitted at once and the backend orders the arms on
   their shared buffers (stream events on CUDA, worker waits on the reference
   backend): layers are joined on the device, never by a host sync. WRITE
   buffers get fresh zero-filled resident buffers and run as READ_WRITE (the
   same kernel), so outputs stay resident. Otherwise each layer's arms are
   dispatched together, the layer is awaited, each arm's outputs become the
   contents of the resources they are bound to, and the next layer starts
   (``GraphReport.joins_on`` says which, ``host_join_reason`` why);
4. the requested resources come back with a `GraphReport`: layers, which arms
   ran concurrently, the reason every serialised arm waited, streams, timing
   and the execution-mode verdict of the submission.

The result equals running the arms one by one in submission order.

Resources are graph-owned. With resident resources, those that arms read are
uploaded once per run and passed as resident buffers. ``residency="resident"``
requires them, ``"host"`` never uploads, and ``"auto"`` (the default) asks the
residency policy (`vyre_async.policies.decide_residency`): resident unless the
backend's calibration measured resident buffers slower than host arrays
(`Calibration.resident_gain_bps`; the reference backend's "resident" buffers
are host arrays the engine copies, so there they cost time). A backend without
resident buffers raises `UnsupportedFeature` on ``upload`` and ``"auto"`` then
keeps the resources as host arrays owned by the graph (reported as
``residency="host"``, reason ``no_resident_buffers``). That is not a silent
fallback of a user's buffer: graph resources never belonged to the device.
BOOL resources always stay host arrays (``upload`` of a ``uint32`` array would
type them U32). The ``vyre.graph`` span carries the verdict
(``vyre.policy.residency`` and ``.reason``), as does `GraphReport`.

Every arm's ``vyre.dispatch`` span (a child of one ``vyre.graph`` span) carries
``vyre.policy.arm.layer``, ``vyre.arm.index``, ``vyre.arm.label`` and, for an
arm that had to wait, ``vyre.policy.arm.reason`` (``write_write``,
``read_after_write`` or ``write_after_read``) and ``vyre.policy.arm.after`` (the
arm it waited for), plus the ``vyre.policy.execution_mode`` verdict.
"""

from vyre_async._exports import public_dir as _public_dir
from vyre_async._graph.arm_graph import ArmGraph
from vyre_async._graph.model import Arm, GraphResource, Residency, summarize_arm
from vyre_async._graph.report import ArmRun, GraphReport, GraphResult

__all__ = [
    "Arm",
    "ArmGraph",
    "ArmRun",
    "GraphReport",
    "GraphResource",
    "GraphResult",
    "Residency",
    "summarize_arm",
]
__dir__ = _public_dir(__name__)
