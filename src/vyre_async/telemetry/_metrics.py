"""The metrics: vyre's counters and histograms, and the in-process sums behind the counters.

Counters are summed in-process (`Tallies`: a dict increment per dispatch) and
read by observable counters when the SDK collects; the two histograms get one
point each per dispatch. Metrics are labelled by backend id and op id, never
by fingerprint (bounded cardinality).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["COUNTERS", "SECONDS_BUCKETS", "Labels", "Tallies", "make_instruments"]

#: Counters: name -> (unit, description). Summed in-process (`Tallies`), read by
#: observable counters when the SDK collects.
COUNTERS = {
    "vyre.dispatch.count": ("{dispatch}", "Dispatches by outcome (vyre.status)"),
    "vyre.pipeline.cache.hits": ("{lookup}", "Pipeline cache hits"),
    "vyre.pipeline.cache.misses": ("{lookup}", "Pipeline cache misses"),
    "vyre.prefetch.hits": ("{prediction}", "Predicted dispatches whose pipeline was ready"),
    "vyre.prefetch.misses": ("{prediction}", "Predictions that missed or were not ready"),
    "vyre.bytes.in": ("By", "Input bytes of successful dispatches"),
    "vyre.bytes.out": ("By", "Output bytes of successful dispatches"),
}
#: Histogram bucket bounds in seconds, 10 µs to 10 s (the SDK default suits milliseconds).
SECONDS_BUCKETS = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

#: Metric labels: ``(attribute, value)`` pairs.
Labels = tuple[tuple[str, str], ...]


class Tallies:
    """Monotonic sums kept in-process and read by observable counters at collection time.

    Counting is a dict increment under an uncontended lock (well under a
    microsecond), instead of a synchronous SDK instrument call per counter.
    Series keys are tuples of ``(attribute, value)`` pairs built once per dispatch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[str, dict[Labels, int]] = {name: {} for name in COUNTERS}

    def add(self, name: str, key: Labels, amount: int = 1) -> None:
        series = self._sums[name]
        with self._lock:
            series[key] = series.get(key, 0) + amount

    def add_many(self, entries: Iterable[tuple[str, Labels, int]]) -> None:
        with self._lock:
            for name, key, amount in entries:
                series = self._sums[name]
                series[key] = series.get(key, 0) + amount

    def items(self, name: str) -> list[tuple[Labels, int]]:
        """The series of counter ``name`` and their sums now."""
        with self._lock:
            return list(self._sums[name].items())


def make_instruments(meter: Any, tallies: Callable[[], Tallies]) -> tuple[Any, Any]:
    """Make vyre's instruments on ``meter``; return the two histograms (latency, device time).

    Every counter of `COUNTERS` is an observable counter that reads ``tallies()``
    when the SDK collects.
    """

    def observe(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            from opentelemetry.metrics import Observation

            return [Observation(value, dict(key)) for key, value in tallies().items(name)]

        return callback

    for name, (unit, description) in COUNTERS.items():
        meter.create_observable_counter(
            name, callbacks=[observe(name)], unit=unit, description=description
        )
    latency = meter.create_histogram(
        "vyre.dispatch.duration",
        unit="s",
        description="dispatch() to result ready, host clock",
        explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
    )
    device = meter.create_histogram(
        "vyre.dispatch.device_time",
        unit="s",
        description="Execution time measured by the backend",
        explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
    )
    return latency, device
