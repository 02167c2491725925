"""The rules of the Prometheus text exposition format, checked on a rendered text.

`check_exposition(text)` parses ``text`` with the Prometheus client's own parser
(``prometheus_client.parser.text_string_to_metric_families``, which refuses a
malformed line, a duplicate label name, a ``__name__`` label)
and then checks, line by line, what that parser lets through but the format
forbids. The rules, from the format's specification
(https://prometheus.io/docs/instrumenting/exposition_formats/, "Text-based
format", version 0.0.4; names from https://prometheus.io/docs/concepts/data_model/):

- every line ends with a line feed; each is a ``# HELP``, a ``# TYPE``, another
  comment, or a sample ``name{labels} value``;
- a backslash in a label value is written ``\\\\``, ``\\"`` or ``\\n``, in HELP
  text ``\\\\`` or ``\\n`` (the Prometheus server refuses any other escape; the
  client's parser keeps it as written);
- metric names match ``[a-zA-Z_:][a-zA-Z0-9_:]*``, label names
  ``[a-zA-Z_][a-zA-Z0-9_]*`` and do not start with ``__`` (reserved);
- at most one HELP and one TYPE line per metric name, both before its first
  sample, and all lines of a metric in one group ("All lines for a given metric
  must be provided as one single group");
- a name is claimed by one family only (a counter ``x_total`` and a gauge
  ``x`` are one family ``x`` to a parser), and each name and label set appears
  on one line only ("Each line must have a unique combination of a metric name
  and labels");
- counters: the samples are ``NAME_total`` — added to an OpenTelemetry sum's
  name when it does not end in ``_total`` already, never doubled (OpenTelemetry's
  Prometheus compatibility specification, "Sums");
- histograms: per label set, ``_bucket`` lines with an ``le`` label that parses
  as a float, in increasing ``le`` order ("The buckets of a histogram ... must
  appear in increasing numerical order of their label values"), values
  cumulative (never decreasing), the last ``le="+Inf"`` equal to ``_count``,
  and ``_sum`` and ``_count`` present.

Label values come back unescaped by the parser, so a test can compare them
with what was recorded.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
#: Suffixes of the series a histogram family writes besides none.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass
class Family:
    """One metric family as written: its TYPE and HELP lines and its samples, in order."""

    name: str
    type: str | None = None
    help: str | None = None
    #: (sample name, labels, value) in the order written; label values unescaped.
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def series(self, **labels: str) -> list[tuple[str, dict[str, str], float]]:
        """The samples whose labels include ``labels`` (``le`` aside)."""
        return [s for s in self.samples if all(s[1].get(k) == v for k, v in labels.items())]


def _split_sample(line: str) -> tuple[str, str]:
    """A sample line's name and the rest (labels and value)."""
    match = re.match(r"([^{\s]+)(.*)", line)
    assert match, f"not a sample line: {line!r}"
    return match.group(1), match.group(2)


def check_exposition(text: str) -> dict[str, Family]:
    """Assert every rule above on ``text``; return its families by the name of their TYPE line."""
    assert text == "" or text.endswith("\n"), "the last line must end with a line feed"
    families: dict[str, Family] = {}
    sampled: set[str] = set()  # families whose samples have begun
    order: list[str] = []  # the family each line belongs to, in order
    by_sample: dict[str, str] = {}  # sample name -> family (TYPE) name
    current: Family | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert METRIC_NAME.fullmatch(name), f"invalid metric name in {line!r}"
                family = families.setdefault(name, Family(name))
                if name in sampled:
                    raise AssertionError(f"{parts[1]} after the samples of {name}: {line!r}")
                if parts[1] == "TYPE":
                    assert len(parts) == 4 and parts[3] in TYPES, f"bad TYPE line {line!r}"
                    assert family.type is None, f"a second TYPE line for {name}"
                    family.type = parts[3]
                else:
                    assert family.help is None, f"a second HELP line for {name}"
                    family.help = parts[3] if len(parts) == 4 else ""
                    assert re.fullmatch(r"([^\\]|\\[\\n])*", family.help), (
                        f"HELP text with a backslash not escaped as \\\\ or \\n: {line!r}"
                    )
                if current is not family:
                    assert name not in order, f"{name}'s lines are not one group"
                    current = family
                    order.append(name)
            continue
        sample, rest = _split_sample(line)
        assert METRIC_NAME.fullmatch(sample), f"invalid metric name in {line!r}"
        for value in re.findall(r'="((?:[^"\\]|\\.)*)"', rest):
            assert re.fullmatch(r'([^\\]|\\[\\"n])*', value), (
                f'label value with a backslash not escaped as \\\\, \\" or \\n: {line!r}'
            )
        owner = _owner(sample, families, current)
        assert owner is current, f"sample {sample} outside its family's group: {line!r}"
        sampled.add(owner.name)
        by_sample.setdefault(sample, owner.name)
        assert by_sample[sample] == owner.name, f"{sample} written by two families"
    # The parser's view of the same text: values and unescaped labels, line by line.
    parsed = list(text_string_to_metric_families(text))  # raises on a malformed text
    parsed_samples = [s for f in parsed for s in f.samples]
    written = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert len(parsed_samples) == len(written), "the parser saw other samples than written"
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for line, sample in zip(written, parsed_samples, strict=True):
        assert _split_sample(line)[0] == sample.name, f"{line!r} is read as {sample.name}"
        for label in sample.labels:
            assert LABEL_NAME.fullmatch(label) and not label.startswith("__"), (
                f"invalid or reserved label name {label!r} in {line!r}"
            )
        key = (sample.name, tuple(sorted(sample.labels.items())))
        assert key not in seen, f"a second line for {sample.name}{sample.labels}"
        seen.add(key)
        family = families[by_sample[sample.name]]
        family.samples.append((sample.name, dict(sample.labels), float(sample.value)))
    _check_claimed_names(families)
    for family in families.values():
        if family.type == "counter":
            _check_counter(family)
        elif family.type == "histogram":
            _check_histogram(family)
        elif family.type == "gauge":
            assert {s[0] for s in family.samples} <= {family.name}, family.name
    return families


