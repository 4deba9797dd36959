"""The FaultPlans in examples/faults/ are valid, and name only what examples/fleet.yaml and their
workloads make: a plan that targets a cluster, a pool or a Job nobody creates would run and hit
nothing, and an expectation on pods nobody runs would pass or fail for no reason."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.api.faultplans import FaultPlan, LabelSelector, Step
from primitives import keys

EXAMPLES = Path(__file__).parent.parent / "examples"
FILES = sorted((EXAMPLES / "faults").glob("*.yaml"))


def documents(path: Path) -> Iterator[dict[str, Any]]:
    yield from (document for document in yaml.safe_load_all(path.read_text()) if document)


def plans() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}:{document['metadata']['name']}", document)
            for path in FILES for document in documents(path)
            if document.get("kind") == "FaultPlan"]


FLEET = list(documents(EXAMPLES / "fleet.yaml"))
#: FakeCluster name -> names of its FakeNodePools.
POOLS: dict[str, set[str]] = {
    cluster["metadata"]["name"]: {
        pool["metadata"]["name"] for pool in FLEET
        if pool["kind"] == "FakeNodePool"
        and pool["spec"]["clusterRef"] == cluster["metadata"]["name"]}
    for cluster in FLEET if cluster["kind"] == "FakeCluster"}


@dataclasses.dataclass(frozen=True)
class Workload:
    """A workload of the examples, for a member cluster."""

    kind: str
    namespace: str
    name: str
    #: The labels its pods get: its template's, and those the Job controller adds.
    labels: dict[str, str]
    #: The pool its nodeSelector pins it to.
    pool: str

    @classmethod
    def of(cls, document: dict[str, Any]) -> Workload:
        name = document["metadata"]["name"]
        template = document["spec"]["template"]
        labels = dict(template["metadata"]["labels"])
        if document["kind"] == "Job":
            labels |= {"batch.kubernetes.io/job-name": name, "job-name": name}
        return cls(document["kind"], document["metadata"].get("namespace", "default"), name,
                   labels, template["spec"].get("nodeSelector", {}).get(keys.POOL, ""))


WORKLOADS = [Workload.of(document) for path in FILES for document in documents(path)
             if document.get("kind") != "FaultPlan"]


def matches(selector: LabelSelector | None, labels: dict[str, str]) -> bool:
    assert selector is None or not selector.matchExpressions, "extend this test to expressions"
    return selector is None or all(labels.get(k) == v for k, v in selector.matchLabels.items())


def pools_of(step: Step) -> set[str]:
    """The pools of the clusters the step targets."""
    return {pool for cluster in step.target.clusters.names for pool in POOLS.get(cluster, ())}


def test_the_examples_are_there() -> None:
    assert {name.split(":")[0] for name, _ in plans()} == {
        "nccl-exit.yaml", "gpu-xid-79.yaml", "apiserver-outage.yaml"}


def test_workloads_run_on_pools_of_the_fleet() -> None:
    assert WORKLOADS
    every_pool = set().union(*POOLS.values())
    for workload in WORKLOADS:
        assert workload.pool in every_pool, f"{workload.name}: no pool {workload.pool!r}"


@pytest.mark.parametrize(("name", "document"), plans(), ids=[name for name, _ in plans()])
def test_plans_validate_and_name_what_the_fleet_has(name: str, document: dict[str, Any]) -> None:
    plan = FaultPlan.model_validate(document)
    for step in plan.spec.steps:
        where = f"{name}, step {step.name}"
        clusters = step.target.clusters.names
        assert clusters, f"{where}: examples name their clusters"
        for cluster in clusters:
            assert cluster in POOLS, f"{where}: no FakeCluster {cluster} in the fleet"
        if step.target.nodes is not None:
            for pool in step.target.nodes.pools:
                assert pool in pools_of(step), f"{where}: no pool {pool} in {clusters}"
        if step.target.pods is not None:
            pods = step.target.pods
            assert [w for w in WORKLOADS
                    if w.namespace == (pods.namespace or "default")
                    and pods.ownerKind in ("", w.kind) and pods.ownerName in ("", w.name)
                    and matches(pods.selector, w.labels) and w.pool in pools_of(step)], (
                f"{where}: no workload in examples/faults/ makes the pods the step targets "
                f"in {clusters}")
        for expectation in step.expectations:
            objects = expectation.objects
            if objects.cluster == "host" and objects.kind == "FakeCluster":
                assert objects.name in clusters, (
                    f"{where}, expectation {expectation.name}: FakeCluster {objects.name} is "
                    f"not a cluster the step hits")
            if objects.kind == "Pod" and objects.selector is not None:
                victim_pools = (set(step.target.nodes.pools) if objects.onVictimNodes
                                and step.target.nodes is not None else pools_of(step))
                assert [w for w in WORKLOADS if matches(objects.selector, w.labels)
                        and w.pool in victim_pools], (
                    f"{where}, expectation {expectation.name}: no workload makes such pods "
                    f"where the step hits")
