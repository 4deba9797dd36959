"""Karpenter provisioning for pending GPU pods and consolidating the empty nodes afterwards, with
its nodes played by fakefleet's engine and, side by side, by KWOK's own controller (the setup
Karpenter's KWOK provider is made for):

    python -m bench.karpenter [--pods 1000] [--gpus-per-pod 8] [--runs 1]
                              [--nodes-by fakefleet,kwok] [--profile load]
                              [--consolidate-after 10s] [--disruption-budget 100%]

Each side of each run gets a fresh control plane: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager from :class:`~operators.controlplane.substrate.Substrate`, with the load
profile unless ``--profile default``. Both sides run the same Karpenter, v1.14.1's KWOK
provider from the per-user cache. The harness starts it as the add-on does, with everything
rendered by :mod:`operators.addons.karpenter`: the CRDs from the module source, the instance
types, the environment, and the NodePool and KWOKNodeClass of one provisioner pool of H100
nodes (type ``h100-sxm5-80gb-8gpu``, 8 GPUs each). Consolidation runs after
``--consolidate-after`` with a budget of ``--disruption-budget``. The defaults are those of
``make demo-autoscaling``, so the scale-down measures how nodes are removed, not Karpenter's
default pacing (10 % of the nodes at a time). The nodes Karpenter makes are played by:

- ``fakefleet``: the engine (``python -m operators.engine``), run as the operator runs it for a
  FakeCluster, with its own identity in ``system:nodes`` and its pools read from a FakeNodePool
  with ``provisioner: karpenter``. The engine's command line has no way to declare a
  provisioner pool, so fakefleet's CRDs and that FakeNodePool are put in the member itself,
  which acts as the engine's host. The engine writes the pool's status there, a few requests.
- ``kwok``: KWOK v0.8.0's controller (:mod:`bench.kwok`: kwokctl's fast stages with Lease
  heartbeats), which manages the nodes annotated ``kwok.x-k8s.io/node=fake``. Karpenter's KWOK
  provider puts that annotation on every node it makes.

Then ``--pods`` pending pods are created at once (64 in flight). Each one asks for
``--gpus-per-pod`` GPUs and tolerates the GPU taint. Watches on pods, NodeClaims and
Karpenter's nodes record the moments of each object on the harness's clock. Scale-up times are
measured from the first pod's creation:

- each pod marked Unschedulable by kube-scheduler;
- Karpenter's decision, from the first Unschedulable pod to the first NodeClaim;
- the NodeClaims made, their nodes Ready, the NodeClaims Initialized;
- every pod Running, which is the total.

The tail is taken apart (:mod:`bench.tails`), per pod and per node (p50, p99, max, and the last
moment of each step): a pod created → bound to a node (its ``spec.nodeName`` seen set) →
Running; a node created → ``karpenter.sh/unregistered`` gone → Ready → usable (no taint left
that the pods do not tolerate) → ``karpenter.sh/initialized``; how long after its node was
usable each pod was bound (kube-scheduler's part), how long after its binding it ran (the node
player's), and the nodes that stopped being usable once they were. A table lists the pods
Running last, each beside its node's moments. kube-scheduler's metrics (its secure port, with
the admin's client certificate) are read before the first pod and once every pod runs: pods
into each queue by event (``UnschedulableTimeout``: the 5-minute flush of pods no event
requeued), attempts by result, pods scheduled after that flush, and each plugin's queueing
hints by event and answer; its queues (pending pods, unschedulable pods by rejecting plugin)
are sampled every 10 s and shown as they were once every node was usable. With the engine,
its log says when its watch of bound pods listed again (a pod bound before the engine played
its node is passed over until then). Every pod's and node's moments go to the JSON results.

Karpenter's own account is shown beside these:

- from its log: each provisioning round ("computed new nodeclaim(s) to fit pod(s)") and its
  scheduling simulation's duration ("found provisionable pod(s)");
- from its metrics port: the mean time from a pod being seen to Karpenter's first try to
  schedule it, the time from pod creation to Running, and the time from a node's deletion to
  the removal of its finalizer.

Then the pods are deleted. The engine's pool finishes a deleted pod at once
(``terminationGracePeriodCap: 0s``), and so does KWOK's fast stage. Scale-down times are
measured from the first deletion: the pods gone, consolidation's first NodeClaim deletion, and
every NodeClaim and node gone. For each phase the table also gives the CPU seconds and peak
RSS of the node player (engine or KWOK), of Karpenter and of the kube-apiserver. A second
table counts the member API server's requests during scale-up (its ``apiserver_request_total``
and APF's ``apiserver_flowcontrol_dispatched_requests_total``, read before the first pod and
once every pod is Running), by verb and resource and by flow schema, in all and per NodeClaim:
what one side's node player asks of the API server that the other's does not.

Fairness: Karpenter, KWOK and the harness use the admin identity, which API Priority and
Fairness exempts. The engine writes as a node, in APF's ``node-high`` and ``system`` levels,
as a kubelet would. The engine's process also serves its nodes' kubelet endpoints and usage
metrics, as under the operator; KWOK serves none. Results also go to
``bench/results/karpenter-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from bench import kwok, metrics, tails
from bench.engines import (
    CONCURRENCY,
    NAMESPACE,
    RESULTS,
    Watched,
    bounded,
    node_ready,
    pod_running,
    untraced_environment,
)
from bench.fleet import usage
from bench.scrapelog import go_duration
from bench.terminating import sigterm_interrupts
from operators.addons.karpenter import KARPENTER_VERSION, TOOL, planning, rendering, source
from operators.addons.karpenter.running import apply_nodepools
from operators.api import API_VERSION, FakeCluster, FakeNodePool
from operators.api.clusters import KarpenterSpec
from operators.api.crdgen import crd
from operators.api.nodepools import FakeNodePoolSpec
from operators.controlplane import binaries as binaries_
from operators.controlplane import health
from operators.controlplane.components import Profile
from operators.controlplane.ports import free_port
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate
from operators.controlplane.supervising import tail
from operators.engine import authorizing
from operators.k8s.applying import install_crds
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import NotFound

SIDES = ("fakefleet", "kwok")
CLUSTER = "bench"
POOL = "gpu"
PRESET = "H100-SXM5-80GB"
GPUS_PER_NODE = 8
PROVISIONED = "kwok://"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
NODEPOOLS = f"/apis/{rendering.NODEPOOL_API}/nodepools"
PHASE_TIMEOUT = 1200.0
START_TIMEOUT = 120.0
#: After the last pod is Running: how long the last nodes may take to be Ready and their
#: NodeClaims Initialized (Karpenter may make a node more than the pods need).
SETTLE = 60.0
POLL = 0.25
#: Both node players get this long, once started, before the first pod is created (the
#: engine's Python start-up and both sides' first lists are then outside the timing).
IDLE = 5.0
#: How often kube-scheduler's queues are sampled during scale-up (s).
QUEUE_SAMPLES = 10.0
#: Where the node player, Karpenter and the apiserver are named in the usage rows.
PROCESSES = ("node player", "Karpenter", "kube-apiserver")


class Failed(Exception):
    """A side could not be measured; the message says why (with a log's last lines)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    pods: int
    gpus_per_pod: int
    consolidate_after: str
    disruption_budget: str

    def karpenter(self) -> KarpenterSpec:
        return KarpenterSpec(consolidateAfter=self.consolidate_after,
                             disruptionBudget=self.disruption_budget)


@dataclasses.dataclass(frozen=True)
class Sources:
    """What every side reads from module sources, fetched before any timing starts."""

    karpenter: Path
    crds: tuple[dict[str, Any], ...]
    kwok: Path | None
    stages: str


@dataclasses.dataclass
class SideRun:
    nodes_by: str
    run: int
    #: Seconds from the first pod's creation (scale-up) or deletion (scale-down), by moment.
    times: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: Karpenter's own account, from its log and its metrics port.
    karpenter: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: Per process (PROCESSES): CPU seconds of each phase and peak RSS (MiB).
    usage: dict[str, dict[str, float | None]] = dataclasses.field(default_factory=dict)
    nodeclaims: int = 0
    #: The member API server's requests during scale-up, by "VERB resource[/subresource]",
    #: and by the APF flow schema that let them through (who sent them).
    requests: dict[str, int] = dataclasses.field(default_factory=dict)
    flows: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The scale-up's tail taken apart (:func:`bench.tails.tail_figures`).
    tail: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: kube-scheduler's counters during scale-up (:func:`bench.tails.scheduler_counters`).
    scheduler: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: kube-scheduler's queues at its first scrape once every node was usable, with "s from the
    #: first pod's creation" the moment of that scrape.
    queues: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: The pods Running last, each with its moments and its node's (:data:`bench.tails.
    #: POD_COLUMNS`).
    last_pods: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Every pod's and node's moments (s from the first pod's creation), each pod's node, and
    #: kube-scheduler's queues sampled during scale-up: the tail, for reading afterwards.
    moments: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Why kube-scheduler's metrics could not be read (the rest of the run is measured).
    scheduler_error: str = ""
    #: Pods deleted during scale-up by someone else (the taint-eviction controller's race with
    #: Karpenter's ``unregistered`` taint, kubernetes#119862): bare pods, never made again.
    evicted: int = 0
    error: str = ""


class Stamps(Watched):
    """When each object of one kind first met each mark (and was first seen, and went), on the
    harness's clock, and which objects are there now. ``notes``: a value kept per object, the
    first one seen (a pod's node); ``held``: properties followed through every change, each
    object's history of (moment, holds) (a node usable, lost, usable again)."""

    def __init__(self, client: Client, path: str, marks: Mapping[str, Callable[[Any], bool]],
                 *, keep: Callable[[Any], bool] = lambda _: True,
                 notes: Mapping[str, Callable[[Any], str | None]] | None = None,
                 held: Mapping[str, Callable[[Any], bool]] | None = None) -> None:
        super().__init__(client, path, {})
        self._marks, self._keep = marks, keep
        self._notes, self._held = dict(notes or {}), dict(held or {})
        self.stamps: dict[str, dict[str, float]] = {}
        self.notes: dict[str, dict[str, str]] = {key: {} for key in self._notes}
        self.histories: dict[str, dict[str, list[tuple[float, bool]]]] = {
            key: {} for key in self._held}
        self.live: set[str] = set()
        self.listed = False  # the first list arrived

    def count(self, mark: str) -> int:
        """Objects there now that have met ``mark``."""
        return sum(1 for name in self.live if mark in self.stamps[name])

    def times(self, mark: str) -> list[float]:
        """When each object ever seen met ``mark``."""
        return [marks[mark] for marks in self.stamps.values() if mark in marks]

    def _relisted(self, items: list[Any]) -> None:
        now = time.time()
        listed = {self._see(item, now) for item in items if self._keep(item)}
        for name in self.live - listed:
            self.stamps[name].setdefault("gone", now)
        self.live = listed
        self.listed = True

    def _event(self, kind: str, obj: Any) -> None:
        if not self._keep(obj):
            return
        now = time.time()
        if kind == "DELETED":
            name = obj["metadata"]["name"]
            self.live.discard(name)
            self.stamps.setdefault(name, {"seen": now}).setdefault("gone", now)
        else:
            self.live.add(self._see(obj, now))

    def _see(self, obj: Any, now: float) -> str:
        name: str = obj["metadata"]["name"]
        marks = self.stamps.setdefault(name, {"seen": now})
        for mark, predicate in self._marks.items():
            if mark not in marks and predicate(obj):
                marks[mark] = now
        for key, note in self._notes.items():
            value = note(obj)
            if value:
                self.notes[key].setdefault(name, value)
        for key, predicate in self._held.items():
            history = self.histories[key].setdefault(name, [])
            holds = predicate(obj)
            if not history or history[-1][1] != holds:
                history.append((now, holds))
        return name


def settled(pods: Stamps, wanted: int) -> bool:
    """Every pod created and every one still there Running. A pod deleted meanwhile (the
    taint-eviction controller deletes a pod bound to a node whose ``karpenter.sh/unregistered``
    taint its cache still holds: kubernetes#119862, open in v1.36) is not made again, so it is
    counted apart (:attr:`SideRun.evicted`) instead of waited for."""
    return len(pods.stamps) >= wanted and bool(pods.live) and \
        all("running" in pods.stamps[name] for name in pods.live)


def condition(kind: str, status: str = "True") -> Callable[[Any], bool]:
    def met(obj: Any) -> bool:
        return any(c.get("type") == kind and c.get("status") == status
                   for c in (obj.get("status") or {}).get("conditions") or ())
    return met


def deleting(obj: Any) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def provisioned(node: Any) -> bool:
    return bool((node.get("spec") or {}).get("providerID", "").startswith(PROVISIONED))


def pool_body() -> dict[str, Any]:
    """The provisioner pool: what the NodePool is rendered from, and on the fakefleet side what
    the engine serves. A deleted pod is finished at once, as KWOK's fast stage does."""
    return {"clusterRef": CLUSTER, "provisioner": "karpenter", "gpu": {"preset": PRESET},
            "pods": {"terminationGracePeriodCap": "0s"}}


def pod_body(index: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"gpu-{index}", "namespace": NAMESPACE,
                     "labels": {"app": "bench-karpenter"}},
        "spec": {"containers": [{"name": "train", "image": "fake", "resources": {
                     "requests": {"cpu": str(gpus), "memory": f"{8 * gpus}Gi"},
                     "limits": {"nvidia.com/gpu": str(gpus)}}}],
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoSchedule"}]},
    }


def log_figures(log: str) -> dict[str, float | None]:
    """Karpenter's provisioning rounds, from its JSON log: the NodeClaims each computed, and how
    long each scheduling simulation took."""
    rounds = claims = 0
    simulations: list[float] = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("message") == "computed new nodeclaim(s) to fit pod(s)":
            rounds += 1
            claims += int(entry.get("nodeclaims") or 0)
        elif entry.get("message") == "found provisionable pod(s)":
            simulations.append(go_duration(str(entry.get("duration", ""))))
    return {"provisioning rounds (log)": rounds, "NodeClaims computed (log)": claims,
            "scheduling simulation s, sum (log)": round(sum(simulations), 3),
            "scheduling simulation s, longest (log)":
                round(max(simulations), 3) if simulations else None}


def metric_figures(text: str, *, scaled_down: bool) -> dict[str, float | None]:
    """What Karpenter's metrics port says about scale-up, or (``scaled_down``) scale-down."""
    samples = [(sample.name, sample.labels, sample.value)
               for family in text_string_to_metric_families(text) for sample in family.samples]

    def values(name: str, **labels: str) -> list[float]:
        return [value for found, having, value in samples if found == name and not
                math.isnan(value) and all(having.get(k) == v for k, v in labels.items())]

    def total(name: str) -> float | None:
        found = values(name)
        return sum(found) if found else None

    def quantile(name: str, q: str) -> float | None:
        found = values(name, quantile=q)
        return round(max(found), 2) if found else None

    if scaled_down:
        terminating = "karpenter_nodes_termination_duration_seconds"
        return {"node deletion → finalizer removed p50 s (metric)": quantile(terminating, "0.5"),
                "node deletion → finalizer removed max s (metric)": quantile(terminating, "1"),
                "disruption decisions (metric)":
                    total("karpenter_voluntary_disruption_decisions_total")}
    seen = "karpenter_pods_scheduling_decision_duration_seconds"
    count, seconds = total(f"{seen}_count"), total(f"{seen}_sum")
    startup = "karpenter_pods_startup_duration_seconds"
    return {"NodeClaims created (metric)": total("karpenter_nodeclaims_created_total"),
            "pod seen → first scheduling try, mean s (metric)":
                round(seconds / count, 2) if count and seconds is not None else None,
            "pod created → Running p50 s (metric)": quantile(startup, "0.5"),
            "pod created → Running p99 s (metric)": quantile(startup, "0.99"),
            "pod created → Running max s (metric)": quantile(startup, "1")}


def since(moment: float | None, zero: float) -> float | None:
    return None if moment is None else round(moment - zero, 2)


def earliest(values: list[float]) -> float | None:
    return min(values) if values else None


def latest(values: list[float]) -> float | None:
    return max(values) if values else None


async def until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll an in-memory condition (the moments come from the watches, not from this poll)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL)
    return True


async def scrape(url: str, tls: ssl.SSLContext | None = None) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session, \
            session.get(url, ssl=tls if tls is not None else True) as response:
        response.raise_for_status()
        return await response.text()


def scheduler_tls(cluster: LocalCluster) -> ssl.SSLContext:
    """For kube-scheduler's secure port: its serving certificate is self-signed (nothing to
    verify it against), and ``/metrics`` is authorized by delegation to the API server, so the
    admin's client certificate (``system:masters``) is presented."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(str(cluster.pki.client_cert("admin")),
                            str(cluster.pki.client_key("admin")))
    return context


class Harness:
    """One side: Karpenter and a node player on a fresh cluster, through both phases."""

    def __init__(self, nodes_by: str, cluster: LocalCluster, workdir: Path, settings: Settings,
                 sources: Sources) -> None:
        self.nodes_by, self.cluster, self.workdir = nodes_by, cluster, workdir
        self.settings, self.sources = settings, sources
        self.pool = FakeNodePoolSpec.model_validate(pool_body())
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        self.client = Client.connect(access, connections=CONCURRENCY, timeout=300)
        self.watcher = Client.connect(access, connections=8)
        self.processes: dict[str, tuple[asyncio.subprocess.Process, Path]] = {}
        self.ports = rendering.KarpenterPorts(metrics=free_port(), health=free_port())
        self.scheduler_url = f"https://127.0.0.1:{cluster.ports.scheduler}/metrics"
        self.scheduler_tls = scheduler_tls(cluster)

    async def run(self, result: SideRun) -> None:
        await self._service_account()
        await self._start_karpenter()
        await self._start_node_player()
        await asyncio.sleep(IDLE)
        pods = Stamps(self.watcher, "/api/v1/pods", {
            "unschedulable": condition("PodScheduled", "False"), "bound": tails.bound,
            "running": pod_running}, notes={"node": tails.node_of})
        claims = Stamps(self.watcher, NODECLAIMS, {"initialized": condition("Initialized"),
                                                    "deleting": deleting})
        usable = tails.usable(node_ready)
        nodes = Stamps(self.watcher, "/api/v1/nodes", {
            "ready": node_ready, "registered": tails.registered, "usable": usable,
            "initialized": tails.initialized}, keep=provisioned,
            held={"usable": usable, "ready": node_ready})
        watches = (pods, claims, nodes)
        for watch in watches:
            watch.start()
        try:
            if not await until(lambda: all(watch.listed for watch in watches), START_TIMEOUT):
                raise Failed(f"the watches had no first list after {START_TIMEOUT:.0f}s")
            await self._phases(result, pods, claims, nodes)
        finally:
            for watch in watches:
                await watch.stop()

    async def _phases(self, result: SideRun, pods: Stamps, claims: Stamps,
                      nodes: Stamps) -> None:
        wanted = self.settings.pods
        before = self._cpu()
        counted = await self._api_counts()
        scheduled = await self._scheduler_metrics(result)
        samples: list[tuple[float, dict[str, float]]] = []
        sampling = asyncio.create_task(self._sample_queues(result, samples))
        started = time.time()
        try:
            await bounded([functools.partial(self._create_pod, index)
                           for index in range(wanted)])
            running = await until(lambda: settled(pods, wanted), PHASE_TIMEOUT)
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
        self._tail(result, pods, nodes, samples, started=started,
                   counted=None if scheduled is None else tails.scheduler_counters(scheduled),
                   scheduled=await self._scheduler_metrics(result))
        if running:
            await until(lambda: nodes.count("ready") == len(nodes.live) and
                        claims.count("initialized") == len(claims.live), SETTLE)
        result.nodeclaims = len(claims.stamps)
        result.evicted = len(pods.stamps) - len(pods.live)
        unschedulable = earliest(pods.times("unschedulable"))
        first_claim = earliest(claims.times("seen"))
        all_ready = bool(nodes.live) and nodes.count("ready") == len(nodes.live)
        all_initialized = bool(claims.live) and claims.count("initialized") == len(claims.live)
        result.times = {
            "pods created": since(latest(pods.times("seen")), started),
            "first pod Unschedulable": since(unschedulable, started),
            "first NodeClaim": since(first_claim, started),
            "Karpenter's decision (first Unschedulable → first NodeClaim)":
                since(first_claim, unschedulable) if unschedulable else None,
            "last NodeClaim": since(latest(claims.times("seen")), started),
            "first node Ready": since(earliest(nodes.times("ready")), started),
            "every node Ready": since(latest(nodes.times("ready")), started)
            if all_ready else None,
            "every NodeClaim Initialized": since(latest(claims.times("initialized")), started)
            if all_initialized else None,
            "every pod Running (total)": since(latest(pods.times("running")), started)
            if running else None,
        }
        grown = self._cpu()
        requests, flows = await self._api_counts()
        result.requests = metrics.grown(counted[0], requests)
        result.flows = metrics.grown(counted[1], flows)
        result.karpenter = metric_figures(await self._metrics(), scaled_down=False)
        if not running:
            self._usage(result, before, grown, None)
            raise Failed(f"{pods.count('running')} of {wanted} pods Running "
                         f"({result.evicted} deleted meanwhile) after "
                         f"{PHASE_TIMEOUT:.0f}s, {len(claims.live)} NodeClaims, "
                         f"{nodes.count('ready')} of {len(nodes.live)} nodes Ready")
        emptied = time.time()
        await bounded([functools.partial(self._delete_pod, index) for index in range(wanted)])
        gone = await until(lambda: not pods.live and not claims.live and not nodes.live,
                           PHASE_TIMEOUT)
        result.times |= {
            "every pod gone": since(latest(pods.times("gone")), emptied) if not pods.live
            else None,
            "consolidation: first NodeClaim deleted": since(
                earliest(claims.times("deleting")), emptied),
            "first node gone": since(earliest(nodes.times("gone")), emptied),
            "every NodeClaim and node gone (scale-down)": since(
                latest(claims.times("gone") + nodes.times("gone")), emptied) if gone else None,
        }
        result.karpenter |= metric_figures(await self._metrics(), scaled_down=True)
        result.karpenter |= log_figures(self.processes["Karpenter"][1].read_text(
            errors="replace"))
        self._usage(result, before, grown, self._cpu())
        if not gone:
            raise Failed(f"after {PHASE_TIMEOUT:.0f}s {len(pods.live)} pods, "
                         f"{len(claims.live)} NodeClaims and {len(nodes.live)} nodes are left")

    def _tail(self, result: SideRun, pods: Stamps, nodes: Stamps,
              samples: list[tuple[float, dict[str, float]]], *, started: float,
              counted: dict[str, float] | None, scheduled: str | None) -> None:
        """The scale-up's tail, as the watches saw it when the last pod ran (or the phase
        timed out), and kube-scheduler's account of it."""
        placed = pods.notes["node"]
        usable, ready = nodes.histories["usable"], nodes.histories["ready"]
        result.tail = tails.tail_figures(pods.stamps, placed, nodes.stamps, usable, ready,
                                         started=started)
        if self.nodes_by == "fakefleet":
            # A bound pod the engine saw before it played the pod's node is seen again only
            # when its pod watch lists again.
            result.tail |= tails.relist_figures(
                self.processes["node player"][1].read_text(errors="replace"), "/api/v1/pods",
                started=started)
        result.last_pods = tails.last_pods(pods.stamps, placed, nodes.stamps, usable,
                                           started=started)
        if counted is not None and scheduled is not None:
            result.scheduler = dict(tails.grown(counted, tails.scheduler_counters(scheduled)))
        last_usable = result.tail.get("last node usable")
        after = tails.gauges_after(samples, None if last_usable is None
                                   else started + last_usable)
        if after is not None:
            when, gauges = after
            result.queues = {"scraped at, s from the first pod's creation":
                             round(when - started, 2), **gauges}

        def relative(stamps: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
            return {name: {mark: round(moment - started, 3) for mark, moment in marks.items()}
                    for name, marks in stamps.items()}

        result.moments = {
            "pods": relative(pods.stamps), "nodes": relative(nodes.stamps), "placed": placed,
            "nodes usable": {name: [[round(moment - started, 3), holds]
                                    for moment, holds in history]
                             for name, history in usable.items()},
            "scheduler queues": [[round(when - started, 3), gauges] for when, gauges in samples],
        }

    async def _scheduler_metrics(self, result: SideRun) -> str | None:
        """kube-scheduler's metrics; None (and why, in the result) when they cannot be read."""
        try:
            return await scrape(self.scheduler_url, self.scheduler_tls)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            result.scheduler_error = result.scheduler_error or \
                f"kube-scheduler's metrics at {self.scheduler_url}: {error}"
            return None

    async def _sample_queues(self, result: SideRun,
                             samples: list[tuple[float, dict[str, float]]]) -> None:
        """kube-scheduler's queues every :data:`QUEUE_SAMPLES` seconds, until cancelled."""
        while True:
            text = await self._scheduler_metrics(result)
            if text is not None:
                samples.append((time.time(), tails.scheduler_gauges(text)))
            await asyncio.sleep(QUEUE_SAMPLES)

    def _usage(self, result: SideRun, before: dict[str, float], grown: dict[str, float],
               shrunk: dict[str, float] | None) -> None:
        peaks = self._peaks()
        for name in PROCESSES:
            start = before.get(name)
            result.usage[name] = {
                "CPU s, scale-up": round(grown[name] - start, 1)
                if start is not None and name in grown else None,
                "CPU s, scale-down": round(shrunk[name] - grown[name], 1)
                if shrunk is not None and name in shrunk and name in grown else None,
                "peak RSS MiB": peaks.get(name),
            }

    def _pids(self) -> dict[str, int]:
        pids = {name: process.pid for name, (process, _) in self.processes.items()
                if process.returncode is None}
        apiserver = self.cluster.apiserver.pid
        if apiserver is not None:
            pids["kube-apiserver"] = apiserver
        return pids

    def _cpu(self) -> dict[str, float]:
        return {name: usage(name, pid).cpu_seconds for name, pid in self._pids().items()}

    def _peaks(self) -> dict[str, float]:
        return {name: usage(name, pid).peak_rss_mib for name, pid in self._pids().items()}

    async def _api_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """The member API server's request counters: by request, and by flow schema."""
        text = await self.watcher.get_text("/metrics")
        return metrics.all_requests(text), metrics.dispatched_requests(text)

    async def _metrics(self) -> str:
        url = f"http://127.0.0.1:{self.ports.metrics}/metrics"
        try:
            return await scrape(url)
        except (aiohttp.ClientError, TimeoutError) as error:
            process, log = self.processes["Karpenter"]
            raise Failed(f"Karpenter's metrics at {url}: {error} (its exit code "
                         f"{process.returncode}); its log ends:\n{tail(log, 20)}") from error

    async def _create_pod(self, index: int) -> None:
        await self.client.create(f"/api/v1/namespaces/{NAMESPACE}/pods",
                                 pod_body(index, self.settings.gpus_per_pod))

    async def _delete_pod(self, index: int) -> None:
        with contextlib.suppress(NotFound):
            await self.client.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/gpu-{index}")

    async def _service_account(self) -> None:
        """Pods need the namespace's default ServiceAccount, made by the controller-manager."""
        path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"

        async def made() -> bool:
            try:
                await self.client.get(path)
            except NotFound:
                return False
            return True

        deadline = time.monotonic() + START_TIMEOUT
        while not await made():
            if time.monotonic() > deadline:
                raise Failed(f"no ServiceAccount {NAMESPACE}/default after {START_TIMEOUT:.0f}s")
            await asyncio.sleep(0.2)

    async def _start_karpenter(self) -> None:
        """As the add-on starts it (:meth:`operators.addons.karpenter.running.Karpenter.setup`),
        then its NodePool and KWOKNodeClass applied as the add-on applies them."""
        spec = self.settings.karpenter()
        await install_crds(self.client, list(self.sources.crds))
        types = self.workdir / "instance-types.json"
        types.write_text(json.dumps(rendering.instance_types(spec.zones), indent=1) + "\n")
        environ = {**untraced_environment(), **rendering.environment(
            kubeconfig=self.cluster.kubeconfig_path, ports=self.ports, instance_types=types,
            node_repair=spec.nodeRepair)}
        await self._spawn("Karpenter", [str(self.sources.karpenter)], environ)
        await self._ready("Karpenter", f"http://127.0.0.1:{self.ports.health}/readyz")
        objects = planning.pool_objects({POOL: self.pool}, spec)
        await apply_nodepools(self.client, planning.ApplyNodePools(
            tuple(objects), frozenset({POOL}), fingerprint=""), key=CLUSTER)
        ready = condition("Ready")

        async def pool_ready() -> bool:
            return ready(await self.client.get(f"{NODEPOOLS}/{POOL}"))

        deadline = time.monotonic() + START_TIMEOUT
        while not await pool_ready():
            if time.monotonic() > deadline:
                raise Failed(f"NodePool {POOL} not Ready after {START_TIMEOUT:.0f}s: "
                             f"{await self.client.get(f'{NODEPOOLS}/{POOL}')}")
            await asyncio.sleep(0.5)

    async def _start_node_player(self) -> None:
        if self.nodes_by == "kwok":
            assert self.sources.kwok is not None, "main() builds KWOK for a kwok side"
            config = self.workdir / "kwok.yaml"
            config.write_text(self.sources.stages)
            await self._spawn("node player", kwok.kwok_argv(
                self.sources.kwok, self.cluster.kubeconfig_path, config), None)
            return
        # The member is the engine's host too: fakefleet's CRDs and the provisioner pool in it.
        await install_crds(self.client, [crd(FakeCluster), crd(FakeNodePool)])
        await self.client.create(
            f"/apis/{API_VERSION}/namespaces/{NAMESPACE}/fakenodepools",
            {"apiVersion": API_VERSION, "kind": "FakeNodePool",
             "metadata": {"name": POOL, "namespace": NAMESPACE}, "spec": pool_body()})
        await authorizing.grant(self.client)
        port = free_port()
        await self._spawn("node player", [
            sys.executable, "-m", "operators.engine",
            "--kubeconfig", str(self.cluster.engine_kubeconfig_path),
            "--host-kubeconfig", str(self.cluster.kubeconfig_path),
            "--cluster", f"{NAMESPACE}/{CLUSTER}", "--kubelet-port", str(port)],
            untraced_environment())
        await self._ready("node player", f"http://127.0.0.1:{port}/healthz")

    async def _spawn(self, name: str, argv: list[str], environ: Mapping[str, str] | None) -> None:
        log = self.workdir / f"{name.replace(' ', '-')}.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=asyncio.subprocess.STDOUT,
                env=dict(environ) if environ is not None else None)
        self.processes[name] = (process, log)

    async def _ready(self, name: str, url: str) -> None:
        process, log = self.processes[name]
        deadline = time.monotonic() + START_TIMEOUT
        while not (await health.probe(url))[0]:
            if process.returncode is not None or time.monotonic() > deadline:
                how = (f"it exited with {process.returncode}" if process.returncode is not None
                       else f"after {START_TIMEOUT:.0f}s")
                raise Failed(f"{name} did not answer {url} ({how}); its log ends:\n"
                             f"{tail(log, 20)}")
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        for process, _ in self.processes.values():
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(process.wait(), 15)
                except TimeoutError:
                    process.kill()
                    await process.wait()
        await self.client.close()
        await self.watcher.close()


