"""What to do about a member's Kueue add-on, and what its KueueReady condition says: pure.

:func:`plan` compares ``spec.addons.kueue`` with what the operator observes (the life every
add-on lives, :mod:`operators.addons.lifecycle`: built, started, hooked once its readiness
probe answers; then, on a MultiKueue manager, are its MultiKueue objects current) and returns
actions; :func:`condition` tells the truth about it in one line a person can act on.
:func:`multikueue_objects` renders what a MultiKueue manager needs for its workers. The add-on
runner (:mod:`operators.addons.kueue.running`) observes, calls these and applies.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from operators.addons import lifecycle
from operators.addons.kueue import KUEUE_VERSION
from operators.addons.kueue.rendering import NAMESPACE
from operators.api.clusters import MULTIKUEUE_CONFIG, FakeCluster
from operators.reconciling.clusters import AddonCondition, AddonState

MANAGED_BY = {"app.kubernetes.io/managed-by": "fakefleet"}
KUEUE_API = "kueue.x-k8s.io/v1beta2"
#: Where the field that names a worker in error messages is.
WORKERS_FIELD = "spec.addons.kueue.multiKueue.workers"
#: The cluster is Ready only with Kueue: the member's Jobs and Pods go through its webhooks.
CONDITION = AddonCondition("KueueReady", "Kueue", required=True)


@dataclasses.dataclass(frozen=True)
class Worker:
    """A worker FakeCluster as the manager's operator sees it."""

    name: str
    exists: bool = False
    kueue: bool = False
    #: The worker's kubeconfig (from its kubeconfig Secret on the host); "" if there is none.
    kubeconfig: str = ""
    #: The MultiKueueCluster's Active condition on the manager: None while there is none.
    active: bool | None = None
    inactive_reason: str = ""


@dataclasses.dataclass(frozen=True)
class Observed(lifecycle.Observed):
    """What the operator sees of one member's Kueue (its hooks: its webhook configurations)."""

    ready: bool = False
    """Kueue's readiness probe answers 200 (its webhook server listens)."""
    webhook_port: int = 0
    workers: tuple[Worker, ...] = ()
    multikueue_applied: str = ""
    """Fingerprint of the MultiKueue objects last applied to this manager ("" none yet)."""


@dataclasses.dataclass(frozen=True)
class ApplyMultiKueue:
    """Apply the worker Secrets, MultiKueueClusters and the MultiKueueConfig; prune others."""

    objects: tuple[dict[str, Any], ...]
    fingerprint: str


Action = lifecycle.Step | ApplyMultiKueue


def plan(cluster: FakeCluster, observed: Observed) -> Sequence[Action]:
    """Actions that bring the member's Kueue to ``spec.addons.kueue``."""
    spec = cluster.spec.kueue
    steps = lifecycle.plan(observed, wanted=spec is not None, serving=observed.ready)
    if steps is not None:
        return steps
    assert spec is not None, "the lifecycle is done only when Kueue is asked for"
    if spec.multiKueue is not None:
        objects = multikueue_objects(observed.workers)
        if objects is not None:
            fingerprint = _fingerprint(objects)
            if fingerprint != observed.multikueue_applied:
                return [ApplyMultiKueue(tuple(objects), fingerprint)]
    return []


def condition(cluster: FakeCluster, observed: Observed) -> AddonState | None:
    """KueueReady, or None when the add-on is not asked for."""
    spec = cluster.spec.kueue
    if spec is None:
        return None
    said = lifecycle.condition(observed, serving=observed.ready, title=f"Kueue {KUEUE_VERSION}",
                               crashed="Kueue", cold_build="several minutes")
    if said is not None:
        return said
    workers = observed.workers if spec.multiKueue is not None else ()
    for worker in workers:
        problem = _worker_problem(cluster, worker)
        if problem:
            return AddonState(False, "WorkerMissing", problem)
    message = f"Kueue {KUEUE_VERSION} running, webhooks at https://127.0.0.1:" \
              f"{observed.webhook_port}"
    if workers:
        message += "; MultiKueue workers: " + ", ".join(
            f"{w.name} {_activity(w)}" for w in workers)
    return AddonState(True, "Running", message)


def multikueue_objects(workers: tuple[Worker, ...]) -> list[dict[str, Any]] | None:
    """A Secret and a MultiKueueCluster per worker and the MultiKueueConfig listing them;
    None while a worker's kubeconfig is not known (nothing half-made is applied)."""
    if any(not worker.kubeconfig for worker in workers):
        return None
    objects: list[dict[str, Any]] = []
    for worker in workers:
        secret = worker_secret_name(worker.name)
        objects.append({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret, "namespace": NAMESPACE, "labels": MANAGED_BY},
            "data": {"kubeconfig": base64.b64encode(worker.kubeconfig.encode()).decode()},
        })
        objects.append({
            "apiVersion": KUEUE_API, "kind": "MultiKueueCluster",
            "metadata": {"name": worker.name, "labels": MANAGED_BY},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret",
                                                      "location": secret}}},
        })
    objects.append({
        "apiVersion": KUEUE_API, "kind": "MultiKueueConfig",
        "metadata": {"name": MULTIKUEUE_CONFIG, "labels": MANAGED_BY},
        "spec": {"clusters": [worker.name for worker in workers]},
    })
    return objects


def worker_secret_name(worker: str) -> str:
    return f"fakefleet-worker-{worker}"


def worker_names(cluster: FakeCluster) -> list[str]:
    spec = cluster.spec.kueue
    return list(spec.multiKueue.workers) if spec and spec.multiKueue else []


def _worker_problem(cluster: FakeCluster, worker: Worker) -> str:
    where = f"FakeCluster {cluster.metadata.get('namespace', 'default')}/{worker.name}"
    if not worker.exists:
        return (f"{WORKERS_FIELD} names {where}, which does not exist: create it (with "
                f"spec.addons.kueue) or remove it from the list")
    if not worker.kueue:
        return (f"{WORKERS_FIELD} names {where}, which runs no Kueue: MultiKueue needs Kueue "
                f"on every worker; set spec.addons.kueue.enabled: true there")
    if not worker.kubeconfig:
        return f"waiting for the kubeconfig Secret of worker {where}"
    return ""


def _activity(worker: Worker) -> str:
    if worker.active is None:
        return "connecting"
    if worker.active:
        return "Active"
    return f"Inactive ({worker.inactive_reason})" if worker.inactive_reason else "Inactive"


def _fingerprint(objects: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()[:16]
