"""``kubectl logs`` end to end: the pinned kubectl 1.36.3 asks a real member API server, which
reaches the engine's kubelet API over TLS (its kubelet CA, its client certificate) at the
node's InternalIP, and the engine answers from the pod's log script: plain, with timestamps,
the tail, followed until the run ends, the previous run after a crash, the kubelet's words
where there is no log, and an empty log where no script is.

One FakeCluster for the module, one CPU node.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import KUBECTL, Fleet, eventually, kubectl, kubectl_json

CLUSTER = "scribe"
MANIFESTS = f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {CLUSTER}}}
spec:
  addons: {{metricsServer: {{enabled: false}}}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: scribe-cpu}}
spec:
  clusterRef: {CLUSTER}
  replicas: 1
  pods: {{terminationGracePeriodCap: 0s}}
"""
SCRIPT = {"start": ["serving {pod} on {node}"],
          "every": {"interval": "2s", "lines": ["tick {n}"]},
          "exit": ["exited {exitCode} ({reason})"]}
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")


@pytest.fixture(scope="module")
def scribe(fleet: Fleet) -> Iterator[Path]:
    fleet.apply(MANIFESTS)
    fleet.wait_cluster_ready(CLUSTER)
    fleet.wait_pool("scribe-cpu", 1)
    kubeconfig = fleet.member(CLUSTER)
    eventually(lambda: kubectl(kubeconfig, "get", "serviceaccount", "default",
                               check=False).returncode == 0, what="the default ServiceAccount")
    yield kubeconfig
    fleet.release(CLUSTER, "scribe-cpu")


def run_pod(kubeconfig: Path, name: str, *, restart: str = "Always",
            **annotations: str) -> None:
    manifest: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": restart,
                 "containers": [{"name": "main", "image": "registry.example/app:1"}]}}
    subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "create", "-f", "-"],
                   input=json.dumps(manifest), text=True, check=True, capture_output=True,
                   timeout=60)


def container(kubeconfig: Path, name: str) -> dict[str, Any]:
    pod = kubectl_json(kubeconfig, "get", "pod", name)
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    found: dict[str, Any] = statuses[0]
    return found


def running(kubeconfig: Path, name: str) -> None:
    eventually(lambda: "running" in container(kubeconfig, name).get("state", {}),
               what=f"pod {name} running")


def logs(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl(kubeconfig, "logs", *args, check=False)


def test_a_pod_s_log_is_its_script(scribe: Path) -> None:
    run_pod(scribe, "talker", **{"fakefleet.dev/logs": json.dumps(SCRIPT)})
    running(scribe, "talker")
    node = kubectl_json(scribe, "get", "pod", "talker")["spec"]["nodeName"]
    plain = eventually(lambda: (done := logs(scribe, "talker")).returncode == 0 and
                       len(done.stdout.splitlines()) >= 3 and done,
                       what="the start line and two periodic lines")
    lines = plain.stdout.splitlines()
    assert lines[:3] == [f"serving talker on {node}", "tick 1", "tick 2"]
    stamped = logs(scribe, "talker", "--timestamps").stdout.splitlines()
    assert all(STAMP.match(line) for line in stamped), stamped
    assert [line.split(" ", 1)[1] for line in stamped[:3]] == lines[:3]
    tail = logs(scribe, "talker", "--tail=1").stdout.splitlines()
    assert len(tail) == 1
    assert tail[0].startswith("tick ")


def test_a_followed_log_gets_new_lines_and_ends_with_the_run(scribe: Path) -> None:
    run_pod(scribe, "finisher", restart="Never", **{
        "fakefleet.dev/logs": json.dumps(SCRIPT), "fakefleet.dev/run-time": "12s",
        "fakefleet.dev/exit-code": "3"})
    running(scribe, "finisher")
    started = time.monotonic()
    followed = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(scribe), "logs", "-f", "--tail=0", "finisher"],
        capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert followed.returncode == 0, followed.stderr
    lines = followed.stdout.splitlines()
    assert any(line.startswith("tick ") for line in lines), lines
    assert lines[-1] == "exited 3 (Error)", "it ends with the run"
    assert took > 3, "it followed the run rather than returning at once"


def test_the_previous_run_after_a_crash(scribe: Path) -> None:
    run_pod(scribe, "crasher", **{
        "fakefleet.dev/logs": json.dumps(SCRIPT), "fakefleet.dev/run-time": "3s",
        "fakefleet.dev/exit-code": "2"})
    eventually(lambda: container(scribe, "crasher").get("restartCount", 0) >= 1,
               timeout=90, what="crasher to crash and restart")
    previous = logs(scribe, "crasher", "--previous")
    assert previous.returncode == 0, previous.stderr
    assert previous.stdout.splitlines()[0] == "serving crasher on " + \
        kubectl_json(scribe, "get", "pod", "crasher")["spec"]["nodeName"]
    assert previous.stdout.splitlines()[-1] == "exited 2 (Error)"


def test_the_kubelet_s_words_where_there_is_no_log(scribe: Path) -> None:
    run_pod(scribe, "quiet")
    run_pod(scribe, "sleeper", **{"fakefleet.dev/start-delay": "10m"})
    running(scribe, "quiet")
    unknown = logs(scribe, "quiet", "-c", "nope")
    assert unknown.returncode != 0
    assert "container nope is not valid for pod quiet" in unknown.stderr
    never = logs(scribe, "quiet", "--previous")
    assert never.returncode != 0
    assert 'previous terminated container "main" in pod "quiet" not found' in never.stderr
    eventually(lambda: kubectl_json(scribe, "get", "pod", "sleeper")["spec"].get("nodeName"),
               what="sleeper bound")
    waiting = logs(scribe, "sleeper")
    assert waiting.returncode != 0
    assert 'container "main" in pod "sleeper" is waiting to start:' in waiting.stderr


def test_a_pod_without_a_script_has_an_empty_log(scribe: Path) -> None:
    run_pod(scribe, "silent")
    running(scribe, "silent")
    empty = logs(scribe, "silent")
    assert (empty.returncode, empty.stdout) == (0, ""), empty.stderr
