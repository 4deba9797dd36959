"""``kubectl logs`` through the engine: its nodes advertise the kubelet API over TLS (metrics
stay on the plain port), a pod's annotation scripts its log, the stages' scripts the rest; a
followed log ends at the exit the engine writes; a bad annotation is a Warning Event."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from operators.api.stages import load_lifecycle
from operators.controlplane.pki import KubeletPKI, ensure_kubelet_pki
from operators.engine.running import ClusterEngine
from operators.engine.stages import compile_lifecycle
from tests.engine.harness import NODES, PODS, POOLS, Fleet, pod, pool
from tests.engine.kubeletclient import api_server_context, connect, get, read_chunk

EVENTS = "/api/v1/namespaces/default/events"
LOGS = json.dumps({"start": ["up on {node}"], "every": {"interval": "10s", "lines": ["n={n}"]},
                   "exit": ["done: {exitCode}"]})
STAGES = Path(__file__).parents[2] / "operators/engine/stages.yaml"


@pytest.fixture
def kubelet(tmp_path: Path) -> KubeletPKI:
    return ensure_kubelet_pki(tmp_path / "kubelet", "west")


def address(fleet: Fleet, node: str) -> str:
    found = fleet.member.object(f"{NODES}/{node}")
    assert found is not None
    return str(found["status"]["addresses"][0]["address"])


def tls_port(engine: ClusterEngine) -> int:
    assert engine.kubelet_api is not None
    return engine.kubelet_api.port


async def test_nodes_advertise_the_tls_port_and_metrics_stay_plain(kubelet: KubeletPKI) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(kubelet_port=0, kubelet_pki=kubelet)) as engine:
        await fleet.clock.advance(1)
        node = fleet.nodes()["cpu-0"]
        assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": tls_port(
            engine)}}
        assert engine.server is not None
        assert engine.server.port != tls_port(engine)
        reader, writer = await connect(tls_port(engine), address(fleet, "cpu-0"),
                                       api_server_context(kubelet))
        status, _, body = await get(reader, writer, "/metrics/resource")
        assert status == 200
        assert b"node_cpu_usage_seconds_total" in body, "kubectl get --raw .../proxy works too"
        writer.close()


async def test_a_pod_s_log_follows_its_script_and_ends_with_its_exit(kubelet: KubeletPKI) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(kubelet_pki=kubelet)) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0", restart="Never", annotations={
            "fakefleet.dev/logs": LOGS, "fakefleet.dev/run-time": "25s",
            "fakefleet.dev/exit-code": "4"}))
        await fleet.clock.advance(12)
        reader, writer = await connect(tls_port(engine), address(fleet, "cpu-0"),
                                       api_server_context(kubelet))
        status, _, body = await get(reader, writer, "/containerLogs/default/web/main")
        assert (status, body) == (200, b"up on cpu-0\nn=1\n")
        writer.write(b"GET /containerLogs/default/web/main?follow=true&tailLines=0 "
                     b"HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        await fleet.clock.advance(10)
        assert await read_chunk(reader) == b"n=2\n"
        await fleet.clock.advance(10)  # the run time is over: the engine writes the exit
        assert fleet.pod("web")["status"]["phase"] == "Failed"
        assert await read_chunk(reader) == b"done: 4\n"
        assert await read_chunk(reader) == b""
        status, _, body = await get(reader, writer, "/containerLogs/default/web/main?tailLines=1")
        assert body == b"done: 4\n"
        writer.close()


async def test_the_stages_script_covers_what_no_annotation_does(kubelet: KubeletPKI) -> None:
    lifecycle = load_lifecycle(STAGES.read_text() + (
        "logs:\n- name: jobs\n  selector:\n    matchExpressions:\n"
        "    - {key: job, operator: In, values: ['true']}\n"
        "  start: ['job {pod} starts']\n"))
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(kubelet_pki=kubelet,
                                          rules=compile_lifecycle(lifecycle))) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("train", "cpu-0", job=True))
        fleet.member.put(PODS, pod("web", "cpu-0"))
        await fleet.clock.advance(2)
        reader, writer = await connect(tls_port(engine), address(fleet, "cpu-0"),
                                       api_server_context(kubelet))
        assert (await get(reader, writer, "/containerLogs/default/train/main"))[2] == \
            b"job train starts\n"
        assert (await get(reader, writer, "/containerLogs/default/web/main"))[2] == b"", \
            "no script: an empty log"
        writer.close()


async def test_a_bad_log_annotation_is_warned_of_and_ignored(kubelet: KubeletPKI) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(kubelet_pki=kubelet)) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={
            "fakefleet.dev/logs": '{"start": ["{oops}"]}'}))
        await fleet.clock.advance(2)
        await fleet.member_client_patch(f"{PODS}/web", {"metadata": {"annotations": {
            "fakefleet.dev/logs": "start: [fixed]"}}})
        await fleet.clock.advance(1)
        reader, writer = await connect(tls_port(engine), address(fleet, "cpu-0"),
                                       api_server_context(kubelet))
        assert (await get(reader, writer, "/containerLogs/default/web/main"))[2] == b"fixed\n"
        writer.close()
    events = [e for e in fleet.member.objects(EVENTS) if e["reason"] == "InvalidAnnotation"]
    assert len(events) == 1
    assert "annotation fakefleet.dev/logs is not a log script: start.0.text: unknown placeholder " \
           "{oops}" in events[0]["message"]


async def test_nodes_of_an_engine_without_tls_are_advertised_anew_and_logs_survive_a_restart(
        kubelet: KubeletPKI) -> None:
    """An engine of an older operator advertised its plain port: the next one, with the
    kubelet PKI, moves the existing nodes to its TLS port; the log is computed from the pod's
    status, so it is the same after the restart."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(kubelet_port=0)) as old:
        await fleet.clock.advance(1)
        assert old.server is not None
        plain = old.server.port
        assert fleet.nodes()["cpu-0"]["status"]["daemonEndpoints"]["kubeletEndpoint"][
            "Port"] == plain
        fleet.member.put(PODS, pod("web", "cpu-0", annotations={"fakefleet.dev/logs": LOGS}))
        await fleet.clock.advance(25)
    uid = fleet.nodes()["cpu-0"]["metadata"]["uid"]
    async with fleet.running(fleet.engine(kubelet_port=plain, kubelet_pki=kubelet)) as engine:
        await fleet.clock.advance(1)
        node = fleet.nodes()["cpu-0"]
        assert node["metadata"]["uid"] == uid, "the same node, re-advertised"
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == tls_port(engine)
        reader, writer = await connect(tls_port(engine), address(fleet, "cpu-0"),
                                       api_server_context(kubelet))
        assert (await get(reader, writer, "/containerLogs/default/web/main"))[2] == \
            b"up on cpu-0\nn=1\nn=2\n"
        writer.close()
