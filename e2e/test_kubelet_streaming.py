"""kubectl exec, attach and port-forward on fake pods, end to end: the pinned kubectl 1.36.3,
the member's real kube-apiserver (which turns kubectl's WebSockets into SPDY/3.1 towards a node
that does not declare ExtendWebSocketsToKubelet), and the engine's kubelet API serving the
SPDY session (operators/engine/streaming.py). Each case runs with kubectl's WebSockets and with
them turned off (SPDY from kubectl through the API server, passed through).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.conftest import KUBECTL, Fleet, eventually, kubectl, kubectl_json

CLUSTER = "streams"
MANIFESTS = f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {CLUSTER}}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: streams-gpu}}
spec:
  clusterRef: {CLUSTER}
  replicas: 1
  gpu: {{preset: H100-SXM5-80GB}}
  pods: {{terminationGracePeriodCap: 0s}}
"""
GPU_NODE = {"nodeSelector": {"fakefleet.dev/pool": "streams-gpu"},
            "tolerations": [{"operator": "Exists"}]}
EXEC_SCRIPTS = json.dumps([{"name": "check", "command": ["check"], "stdout": "checked\n",
                            "exitCode": 3}])
PORT_RULES = json.dumps([{"name": "api", "ports": [8000],
                          "http": {"contentType": "application/json",
                                   "body": '{"status":"ok"}'}}])
#: kubectl's WebSockets (the default), and SPDY all the way.
TRANSPORTS = {
    "websockets": {},
    "spdy": {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false",
             "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"},
}


