"""OpenTelemetry SDK metrics in the Prometheus text exposition format (`prometheus_text`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["prometheus_text"]


def _prom_name(name: str) -> str:
    """A Prometheus metric or label name: ASCII letters, digits and ``_``, no leading digit."""
    cleaned = "".join(c if c.isascii() and c.isalnum() else "_" for c in name)
    return f"_{cleaned}" if cleaned[:1].isdigit() else cleaned


def _prom_labels(
    attributes: Mapping[str, Any],
    extra: Iterable[tuple[str, str]] = (),
    reserved: frozenset[str] = frozenset(),
) -> str:
    """``{name="value",...}``: attribute keys as label names, ``extra`` labels last.

    Keys that become one name (``a.b`` and ``a_b``) are one label whose values are
    joined by ``;`` in the order of the keys (OpenTelemetry's Prometheus
    compatibility rule). A name the format reserves (``__`` in front, or one of
    ``reserved``: ``le`` on a histogram's series) gets ``exported_`` in front, as
    Prometheus renames a scraped label that clashes with one it sets.
    """
    merged: dict[str, list[str]] = {}
    for key, value in sorted(attributes.items()):
        name = _prom_name(key)
        if name.startswith("__") or name in reserved:
            name = f"exported_{name}"
        merged.setdefault(name, []).append(str(value))
    items = [(k, ";".join(v)) for k, v in merged.items()] + list(extra)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(series: str, metric: Any) -> str:
    text = str(metric.description or metric.name)
    return f"# HELP {series} " + text.replace("\\", "\\\\").replace("\n", "\\n")


def prometheus_text(metrics_data: Any) -> str:
    """Render OpenTelemetry SDK ``MetricsData`` in the Prometheus text exposition format.

    Pass what an SDK ``InMemoryMetricReader.get_metrics_data()`` (or any
    ``MetricReader``) returns. Sums become counters (``_total`` added unless the
    name ends in it) or gauges, gauges gauges, explicit-bucket histograms
    ``_bucket``/``_sum``/``_count`` series. Names become valid Prometheus names
    (other characters as ``_``, a leading digit prefixed with ``_``); label
    names that become equal are one label (values joined by ``;``), reserved ones
    get ``exported_`` in front (see `_prom_labels`). What the format cannot hold
    is named in a comment line and left out: a kind it has no plain form for (an
    exponential histogram), a metric whose names another metric already took
    (the same name in a second scope, a gauge named like a counter's series),
    a point whose labels equal an earlier point's.
    """
    lines: list[str] = []
    taken: set[str] = set()
    for resource_metrics in getattr(metrics_data, "resource_metrics", ()) or ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                lines += _prom_metric(metric, taken)
    return "\n".join(lines) + ("\n" if lines else "")


def _prom_metric(metric: Any, taken: set[str]) -> list[str]:
    """The lines of one metric; ``taken`` holds the names earlier metrics wrote (and grows)."""
    name = _prom_name(metric.name)
    data = metric.data
    kind = type(data).__name__  # the SDK's Sum, Gauge, Histogram, ExponentialHistogram
    points: Sequence[Any] = data.data_points
    if kind == "Sum" or hasattr(data, "is_monotonic"):
        counter = bool(data.is_monotonic)
        base = name.removesuffix("_total")
        series = f"{base}_total" if counter else name
        names = {base, series} if counter else {name}
        kind_name = "counter" if counter else "gauge"
    elif kind == "Histogram" or (points and hasattr(points[0], "explicit_bounds")):
        series, kind_name = name, "histogram"
        names = {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    elif kind == "Gauge" or (points and hasattr(points[0], "value")):
        series, kind_name, names = name, "gauge", {name}
    else:
        return [f"# {name}: a {kind} metric, which this exposition does not render"]
    if names & taken:
        clash = ", ".join(sorted(names & taken))
        return [f"# {name}: {clash} written for another metric already; this {kind} is left out"]
    taken |= names
    out = [_help(series, metric), f"# TYPE {series} {kind_name}"]
    reserved = frozenset({"le"}) if kind_name == "histogram" else frozenset()
    written: set[str] = set()
    for p in points:
        labels = _prom_labels(p.attributes, reserved=reserved)
        if labels in written:
            out.append(f"# {series}{labels}: a second point with these labels, left out")
            continue
        written.add(labels)
        if kind_name != "histogram":
            out.append(f"{series}{labels} {p.value}")
            continue
        running = 0
        for bound, count in zip((*p.explicit_bounds, float("inf")), p.bucket_counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            bucket = _prom_labels(p.attributes, [("le", le)], reserved)
            out.append(f"{name}_bucket{bucket} {running}")
        out.append(f"{name}_sum{labels} {p.sum}")
        out.append(f"{name}_count{labels} {p.count}")
    return out