def _owner(sample: str, families: dict[str, Family], current: Family | None) -> Family:
    """The family a sample line belongs to: by its name, or a histogram's by a suffix."""
    if sample in families:
        return families[sample]
    for suffix in HISTOGRAM_SUFFIXES:
        base = sample.removesuffix(suffix)
        if base != sample and base in families and families[base].type in ("histogram", "summary"):
            return families[base]
    raise AssertionError(f"sample {sample} has no TYPE line (current: {current and current.name})")


def _check_claimed_names(families: dict[str, Family]) -> None:
    """No name is claimed by two families, the name a parser gives a counter included."""
    claimed: dict[str, str] = {}
    for family in families.values():
        names = {family.name, *(s[0] for s in family.samples)}
        if family.type == "counter":
            names.add(family.name.removesuffix("_total"))
        if family.type == "histogram":
            names |= {family.name + suffix for suffix in HISTOGRAM_SUFFIXES}
        for name in names:
            assert claimed.setdefault(name, family.name) == family.name, (
                f"{name} is claimed by {claimed[name]} and {family.name}"
            )


def _check_counter(family: Family) -> None:
    assert family.name.endswith("_total"), f"counter {family.name} does not end in _total"
    assert not family.name.endswith("_total_total"), f"counter {family.name}: _total doubled"
    for name, _, value in family.samples:
        assert name == family.name, f"counter {family.name} writes {name}"
        assert value >= 0, f"counter {family.name} is negative: {value}"


def _le(value: str) -> float:
    assert value == "+Inf" or re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", value), (
        f"le={value!r} is not a float"
    )
    return math.inf if value == "+Inf" else float(value)


def _check_histogram(family: Family) -> None:
    """Buckets sorted by ``le``, cumulative, ending in +Inf == _count; _sum and _count."""
    name = family.name
    groups: dict[tuple[tuple[str, str], ...], dict[str, list[tuple[str, float]]]] = {}
    for sample, written, value in family.samples:
        suffix = sample.removeprefix(name)
        labels = dict(written)
        assert suffix in HISTOGRAM_SUFFIXES, f"histogram {name} writes {sample}"
        le = labels.pop("le", None)
        assert (le is not None) == (suffix == "_bucket"), f"{sample} {labels}: le misplaced"
        group = groups.setdefault(tuple(sorted(labels.items())), {})
        group.setdefault(suffix, []).append((le or "", value))
    for labels, parts in groups.items():
        where = f"{name}{dict(labels)}"
        assert set(parts) == set(HISTOGRAM_SUFFIXES), (
            f"{where} lacks {set(HISTOGRAM_SUFFIXES) - set(parts)}"
        )
        assert len(parts["_sum"]) == 1 and len(parts["_count"]) == 1, where
        buckets = parts["_bucket"]
        bounds = [_le(le) for le, _ in buckets]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), (
            f"{where}: le not in increasing order: {[le for le, _ in buckets]}"
        )
        assert buckets[-1][0] == "+Inf", f'{where}: no le="+Inf" bucket last'
        counts = [value for _, value in buckets]
        assert all(a <= b for a, b in itertools.pairwise(counts)), (
            f"{where}: buckets not cumulative: {counts}"
        )
        assert counts[-1] == parts["_count"][0][1], (
            f"{where}: +Inf bucket {counts[-1]} != _count {parts['_count'][0][1]}"
        )


def sample_values(
    families: Iterable[Family], name: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called ``name``: its value by its label set."""
    return {
        tuple(sorted(labels.items())): value
        for family in families
        for sample, labels, value in family.samples
        if sample == name
    }
