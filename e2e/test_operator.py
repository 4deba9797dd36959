"""The operator end to end: `fakefleet up`, then FakeCluster/FakeNodePool applied with kubectl.

Everything is real: the host control plane, the operator process it supervises, the member
kube-apiservers with their schedulers and controller-managers, and the engine's nodes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import (
    CLUSTER,
    POOL,
    Fleet,
    eventually,
    fakefleet,
    kubectl,
    kubectl_json,
    processes_mentioning,
)
from operators.controlplane.etcd import count_etcd_keys, shared_etcd
from operators.controlplane.state import StateDir
from operators.k8s.times import parse


@pytest.fixture(scope="module")
def alpha(fleet: Fleet) -> Iterator[Path]:
    """Cluster alpha with a CPU pool of 3 and an H100 pool of 2; its member kubeconfig."""
    fleet.apply(CLUSTER.format(name="alpha"))
    fleet.apply(POOL.format(name="cpu", cluster="alpha", replicas=3, extra=""))
    fleet.apply(POOL.format(name="h100", cluster="alpha", replicas=2,
                            extra="  gpu: {preset: H100-SXM5-80GB}\n"
                                  "  leaseDurationSeconds: 10"))
    fleet.wait_cluster_ready("alpha")
    fleet.wait_pool("cpu", 3)
    fleet.wait_pool("h100", 2)
    yield fleet.member("alpha")
    fleet.release("alpha", "cpu", "h100")


def ready_nodes(kubeconfig: Path, selector: str = "fakefleet.dev/pool") -> list[str]:
    items = kubectl_json(kubeconfig, "get", "nodes", "-l", selector)["items"]
    return sorted(
        item["metadata"]["name"] for item in items
        if any(c["type"] == "Ready" and c["status"] == "True"
               for c in item["status"]["conditions"])
    )


def test_cluster_and_pools_become_ready(fleet: Fleet, alpha: Path) -> None:
    cluster = fleet.get("fc", "alpha")
    status = cluster["status"]
    assert status["endpoint"].startswith("https://127.0.0.1:")
    assert status["kubernetesVersion"] == "v1.36.3"
    assert status["kubeconfigSecret"] == "alpha-kubeconfig"
    assert status["observedGeneration"] == cluster["metadata"]["generation"]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    # HubConnected too, once its hub link reported (e2e/test_federation.py tests it), and
    # MetricsServerReady (e2e/test_metrics.py).
    assert {kind: conditions[kind] for kind in ("Ready", "Reconciling", "Stalled")} == {
        "Ready": "True", "Reconciling": "False", "Stalled": "False"}
    assert set(conditions) <= {"Ready", "Reconciling", "Stalled", "HubConnected",
                               "MetricsServerReady"}
    assert status["dcgmEndpoint"].startswith("http://127.0.0.1:")
    eventually(lambda: fleet.get("fc", "alpha")["status"].get("readyNodes") == 5,
               what="node counts in the FakeCluster status")

    assert ready_nodes(alpha) == ["cpu-0", "cpu-1", "cpu-2", "h100-0", "h100-1"]
    # The TaintNodesByCondition admission plugin taints every new node not-ready; the member's
    # node-lifecycle controller lifts it once it sees the Ready condition.
    gpu_taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    gpu = eventually(
        lambda: (node := kubectl_json(alpha, "get", "node", "h100-0"))["spec"].get("taints")
        == gpu_taint and node, what="only the GPU taint on h100-0")
    assert gpu["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    cidrs = {kubectl_json(alpha, "get", "node", n)["spec"]["podCIDR"] for n in ready_nodes(alpha)}
    assert len(cidrs) == 5

    # The Secret has the layout MultiKueue and Karmada read, and the kubeconfig works.
    secret = fleet.get("secret", "alpha-kubeconfig")
    config = base64.b64decode(secret["data"]["kubeconfig"]).decode()
    assert status["endpoint"] in config
    pool = fleet.get("fnp", "cpu")
    assert pool["status"]["selector"] == "fakefleet.dev/pool=cpu"
    listing = kubectl(fleet.host, "get", "fakefleet").stdout
    assert "fakecluster.fakefleet.dev/alpha" in listing
    assert "fakenodepool.fakefleet.dev/cpu" in listing
    table = fakefleet("get", "--state-dir", str(fleet.state)).stdout
    assert "alpha" in table
    assert "Ready" in table


def test_status_lists_each_engine_with_its_pid(fleet: Fleet, alpha: Path) -> None:
    engines = [pid for pid in processes_mentioning("--cluster default/alpha")
               if "operators.engine" in Path(f"/proc/{pid}/cmdline").read_text()
               and str(fleet.state) in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(engines) == 1, "one engine process per cluster"

    def listed() -> str | None:
        table = fakefleet("status", "--state-dir", str(fleet.state)).stdout
        row = next((line for line in table.splitlines()
                    if "default.alpha" in line and "engine" in line), "")
        return row if str(engines[0]) in row and " ok " in row else None

    row = eventually(listed, timeout=10, what="the engine of alpha in fakefleet status")
    assert "default.alpha" in row
    table = fakefleet("status", "--state-dir", str(fleet.state)).stdout
    member = [line for line in table.splitlines() if "default.alpha" in line]
    assert {name for name in ("kube-apiserver", "kube-scheduler", "kube-controller-manager",
                              "engine") if any(name in line for line in member)} == {
        "kube-apiserver", "kube-scheduler", "kube-controller-manager", "engine"}
    assert all(" ok " in line for line in member), member


def test_kubectl_scale_changes_the_node_count_both_ways(fleet: Fleet, alpha: Path) -> None:
    kubectl(fleet.host, "scale", "fnp/cpu", "--replicas=6")
    fleet.wait_pool("cpu", 6)
    assert len(ready_nodes(alpha, "fakefleet.dev/pool=cpu")) == 6
    kubectl(fleet.host, "scale", "fnp/cpu", "--replicas=1")
    fleet.wait_pool("cpu", 1)
    eventually(lambda: ready_nodes(alpha, "fakefleet.dev/pool=cpu") == ["cpu-0"],
               what="scale-down to keep exactly cpu-0")
    leases = kubectl_json(alpha, "-n", "kube-node-lease", "get", "leases")["items"]
    assert {lease["metadata"]["name"] for lease in leases} == {"cpu-0", "h100-0", "h100-1"}
    kubectl(fleet.host, "scale", "fnp/cpu", "--replicas=3")
    fleet.wait_pool("cpu", 3)


def test_real_scheduler_binds_pods_to_fake_nodes(alpha: Path) -> None:
    kubectl(alpha, "create", "namespace", "apps")
    kubectl(alpha, "-n", "apps", "create", "deployment", "web",
            "--image=registry.k8s.io/pause:3.10", "--replicas=4")

    def bound() -> list[str]:
        pods = kubectl_json(alpha, "-n", "apps", "get", "pods")["items"]
        nodes = [p["spec"].get("nodeName") for p in pods]
        return nodes if len(nodes) == 4 and all(nodes) else []

    nodes = eventually(bound, what="4 pods bound by the kube-scheduler")
    # Untolerated GPU taint: the scheduler puts them on the CPU pool only.
    assert all(node.startswith("cpu-") for node in nodes)


def test_operator_restart_adopts_without_duplicates(fleet: Fleet, alpha: Path) -> None:
    endpoint = fleet.get("fc", "alpha")["status"]["endpoint"]
    nodes_before = ready_nodes(alpha)
    processes = fleet.member_processes("alpha")
    old = fleet.operator_pid()
    os.kill(old, signal.SIGKILL)  # its members run on, children of fakefleet up's daemon
    adopted = fleet.wait_member_served("alpha", old, frozenset(processes))
    assert adopted == processes, "each one adopted"
    fleet.wait_cluster_ready("alpha")
    assert fleet.get("fc", "alpha")["status"]["endpoint"] == endpoint
    # The session's fleet may hold other files' clusters: count alpha's and the host's alone.
    for key in ("host", "default.alpha"):
        apiservers = [pid for pid in processes_mentioning(f"{fleet.state}/clusters/{key}/")
                      if "kube-apiserver" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(apiservers) == 1, f"one apiserver for {key}, no duplicates: {apiservers}"
    eventually(lambda: ready_nodes(alpha) == nodes_before, what="the same nodes, Ready")
    assert len(ready_nodes(alpha)) == 5, "the new engine adopted the nodes, created none"
    fleet.wait_pool("cpu", 3)


STUCK_PLAN = """
apiVersion: fakefleet.dev/v1alpha1
kind: FaultPlan
metadata: {name: holds-clients}
spec:
  steps:
  - name: cordon
    target: {clusters: {names: [alpha]}, nodes: {pools: [cpu]}, mode: one}
    fault: {type: Cordon}
    at: 0s
    duration: 10m
    expectations:
    - {name: never, within: 10m, objects: {kind: Node, victims: true}, count: {equals: 99}}
