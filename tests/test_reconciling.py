"""The FakeCluster planner and the statuses it reports: pure, no cluster."""

from __future__ import annotations

from typing import Any

from operators.api.clusters import FakeCluster
from operators.api.nodepools import FakeNodePool
from operators.api.status import pool_status
from operators.reconciling import clusters as planning
from operators.reconciling.clusters import (
    ConnectExternal,
    DrainNodes,
    Observed,
    RemoveControlPlane,
    StartControlPlane,
    StartEngine,
    StopEngine,
    WriteKubeconfigSecret,
)

NOW = "2026-11-30T12:00:00Z"


def cluster(**spec: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default", "generation": 3, "uid": "u"},
        "spec": spec,
    })


def test_new_local_cluster_starts_everything_in_order() -> None:
    assert planning.plan(cluster(), Observed()) == [
        StartControlPlane(), WriteKubeconfigSecret("west-kubeconfig"), StartEngine()]


def test_running_cluster_needs_nothing() -> None:
    running = Observed(control_plane_running=True, secret_current=True, engine_running=True)
    assert planning.plan(cluster(), running) == []


def test_adoption_after_operator_restart_restarts_on_the_same_state() -> None:
    """A fresh operator sees nothing running but a current Secret: restart, do not rewrite."""
    assert planning.plan(cluster(), Observed(secret_current=True)) == [
        StartControlPlane(), StartEngine()]


def test_external_cluster_is_connected_not_started() -> None:
    external = cluster(controlPlane={"backend": "external",
                                     "kubeconfigSecretRef": {"name": "creds"}})
    assert planning.plan(external, Observed()) == [
        ConnectExternal("creds", "kubeconfig"), StartEngine()]


def test_deletion_removes_local_control_planes_and_drains_adopted_clusters() -> None:
    assert planning.plan(cluster(), Observed(), deleting=True) == [
        StopEngine(), RemoveControlPlane()]
    external = cluster(controlPlane={"backend": "external",
                                     "kubeconfigSecretRef": {"name": "creds"}})
    assert planning.plan(external, Observed(), deleting=True) == [StopEngine(), DrainNodes()]


def test_ready_status_has_kstatus_conditions() -> None:
    observed = Observed(control_plane_running=True, secret_current=True, engine_running=True,
                        endpoint="https://127.0.0.1:1", version="v1.36.3", nodes=5,
                        ready_nodes=4)
    status = planning.status(cluster(), observed, now=NOW, previous=None)
    assert status.phase == "Ready"
    assert status.kubeconfigSecret == "west-kubeconfig"
    assert status.observedGeneration == 3
    assert (status.nodes, status.readyNodes) == (5, 4)
    kinds = {c.type: c.status for c in status.conditions}
    assert kinds == {"Ready": "True", "Reconciling": "False", "Stalled": "False"}


def test_unbuildable_version_is_stalled_with_the_reason() -> None:
    observed = Observed(error="no Go toolchain", stalled=True)
    status = planning.status(cluster(), observed, now=NOW, previous=None)
    assert status.phase == "Failed"
    stalled = next(c for c in status.conditions if c.type == "Stalled")
    assert stalled.status == "True"
    assert stalled.message == "no Go toolchain"


def test_transition_time_is_kept_while_status_holds() -> None:
    ready = Observed(control_plane_running=True, engine_running=True, secret_current=True)
    first = planning.status(cluster(), ready, now="t1", previous=None)
    second = planning.status(cluster(), ready, now="t2", previous=first)
    assert second == first


def pool(replicas: int) -> FakeNodePool:
    return FakeNodePool.model_validate({
        "metadata": {"name": "cpu", "namespace": "default", "generation": 2},
        "spec": {"clusterRef": "west", "replicas": replicas},
    })


def conditions(status: object) -> dict[str, str]:
    return {c.type: c.status for c in status.conditions}  # type: ignore[attr-defined]


def test_pool_status_ready_only_when_all_desired_nodes_are_ready() -> None:
    scaling = pool_status(pool(5), replicas=5, ready=3, generation=2, now=NOW)
    assert scaling.selector == "fakefleet.dev/pool=cpu"
    assert conditions(scaling) == {"Ready": "False", "Reconciling": "True", "Stalled": "False"}
    done = pool_status(pool(5), replicas=5, ready=5, generation=2, now=NOW)
    assert conditions(done) == {"Ready": "True", "Reconciling": "False", "Stalled": "False"}
    assert done.observedGeneration == 2


def test_pool_status_is_not_ready_before_the_engine_acted_on_its_generation() -> None:
    stale = pool_status(pool(5), replicas=5, ready=5, generation=1, now=NOW)
    assert conditions(stale)["Ready"] == "False"
    assert stale.observedGeneration == 1


def test_pool_status_waits_for_its_cluster() -> None:
    waiting = pool_status(pool(1), replicas=0, ready=0, generation=0, now=NOW,
                          waiting="FakeCluster west is Pending")
    assert waiting.conditions[0].reason == "ClusterNotReady"
    assert waiting.conditions[0].message == "FakeCluster west is Pending"


def test_pool_status_stalls_with_the_problem() -> None:
    stalled = pool_status(pool(5), replicas=3, ready=3, generation=2, now=NOW,
                          problem="the pod network is full")
    assert conditions(stalled) == {"Ready": "False", "Reconciling": "False", "Stalled": "True"}
    assert stalled.conditions[2].message == "the pod network is full"
