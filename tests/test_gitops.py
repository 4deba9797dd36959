"""examples/gitops: the Argo CD health checks run through Lua (as Argo CD runs them) against the
statuses fakefleet writes, and the Flux and Argo CD objects point at what the repository holds.

Argo CD's and Flux's own CRDs are not available here, so their objects are checked for the
fields these examples rely on, not against their schemas; the fleet they apply is validated by
a real API server (``hack/chart.sh``, e2e/test_chart.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa
import pytest
import yaml

from operators.api.base import Condition
from operators.api.clusters import FakeCluster
from operators.api.faultplans import FaultPlan
from operators.api.nodepools import FakeNodePool
from operators.api.replays import Replay
from operators.api.status import condition, pool_status

GITOPS = Path(__file__).parent.parent / "examples" / "gitops"
ROOT = GITOPS.parent.parent
NOW = "2026-12-01T09:00:00Z"


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """What Argo CD shows for ``obj`` with the example's health check of ``kind``."""
    config = yaml.safe_load((GITOPS / "argocd-cm.yaml").read_text())
    script = config["data"][f"resource.customizations.health.fakefleet.dev_{kind}"]
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script)
    return str(result["status"]), str(result["message"])


def conditions(generation: int, **states: bool | tuple[bool, str]) -> list[dict[str, Any]]:
    found: list[Condition] = []
    for kind, state in states.items():
        holds, message = state if isinstance(state, tuple) else (state, "")
        found.append(condition(kind, holds, reason="R", message=message, generation=generation,
                               now=NOW, previous=[]))
    return [c.model_dump(mode="json") for c in found]


def cluster(generation: int = 1, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                           "metadata": {"name": "west", "generation": generation}, "spec": {}}
    if status is not None:
        obj["status"] = status
    return obj


@pytest.mark.parametrize("kind", ["FakeCluster", "FakeNodePool", "FaultPlan", "Replay"])
def test_an_object_no_one_looked_at_yet_is_progressing(kind: str) -> None:
    assert health(kind, cluster()) == ("Progressing", "waiting for the fakefleet operator")
    # What the CRD's default makes of a new object's status (observedGeneration 0).
    assert health(kind, cluster(status={"observedGeneration": 0})) == (
        "Progressing", "generation 1 not observed yet (observed 0)")


def test_a_cluster_through_its_life() -> None:
    provisioning = {"observedGeneration": 1, "phase": "Provisioning", "conditions": conditions(
        1, Ready=(False, "starting the control plane and the engine"),
        Reconciling=(True, "starting the control plane and the engine"), Stalled=False)}
    assert health("FakeCluster", cluster(status=provisioning)) == (
        "Progressing", "starting the control plane and the engine")
    ready = {"observedGeneration": 1, "phase": "Ready", "conditions": conditions(
        1, Ready=(True, "API server at https://127.0.0.1:1, engine running"),
        Reconciling=False, Stalled=False)}
    assert health("FakeCluster", cluster(status=ready)) == (
        "Healthy", "API server at https://127.0.0.1:1, engine running")
    assert health("FakeCluster", cluster(generation=2, status=ready))[0] == "Progressing"
    stalled = {"observedGeneration": 1, "phase": "Failed", "conditions": conditions(
        1, Ready=(False, "x"), Reconciling=False, Stalled=(True, "Secret default/x missing"))}
    assert health("FakeCluster", cluster(status=stalled)) == (
        "Degraded", "Secret default/x missing")
    FakeCluster.model_validate(cluster(status=stalled))  # the shapes are the real ones


def test_a_pool_as_its_engine_reports_it() -> None:
    pool = FakeNodePool.model_validate({
        "metadata": {"name": "gpu", "namespace": "default", "generation": 3},
        "spec": {"clusterRef": "west", "replicas": 4}})
    scaling = pool_status(pool, replicas=4, ready=2, generation=3, now=NOW)
    body = {**pool.model_dump(mode="json"), "status": scaling.model_dump(mode="json")}
    assert health("FakeNodePool", body) == ("Progressing", "2/4 nodes Ready (4 exist)")
    ready = pool_status(pool, replicas=4, ready=4, generation=3, now=NOW)
    body["status"] = ready.model_dump(mode="json")
    assert health("FakeNodePool", body) == ("Healthy", "4/4 nodes Ready")
    stalled = pool_status(pool, replicas=1, ready=1, generation=3, now=NOW,
                          problem="node gpu-1 belongs to someone else")
    body["status"] = stalled.model_dump(mode="json")
    assert health("FakeNodePool", body) == ("Degraded", "node gpu-1 belongs to someone else")
    waiting = pool_status(pool, replicas=0, ready=0, generation=0, now=NOW,
                          waiting="waiting for FakeCluster west (Pending)")
    body["status"] = waiting.model_dump(mode="json")
    assert health("FakeNodePool", body)[0] == "Progressing"