"""


def test_a_stopping_operator_closes_every_client(fleet: Fleet, alpha: Path) -> None:
    """SIGTERM while a plan's daemon holds member clients and every cluster's hub link runs:
    the log of the operator that stopped says nothing of unclosed sessions or lost tasks."""
    fleet.apply(STUCK_PLAN)
    try:
        eventually(lambda: (fleet.get("fp", "holds-clients").get("status") or {}).get(
            "injections", [{}])[0].get("state") == "Injected", what="the plan's injection")
        log = StateDir(fleet.state).operator_log
        offset = log.stat().st_size
        old = fleet.operator_pid()
        os.kill(old, signal.SIGTERM)
        eventually(lambda: fleet.operator_restarted(old), timeout=90,
                   what="the daemon to start the operator again")
        with log.open() as text:
            text.seek(offset)
            stopping = text.read()
        assert "Signal SIGTERM is received" in stopping
        for sign in ("Unclosed", "Task was destroyed", "never retrieved", "did not stop within"):
            assert sign not in stopping, stopping[-4000:]
    finally:
        kubectl(fleet.host, "delete", "fp", "holds-clients", "--wait=true", "--timeout=60s",
                check=False)


def test_the_longest_names_the_api_accepts_work_end_to_end(fleet: Fleet) -> None:
    """A 60-character FakeCluster name stayed Pending forever: its CA's common name did not
    fit X.509's 64 characters. Names at the CRDs' limits (63 and 53) now get Ready nodes."""
    cluster, pool = "c" * 63, "p" * 53
    fleet.apply(CLUSTER.format(name=cluster))
    fleet.apply(POOL.format(name=pool, cluster=cluster, replicas=1,
                            extra="  gpu: {preset: GB200}"))
    fleet.wait_cluster_ready(cluster, timeout=180)
    fleet.wait_pool(pool, 1)
    member = fleet.member(cluster)
    node = kubectl_json(member, "get", "node", f"{pool}-0")
    assert len(node["metadata"]["labels"]["nvidia.com/gpu.clique"]) <= 63
    kubectl(fleet.host, "delete", "fnp", pool, "--timeout=60s")
    kubectl(fleet.host, "delete", "fc", cluster, "--timeout=60s")


def test_heartbeats_keep_nodes_ready_over_several_lease_periods(alpha: Path) -> None:
    """The member's node-lifecycle controller (grace period 40s by default) must never see a
    stale node: wait until the oldest node is 70s old and check leases and conditions. It comes
    after the operator's kill and stop and another cluster's start, so that their time counts
    toward the 70s instead of a sleep (and the heartbeats are seen to go on through them); and
    before the test that turns a node NotReady on purpose."""
    nodes = kubectl_json(alpha, "get", "nodes")["items"]
    oldest = min(parse(n["metadata"]["creationTimestamp"]) for n in nodes)
    time.sleep(max(0.0, oldest + 70 - time.time()))
    now = time.time()
    for node in kubectl_json(alpha, "get", "nodes")["items"]:
        name = node["metadata"]["name"]
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", f"{name} is not Ready: {ready}"
        taints = {t["key"] for t in node["spec"].get("taints", [])}
        assert not taints & {"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"}
        lease = kubectl_json(alpha, "-n", "kube-node-lease", "get", "lease", name)
        age = now - parse(lease["spec"]["renewTime"])
        assert age < lease["spec"]["leaseDurationSeconds"] / 2, f"{name} lease is {age:.0f}s old"
    events = kubectl(alpha, "get", "events", "-A", "--field-selector",
                     "reason=NodeNotReady").stdout
    assert "NodeNotReady" not in events


def test_a_node_annotated_not_ready_turns_not_ready_and_back(alpha: Path) -> None:
    """Node behaviour is stages too: the default ones read fakefleet.dev/state."""
    kubectl(alpha, "annotate", "node", "cpu-1", "fakefleet.dev/state=NotReady")

    def ready_status() -> str:
        node = kubectl_json(alpha, "get", "node", "cpu-1")
        return str(next(c for c in node["status"]["conditions"] if c["type"] == "Ready")[
            "status"])

    eventually(lambda: ready_status() == "False", timeout=30, what="cpu-1 NotReady")
    node = kubectl_json(alpha, "get", "node", "cpu-1")
    condition = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert condition["reason"] == "KubeletNotReady"
    kubectl(alpha, "annotate", "node", "cpu-1", "fakefleet.dev/state-")
    eventually(lambda: ready_status() == "True", timeout=30, what="cpu-1 Ready again")


def test_a_users_secret_where_the_kubeconfig_would_go_is_left_and_survives_the_cluster(
        fleet: Fleet) -> None:
    """The Secret <name>-kubeconfig was created or replaced whatever was there, with the
    FakeCluster as its owner: deleting the FakeCluster garbage-collected a user's Secret."""
    kubectl(fleet.host, "create", "secret", "generic", "theirs-kubeconfig",
            "--from-literal=kubeconfig=the user's own")
    before = kubectl_json(fleet.host, "get", "secret", "theirs-kubeconfig")
    fleet.apply(CLUSTER.format(name="theirs"))

    def stalled() -> dict[str, Any] | None:
        status: dict[str, Any] = fleet.get("fc", "theirs").get("status") or {}
        return next((c for c in status.get("conditions") or []
                     if c["type"] == "Stalled" and c["status"] == "True"), None)

    condition = eventually(stalled, timeout=120, what="FakeCluster theirs Stalled")
    assert "Secret default/theirs-kubeconfig exists and FakeCluster/theirs did not make " \
           "it" in condition["message"]
    assert fleet.get("fc", "theirs")["status"].get("kubeconfigSecret", "") == ""
    kubectl(fleet.host, "delete", "fc", "theirs", "--timeout=120s")
    time.sleep(5)  # the garbage collector's turn
    after = kubectl_json(fleet.host, "get", "secret", "theirs-kubeconfig")
    assert after["data"] == before["data"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    kubectl(fleet.host, "delete", "secret", "theirs-kubeconfig")


def _adopt_refused(fleet: Fleet, name: str, *secret_source: str) -> dict[str, Any]:
    """Adopt a cluster from a Secret made of ``secret_source`` (kubectl's --from-... flags),
    wait for the FakeCluster to be refused, delete both; the Stalled condition it showed."""
    kubectl(fleet.host, "create", "secret", "generic", f"{name}-creds", *secret_source)
    fleet.apply(f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {name}}}
