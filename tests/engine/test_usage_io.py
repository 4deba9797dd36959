"""Usage metrics over in-memory API servers and the engine's real endpoints (loopback sockets):
each node's kubelet at its own address, counters carried across annotation changes, node sums,
GPUs that follow their pods and their faults, and what an engine restart keeps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from operators.api.faultplans import Fault
from operators.api.gpus import gpu_uuid
from operators.engine.running import ClusterEngine
from operators.faults import catalogue
from operators.k8s.times import parse
from tests.engine.harness import ENGINE_NAME, NODES, PODS, POOLS, Fleet, as_written, pod, pool

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def scrape(http: aiohttp.ClientSession, address: str, port: int,
                 path: str) -> tuple[int, str]:
    async with http.get(f"http://{address}:{port}{path}") as response:
        return response.status, await response.text()


def samples(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def pod_cpu(found: Samples, name: str) -> float:
    return found[("pod_cpu_usage_seconds_total", (("namespace", "default"), ("pod", name)))]


def node_address(fleet: Fleet, name: str) -> str:
    found = fleet.member.object(f"{NODES}/{name}")
    assert found is not None
    address: str = found["status"]["addresses"][0]["address"]
    return address


def gpu_pod(name: str, node: str, gpus: int, **annotations: str) -> dict[str, Any]:
    body = pod(name, node, annotations=annotations)
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return body


def served(fleet: Fleet) -> ClusterEngine:
    return fleet.engine(kubelet_port=0)


async def test_each_node_s_kubelet_answers_at_its_own_address_with_its_own_pods(
        http: aiohttp.ClientSession) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(served(fleet)) as engine:
        await fleet.clock.advance(1)
        port = engine.registrar.kubelet_port
        assert port == engine.server.port if engine.server else False
        node = fleet.member.object(f"{NODES}/cpu-1")
        assert node is not None
        assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": port}}
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={
            "fakefleet.dev/usage-cpu": "250m", "fakefleet.dev/usage-memory": "1Gi"}))
        fleet.member.put(PODS, pod("other", "cpu-1"))
        await fleet.clock.advance(1)
        started = parse(fleet.pod("web")["status"]["containerStatuses"][0]["state"]["running"]
                        ["startedAt"])
        await fleet.clock.advance(20)
        status, text = await scrape(http, node_address(fleet, "cpu-0"), port,
                                    "/metrics/resource")
        assert status == 200
        found = samples(text)
        assert pod_cpu(found, "web") == pytest.approx(0.25 * (fleet.clock.now() - started))
        assert found[("pod_memory_working_set_bytes",
                      (("namespace", "default"), ("pod", "web")))] == 2 ** 30
        assert ("pod_cpu_usage_seconds_total",
                (("namespace", "default"), ("pod", "other"))) not in found
        _, other = await scrape(http, node_address(fleet, "cpu-1"), port, "/metrics/resource")
        assert pod_cpu(samples(other), "other") == pytest.approx(
            0.001 * (fleet.clock.now() - started)), "the pool's default, 1m"
        status, _ = await scrape(http, "127.0.0.1", port, "/metrics/resource")
        assert status == 404, "127.0.0.1 is no node's address"
        status, _ = await scrape(http, "127.64.0.200", port, "/metrics/resource")
        assert status == 404


async def test_a_node_reports_its_own_usage_plus_its_pods(http: aiohttp.ClientSession) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1, usage={"node": {"cpu": "500m",
                                                                   "memory": "2Gi"}}))
    async with fleet.running(served(fleet)) as engine:
        await fleet.clock.advance(1)
        created = parse(fleet.nodes()["cpu-0"]["metadata"]["creationTimestamp"])
        for name in ("a", "b"):
            fleet.member.put(PODS, pod(name, "cpu-0", annotations={
                "fakefleet.dev/usage-cpu": "1", "fakefleet.dev/usage-memory": "1Gi"}))
        await fleet.clock.advance(30)
        _, text = await scrape(http, node_address(fleet, "cpu-0"), engine.registrar.kubelet_port,
                               "/metrics/resource")
        found = samples(text)
    pods = pod_cpu(found, "a") + pod_cpu(found, "b")
    now = fleet.clock.now()
    assert found[("node_cpu_usage_seconds_total", ())] == pytest.approx(
        0.5 * (now - created) + pods, abs=1e-3)
    assert found[("node_memory_working_set_bytes", ())] == 2 * 2 ** 30 + 2 * 2 ** 30


async def test_an_annotation_change_carries_the_counter_over(
        http: aiohttp.ClientSession) -> None:
    """The counter never runs backwards, and the rate between two scrapes is exactly the
    usage in force: what an HPA reads."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(served(fleet)) as engine:
        port = engine.registrar.kubelet_port
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={
            "fakefleet.dev/usage-cpu": "ramp(0, 1, 100s)"}))
        await fleet.clock.advance(41)
        address = node_address(fleet, "cpu-0")
        _, first = await scrape(http, address, port, "/metrics/resource")
        ran = fleet.clock.now() - parse(
            fleet.pod("web")["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
        await fleet.member_client_patch(f"{PODS}/web", {"metadata": {"annotations": {
            "fakefleet.dev/usage-cpu": "100m"}}})
        await fleet.clock.advance(1)
        changed = fleet.clock.now()
        _, second = await scrape(http, address, port, "/metrics/resource")
        await fleet.clock.advance(10)
        _, third = await scrape(http, address, port, "/metrics/resource")
    one, two, three = (pod_cpu(samples(text), "web") for text in (first, second, third))
    assert one < two < three
    assert (three - two) / (fleet.clock.now() - changed) == pytest.approx(0.1)
    assert one == pytest.approx(0.5 * ran ** 2 / 100), "the ramp until then"


async def test_a_bad_usage_annotation_is_warned_of_and_the_pool_default_used(
        http: aiohttp.ClientSession) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1, usage={"pod": {"cpu": "2"}}))
    async with fleet.running(served(fleet)) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={
            "fakefleet.dev/usage-cpu": "lots"}))
        await fleet.clock.advance(11)
        _, text = await scrape(http, node_address(fleet, "cpu-0"),
                               engine.registrar.kubelet_port, "/metrics/resource")
        await fleet.member_client_patch(f"{PODS}/web", {"metadata": {"annotations": {
            "fakefleet.dev/usage-memory": "sine(1Gi, 2Gi)"}}})
        await fleet.clock.advance(1)
    events = [e for e in fleet.member.objects("/api/v1/namespaces/default/events")
              if e["reason"] == "InvalidAnnotation"]
    assert [e["involvedObject"]["name"] for e in events] == ["web", "web"]
    assert "fakefleet.dev/usage-cpu ignored: 'lots' is not CPU in cores" in events[0]["message"]
    assert "fakefleet.dev/usage-memory" in events[1]["message"], "warned of when it changes"
    assert pod_cpu(samples(text), "web") == pytest.approx(2 * 10, rel=0.1)