async def run_side(nodes_by: str, run: int, binaries: binaries_.Binaries, workdir: Path, *,
                   settings: Settings, sources: Sources, profile: Profile) -> SideRun:
    result = SideRun(nodes_by, run)
    state = workdir / f"{nodes_by}-{run}"
    state.mkdir(parents=True)
    async with Substrate(state, binaries, fsync=False,
                         environ=untraced_environment()) as substrate:
        cluster = await substrate.add_cluster(CLUSTER, ClusterOptions(profile=profile))
        harness = Harness(nodes_by, cluster, state, settings, sources)
        try:
            await harness.run(result)
        except Failed as error:
            result.error = str(error)
        finally:
            await harness.close()
    return result


def figure(kind: str, label: str, run: SideRun) -> float | None:
    """One of a run's figures: ``kind`` is "times" or "karpenter"."""
    found: dict[str, float | None] = getattr(run, kind)
    return found.get(label)


def used(process: str, what: str, run: SideRun) -> float | None:
    return run.usage.get(process, {}).get(what)


def cell(values: list[float | None]) -> str:
    return " / ".join("-" if value is None else f"{value:g}" for value in values)


def median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def report(runs: list[SideRun], console: Console, *, settings: Settings, profile: Profile) -> None:
    sides = list(dict.fromkeys(run.nodes_by for run in runs))
    table = Table(title=f"Karpenter {KARPENTER_VERSION}: {settings.pods} pending pods of "
                        f"{settings.gpus_per_pod} GPUs, {PRESET} nodes of {GPUS_PER_NODE}; "
                        f"profile {profile}, consolidateAfter {settings.consolidate_after}, "
                        f"budget {settings.disruption_budget}; {os.cpu_count()} CPUs "
                        f"(runs separated by /; kwok/fakefleet of the medians, > 1: "
                        f"fakefleet faster or lighter)")
    table.add_column("")
    for side in sides:
        table.add_column(f"nodes by {side}", justify="right")
    compare = set(SIDES) <= set(sides)
    if compare:
        table.add_column("kwok/fakefleet", justify="right")

    def row(label: str, pick: Callable[[SideRun], float | None]) -> None:
        columns = {side: [pick(run) for run in runs if run.nodes_by == side] for side in sides}
        cells = [label, *(cell(columns[side]) for side in sides)]
        if compare:
            ours, theirs = median(columns["fakefleet"]), median(columns["kwok"])
            cells.append(f"{theirs / ours:.2f}" if ours and theirs is not None else "-")
        table.add_row(*cells)

    table.add_row("[bold]scale-up, s from the first pod's creation[/]")
    row("NodeClaims (seen by the harness)", lambda run: run.nodeclaims)
    row("pods deleted during scale-up by others (not waited for)", lambda run: run.evicted)
    labels = list(dict.fromkeys(label for run in runs for label in run.times))
    for label in labels:
        if label == "every pod gone":
            table.add_row("[bold]scale-down, s from the first pod's deletion[/]")
        row(label, functools.partial(figure, "times", label))
    table.add_row("[bold]the tail: s per pod or node (p50, p99, max), counts, and the last "
                  "moments (s from the first pod's creation)[/]")
    for label in dict.fromkeys(label for run in runs for label in run.tail):
        if not label.endswith("(count)"):
            row(label, functools.partial(figure, "tail", label))
    table.add_row("[bold]kube-scheduler's account of scale-up (its metrics)[/]")
    for label in sorted({label for run in runs for label in run.scheduler},
                        key=lambda label: -max(run.scheduler.get(label) or 0 for run in runs)):
        row(label, functools.partial(figure, "scheduler", label))
    table.add_row("[bold]kube-scheduler's queues at its first scrape once every node was "
                  "usable[/]")
    for label in dict.fromkeys(label for run in runs for label in run.queues):
        row(label, functools.partial(figure, "queues", label))
    table.add_row("[bold]Karpenter's own account[/]")
    for label in dict.fromkeys(label for run in runs for label in run.karpenter):
        row(label, functools.partial(figure, "karpenter", label))
    table.add_row("[bold]processes (node player: the engine, or KWOK)[/]")
    for name in PROCESSES:
        for what in ("CPU s, scale-up", "CPU s, scale-down", "peak RSS MiB"):
            row(f"{name}: {what}", functools.partial(used, name, what))
    console.print(table)
    console.print(requests_table(runs, sides))
    for run in runs:
        if run.last_pods:
            console.print(last_pods_table(run))
    for run in runs:
        if run.scheduler_error:
            console.print(f"[yellow]{run.nodes_by} run {run.run}: {run.scheduler_error}[/]")
        if run.error:
            console.print(f"[red]{run.nodes_by} run {run.run}: {run.error}[/]")