spec:
  controlPlane: {{backend: external, kubeconfigSecretRef: {{name: {name}-creds}}}}
""")

    def refused() -> dict[str, Any] | None:
        status: dict[str, Any] = fleet.get("fc", name).get("status") or {}
        return status if status.get("phase") == "Failed" else None

    status = eventually(refused, what="the FakeCluster to be refused")
    stalled: dict[str, Any] = next(c for c in status["conditions"] if c["type"] == "Stalled")
    kubectl(fleet.host, "delete", "fc", name, "--timeout=60s")
    kubectl(fleet.host, "delete", "secret", f"{name}-creds")
    return stalled


def test_a_kubeconfig_secret_that_names_local_files_is_refused_in_the_status(
        fleet: Fleet) -> None:
    """A tenant's kubeconfig must not make the operator read its files or run commands."""
    sneaky = ("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
              "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
              "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
              "users: [{name: u, user: {client-certificate: /etc/hostname, "
              "client-key: /etc/hostname}}]\n")
    stalled = _adopt_refused(fleet, "sneaky", f"--from-literal=kubeconfig={sneaky}")
    assert stalled["status"] == "True"
    assert "Secret default/sneaky-creds sets users[0].user.client-certificate" in \
        stalled["message"]
    assert "must embed its credentials" in stalled["message"]


