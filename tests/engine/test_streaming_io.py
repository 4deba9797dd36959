"""``kubectl exec`` through the engine, as the member's API server reaches it: the TLS kubelet
API of a GPU node hands the SPDY session to the engine's upgrader, which sees the pods the
engine runs; ``nvidia-smi -L`` names the GPUs the DCGM endpoint shows the pod holding, and a
command's delay runs on the engine's clock."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from operators.controlplane.pki import KubeletPKI, ensure_kubelet_pki
from operators.engine.running import ClusterEngine
from tests.engine.harness import NODES, PODS, POOLS, Fleet, pod, pool
from tests.engine.kubeletclient import api_server_context, connect
from tests.engine.spdyclient import Client, Frame, status_of, stream_data


@pytest.fixture
def kubelet(tmp_path: Path) -> KubeletPKI:
    return ensure_kubelet_pki(tmp_path / "kubelet", "west")


def gpu_pod(name: str, gpus: int, **annotations: str) -> dict[str, Any]:
    body = pod(name, "gpu-0", annotations=annotations)
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return body


def held(engine: ClusterEngine, name: str) -> list[str]:
    """The UUIDs of the GPUs the DCGM endpoint shows pod ``name`` holding, by index."""
    samples = [sample for family in text_string_to_metric_families(
        engine.dcgm_metrics().decode()) for sample in family.samples
        if sample.name == "DCGM_FI_DEV_GPU_UTIL" and sample.labels.get("pod") == name]
    return [sample.labels["UUID"] for sample in
            sorted(samples, key=lambda sample: int(sample.labels["gpu"]))]


async def exec_(engine: ClusterEngine, fleet: Fleet, kubelet: KubeletPKI, pod_name: str,
                *command: str, advance: float = 0) -> list[Frame]:
    """Run ``command`` as client-go does over SPDY; the frames the engine wrote until it went
    away (``advance``: seconds of the engine's clock to let pass once the streams are open)."""
    node = fleet.member.object(f"{NODES}/gpu-0")
    assert node is not None
    assert engine.kubelet_api is not None
    address = node["status"]["addresses"][0]["address"]
    reader, writer = await connect(engine.kubelet_api.port, address,
                                   api_server_context(kubelet))
    query = "&".join(f"command={word}" for word in command)
    writer.write(f"POST /exec/default/{pod_name}/main?{query}&output=1&error=1 HTTP/1.1\r\n"
                 f"Host: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                 f"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n"), head
    client = Client()
    writer.write(client.syn_stream(1, {"streamtype": "error"}) + client.data(1, b"", fin=True) +
                 client.syn_stream(3, {"streamtype": "stdout"}) +
                 client.syn_stream(5, {"streamtype": "stderr"}))
    if advance:
        await asyncio.sleep(0.1)  # the streams are open, the command waits
        await fleet.clock.advance(advance)
    frames: list[Frame] = []
    while not any(frame.kind == 7 for frame in frames):  # GOAWAY: the session is over
        frames += client.read(await asyncio.wait_for(reader.read(65536), 5))
    writer.close()
    return frames


async def test_nvidia_smi_lists_the_gpus_dcgm_shows_the_pod_holding(kubelet: KubeletPKI) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=1, gpu={"preset": "H100-SXM5-80GB"}))
    async with fleet.running(fleet.engine(kubelet_port=0, kubelet_pki=kubelet)) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, gpu_pod("holder", 1))
        fleet.member.put(PODS, gpu_pod("trainer", 2))
        await fleet.clock.advance(5)
        assert fleet.pod("trainer")["status"]["phase"] == "Running"
        frames = await exec_(engine, fleet, kubelet, "trainer", "nvidia-smi", "-L")
        listed = stream_data(frames, 3).decode().splitlines()
        uuids = held(engine, "trainer")
        assert len(uuids) == 2
        assert listed == [f"GPU {number}: NVIDIA H100 80GB HBM3 (UUID: {uuid})"
                          for number, uuid in enumerate(uuids)]
        assert status_of(frames, 1) == {"status": "Success"}


async def test_a_command_s_delay_runs_on_the_engine_s_clock(kubelet: KubeletPKI) -> None:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=1, gpu={"preset": "H100-SXM5-80GB"}))
    slow = json.dumps([{"name": "slow", "command": ["slow"], "stdout": "done\n",
                        "delay": "30s"}])
    async with fleet.running(fleet.engine(kubelet_pki=kubelet)) as engine:
        await fleet.clock.advance(1)
        fleet.member.put(PODS, gpu_pod("waiter", 0, **{"fakefleet.dev/exec": slow}))
        await fleet.clock.advance(5)
        frames = await exec_(engine, fleet, kubelet, "waiter", "slow", advance=30)
        assert stream_data(frames, 3) == b"done\n"
        assert status_of(frames, 1) == {"status": "Success"}
