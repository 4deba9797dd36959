"""A node's kubelet resource metrics (``GET /metrics/resource``), as the kubelet of the pinned
Kubernetes writes them and metrics-server reads them: CPU as counters of core-seconds since the
container (or node) started, memory as the working set in bytes, each sample stamped with the
time it was taken, in milliseconds.

metrics-server drops a container whose CPU counter or memory reads 0 (and with it the whole pod,
from ``kubectl top`` and from every HorizontalPodAutoscaler), and a node likewise: a usage of 0
is therefore reported as 1 nanosecond of CPU and 1 byte, which it shows as 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from operators.metrics.text import family, labels

#: The least a counter or a working set reads (see the module's docstring).
LEAST_CPU_SECONDS = 1e-9
LEAST_BYTES = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerSample:
    name: str
    cpu_seconds: float
    memory_bytes: float
    started: float  # seconds since the epoch


@dataclasses.dataclass(frozen=True, slots=True)
class PodSample:
    namespace: str
    name: str
    containers: tuple[ContainerSample, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSample:
    """Everything one scrape of a node reports, taken at ``timestamp`` (ms since the epoch)."""

    timestamp: int
    cpu_seconds: float
    memory_bytes: float
    pods: Sequence[PodSample]


def render(sample: NodeSample) -> str:
    """The ``/metrics/resource`` text of one node."""
    at = sample.timestamp
    # Each label set once, not once per family: most of a render is labels.
    containers = [(labels([("container", container.name), ("namespace", pod.namespace),
                           ("pod", pod.name)]), container)
                  for pod in sample.pods for container in pod.containers]
    pods = [(labels([("namespace", pod.namespace), ("pod", pod.name)]), pod)
            for pod in sample.pods]
    lines = [
        *family("container_cpu_usage_seconds_total", "counter",
                "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
                [(who, _cpu(c.cpu_seconds)) for who, c in containers], at),
        *family("container_memory_working_set_bytes", "gauge",
                "[STABLE] Current working set of the container in bytes",
                [(who, _bytes(c.memory_bytes)) for who, c in containers], at),
        *family("container_start_time_seconds", "gauge",
                "[STABLE] Start time of the container since unix epoch in seconds",
                [(who, c.started) for who, c in containers], at),
        *family("node_cpu_usage_seconds_total", "counter",
                "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
                [("", _cpu(sample.cpu_seconds))], at),
        *family("node_memory_working_set_bytes", "gauge",
                "[STABLE] Current working set of the node in bytes",
                [("", _bytes(sample.memory_bytes))], at),
        *family("pod_cpu_usage_seconds_total", "counter",
                "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
                [(who, _cpu(sum(c.cpu_seconds for c in p.containers))) for who, p in pods], at),
        *family("pod_memory_working_set_bytes", "gauge",
                "[STABLE] Current working set of the pod in bytes",
                [(who, _bytes(sum(c.memory_bytes for c in p.containers))) for who, p in pods],
                at),
        *family("resource_scrape_error", "gauge",
                "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
                [("", 0)]),
    ]
    return "\n".join(lines) + "\n"


def _cpu(seconds: float) -> float:
    return max(seconds, LEAST_CPU_SECONDS)


def _bytes(amount: float) -> float:
    return max(float(round(amount)), LEAST_BYTES)