@pytest.fixture(scope="module")
def streams(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(MANIFESTS)
    fleet.wait_cluster_ready(CLUSTER)
    fleet.wait_pool("streams-gpu", 1)
    kubeconfig = fleet.member(CLUSTER)
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    create(kubeconfig, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "trainer", "annotations": {"fakefleet.dev/exec": EXEC_SCRIPTS,
                                                        "fakefleet.dev/port-forward":
                                                            PORT_RULES}},
        "spec": {**GPU_NODE, "containers": [{
            "name": "main", "image": "pytorch", "ports": [{"containerPort": 8000}],
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    eventually(lambda: kubectl_json(kubeconfig, "get", "pod", "trainer")["status"].get(
        "phase") == "Running", what="pod trainer Running")
    yield kubeconfig
    fleet.release(CLUSTER, "streams-gpu")


def create(kubeconfig: Path, manifest: dict[str, Any]) -> None:
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
                   input=json.dumps(manifest), text=True, check=True, capture_output=True,
                   timeout=60)


def run(kubeconfig: Path, transport: str, *args: str,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, check=False, timeout=timeout,
                          env={**os.environ, **TRANSPORTS[transport]})


def held_gpus(fleet: Fleet, pod: str) -> dict[str, str]:
    """UUID → modelName of the GPUs the DCGM endpoint shows ``pod`` holding."""
    url = fleet.get("fc", CLUSTER)["status"]["dcgmEndpoint"]
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["UUID"]: sample.labels["modelName"]
            for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.name == "DCGM_FI_DEV_GPU_UTIL" and sample.labels.get("pod") == pod}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_nvidia_smi_lists_the_gpus_dcgm_shows_the_pod_holding(fleet: Fleet, streams: Path,
                                                              transport: str) -> None:
    done = run(streams, transport, "exec", "trainer", "--", "nvidia-smi", "-L")
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)$", done.stdout, re.M)
    assert [number for number, _, _ in listed] == ["0", "1"]
    assert {uuid: model for _, model, uuid in listed} == held_gpus(fleet, "trainer")
    assert {model for _, model, _ in listed} == {"NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_the_exit_code_passes_through(streams: Path, transport: str) -> None:
    done = run(streams, transport, "exec", "trainer", "--", "check")
    assert (done.returncode, done.stdout) == (3, "checked\n")
    assert "command terminated with exit code 3" in done.stderr
    done = run(streams, transport, "exec", "trainer", "--", "false")
    assert done.returncode == 1


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_an_unknown_command_fails_as_the_runtime_fails_it(streams: Path, transport: str) -> None:
    done = run(streams, transport, "exec", "trainer", "--", "nosuch")
    assert done.returncode != 0
    assert 'exec: "nosuch": executable file not found in $PATH' in done.stderr
    # The kubelet's words are an InternalError's; the API server's stream translator reads them
    # as a plain error and wraps that in an InternalError of its own, as for a real kubelet.
    said = "Internal error occurred: error executing command in container: "
    assert done.stderr.startswith(
        "error: " + ("Internal error occurred: " if transport == "websockets" else "") + said)


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_a_crash_looping_container_cannot_be_exec_d_into_nor_attached_to(
        streams: Path, transport: str) -> None:
    name = f"crashy-{transport}"
    create(streams, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"fakefleet.dev/run-time": "1s",
                                                   "fakefleet.dev/exit-code": "1"}},
        "spec": {**GPU_NODE, "containers": [{"name": "main", "image": "busybox"}]}})

    def backing_off() -> bool:
        # After two crashes the back-off is 20 s: long enough to exec into it while it waits.
        status = kubectl_json(streams, "get", "pod", name)["status"]
        container = (status.get("containerStatuses") or [{}])[0]
        return bool(container.get("restartCount", 0) >= 2 and container.get("state", {}).get(
            "waiting", {}).get("reason") == "CrashLoopBackOff")
    eventually(backing_off, timeout=90, what=f"{name} in CrashLoopBackOff")
    done = run(streams, transport, "exec", name, "--", "true")
    assert done.returncode != 0
    assert 'unable to upgrade connection: container not found ("main")' in done.stderr
    done = run(streams, transport, "attach", name, "-c", "main")
    assert done.returncode != 0
    assert f"unable to upgrade connection: container main not found in pod {name}_default" \
        in done.stderr


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_attach_returns_once_the_container_ends(streams: Path, transport: str) -> None:
    name = f"short-{transport}"
    create(streams, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"fakefleet.dev/run-time": "8s"}},
        "spec": {**GPU_NODE, "restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox"}]}})
    eventually(lambda: kubectl_json(streams, "get", "pod", name)["status"].get(
        "phase") == "Running", what=f"{name} Running")
    started = time.monotonic()
    done = run(streams, transport, "attach", name, "-c", "main", timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30


@pytest.fixture
def forwarding(streams: Path, request: pytest.FixtureRequest) -> Iterator[
        tuple[subprocess.Popen[str], int]]:
    """``kubectl port-forward pod/trainer 0:<port>`` running: the process and its local port."""
    transport, port = request.param
    with subprocess.Popen(  # closes its pipes when done
            [str(KUBECTL), "--kubeconfig", str(streams), "port-forward", "pod/trainer",
             f"0:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **TRANSPORTS[transport]}) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            found = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
            assert found, f"kubectl port-forward said {line!r}"
            yield process, int(found.group(1))
        finally:
            process.terminate()
            process.wait(timeout=10)


@pytest.mark.parametrize("forwarding", [(transport, 8000) for transport in sorted(TRANSPORTS)],
                         indirect=True)
def test_a_forwarded_port_answers_its_static_response(
        forwarding: tuple[subprocess.Popen[str], int]) -> None:
    _, local = forwarding
    for _ in range(2):  # one forwarding, many connections
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/health", timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "application/json"
            assert response.read() == b'{"status":"ok"}'


@pytest.mark.parametrize("forwarding", [(transport, 9999) for transport in sorted(TRANSPORTS)],
                         indirect=True)
def test_a_port_nothing_listens_on_gets_the_kubelets_error(
        forwarding: tuple[subprocess.Popen[str], int]) -> None:
    process, local = forwarding
    with socket.create_connection(("127.0.0.1", local), timeout=10) as connection:
        connection.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert connection.recv(1024) == b""  # closed without an answer
    process.wait(timeout=30)  # kubectl gives up the forwarding on the error
    assert process.stderr is not None
    said = process.stderr.read()
    assert "an error occurred forwarding" in said
    assert "error forwarding port 9999 to pod " in said
    assert "connect: connection refused" in said
