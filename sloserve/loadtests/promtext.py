"""Reading a Prometheus text exposition (a ``/metrics`` page: sloserve's, Triton's) with
prometheus_client's own parser: the benchmarks, the load tests and the integration tests read their
numbers here.

>>> page = 'sloserve_shed_total{model="m",reason="deadline"} 2.0\\nsloserve_shed_total{model="n",reason="overload"} 4.0'
>>> prom_sum(page, "sloserve_shed_total"), prom_sum(page, "sloserve_shed_total", model="m")
(6.0, 2.0)
>>> sorted(label_values(page, "sloserve_shed_total", "reason"))
['deadline', 'overload']
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def samples(text: str | None, name: str | None = None, **labels: str) -> Iterator[Sample]:
    """Every sample of the page (a counter's ``_total`` and ``_created``, a histogram's ``_bucket``,
    ``_sum`` and ``_count`` are each their own sample name), or those named ``name`` whose labels
    include these values."""
    for family in text_string_to_metric_families(text or ""):
        for s in family.samples:
            if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items()):
                yield s


def families(text: str | None) -> set[str]:
    """The metric families the page declares, samples or not (a counter's without ``_total``)."""
    return {f.name for f in text_string_to_metric_families(text or "")}


def prom_sum(text: str | None, name: str, model: str | None = None, **labels: str) -> float:
    """The sum of sample ``name`` over the series with these label values (``model``: any when None)."""
    if model is not None:
        labels["model"] = model
    return sum(s.value for s in samples(text, name, **labels))


def label_values(text: str | None, name: str, label: str, **labels: str) -> set[str]:
    """The values label ``label`` takes among the samples ``name`` (with these label values)."""
    return {s.labels[label] for s in samples(text, name, **labels) if label in s.labels}


def prom_max(text: str | None, name: str, **labels: str) -> float | None:
    """The largest value of sample ``name`` over the series with these label values (None: no series)."""
    values = [s.value for s in samples(text, name, **labels)]
    return max(values) if values else None
