"""The engine's usage book, pure: node sums, containers' shares, counters across restarts of
containers and departures of pods, GPUs held and freed."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from operators.api.nodepools import FakeNodePoolSpec
from operators.engine import pods as podlife
from operators.engine.nodes import NodeLife
from operators.engine.pods import PodFacts, PodLife
from operators.engine.usage import UsageBook
from operators.k8s.times import rfc3339

T0 = 1_800_000_000.0
SPEC = FakeNodePoolSpec.model_validate({
    "clusterRef": "c", "gpu": {"preset": "H100-SXM5-80GB"},
    "usage": {"node": {"cpu": "500m", "memory": "1Gi"}, "pod": {"cpu": "100m"}}})


def book() -> UsageBook:
    return UsageBook(pool_of=lambda node: ("gpu", SPEC), created=lambda node: rfc3339(T0))


def facts(name: str, *containers: dict[str, Any], **annotations: str) -> PodFacts:
    return PodFacts({"metadata": {"uid": f"uid-{name}", "namespace": "ns", "name": name,
                                  "annotations": annotations},
                     "spec": {"nodeName": "gpu-0", "containers": list(containers) or [
                         {"name": "main", "image": "i"}]}})


def running(at: float) -> PodLife:
    return PodLife(phase=podlife.RUNNING, started_at=rfc3339(at))


def test_a_pod_s_usage_is_split_over_its_containers_by_their_requests() -> None:
    usage = book()
    pod = facts("web", {"name": "app", "resources": {"requests": {"cpu": "3", "memory": "3Gi"}}},
                {"name": "proxy", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                **{"fakefleet.dev/usage-cpu": "2", "fakefleet.dev/usage-memory": "2Gi"})
    usage.seen(pod, running(T0 + 10), T0 + 10)
    sample = usage.node_sample("gpu-0", T0 + 110)
    (only,) = sample.pods
    app, proxy = only.containers
    assert (app.cpu_seconds, proxy.cpu_seconds) == pytest.approx((150.0, 50.0))
    assert (app.memory_bytes, proxy.memory_bytes) == (1.5 * 2 ** 30, 0.5 * 2 ** 30)
    assert sample.cpu_seconds == pytest.approx(0.5 * 110 + 200.0), "the node's own and its pod's"
    assert sample.memory_bytes == 2 ** 30 + 2 * 2 ** 30


def test_what_stopped_containers_used_stays_in_the_node_s_counter() -> None:
    usage = book()
    pod = facts("crashy")
    usage.seen(pod, running(T0), T0)
    usage.lived(pod.uid, PodLife(phase=podlife.BACKOFF), T0 + 100)  # 10 core-seconds at 100m
    assert usage.node_sample("gpu-0", T0 + 110).pods == []
    usage.lived(pod.uid, running(T0 + 120), T0 + 120)
    sample = usage.node_sample("gpu-0", T0 + 130)
    assert sample.pods[0].containers[0].cpu_seconds == pytest.approx(1.0), "a new container"
    assert sample.cpu_seconds == pytest.approx(0.5 * 130 + 10 + 1)
    usage.gone(pod.uid, T0 + 140)
    assert usage.node_sample("gpu-0", T0 + 150).cpu_seconds == pytest.approx(0.5 * 150 + 12)
    assert len(usage) == 0


def test_what_a_deleted_node_s_containers_used_is_forgotten_with_it() -> None:
    """Nodes come and go (a pool scaled down, up): the book keeps nothing per node that no
    longer exists, also when its pods go after it."""
    nodes = {"gpu-0": rfc3339(T0)}
    usage = UsageBook(pool_of=lambda node: ("gpu", SPEC), created=lambda n: nodes.get(n, ""))
    first, second = facts("a"), facts("b")
    for pod in (first, second):
        usage.seen(pod, running(T0), T0)
    usage.gone(first.uid, T0 + 100)  # 10 core-seconds at 100m stay in the node's counter
    assert usage.node_sample("gpu-0", T0 + 100).cpu_seconds == pytest.approx(50 + 10 + 10)
    del nodes["gpu-0"]
    usage.node_gone("gpu-0")
    usage.gone(second.uid, T0 + 200)  # its pod went after it
    assert usage._retired == {}
    assert len(usage) == 0
    nodes["gpu-0"] = rfc3339(T0 + 300)  # made again: its counter starts anew
    assert usage.node_sample("gpu-0", T0 + 310).cpu_seconds == pytest.approx(0.5 * 10)


def test_an_annotation_change_carries_the_counter_and_a_bad_one_is_reported_once() -> None:
    usage = book()
    pod = facts("web", **{"fakefleet.dev/usage-cpu": "1"})
    usage.seen(pod, running(T0), T0)
    pod.recorded({"annotations": {"fakefleet.dev/usage-cpu": "250m"}})
    assert usage.annotated(pod.uid, T0 + 60) == ()
    cpu = usage.node_sample("gpu-0", T0 + 100).pods[0].containers[0].cpu_seconds
    assert cpu == pytest.approx(60 + 0.25 * 40)
    pod.recorded({"annotations": {"fakefleet.dev/usage-cpu": "fast"}})
    (problem,) = usage.annotated(pod.uid, T0 + 100)
    assert problem.startswith("annotation fakefleet.dev/usage-cpu ignored: 'fast' is not")
    assert usage.annotated(pod.uid, T0 + 101) == (), "not again for the same text"
    cpu_later = usage.node_sample("gpu-0", T0 + 200).pods[0].containers[0].cpu_seconds
    assert cpu_later == pytest.approx(cpu + 0.1 * 100), "the pool's default from then on"


def gpu_pod(name: str, gpus: int) -> PodFacts:
    return facts(name, {"name": "trainer", "image": "i",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}})


def holders(usage: UsageBook, now: float, life: NodeLife | None = None) -> list[str | None]:
    return [sample.holder.pod if sample.holder else None
            for sample in usage.gpu_samples("c", "gpu-0", SPEC, life or NodeLife(), now)]


def test_gpus_are_held_where_they_were_first_given_and_freed_when_the_pod_ends() -> None:
    usage = book()
    first, second = gpu_pod("a", 3), gpu_pod("b", 2)
    usage.seen(first, running(T0), T0)
    usage.seen(second, running(T0), T0)
    assert holders(usage, T0 + 1) == ["a", "a", "a", "b", "b", None, None, None]
    usage.lived(first.uid, PodLife(phase=podlife.SUCCEEDED), T0 + 2)
    assert holders(usage, T0 + 3) == [None, None, None, "b", "b", None, None, None], \
        "b keeps its GPUs"
    third = gpu_pod("c", 4)
    usage.seen(third, PodLife(), T0 + 4)  # bound, not started: it holds them already
    samples = list(usage.gpu_samples("c", "gpu-0", SPEC, NodeLife(), T0 + 5))
    assert [s.holder.pod if s.holder else None for s in samples] == [
        "c", "c", "c", "b", "b", "c", None, None]
    assert [s.utilization for s in samples[:4]] == [0, 0, 0, 90], "busy only while running"


def test_rates_over_a_scrape_window_are_the_profile_s_exactly() -> None:
    """metrics-server divides a counter's increase by the window: at today's epoch a float
    difference of times is off by fractions of a microsecond, which made 350m read 350000005n
    (and kubectl top, rounding up, 351m). Counters are computed to the stamped millisecond."""
    usage = book()
    pod = facts("web", **{"fakefleet.dev/usage-cpu": "250m"})
    started = T0 + 23.417  # a pod that started at a fraction of a second
    usage.seen(pod, running(started), started)
    scrapes = [T0 + 152.038 + 10.003 * i + 0.0007 * i * i for i in range(8)]
    samples = [usage.node_sample("gpu-0", at) for at in scrapes]
    for first, second in itertools.pairwise(samples):
        window = (second.timestamp - first.timestamp) / 1000
        node = (second.cpu_seconds - first.cpu_seconds) / window
        (before,), (after,) = first.pods, second.pods
        pod_rate = (after.containers[0].cpu_seconds - before.containers[0].cpu_seconds) / window
        assert round(node * 1e9) == 750_000_000, "the node's 500m and its pod's 250m"
        assert round(pod_rate * 1e9) == 250_000_000