def test_a_kubeconfig_secret_that_is_not_utf8_is_refused_and_deletes_cleanly(
        fleet: Fleet, tmp_path: Path) -> None:
    """A kubeconfig saved as UTF-16 (PowerShell's '>') is refused with a message, and the
    FakeCluster can still be deleted."""
    utf16 = tmp_path / "kubeconfig"
    utf16.write_bytes("apiVersion: v1\nkind: Config\n".encode("utf-16"))
    stalled = _adopt_refused(fleet, "utf16", f"--from-file=kubeconfig={utf16}")
    assert "is not a kubeconfig in UTF-8 text" in stalled["message"]


def test_an_adopted_cluster_that_stops_answering_is_not_ready_and_says_why(
        fleet: Fleet) -> None:
    """Ready was computed once for an adopted cluster: one that went away stayed Ready."""
    fleet.apply("""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {name: donor}
spec: {}
""")
    fleet.wait_cluster_ready("donor")
    data = kubectl_json(fleet.host, "get", "secret", "donor-kubeconfig")["data"]["kubeconfig"]
    kubectl(fleet.host, "create", "secret", "generic", "donor-creds",
            f"--from-literal=kubeconfig={base64.b64decode(data).decode()}")
    fleet.apply("""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {name: adopter}
spec:
  controlPlane: {backend: external, kubeconfigSecretRef: {name: donor-creds}}
""")
    fleet.wait_cluster_ready("adopter")
    operator = json.loads(StateDir(fleet.state).operator_file.read_text())
    [apiserver] = [c["pid"] for c in operator["components"]
                   if c["cluster"] == "default.donor" and c["name"] == "kube-apiserver"]
    os.kill(apiserver, signal.SIGSTOP)  # there, and answering nothing
    try:
        def not_ready() -> dict[str, Any] | None:
            status: dict[str, Any] = fleet.get("fc", "adopter").get("status") or {}
            ready = next(c for c in status.get("conditions", []) if c["type"] == "Ready")
            return ready if ready["status"] == "False" else None

        ready = eventually(not_ready, timeout=90, what="the adopted cluster to be not Ready")
        assert "does not answer" in ready["message"]
    finally:
        os.kill(apiserver, signal.SIGCONT)
    fleet.wait_cluster_ready("adopter", timeout=90)
    kubectl(fleet.host, "delete", "fc", "adopter", "--timeout=90s")
    kubectl(fleet.host, "delete", "fc", "donor", "--timeout=90s")
    kubectl(fleet.host, "delete", "secret", "donor-creds")