WAITING = "fakefleet.dev/metric.vllm_num_requests_waiting"


async def test_a_pod_s_application_metrics_are_served_at_its_node_and_follow_its_annotation(
        http: aiohttp.ClientSession) -> None:
    """What Prometheus scrapes (through the node: pod addresses are not routed here), and an
    invalid metric annotation warned of as the usage annotations are."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=2))
    async with fleet.running(served(fleet)) as engine:
        port = engine.registrar.kubelet_port
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("vllm", "cpu-0", annotations={
            WAITING: "ramp(0, 40, 100s)", "fakefleet.dev/metric.queue-length": "3"}))
        await fleet.clock.advance(1)
        started = parse(fleet.pod("vllm")["status"]["containerStatuses"][0]["state"]["running"]
                        ["startedAt"])
        await fleet.clock.advance(24)
        address = node_address(fleet, "cpu-0")
        status, text = await scrape(http, address, port, "/pods/default/vllm/metrics")
        assert status == 200
        assert samples(text) == {("vllm_num_requests_waiting", (
            ("container", "main"), ("namespace", "default"), ("pod", "vllm"))):
            pytest.approx(0.4 * (fleet.clock.now() - started))}
        status, text = await scrape(http, node_address(fleet, "cpu-1"), port,
                                    "/pods/default/vllm/metrics")
        assert (status, text) == (404, f"no pod default/vllm runs on the node at "
                                       f"{node_address(fleet, 'cpu-1')}: a pod's metrics are "
                                       f"at its node's InternalIP\n")
        status, _ = await scrape(http, address, port, "/pods/default/vllm")
        assert status == 404
        await fleet.member_client_patch(f"{PODS}/vllm", {"metadata": {"annotations": {
            WAITING: "0"}}})
        await fleet.clock.advance(1)
        _, text = await scrape(http, address, port, "/pods/default/vllm/metrics")
        assert list(samples(text).values()) == [0]
        status, _ = await scrape(http, address, port, "/metrics/resource")
        assert status == 200, "the kubelet's own route as it was"
    events = [e for e in fleet.member.objects("/api/v1/namespaces/default/events")
              if e["reason"] == "InvalidAnnotation"]
    (event,) = events
    assert event["involvedObject"]["name"] == "vllm"
    assert "fakefleet.dev/metric.queue-length ignored: 'queue-length' is not a metric name" \
        in event["message"]


def xid(code: int, gpus: int = 1) -> dict[str, Any]:
    return as_written(catalogue.node_entry("ns/plan-1/xid/0",
                                           Fault(type="GPUXid", xid=code, gpus=gpus), gpus=8))


def by_gpu(text: str, metric: str) -> dict[str, tuple[float, dict[str, str]]]:
    return {s.labels["gpu"]: (s.value, s.labels)
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == metric}


async def test_gpus_follow_their_pods_and_an_xid_shows_on_the_gpu_it_hit(
        http: aiohttp.ClientSession) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("h100", replicas=1, gpu={"preset": "H100-SXM5-80GB"}))
    async with fleet.running(served(fleet)) as engine:
        port = engine.registrar.kubelet_port
        await fleet.clock.advance(1)
        fleet.member.put(PODS, gpu_pod("train", "h100-0", 2,
                                       **{"fakefleet.dev/usage-gpu-util": "75"}))
        await fleet.clock.advance(2)
        _, text = await scrape(http, "127.0.0.1", port, "/metrics")
        util = by_gpu(text, "DCGM_FI_DEV_GPU_UTIL")
        assert sorted(util) == [str(i) for i in range(8)]
        assert [util[str(i)][0] for i in range(8)] == [75, 75, 0, 0, 0, 0, 0, 0]
        assert util["0"][1]["pod"] == "train"
        assert util["0"][1]["container"] == "main"
        assert util["0"][1]["UUID"] == gpu_uuid(ENGINE_NAME, "h100-0", 0)
        assert "pod" not in util["2"][1]
        fleet.inject(xid(79, gpus=3), "h100-0")
        await fleet.clock.advance(1)
        _, text = await scrape(http, "127.0.0.1", port, "/metrics")
        xids = by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")
        assert [xids[str(i)][0] for i in range(8)] == [79, 79, 79, 0, 0, 0, 0, 0]
        fleet.member.put(PODS, gpu_pod("late", "h100-0", 2))
        await fleet.clock.advance(2)
        _, text = await scrape(http, "127.0.0.1", port, "/metrics")
        util = by_gpu(text, "DCGM_FI_DEV_GPU_UTIL")
        assert util["0"][1]["pod"] == "train", "a pod keeps the GPUs it holds"
        assert [util[str(i)][1].get("pod") for i in range(8)] == [
            "train", "train", None, "late", "late", None, None, None], \
            "a new pod gets the lowest indices in service"
        assert [util[str(i)][0] for i in range(8)] == [0, 0, 0, 90, 90, 0, 0, 0], \
            "GPUs that fell off the bus do no work; the pool's default is 90"
    async with fleet.running(served(fleet)) as engine:  # a restart remembers the Xid
        await fleet.clock.advance(1)
        _, text = await scrape(http, "127.0.0.1", engine.registrar.kubelet_port, "/metrics")
        assert by_gpu(text, "DCGM_FI_DEV_XID_ERRORS")["2"][0] == 79
        await fleet.recover("ns/plan-1/xid/0")
        await fleet.clock.advance(1)
        _, text = await scrape(http, "127.0.0.1", engine.registrar.kubelet_port, "/metrics")
    assert {value for value, _ in by_gpu(text, "DCGM_FI_DEV_XID_ERRORS").values()} == {0}, \
        "the GPUs were reset"


async def test_a_condition_fault_heats_and_throttles_the_node_s_gpus(
        http: aiohttp.ClientSession) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("h100", replicas=1, gpu={"preset": "H100-SXM5-80GB",
                                                        "count": 4}))
    fault = Fault.model_validate({"type": "Condition", "condition": {
        "type": "GPUThermalSlowdown", "reason": "HWSlowdown"},
        "gpu": {"temperature": 93, "smClock": 1005}})
    heat = as_written(catalogue.node_entry("ns/hot/heat/0", fault, gpus=4))
    async with fleet.running(served(fleet)) as engine:
        await fleet.clock.advance(1)
        fleet.inject(heat, "h100-0")
        await fleet.clock.advance(1)
        _, text = await scrape(http, "127.0.0.1", engine.registrar.kubelet_port, "/metrics")
    assert {v for v, _ in by_gpu(text, "DCGM_FI_DEV_GPU_TEMP").values()} == {93}
    assert {v for v, _ in by_gpu(text, "DCGM_FI_DEV_SM_CLOCK").values()} == {1005}


async def test_an_engine_without_metrics_serves_nothing_and_measures_nothing() -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine()) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0"))
        await fleet.clock.advance(1)
    assert engine.server is None
    assert engine.usage is None
    assert fleet.nodes()["cpu-0"]["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == \
        10250

