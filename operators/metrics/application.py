"""A pod's application metrics (``GET /pods/<namespace>/<pod>/metrics`` at its node), as an
application's own endpoint would show them to Prometheus: a gauge per metric the pod's
annotations declare (:mod:`operators.api.appmetrics`), without timestamps (Prometheus stamps a
scrape with its own time, and marks a series stale once its pod is gone).

Each sample carries the labels ``namespace``, ``pod`` and ``container`` (the pod's first
container, the application's), which Prometheus' pod discovery would add to an application's
series by relabelling: so the series are the same whether a scrape honours them or adds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from operators.metrics.text import family, labels
from primitives import keys


@dataclasses.dataclass(frozen=True, slots=True)
class ApplicationSample:
    """One pod's application metrics at one time: (name, value) in name order."""

    namespace: str
    pod: str
    container: str
    values: Sequence[tuple[str, float]]


def render(sample: ApplicationSample) -> str:
    """The text of one pod's metrics endpoint ("" for a pod that declares none)."""
    who = labels([("container", sample.container), ("namespace", sample.namespace),
                  ("pod", sample.pod)])
    lines: list[str] = []
    for name, value in sample.values:
        lines += family(name, "gauge", f"the pod's annotation {keys.METRIC_PREFIX}{name}",
                        [(who, value)])
    return "".join(f"{line}\n" for line in lines)