def plan(status: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": "p", "generation": 1}, "status": status}


def test_a_plan_is_healthy_when_it_passed_and_degraded_when_it_failed() -> None:
    running = {"observedGeneration": 1, "phase": "Running", "stepsDone": "1/3",
               "conditions": conditions(1, Ready=False, Reconciling=(True, "running"),
                                        Stalled=False)}
    assert health("FaultPlan", plan(running)) == ("Progressing", "running: 1/3 steps done")
    finished = conditions(1, Ready=(True, "the plan finished"), Reconciling=False,
                          Stalled=False)
    passed = {"observedGeneration": 1, "phase": "Succeeded", "verdict": "Passed",
              "stepsDone": "3/3", "conditions": finished}
    assert health("FaultPlan", plan(passed)) == ("Healthy", "phase Succeeded, verdict Passed")
    failed = {**passed, "phase": "Failed", "verdict": "Failed"}
    assert health("FaultPlan", plan(failed)) == (
        "Degraded", "verdict Failed (3/3 steps done): see its expectations")
    invalid = {"observedGeneration": 1, "phase": "Failed", "conditions": conditions(
        1, Ready=False, Reconciling=False, Stalled=(True, "step a: no such pool"))}
    assert health("FaultPlan", plan(invalid)) == ("Degraded", "step a: no such pool")


def replay(status: dict[str, Any]) -> dict[str, Any]:
    obj = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "Replay",
           "metadata": {"name": "r", "generation": 1},
           "spec": {"clusterRef": "west",
                    "trace": {"configMapRef": {"name": "t", "key": "trace"}}},
           "status": status}
    Replay.model_validate(obj)  # the shapes are the real ones
    return obj


def test_a_replay_is_healthy_when_every_write_was_taken_and_degraded_when_not() -> None:
    waiting = {"observedGeneration": 1, "phase": "Pending", "conditions": conditions(
        1, Ready=False, Reconciling=(True, "FakeCluster west is Provisioning, not Ready yet"),
        Stalled=False)}
    assert health("Replay", replay(waiting)) == (
        "Progressing", "FakeCluster west is Provisioning, not Ready yet")
    running = {"observedGeneration": 1, "phase": "Running", "progress": "40/70",
               "lagSeconds": 0.25, "conditions": conditions(
                   1, Ready=False, Reconciling=(True, "replaying 70 writes"), Stalled=False)}
    assert health("Replay", replay(running)) == (
        "Progressing", "replaying: 40/70 writes settled, lag 0.25s")
    done = {"observedGeneration": 1, "phase": "Succeeded", "progress": "70/70",
            "conditions": conditions(1, Ready=(True, "70 of 70 writes applied"),
                                     Reconciling=False, Stalled=False)}
    assert health("Replay", replay(done)) == ("Healthy", "70 of 70 writes applied")
    refused = {**done, "phase": "Failed", "conditions": conditions(
        1, Ready=False, Reconciling=False, Stalled=(True, "the API refused 2"))}
    assert health("Replay", replay(refused)) == ("Degraded", "the API refused 2")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_flux_applies_the_fleet_then_its_faults() -> None:
    objects = {(doc["kind"], doc["metadata"]["name"]): doc
               for doc in _documents(GITOPS / "flux.yaml")}
    assert objects[("GitRepository", "fleet")]["apiVersion"] == "source.toolkit.fluxcd.io/v1"
    fleet = objects[("Kustomization", "fleet")]["spec"]
    faults = objects[("Kustomization", "fleet-faults")]["spec"]
    for spec in (fleet, faults):
        assert spec["sourceRef"] == {"kind": "GitRepository", "name": "fleet"}
        assert spec["wait"] is True
        assert (ROOT / spec["path"] / "kustomization.yaml").is_file()
    assert faults["dependsOn"] == [{"name": "fleet"}]
    [check] = faults["healthCheckExprs"]
    assert (check["apiVersion"], check["kind"]) == ("fakefleet.dev/v1alpha1", "FaultPlan")
    assert "verdict == 'Failed'" in check["failed"]


def test_argo_cd_applies_the_repository_and_never_replaces_an_unchanged_plan() -> None:
    [application] = _documents(GITOPS / "argocd-application.yaml")
    assert application["apiVersion"] == "argoproj.io/v1alpha1"
    source = application["spec"]["source"]
    assert (ROOT / source["path"] / "kustomization.yaml").is_file()
    assert "ApplyOutOfSyncOnly=true" in application["spec"]["syncPolicy"]["syncOptions"]
    [faultplan] = _documents(GITOPS / "faults" / "xid-79.yaml")
    annotations = faultplan["metadata"]["annotations"]
    assert annotations["argocd.argoproj.io/sync-options"] == "Force=true,Replace=true"
    assert annotations["kustomize.toolkit.fluxcd.io/force"] == "enabled"
    FaultPlan.model_validate(faultplan)
