"""Application metrics as users write them: one pod annotation per metric, whose value is a
number or a profile of the usage syntax (:mod:`operators.api.usage`, counted from the
container's start)::

    fakefleet.dev/metric.vllm_num_requests_waiting: "30"
    fakefleet.dev/metric.vllm_num_requests_running: "ramp(0, 40, 5m)"

The engine serves them as gauges in Prometheus' text format at the pod's node
(``/pods/<namespace>/<pod>/metrics``), for Prometheus to scrape and the custom-metrics adapter
to serve to HorizontalPodAutoscalers. Pure: the name rule and the parse of a pod's annotations.

A metric's name is Prometheus' metric name without the colon, which an annotation key cannot
hold (vLLM's ``vllm:num_requests_waiting`` is spelled ``vllm_num_requests_waiting``); the key's
name part (``metric.<name>``) ends with a letter or digit and has at most 63 characters, so a
name does too, and has at most :data:`MAX_NAME_LENGTH`. The API server refuses a pod whose key
breaks the annotation rules; the engine ignores, with an Event, one whose name or value is not
a metric's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from operators.api import usage
from operators.api.usage import Profile
from primitives import keys

#: Characters of a name: an annotation key's name part has at most 63, ``metric.`` takes 7.
MAX_NAME_LENGTH = 63 - len("metric.")
#: A metric's name (anchored), as the CRDs check it too.
NAME_PATTERN = r"^[a-zA-Z_]([a-zA-Z0-9_]*[a-zA-Z0-9])?$"
#: Metrics a pod may declare: bounds what one scrape of it renders.
MAX_METRICS = 32

_NAME = re.compile(NAME_PATTERN)

#: What a pod declares: (annotation key, text) of each metric annotation, in key order.
Declared = tuple[tuple[str, str], ...]
#: What a pod serves: (name, profile) of each valid metric, in name order.
Metrics = tuple[tuple[str, Profile], ...]


def declared(annotations: Mapping[str, str]) -> Declared:
    """The pod's metric annotations, in key order (compared to tell whether they changed)."""
    return tuple(sorted((key, text) for key, text in annotations.items()
                        if key.startswith(keys.METRIC_PREFIX)))


def check_name(name: str) -> str | None:
    """Why ``name`` is not a metric's name (None: it is one)."""
    if len(name) <= MAX_NAME_LENGTH and _NAME.match(name):
        return None
    return (f"{name!r} is not a metric name: letters, digits and underscores, not starting "
            f"with a digit, ending with a letter or digit, at most {MAX_NAME_LENGTH} "
            f"characters, e.g. vllm_num_requests_waiting")


def parse(annotations: Declared) -> tuple[Metrics, dict[str, str]]:
    """The metrics a pod serves, and each ignored annotation's problem by its key."""
    metrics: list[tuple[str, Profile]] = []
    problems: dict[str, str] = {}
    for key, text in annotations:
        name = key.removeprefix(keys.METRIC_PREFIX)
        wrong = check_name(name)
        if wrong is not None:
            problems[key] = wrong
            continue
        if len(metrics) == MAX_METRICS:
            problems[key] = (f"a pod serves at most {MAX_METRICS} metrics; remove one of "
                             f"its {keys.METRIC_PREFIX}* annotations")
            continue
        try:
            metrics.append((name, usage.parse(text, "number")))
        except ValueError as error:
            problems[key] = str(error)
    return tuple(metrics), problems