def last_pods_table(run: SideRun) -> Table:
    """The pods Running last in one run, each beside its node's moments: which step of the
    tail each one waited on."""
    table = Table(title=f"nodes by {run.nodes_by}, run {run.run}: the {len(run.last_pods)} "
                        f"pods Running last, s from the first pod's creation")
    for column in tails.POD_COLUMNS:
        table.add_column(column, justify="left" if column in ("pod", "node") else "right")
    for pod in run.last_pods:
        table.add_row(*(str(pod.get(column) or "") if column in ("pod", "node")
                        else cell([pod.get(column)]) for column in tails.POD_COLUMNS))
    return table


#: The API requests table shows the most frequent requests, this many.
REQUEST_ROWS = 30


def per_node(count: int, run: SideRun) -> str:
    return f"{count} ({count / run.nodeclaims:.1f})" if run.nodeclaims else str(count)


def requests_table(runs: list[SideRun], sides: list[str]) -> Table:
    """The member API server's requests during scale-up, most frequent first: what each node
    player (with Karpenter and the harness, the same on both sides) asked of it."""
    table = Table(title="API requests during scale-up, by request and by APF flow schema "
                        "(who sent them): total (per NodeClaim); runs separated by /")
    table.add_column("")
    for side in sides:
        table.add_column(f"nodes by {side}", justify="right")

    def rows(counts: Callable[[SideRun], dict[str, int]], limit: int | None) -> None:
        keys = sorted({key for run in runs for key in counts(run)},
                      key=lambda key: -max(counts(run).get(key, 0) for run in runs))
        for key in keys[:limit]:
            table.add_row(key or "(none)", *(
                " / ".join(per_node(counts(run).get(key, 0), run)
                           for run in runs if run.nodes_by == side) for side in sides))

    table.add_row("[bold]all requests[/]", *(
        " / ".join(per_node(sum(run.requests.values()), run)
                   for run in runs if run.nodes_by == side) for side in sides))
    table.add_row("[bold]by flow schema[/]")
    rows(lambda run: run.flows, None)
    table.add_row(f"[bold]by request (the {REQUEST_ROWS} most frequent)[/]")
    rows(lambda run: run.requests, REQUEST_ROWS)
    return table


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--gpus-per-pod", type=int, default=GPUS_PER_NODE,
                        help=f"1 to {GPUS_PER_NODE}: each node has {GPUS_PER_NODE}")
    parser.add_argument("--runs", type=int, default=1,
                        help="how many times each side runs (alternating)")
    parser.add_argument("--nodes-by", default=",".join(SIDES),
                        help="comma-separated subset of fakefleet,kwok")
    parser.add_argument("--profile", choices=[p.value for p in Profile],
                        default=Profile.LOAD.value,
                        help="the control plane's profile (default: load, as bench.engines)")
    parser.add_argument("--consolidate-after", default="10s",
                        help="the NodePool's consolidateAfter (default 10s)")
    parser.add_argument("--disruption-budget", default="100%",
                        help="the NodePool's disruption budget (default 100%%: every empty "
                             "node in one decision)")
    parser.add_argument("--output", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    sides = [side for side in args.nodes_by.split(",") if side]
    if not sides or set(sides) - set(SIDES):
        parser.error(f"--nodes-by {args.nodes_by!r}: choose from {', '.join(SIDES)}")
    if args.pods < 1 or args.runs < 1:
        parser.error("--pods and --runs: at least 1")
    if not 1 <= args.gpus_per_pod <= GPUS_PER_NODE:
        parser.error(f"--gpus-per-pod {args.gpus_per_pod}: from 1 to {GPUS_PER_NODE} (a "
                     f"node of {PRESET} has {GPUS_PER_NODE})")
    settings = Settings(args.pods, args.gpus_per_pod, args.consolidate_after,
                        args.disruption_budget)
    try:
        settings.karpenter()
    except ValueError as error:
        parser.error(f"--consolidate-after or --disruption-budget: {error}")
    profile = Profile(args.profile)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    binaries = binaries_.resolve()
    # Built or found, and the module sources read, before any timing starts.
    sources = Sources(
        karpenter=TOOL.ensure(progress=console.print),
        crds=source.load(source.module_dir()).crds,
        kwok=kwok.kwok_binary(progress=console.print) if "kwok" in sides else None,
        stages=kwok.stage_config() if "kwok" in sides else "")
    runs: list[SideRun] = []
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-karpenter-") as workdir:
        for run in range(1, args.runs + 1):
            for side in sides:
                console.print(f"[bold]nodes by {side}[/], run {run}: {args.pods} pods of "
                              f"{args.gpus_per_pod} GPUs ...")
                runs.append(asyncio.run(run_side(
                    side, run, binaries, Path(workdir), settings=settings, sources=sources,
                    profile=profile)))
    report(runs, console, settings=settings, profile=profile)
    payload = {
        "pods": args.pods, "gpusPerPod": args.gpus_per_pod, "preset": PRESET,
        "profile": profile.value, "consolidateAfter": args.consolidate_after,
        "disruptionBudget": args.disruption_budget, "cpus": os.cpu_count(),
        "karpenterVersion": KARPENTER_VERSION, "kwokVersion": kwok.KWOK_VERSION,
        "kubernetesVersion": binaries.version,
        "runs": [dataclasses.asdict(run) for run in runs],
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"karpenter-{time.strftime('%Y%m%dT%H%M%S')}.json"
    for path in (out, args.output):
        if path is not None:
            path.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results: {out}")
    failed = [f"{run.nodes_by} run {run.run}" for run in runs if run.error]
    if failed:
        raise SystemExit(f"not measured to the end: {', '.join(failed)}")


if __name__ == "__main__":
    main()
