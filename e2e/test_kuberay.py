"""KubeRay's ray-operator v1.5.0 on a FakeCluster (``spec.addons.kuberay: {}``), its webhook on:
its CRDs are Established, its webhook refuses an invalid RayCluster with its own message, and a
RayCluster goes ready on fake nodes (the engine runs its head and worker pods), scales its
workers and is deleted with its pods. A RayJob is left out: it completes only after reading the
Ray dashboard at the head Service's cluster-DNS name, which nothing here serves
(docs/kuberay.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import KUBECTL, Fleet, eventually, fakefleet, kubectl, kubectl_json
from operators.controlplane.limits import INOTIFY_INSTANCES

NAMESPACE = "ray"
CLUSTER = "raying"
CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")


def manifest() -> str:
    return "\n---\n".join(json.dumps(doc) for doc in (
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
         "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
         "spec": {"addons": {"kuberay": {}}}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": "cpu", "namespace": NAMESPACE},
         "spec": {"clusterRef": CLUSTER, "replicas": 2}},
    ))


def raycluster(name: str, workers: int, groups: tuple[str, ...] = ("workers",)) -> str:
    def pod(role: str) -> dict[str, Any]:
        return {"spec": {"containers": [{
            "name": f"ray-{role}", "image": "rayproject/ray:2.46.0",
            "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                          "limits": {"cpu": "1", "memory": "2Gi"}}}]}}
    return json.dumps({
        "apiVersion": "ray.io/v1", "kind": "RayCluster",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"headGroupSpec": {"rayStartParams": {}, "template": pod("head")},
                 "workerGroupSpecs": [{"groupName": group, "replicas": workers,
                                       "minReplicas": 0, "maxReplicas": 8,
                                       "rayStartParams": {}, "template": pod("worker")}
                                      for group in groups]}})


def apply(kubeconfig: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
                          input=text, text=True, capture_output=True, timeout=60)


def condition(found: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (found.get("status") or {}).get("conditions") or []
                 if c["type"] == kind), {})


def running(member: Path, selector: str) -> list[dict[str, Any]]:
    """The pods of ``selector`` Running and Ready."""
    pods = kubectl_json(member, "get", "pods", "-n", "default", "-l", selector)["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"
            and condition(p, "Ready").get("status") == "True"]


@pytest.fixture(scope="module")
def member(fleet: Fleet) -> Iterator[Path]:
    """The cluster with KubeRay running, its webhook hooked; its kubeconfig."""
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(manifest())
    eventually(lambda: condition(fleet.get("fc", CLUSTER, "-n", NAMESPACE),
                                 "KubeRayReady").get("status") == "True",
               timeout=300, what="KubeRayReady")
    path = fleet.state / f"{NAMESPACE}.{CLUSTER}.kubeconfig"
    path.write_text(fakefleet("kubeconfig", "--state-dir", str(fleet.state),
                              f"{NAMESPACE}/{CLUSTER}").stdout)
    eventually(lambda: kubectl(path, "get", "serviceaccount", "default",
                               check=False).returncode == 0, timeout=60,
               what="ServiceAccount default/default")
    yield path
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_its_crds_are_established_and_its_webhook_refuses_an_invalid_raycluster(
        member: Path) -> None:
    for crd in CRDS:
        found = kubectl_json(member, "get", "crd", crd)
        assert condition(found, "Established").get("status") == "True", crd
    webhook = kubectl_json(member, "get", "validatingwebhookconfiguration",
                           "kuberay-validating-webhook-configuration")
    (hook,) = webhook["webhooks"]
    assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:")
    refused = apply(member, raycluster("invalid", 1, groups=("same", "same")))
    assert refused.returncode != 0
    # The webhook's own words (the CRD's schema has no such rule), passed through by the API
    # server as KubeRay's webhook returned them: a 422 Invalid naming the field.
    assert refused.stderr.startswith('The RayCluster "invalid" is invalid: '
                                     'spec.workerGroupSpecs[1]: Invalid value: ')
    assert refused.stderr.rstrip().endswith("worker group names must be unique")


def test_it_listens_on_loopback_only_on_ports_of_its_own(fleet: Fleet, member: Path) -> None:
    directory = fleet.state / "clusters" / f"{NAMESPACE}.{CLUSTER}" / "kuberay"
    pid = json.loads((directory / "kuberay.process.json").read_text())["pid"]
    ports = json.loads((directory / "ports.json").read_text())
    listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    addresses = sorted(line.split()[3] for line in listening if f"pid={pid}," in line)
    assert addresses == sorted(f"127.0.0.1:{ports[name]}"
                               for name in ("webhook", "health", "metrics"))
    inotify = [fd for fd in Path(f"/proc/{pid}/fd").iterdir()
               if os.readlink(fd) == "anon_inode:inotify"]
    assert len(inotify) == INOTIFY_INSTANCES["kuberay"]


def test_a_raycluster_goes_ready_on_fake_nodes_scales_and_is_deleted(member: Path) -> None:
    started = time.monotonic()
    created = apply(member, raycluster("ray", 1))
    assert created.returncode == 0, created.stderr

    def ready() -> dict[str, Any] | None:
        found: dict[str, Any] = kubectl_json(member, "get", "raycluster", "ray", "-n", "default")
        status = found.get("status") or {}
        return found if status.get("state") == "ready" \
            and condition(found, "HeadPodReady").get("status") == "True" \
            and condition(found, "RayClusterProvisioned").get("status") == "True" else None

    eventually(ready, timeout=120, what="RayCluster ray ready")
    print(f"\nRayCluster (a head, a worker) ready: {time.monotonic() - started:.1f}s")
    assert len(running(member, "ray.io/cluster=ray,ray.io/node-type=head")) == 1
    assert len(running(member, "ray.io/cluster=ray,ray.io/node-type=worker")) == 1

    started = time.monotonic()
    kubectl(member, "patch", "raycluster", "ray", "-n", "default", "--type=json", "-p",
            '[{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3}]')
    eventually(lambda: len(running(member, "ray.io/cluster=ray,ray.io/node-type=worker")) == 3,
               timeout=120, what="3 Ray workers Running")
    eventually(lambda: (kubectl_json(member, "get", "raycluster", "ray", "-n", "default")
                        .get("status") or {}).get("readyWorkerReplicas") == 3,
               timeout=60, what="the RayCluster's status counting 3 ready workers")
    print(f"scaled to 3 workers: {time.monotonic() - started:.1f}s")

    kubectl(member, "delete", "raycluster", "ray", "-n", "default", "--wait=false")
    eventually(lambda: not kubectl_json(member, "get", "pods", "-n", "default", "-l",
                                        "ray.io/cluster=ray")["items"],
               timeout=120, what="the RayCluster's pods gone")
    gone = kubectl(member, "get", "raycluster", "ray", "-n", "default", check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