def test_deleting_a_cluster_removes_its_control_plane_and_data(fleet: Fleet) -> None:
    fleet.apply(CLUSTER.format(name="doomed"))
    fleet.apply(POOL.format(name="doomed-nodes", cluster="doomed", replicas=2, extra=""))
    fleet.wait_cluster_ready("doomed")
    fleet.wait_pool("doomed-nodes", 2)
    member_dir = fleet.state / "clusters" / "default.doomed"
    assert processes_mentioning(str(member_dir))

    def keys() -> int:
        return asyncio.run(count_etcd_keys(shared_etcd(fleet.state),
                                           "/fakefleet/clusters/default.doomed/"))

    assert keys() > 0
    kubectl(fleet.host, "delete", "fnp", "doomed-nodes", "--timeout=60s")
    kubectl(fleet.host, "delete", "fc", "doomed", "--timeout=60s")
    eventually(lambda: not processes_mentioning(str(member_dir)), timeout=30,
               what="the member's processes to stop")
    assert keys() == 0
    assert not member_dir.exists()
    eventually(lambda: kubectl(fleet.host, "get", "secret", "doomed-kubeconfig",
                               check=False).returncode != 0,
               what="the kubeconfig Secret to be garbage-collected")


def test_external_backend_adopts_an_existing_cluster(fleet: Fleet) -> None:
    """Adopt the host cluster itself (it has no engine of its own) from a kubeconfig Secret."""
    host_config = fleet.host.read_text()
    kubectl(fleet.host, "create", "secret", "generic", "host-creds",
            f"--from-literal=kubeconfig={host_config}")
    fleet.apply("""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {name: adopted}
spec:
  controlPlane: {backend: external, kubeconfigSecretRef: {name: host-creds}}
""")
    fleet.apply(POOL.format(name="ext", cluster="adopted", replicas=2, extra=""))
    fleet.apply(POOL.format(name="ext-more", cluster="adopted", replicas=1, extra=""))
    cluster = fleet.wait_cluster_ready("adopted")
    fleet.wait_pool("ext", 2)
    fleet.wait_pool("ext-more", 1)
    assert cluster["status"]["kubeconfigSecret"] == "host-creds"
    assert ready_nodes(fleet.host, "fakefleet.dev/pool=ext") == ["ext-0", "ext-1"]
    kubectl(fleet.host, "delete", "fnp", "ext", "--timeout=60s")
    assert ready_nodes(fleet.host, "fakefleet.dev/pool=ext") == []
    # The adopted cluster outlives its FakeCluster; the fake nodes still in it do not.
    assert ready_nodes(fleet.host, "fakefleet.dev/pool=ext-more") == ["ext-more-0"]
    kubectl(fleet.host, "delete", "fc", "adopted", "--timeout=60s")
    assert kubectl_json(fleet.host, "get", "nodes", "-l", "fakefleet.dev/pool")["items"] == []
    assert kubectl(fleet.host, "get", "--raw", "/readyz").stdout.strip() == "ok"
    kubectl(fleet.host, "delete", "fnp", "ext-more", "--timeout=60s")  # orphaned: goes at once
