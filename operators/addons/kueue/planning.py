"""What to do about a member's Kueue add-on, and what its KueueReady condition says: pure.

:func:`plan` compares ``spec.addons.kueue`` with what the operator observes (is the binary in
the cache or being built, does the process run and answer its readiness probe, are the
MultiKueue objects on a manager current) and returns actions; :func:`condition` tells the
truth about it in one line a person can act on. :func:`multikueue_objects` renders what a
MultiKueue manager needs for its workers. The kopf glue (:mod:`operators.handlers.kueue`)
observes, calls these and applies.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from typing import Any

from operators.addons.kueue import KUEUE_VERSION
from operators.addons.kueue.rendering import NAMESPACE
from operators.api.clusters import MULTIKUEUE_CONFIG, FakeCluster

MANAGED_BY = {"app.kubernetes.io/managed-by": "fakefleet"}
KUEUE_API = "kueue.x-k8s.io/v1beta2"
#: Where the field that names a worker in error messages is.
WORKERS_FIELD = "spec.addons.kueue.multiKueue.workers"


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
class Observed:
    """What the operator sees of one member's Kueue."""

    control_plane_running: bool = False
    binary: bool = False
    building_for: float | None = None
    """Seconds the background build has run, None when none runs."""
    build_error: str = ""
    installed: bool = False
    """Kueue's files exist in the member's state (it was set up, and may need tearing down)."""
    supervised: bool = False
    ready: bool = False
    """Kueue's readiness probe answers 200 (its webhook server listens)."""
    hooked: bool = False
    """Its webhook configurations were applied since it started."""
    restarts: int = 0
    log_tail: str = ""
    webhook_port: int = 0
    workers: tuple[Worker, ...] = ()
    multikueue_applied: str = ""
    """Fingerprint of the MultiKueue objects last applied to this manager ("" none yet)."""


@dataclasses.dataclass(frozen=True)
class BuildKueue:
    """Build the Kueue binary into the cache, in the background."""


@dataclasses.dataclass(frozen=True)
class StartKueue:
    """Install Kueue's CRDs, RBAC, namespace and webhooks in the member, then start it."""


@dataclasses.dataclass(frozen=True)
class HookKueue:
    """Apply the webhook configurations: only once Kueue is ready, as before they would
    refuse the member's Jobs and Pods (their failure policy is Fail)."""


@dataclasses.dataclass(frozen=True)
class StopKueue:
    """Stop Kueue; ``unhook``: delete its webhook configurations too (the member stays, and a
    webhook whose server is gone would refuse the member's Pods and Jobs)."""

    unhook: bool = True


@dataclasses.dataclass(frozen=True)
class ApplyMultiKueue:
    """Apply the worker Secrets, MultiKueueClusters and the MultiKueueConfig; prune others."""

    objects: tuple[dict[str, Any], ...]
    fingerprint: str


Action = BuildKueue | StartKueue | HookKueue | StopKueue | ApplyMultiKueue


@dataclasses.dataclass(frozen=True)
class KueueState:
    """The KueueReady condition."""

    ready: bool
    reason: str
    message: str


def plan(cluster: FakeCluster, observed: Observed) -> list[Action]:
    """Actions that bring the member's Kueue to ``spec.addons.kueue``."""
    spec = cluster.spec.kueue
    if spec is None:
        return [StopKueue()] if observed.supervised or observed.installed else []
    if not observed.binary:
        return [BuildKueue()] if observed.building_for is None and not observed.build_error \
            else []
    if not observed.control_plane_running:
        return []
    if not observed.supervised:
        return [StartKueue()]
    if observed.ready and not observed.hooked:
        return [HookKueue()]
    if observed.ready and spec.multiKueue is not None:
        objects = multikueue_objects(observed.workers)
        if objects is not None:
            fingerprint = _fingerprint(objects)
            if fingerprint != observed.multikueue_applied:
                return [ApplyMultiKueue(tuple(objects), fingerprint)]
    return []


def condition(cluster: FakeCluster, observed: Observed) -> KueueState | None:
    """KueueReady, or None when the add-on is not asked for."""
    spec = cluster.spec.kueue
    if spec is None:
        return None
    if observed.build_error:
        return KueueState(False, "BuildFailed", f"Kueue {KUEUE_VERSION} could not be built: "
                                                f"{observed.build_error}")
    if not observed.binary:
        so_far = f" ({observed.building_for:.0f}s so far)" if observed.building_for else ""
        return KueueState(False, "Building",
                          f"building Kueue {KUEUE_VERSION} from the Go module proxy into the "
                          f"cache{so_far}; a cold build takes several minutes ('fakefleet "
                          f"binaries' builds it ahead of time)")
    if not observed.control_plane_running:
        return KueueState(False, "Waiting", "waiting for the cluster's API server")
    if not (observed.ready and observed.hooked):
        if observed.restarts:
            return KueueState(False, "Crashed",
                              f"Kueue exited and was restarted {observed.restarts} times: "
                              f"{crash_summary(observed.log_tail)}")
        return KueueState(False, "Starting", f"starting Kueue {KUEUE_VERSION}")
    workers = observed.workers if spec.multiKueue is not None else ()
    for worker in workers:
        problem = _worker_problem(cluster, worker)
        if problem:
            return KueueState(False, "WorkerMissing", problem)
    message = f"Kueue {KUEUE_VERSION} running, webhooks at https://127.0.0.1:" \
              f"{observed.webhook_port}"
    if workers:
        message += "; MultiKueue workers: " + ", ".join(
            f"{w.name} {_activity(w)}" for w in workers)
    return KueueState(True, "Running", message)


def crash_summary(log: str) -> str:
    """The line of Kueue's log that says why it stopped: a panic, else the last error's
    message (its log is JSON lines), else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith(("panic:", "fatal error:")):
            return line
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("level") == "error":
                error = f": {entry['error']}" if entry.get("error") else ""
                return f"{entry.get('msg', '')}{error}"
    return lines[-1] if lines else "(its log is empty)"


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
