"""`prometheus_text` read back by the Prometheus client's parser, with the format's rules.

Every test renders metrics and passes the text through
`tests.prometheus_rules.check_exposition` (the parser, then the rules it lets
through: one group and one TYPE per name, unique series, ``_total`` counters,
sorted cumulative buckets ending in ``+Inf`` equal to ``_count``). The dispatch
test reads what real dispatches on the reference backend recorded in the
session's SDK; the others build the SDK's metric data directly, with the names
and labels that the format's rules are about.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tests.driver.fakes import BytesBackend
from tests.helpers import backend_of
from tests.prometheus_rules import Family, check_exposition, sample_values
from vyre_async import InvalidProgram, Program
from vyre_async.programs import elementwise_xor, saxpy
from vyre_async.telemetry import SECONDS_BUCKETS, prometheus_text
from vyre_reference import reference_backend

#: A program name and a backend id are the user's own strings: quote, backslash, newline.
ODD_OP = 'user "op" \\ with\na newline, \\n'
ODD_BACKEND = 'odd "backend" \\ id\n2'


class OddBackend(BytesBackend):
    """Answers inline (outputs as initialised); only its id matters here."""

    id = ODD_BACKEND


def _families(reader: InMemoryMetricReader) -> dict[str, Family]:
    return check_exposition(prometheus_text(reader.get_metrics_data()))


def _delta(
    before: dict[str, Family], after: dict[str, Family], sample: str, **labels: str
) -> float:
    """How much the sample ``sample`` with exactly ``labels`` grew."""
    key = tuple(sorted(labels.items()))
    return sample_values(after.values(), sample).get(key, 0.0) - sample_values(
        before.values(), sample
    ).get(key, 0.0)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # metrics do not depend on the loop
@pytest.mark.anyio
async def test_dispatch_metrics_parse_with_several_metrics_and_label_sets(
    reader: InMemoryMetricReader,
) -> None:
    xor = elementwise_xor(64)
    odd = Program(list(xor.buffers), xor.workgroup_size, list(xor.body), op_id=ODD_OP)
    inputs = [np.arange(64, dtype=np.uint32), np.ones(64, np.uint32)]
    floats = [np.ones(256, np.float32), np.ones(256, np.float32), np.array([2.0], np.float32)]
    before = _families(reader)
    reference = reference_backend()
    odd_backend = backend_of(OddBackend)
    try:
        for _ in range(3):
            await reference.dispatch(xor, inputs)
        for _ in range(2):
            await reference.dispatch(odd, inputs)
        await reference.dispatch(saxpy(256), floats)
        with pytest.raises(InvalidProgram):
            reference.dispatch(odd, inputs[:1])  # refused: counted as rejected
        for _ in range(2):
            await odd_backend.dispatch(xor, inputs)
    finally:
        await reference.aclose()
        await odd_backend.aclose()
    after = _families(reader)

    # The kinds vyre records, each one family of the right type.
    types = {name: family.type for name, family in after.items()}
    assert types["vyre_dispatch_duration"] == types["vyre_dispatch_device_time"] == "histogram"
    for counter in ("vyre_dispatch_count_total", "vyre_bytes_in_total", "vyre_bytes_out_total"):
        assert types[counter] == "counter"
    # Several label sets in one family; the user's strings come back exactly.
    series = [
        ("reference", "std.xor", 3),
        ("reference", ODD_OP, 2),
        ("reference", "std.saxpy", 1),
        (ODD_BACKEND, "std.xor", 2),
    ]
    for backend_id, op_id, n in series:
        labels = {"vyre_backend_id": backend_id, "vyre_program_op_id": op_id}
        for histogram in ("vyre_dispatch_duration", "vyre_dispatch_device_time"):
            assert _delta(before, after, histogram + "_count", **labels) == n, (histogram, labels)
            assert _delta(before, after, histogram + "_bucket", le="+Inf", **labels) == n
            assert _delta(before, after, histogram + "_sum", **labels) >= 0
        ok = _delta(before, after, "vyre_dispatch_count_total", vyre_status="ok", **labels)
        assert ok == n, labels
    odd_labels = {"vyre_backend_id": "reference", "vyre_program_op_id": ODD_OP}
    rejected = _delta(
        before, after, "vyre_dispatch_count_total", vyre_status="rejected", **odd_labels
    )
    assert rejected == 1
    assert _delta(before, after, "vyre_bytes_in_total", **odd_labels) == 2 * 512
    # The buckets are vyre's seconds bounds, written in order, each cumulative (checked
    # above for every series); the new observations fall in finite buckets.
    duration = after["vyre_dispatch_duration"]
    les = [
        labels["le"]
        for name, labels, _ in duration.series(**odd_labels)
        if name.endswith("_bucket")
    ]
    assert [float(le) for le in les[:-1]] == list(SECONDS_BUCKETS) and les[-1] == "+Inf"


def _data(*scopes: list[Metric]) -> MetricsData:
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=Resource.create({}),
                scope_metrics=[
                    ScopeMetrics(scope=InstrumentationScope(f"scope{i}"), metrics=m, schema_url="")
                    for i, m in enumerate(scopes)
                ],
                schema_url="",
            )
        ]
    )


def _sum(name: str, points: list[tuple[dict[str, Any], float]], monotonic: bool = True) -> Metric:
    return Metric(
        name=name,
        description=f"{name} help",
        unit="",
        data=Sum(
            data_points=[
                NumberDataPoint(attributes=a, start_time_unix_nano=0, time_unix_nano=1, value=v)
                for a, v in points
            ],
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
            is_monotonic=monotonic,
        ),
    )


def _gauge(name: str, points: list[tuple[dict[str, Any], float]]) -> Metric:
    return Metric(
        name=name,
        description="",
        unit="",
        data=Gauge(
            data_points=[
                NumberDataPoint(attributes=a, start_time_unix_nano=0, time_unix_nano=1, value=v)
                for a, v in points
            ]
        ),
    )


def _histogram(
    name: str, points: list[tuple[dict[str, Any], list[int]]], bounds: tuple[float, ...]
) -> Metric:
    return Metric(
        name=name,
        description="",
        unit="s",
        data=Histogram(
            data_points=[
                HistogramDataPoint(
                    attributes=a,
                    start_time_unix_nano=0,
                    time_unix_nano=1,
                    count=sum(counts),
                    sum=float(sum(counts)),
                    bucket_counts=counts,
                    explicit_bounds=bounds,
                    min=0.0,
                    max=1.0,
                )
                for a, counts in points
            ],
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
        ),
    )


def test_label_names_that_collide_or_are_reserved_give_valid_text() -> None:
    text = prometheus_text(
        _data(
            [
                # "a.b" and "a_b" are both a_b: one label, values joined by ";" in key order
                _sum("hits", [({"a.b": "x", "a_b": "y"}, 1)]),
                # a user's "le" on a histogram, and "__name__", are reserved names
                _histogram("lat", [({"le": "user", "__name__": "n"}, [1, 0, 2])], (0.1, 1.0)),
            ]
        )
    )
    families = check_exposition(text)
    assert families["hits_total"].samples == [("hits_total", {"a_b": "x;y"}, 1.0)]
    buckets = families["lat"].series(exported_le="user", exported___name__="n")
    assert [(s[1]["le"], s[2]) for s in buckets if s[0] == "lat_bucket"] == [
        ("0.1", 1.0),
        ("1.0", 1.0),
        ("+Inf", 3.0),
    ]


def test_a_name_claimed_twice_is_written_once_and_the_other_named_in_a_comment() -> None:
    text = prometheus_text(
        _data(
            [
                _sum("requests", [({"code": "200"}, 5)]),
                _sum("sent_total", [({}, 7)]),  # already ends in _total: not doubled
                _gauge("requests_total", [({}, 1)]),  # the counter's series name
                _histogram("wait", [({}, [1, 1])], (0.5,)),
                _gauge("wait_count", [({}, 2)]),  # one of the histogram's series
            ],
            [_sum("requests", [({"code": "200"}, 9)])],  # the same name from another scope
        )
    )
    families = check_exposition(text)
    assert families["requests_total"].samples == [("requests_total", {"code": "200"}, 5.0)]
    assert families["sent_total"].samples == [("sent_total", {}, 7.0)]
    assert "wait_count" not in families and families["wait"].type == "histogram"
    comments = [line for line in text.splitlines() if line.startswith("# ") and ": " in line]
    assert len(comments) == 3 and all("left out" in line for line in comments), comments


def test_points_whose_labels_become_equal_are_one_series() -> None:
    text = prometheus_text(_data([_sum("hits", [({"a.b": "x"}, 1), ({"a_b": "x"}, 2)])]))
    families = check_exposition(text)
    assert families["hits_total"].samples == [("hits_total", {"a_b": "x"}, 1.0)]
    assert "left out" in text


KEYS = st.sampled_from(["a.b", "a_b", "le", "__name__", "2xx", "naïve", "op", "x-y"])
VALUES = st.text(alphabet=st.sampled_from('ab"\\\n é{}=,'), max_size=6)
NAMES = st.sampled_from(["req", "req_total", "req.total", "lat", "lat_count", "x"])


@st.composite
def metric_data(draw: st.DrawFn) -> MetricsData:
    """A few metrics of every kind, with names and labels chosen to collide."""
    bounds = tuple(sorted(draw(st.sets(st.sampled_from([0.001, 0.5, 1.0, 2.5, 10.0]), max_size=4))))
    scopes = []
    for _ in range(draw(st.integers(1, 2))):
        metrics = []
        for _ in range(draw(st.integers(1, 4))):
            name = draw(NAMES)
            attrs = st.dictionaries(KEYS, VALUES, max_size=3)
            kind = draw(st.sampled_from(["counter", "updown", "gauge", "histogram"]))
            if kind == "histogram":
                counts = st.lists(
                    st.integers(0, 5), min_size=len(bounds) + 1, max_size=len(bounds) + 1
                )
                points = draw(st.lists(st.tuples(attrs, counts), max_size=3))
                metrics.append(_histogram(name, points, bounds))
            else:
                points = draw(st.lists(st.tuples(attrs, st.integers(0, 100)), max_size=3))
                if kind == "gauge":
                    metrics.append(_gauge(name, points))
                else:
                    metrics.append(_sum(name, points, monotonic=kind == "counter"))
        scopes.append(metrics)
    return _data(*scopes)


@settings(max_examples=150, deadline=None)
@given(metric_data())
def test_any_metrics_render_as_text_the_parser_and_the_rules_accept(data: MetricsData) -> None:
    families = check_exposition(prometheus_text(data))
    # What was written is what was recorded: each histogram series is its points'
    # running sums, each counter a point's value.
    points: dict[str, list[Any]] = {}
    for scope in data.resource_metrics[0].scope_metrics:
        for metric in scope.metrics:
            points.setdefault(metric.name, []).extend(metric.data.data_points)
    recorded_runs = {
        tuple(itertools.accumulate(p.bucket_counts))
        for ps in points.values()
        for p in ps
        if isinstance(p, HistogramDataPoint)
    }
    for family in families.values():
        if family.type == "histogram":
            by_labels: dict[tuple[tuple[str, str], ...], list[float]] = {}
            for name, labels, value in family.samples:
                if name.endswith("_bucket"):
                    key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                    by_labels.setdefault(key, []).append(value)
            for run in by_labels.values():
                assert tuple(int(v) for v in run) in recorded_runs, run


H = "# TYPE h histogram\n"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("x 1", "line feed"),
        ('# TYPE x gauge\nx{a="1} 1\n', "convert"),  # the parser's own refusal
        ("# TYPE x gauge\n# TYPE x gauge\nx 1\n", "second TYPE"),
        ("# TYPE x gauge\nx 1\n# HELP x late\n", "after the samples"),
        ("# TYPE x gauge\nx 1\n# TYPE y gauge\ny 1\nx 2\n", "outside its family"),
        ("x 1\n", "no TYPE"),
        ("# TYPE x.y gauge\n", "invalid metric name"),
        ('# TYPE x gauge\nx{__a="1"} 1\n', "labels"),  # (refused by the parser too)
        ("# TYPE x gauge\nx 1\nx 2\n", "a second line"),
        ("# TYPE x_total counter\nx_total 1\n# TYPE x gauge\nx 1\n", "claimed"),
        ("# TYPE x counter\nx 1\n", "read as x_total"),
        ("# TYPE x_total_total counter\nx_total_total 1\n", "doubled"),
        ("# TYPE x_total counter\nx_total -1\n", "negative"),
        (H + 'h_bucket{le="+Inf"} 1\nh_count 1\n', "lacks"),
        (
            H
            + 'h_bucket{le="2"} 1\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
            "increasing",
        ),
        (H + 'h_bucket{le="1"} 1\nh_sum 1\nh_count 1\n', "+Inf"),
        (H + 'h_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n', "cumulative"),
        (H + 'h_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n', "!= _count"),
        (H + 'h_bucket{le="one"} 2\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 2\n', "not a float"),
        (H + "h_bucket 2\nh_sum 1\nh_count 2\n", "le misplaced"),
        ('# TYPE x gauge\nx{a="back\\ slash"} 1\n', "not escaped"),
        ("# HELP x back\\ slash\n# TYPE x gauge\nx 1\n", "not escaped"),
    ],
)
def test_the_exposition_rules_refuse_what_the_format_forbids(text: str, complaint: str) -> None:
    with pytest.raises((AssertionError, ValueError)) as refused:
        check_exposition(text)
    assert complaint in str(refused.value)
