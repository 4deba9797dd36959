"""The engine benchmark, modelled on KWOK's own CI benchmark (test/e2e/benchmark.go), run side by
side on the same machine against the same kind of control plane:

    python -m bench.engines [--nodes 5000] [--pods 10000] [--engines fakefleet,kwok,ceiling]
                            [--inflight READ,MUTATING] [--hog]

Phases, each timed until every object reached its state:
1. nodes: 5000 nodes Ready (fakefleet's engine creates its pool's nodes itself; for KWOK and the
   ceiling the harness creates them, as KWOK's benchmark does);
2. pods: 10000 pods created bound to the nodes (``spec.nodeName``, round-robin), all Running;
3. delete: those pods deleted (default grace period), all gone;
4. and 5., the scheduler variant: Deployments totalling the same pods, scheduled by the real
   kube-scheduler, all Running; then the Deployments deleted, all pods gone.

Engines: ``fakefleet`` (``python -m operators.engine``), ``kwok`` (KWOK's controller at v0.8.0
with its fast stages and leases, as kwokctl runs it) and ``ceiling`` (no engine: the harness
itself writes the end states as fast as the API server takes them: nodes created Ready, pod
status patched Running, pods deleted with grace 0). Every engine gets a fresh control plane
(etcd, kube-apiserver, kube-scheduler, kube-controller-manager) with the load profile (the
scheduler's and controller-manager's QPS limits lifted, as KWOK's ``--disable-qps-limits``;
API Priority and Fairness on, with the API server's in-flight limits of
``operators.controlplane.components.LIMITS``, or ``--inflight READ,MUTATING``). fakefleet's
engine runs with its own identity (``system:nodes``, served by APF as kubelets are); KWOK and
the harness run as admins, whom APF exempts.

Tracing on against off: ``--engines fakefleet,fakefleet-traced`` runs fakefleet's engine twice.
``fakefleet`` runs with no OTLP endpoint anywhere (any ``OTEL_EXPORTER_OTLP_*ENDPOINT`` of the
shell is dropped); ``fakefleet-traced`` runs as under ``fakefleet up``: the embedded collector
(``python -m federation.telemetry.collector``, without fsync) in a process of its own, its
endpoint given to the engine (SDK and exporter configured), to etcd and to the kube-apiserver
(``--tracing-config-file``). The phases inject no faults, so what is measured is the cost of
tracing being on for background work (it should be near nothing: none of it is traced; the
spans the collector stored are reported). The column fakefleet-traced/fakefleet is the ratio of
the times (< 0.9: tracing costs more than 10 %).

``--hog`` runs everything with one busy process pinned to the last core, a slowdown that is the
same every run (:mod:`bench.hogging`).

The table gives seconds and objects/s per phase, the engine's peak RSS and CPU seconds, and the
ratios fakefleet/KWOK and fakefleet/ceiling (> 1 means fakefleet is faster). Results also go to
``bench/results/engines-<time>.json`` (git-ignored), each engine's log beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import kwok
from bench.hogging import hog
from bench.metrics import mutating_requests, queue_waits, throttled_requests
from bench.terminating import sigterm_interrupts
from federation.telemetry.exporting import ENDPOINT_VARIABLES, exporter_environment
from federation.telemetry.files import CollectorFiles, CollectorInfo
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import LIMITS, Profile, RequestLimits
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate
from operators.engine import authorizing
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import Conflict, NotFound
from operators.k8s.times import micro_time, parse
from operators.k8s.watching import list_and_watch

RESULTS = Path(__file__).parent / "results"
ENGINES = ("fakefleet", "kwok", "ceiling")
#: Run on request only: fakefleet's engine with tracing on (see the module's docstring).
TRACED = "fakefleet-traced"
FAKEFLEET = ("fakefleet", TRACED)
COLLECTOR_TIMEOUT = 30.0
NAMESPACE = "default"
POOL = "bench"
CONCURRENCY = 64
PHASE_TIMEOUT = 600.0
#: How long after a Running phase its pods may take to be Ready before they count as left
#: not Ready (outside the phase's time: Running is what the phase waits for, as KWOK's does).
READY_GRACE = 15.0


@dataclasses.dataclass
class Phase:
    name: str
    objects: int
    seconds: float | None = None  # None: did not complete in time
    #: Mutating requests the API server served during the phase, by "VERB resource".
    writes: dict[str, int] = dataclasses.field(default_factory=dict)
    #: The longest any node went without a Lease renewal during the phase (seconds); the
    #: node-lifecycle controller marks a node NotReady past its grace period (50 s in v1.36).
    lease_gap: float | None = None
    #: Times a Ready node turned not Ready during the phase (the benchmark never asks for it).
    nodes_lost: int = 0
    #: Times a Ready pod turned not Ready during the phase (not counting pods being deleted).
    pods_lost: int = 0
    #: Pods that were not Ready once the phase was over and READY_GRACE more had passed
    #: (phases that make pods Running only; None for the others).
    pods_not_ready: int | None = None
    #: Requests answered 429 by API Priority and Fairness during the phase, by "VERB resource".
    throttled: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Mean seconds a request waited in APF's queues during the phase, by priority level.
    queue_wait: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return self.objects / self.seconds if self.seconds else None


@dataclasses.dataclass
class EngineRun:
    engine: str
    phases: list[Phase] = dataclasses.field(default_factory=list)
    peak_rss_mib: float | None = None
    cpu_seconds: float | None = None
    #: fakefleet only: how long its pod lifecycle held back for late heartbeats, in all.
    held_back_seconds: float | None = None
    #: fakefleet-traced only: the spans the collector stored (engine, apiserver, etcd).
    spans: int | None = None
    error: str = ""


class Watched:
    """One list+watch in the background (no polling lists); subclasses digest what it sees."""

    def __init__(self, client: Client, path: str, params: dict[str, str]) -> None:
        self._client, self._path, self._params = client, path, params
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(list_and_watch(
            self._client, self._path, self._params, on_list=self._relisted,
            on_event=self._event))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _relisted(self, items: list[Any]) -> None:
        raise NotImplementedError

    def _event(self, kind: str, obj: Any) -> None:
        raise NotImplementedError


class Tally(Watched):
    """Counts objects of one kind by a predicate."""

    def __init__(self, client: Client, path: str, params: dict[str, str],
                 predicate: Callable[[Any], bool]) -> None:
        super().__init__(client, path, params)
        self._predicate = predicate
        self._states: dict[str, bool] = {}
        self.lost = 0  # objects that matched and stopped matching
        self._changed = asyncio.Event()

    @property
    def present(self) -> int:
        return len(self._states)

    @property
    def matching(self) -> int:
        return sum(self._states.values())

    def _relisted(self, items: list[Any]) -> None:
        self._states = {self._key(item): self._predicate(item) for item in items}
        self._changed.set()

    def _event(self, kind: str, obj: Any) -> None:
        key = self._key(obj)
        if kind == "DELETED":
            self._states.pop(key, None)
        else:
            matches = self._predicate(obj)
            if self._states.get(key) and not matches:
                self.lost += 1
            self._states[key] = matches
        self._changed.set()

    @staticmethod
    def _key(obj: Any) -> str:
        return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"

    async def until(self, condition: Callable[[Tally], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
        return True


class LeaseGaps(Watched):
    """The longest time between two renewals of any node Lease."""

    def __init__(self, client: Client) -> None:
        super().__init__(client, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                         {})
        self._renewed: dict[str, float] = {}
        self.worst = 0.0

    def restart(self) -> None:
        """Start a new phase: count the gaps that end in it (even if they began before)."""
        self.worst = 0.0

    def phase_worst(self) -> float | None:
        """The worst gap of the phase so far, counting leases overdue right now (a gap
        that began in an earlier phase counts in full: it is how stale the Lease got)."""
        if not self._renewed:
            return None
        overdue = time.time() - min(self._renewed.values())
        return max(self.worst, overdue)

    def _relisted(self, items: list[Any]) -> None:
        self._renewed = {}
        for item in items:
            self._event("ADDED", item)

    def _event(self, kind: str, lease: Any) -> None:
        name = lease["metadata"]["name"]
        if kind == "DELETED":
            self._renewed.pop(name, None)
            return
        stamp = (lease.get("spec") or {}).get("renewTime")
        if not stamp:
            return
        renewed = parse(stamp)
        previous = self._renewed.get(name)
        if previous is not None and renewed > previous:
            self.worst = max(self.worst, renewed - previous)
        self._renewed[name] = max(renewed, previous or renewed)


def held_back(log: Path) -> float:
    """Seconds the engine's pod lifecycle spent holding back for heartbeats (from its log)."""
    held, since = 0.0, None
    for line in log.read_text(errors="replace").splitlines():
        if "holding back" in line or "back to full speed" in line:
            stamp = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
            if "holding back" in line:
                since = stamp
            elif since is not None:
                held += stamp - since
                since = None
    return held


def node_ready(node: Any) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or ())


def pod_running(pod: Any) -> bool:
    return bool((pod.get("status") or {}).get("phase") == "Running")


def pod_ready(pod: Any) -> bool:
    """Ready, and not being deleted (a pod going away may stop being Ready on its way)."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ())


async def bounded(calls: list[Callable[[], Awaitable[Any]]], limit: int = CONCURRENCY) -> None:
    """Run the calls with at most ``limit`` in flight."""
    queue = iter(calls)

    async def worker() -> None:
        for call in queue:
            await call()

    await asyncio.gather(*(worker() for _ in range(limit)))


def node_body(name: str, *, ready: bool) -> dict[str, Any]:
    """A node as KWOK's benchmark creates it; the ceiling creates it Ready at once."""
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {kwok.NODE_ANNOTATION: "fake"},
                     "labels": {"type": "kwok"}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake",
                             "effect": "NoSchedule"}]},
    }
    if ready:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body["status"] = {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "phase": "Running",
        }
    return body


def pod_body(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "fake"}],
                 "tolerations": [{"operator": "Exists"}]},
    }


def deployment_body(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "variant": "scheduled"}},
                "spec": {"containers": [{"name": "c", "image": "fake"}],
                         "tolerations": [{"operator": "Exists"}]},
            },
        },
    }


def keep_log(log: Path) -> None:
    """The engine's (or KWOK's) log, kept beside the results: the workdir goes with the run,
    and the log is where late renewals and held-back pods are explained."""
    if log.exists():
        RESULTS.mkdir(exist_ok=True)
        shutil.copyfile(log, RESULTS / f"engines-{time.strftime('%Y%m%dT%H%M%S')}-{log.name}")


def growth(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """What each counter gained between two readings (those that gained only)."""
    return {key: after[key] - before.get(key, 0) for key in sorted(after)
            if after[key] > before.get(key, 0)}


class Harness:
    """Drives one engine through the phases against one fresh control plane."""

    def __init__(self, engine: str, cluster: LocalCluster, workdir: Path, *, nodes: int,
                 pods: int, scheduler: bool, environ: Mapping[str, str] | None = None) -> None:
        """``environ``: the engine process's environment (fakefleet's engines)."""
        self.engine, self.cluster, self.workdir = engine, cluster, workdir
        self.environ = environ
        self.nodes, self.pods, self.scheduler = nodes, pods, scheduler
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        # Writers and watchers apart: a long watch never holds a writer's connection, and a
        # request queued behind 64 others under load is slow, not failed.
        self.client = Client.connect(access, connections=CONCURRENCY, timeout=300)
        self.watcher = Client.connect(access, connections=8)
        self.process: asyncio.subprocess.Process | None = None
        self.node_names: list[str] = []
        self.leases = LeaseGaps(self.watcher)
        self.node_tally: Tally
        self.ready_tally: Tally

    async def run(self) -> EngineRun:
        result = EngineRun(self.engine)
        node_tally = self.node_tally = Tally(self.watcher, "/api/v1/nodes", {}, node_ready)
        pod_tally = Tally(self.watcher, "/api/v1/pods", {}, pod_running)
        ready_tally = self.ready_tally = Tally(self.watcher, "/api/v1/pods", {}, pod_ready)
        node_tally.start()
        pod_tally.start()
        ready_tally.start()
        self.leases.start()
        try:
            await self._service_account()
            if self.engine == "kwok":
                await self._start_kwok()
            result.phases.append(await self._phase(
                "nodes Ready", self.nodes, self._make_nodes,
                lambda: node_tally.until(lambda t: t.matching >= self.nodes, PHASE_TIMEOUT)))
            self.node_names = await self._ready_node_names()
            result.phases.append(await self._phase(
                "pods Running (bound)", self.pods, self._make_pods,
                lambda: pod_tally.until(lambda t: t.matching >= self.pods, PHASE_TIMEOUT),
                running=True))
            result.phases.append(await self._phase(
                "pods deleted (bound)", self.pods, self._delete_pods,
                lambda: pod_tally.until(lambda t: t.present == 0, PHASE_TIMEOUT)))
            if self.scheduler and self.engine != "ceiling":
                result.phases.append(await self._phase(
                    "pods Running (scheduled)", self.pods, self._make_deployments,
                    lambda: pod_tally.until(lambda t: t.matching >= self.pods, PHASE_TIMEOUT),
                    running=True))
                result.phases.append(await self._phase(
                    "pods deleted (scheduled)", self.pods, self._delete_deployments,
                    lambda: pod_tally.until(lambda t: t.present == 0, PHASE_TIMEOUT)))
            result.peak_rss_mib, result.cpu_seconds = self._engine_usage()
            if self.engine in FAKEFLEET:
                result.held_back_seconds = held_back(self.workdir / f"{self.engine}.log")
        finally:
            keep_log(self.workdir / f"{self.engine}.log")
            await node_tally.stop()
            await pod_tally.stop()
            await ready_tally.stop()
            await self.leases.stop()
            await self._stop_engine()
            await self.client.close()
            await self.watcher.close()
        return result

    async def _phase(self, name: str, objects: int, act: Callable[[], Awaitable[None]],
                     done: Callable[[], Awaitable[bool]], *, running: bool = False) -> Phase:
        before, throttled_before, waits_before = await self._server_counts()
        lost, pods_lost = self.node_tally.lost, self.ready_tally.lost
        self.leases.restart()
        started = time.monotonic()
        waiting = asyncio.create_task(done())
        await act()
        completed = await waiting
        seconds = time.monotonic() - started if completed else None
        # The ceiling writes each Lease once and never renews it: no gaps to speak of.
        gap = self.leases.phase_worst() if self.engine != "ceiling" else None
        after, throttled_after, waits_after = await self._server_counts()
        delta = growth(before, after)
        waited = {}
        for level, (total, count) in waits_after.items():
            total_before, count_before = waits_before.get(level, (0.0, 0))
            if count > count_before:
                waited[level] = (total - total_before) / (count - count_before)
        not_ready = None
        if running and completed:
            await self.ready_tally.until(lambda t: t.matching >= self.pods, READY_GRACE)
            not_ready = self.ready_tally.present - self.ready_tally.matching
        return Phase(name, objects, seconds, delta, gap, self.node_tally.lost - lost,
                     self.ready_tally.lost - pods_lost, not_ready,
                     growth(throttled_before, throttled_after), waited)

    async def _server_counts(
        self,
    ) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[float, int]]]:
        """The API server's own counts so far: mutating requests (apiserver_request_total),
        requests APF answered 429, and APF's queue waits per priority level."""
        metrics = await self.watcher.get_text("/metrics")
        return mutating_requests(metrics), throttled_requests(metrics), queue_waits(metrics)

    async def _service_account(self) -> None:
        """Pods need the namespace's default ServiceAccount, made by the controller-manager."""
        deadline = time.monotonic() + 60
        while True:
            try:
                await self.client.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                return
            except NotFound:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _start_kwok(self) -> None:
        config = self.workdir / "kwok.yaml"
        config.write_text(kwok.stage_config())
        argv = kwok.kwok_argv(kwok.kwok_binary(), self.cluster.kubeconfig_path, config)
        await self._spawn(argv)

    async def _spawn(self, argv: list[str]) -> None:
        log = (self.workdir / f"{self.engine}.log").open("wb")
        self.process = await asyncio.create_subprocess_exec(
            *argv, stdout=log, stderr=asyncio.subprocess.STDOUT,
            env=dict(self.environ) if self.environ is not None else None)
        log.close()

    async def _make_nodes(self) -> None:
        if self.engine in FAKEFLEET:
            # As the operator runs it: its own identity in system:nodes, which APF serves as
            # it serves kubelets (the harness, an admin, is exempt).
            await authorizing.grant(self.client)
            await self._spawn([
                sys.executable, "-m", "operators.engine",
                "--kubeconfig", str(self.cluster.engine_kubeconfig_path),
                "--pool", f"{POOL}={self.nodes}", "--grace-cap", "0s",
                "--concurrency", str(CONCURRENCY)])
            return
        ready = self.engine == "ceiling"
        names = [f"{POOL}-{index}" for index in range(self.nodes)]

        async def create(name: str) -> None:
            await self.client.create("/api/v1/nodes", node_body(name, ready=ready))
            if ready:
                lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                         "metadata": {"name": name, "namespace": "kube-node-lease"},
                         "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                                  "renewTime": micro_time(time.time())}}
                await self.client.create(
                    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)

        await bounded([lambda n=name: create(n) for name in names])

    async def _ready_node_names(self) -> list[str]:
        listed = await self.client.get("/api/v1/nodes")
        return sorted(item["metadata"]["name"] for item in listed["items"] if node_ready(item))

    async def _make_pods(self) -> None:
        pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        nodes = self.node_names

        async def create(index: int) -> None:
            name = f"bench-{index}"
            created = await self.client.create(pods_path, pod_body(name, nodes[index % len(nodes)]))
            if self.engine == "ceiling":
                await self.client.patch(f"{pods_path}/{name}/status", {"status": {
                    "phase": "Running", "podIP": f"10.{index >> 16 & 255}.{index >> 8 & 255}."
                    f"{index & 255}", "conditions": [{"type": "Ready", "status": "True"}],
                    "containerStatuses": [{"name": "c", "image": "fake", "imageID": "",
                                           "ready": True, "restartCount": 0,
                                           "state": {"running": {"startedAt": created[
                                               "metadata"]["creationTimestamp"]}}}]}})

        await bounded([lambda i=index: create(i) for index in range(self.pods)])

    async def _delete_pods(self) -> None:
        pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"

        async def delete(index: int) -> None:
            path = f"{pods_path}/bench-{index}"
            try:
                await self.client.delete(path)
                if self.engine == "ceiling":  # what the kubelet does once containers stop
                    await self.client.delete(path, body={"gracePeriodSeconds": 0})
            except NotFound:
                pass

        await bounded([lambda i=index: delete(i) for index in range(self.pods)])

    def _deployments(self) -> list[tuple[str, int]]:
        size = 1000
        names = [(f"deploy-{i}", min(size, self.pods - i * size))
                 for i in range((self.pods + size - 1) // size)]
        return names

    async def _make_deployments(self) -> None:
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        for name, replicas in self._deployments():
            with contextlib.suppress(Conflict):
                await self.client.create(path, deployment_body(name, replicas))

    async def _delete_deployments(self) -> None:
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
        for name, _ in self._deployments():
            await self.client.delete(f"{path}/{name}",
                                     body={"propagationPolicy": "Background"})

    def _engine_usage(self) -> tuple[float | None, float | None]:
        if self.process is None or self.process.returncode is not None:
            return None, None
        pid = self.process.pid
        peak = None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return peak, (int(fields[11]) + int(fields[12])) / ticks

    async def _stop_engine(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def untraced_environment() -> dict[str, str]:
    """This process's environment with no OTLP endpoint: nothing exports spans."""
    return {name: value for name, value in os.environ.items()
            if name not in ENDPOINT_VARIABLES}


@contextlib.asynccontextmanager
async def collecting(directory: Path) -> AsyncIterator[CollectorInfo]:
    """The embedded collector as ``fakefleet up`` runs it (without fsync), in its own process,
    until the block ends."""
    files = CollectorFiles(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with files.log.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "federation.telemetry.collector", "--state-dir",
            str(directory), "--listen", "127.0.0.1:0", "--unsafe-no-fsync",
            stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + COLLECTOR_TIMEOUT
        while (info := CollectorInfo.read(files.info)) is None or info.pid != process.pid:
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the collector did not serve: see {files.log}")
            await asyncio.sleep(0.1)
        yield info
    finally:
        if process.returncode is None:
            process.terminate()
            await process.wait()


def stored_spans(directory: Path) -> int:
    """How many spans the collector in ``directory`` stored."""
    database = CollectorFiles(directory).database
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        count: int = db.execute("SELECT count(*) FROM spans").fetchone()[0]
        return count


async def run_engine(engine: str, binaries: binaries_.Binaries, workdir: Path, *, nodes: int,
                     pods: int, scheduler: bool,
                     limits: RequestLimits | None = None) -> EngineRun:
    """``limits``: the API server's request limits, if not the load profile's."""
    state = workdir / engine
    state.mkdir(parents=True)
    if engine != TRACED:
        return await _run_engine(engine, binaries, state, untraced_environment(),
                                 nodes=nodes, pods=pods, scheduler=scheduler, limits=limits)
    async with collecting(state / "collector") as collector:
        environ = {**untraced_environment(),
                   **exporter_environment(collector.endpoint, {})}
        result = await _run_engine(engine, binaries, state, environ, nodes=nodes, pods=pods,
                                   scheduler=scheduler, limits=limits)
    result.spans = stored_spans(state / "collector")
    return result


async def _run_engine(engine: str, binaries: binaries_.Binaries, state: Path,
                      environ: Mapping[str, str], *, nodes: int, pods: int,
                      scheduler: bool, limits: RequestLimits | None = None) -> EngineRun:
    async with Substrate(state, binaries, fsync=False, environ=environ) as substrate:
        cluster = await substrate.add_cluster("bench", ClusterOptions(profile=Profile.LOAD,
                                                                      limits=limits))
        harness = Harness(engine, cluster, state, nodes=nodes, pods=pods, scheduler=scheduler,
                          environ=environ if engine in FAKEFLEET else None)
        return await harness.run()


def ratio(ours: float | None, theirs: float | None) -> str:
    return f"{theirs / ours:.2f}" if ours and theirs else "-"


def report(runs: dict[str, EngineRun], console: Console, *, nodes: int, pods: int) -> None:
    table = Table(title=f"engines side by side: {nodes} nodes, {pods} pods, "
                        f"{os.cpu_count()} CPUs")
    table.add_column("phase")
    for engine in runs:
        table.add_column(f"{engine} s", justify="right")
        table.add_column(f"{engine} obj/s", justify="right")
    if "fakefleet" in runs and "kwok" in runs:
        table.add_column("fakefleet/kwok", justify="right")
    if "fakefleet" in runs and "ceiling" in runs:
        table.add_column("fakefleet/ceiling", justify="right")
    if "fakefleet" in runs and TRACED in runs:
        table.add_column(f"{TRACED}/fakefleet", justify="right")
    names = [phase.name for phase in max(runs.values(), key=lambda r: len(r.phases)).phases]
    for name in names:
        row = [name]
        found = {engine: next((p for p in run.phases if p.name == name), None)
                 for engine, run in runs.items()}
        for phase in found.values():
            row.append(f"{phase.seconds:.1f}" if phase and phase.seconds else
                       "timeout" if phase else "-")
            row.append(f"{phase.rate:.0f}" if phase and phase.rate else "-")
        ours = found.get("fakefleet")
        for other in ("kwok", "ceiling"):
            if "fakefleet" in runs and other in runs:
                theirs = found.get(other)
                row.append(ratio(ours.seconds if ours else None,
                                 theirs.seconds if theirs else None))
        if "fakefleet" in runs and TRACED in runs:
            traced = found.get(TRACED)
            row.append(ratio(traced.seconds if traced else None,
                             ours.seconds if ours else None))
        table.add_row(*row)
    for label, attribute in (("engine peak RSS (MiB)", "peak_rss_mib"),
                             ("engine CPU (s)", "cpu_seconds"),
                             ("pods held back for heartbeats (s)", "held_back_seconds"),
                             ("spans stored by the collector", "spans")):
        row = [label]
        for run in runs.values():
            value = getattr(run, attribute)
            row += [f"{value:.0f}" if value is not None else "-", ""]
        table.add_row(*row)
    console.print(table)
    writes = Table(title="mutating API requests per object during each phase (all clients)")
    writes.add_column("phase")
    for engine in runs:
        writes.add_column(engine, justify="right")
    writes.add_column("largest share (fakefleet)" if "fakefleet" in runs else "")
    for name in names:
        row = [name]
        for run in runs.values():
            phase = next((p for p in run.phases if p.name == name), None)
            row.append(f"{sum(phase.writes.values()) / phase.objects:.1f}" if phase else "-")
        ours = next((p for p in runs["fakefleet"].phases if p.name == name), None) \
            if "fakefleet" in runs else None
        if ours and ours.writes:
            top = sorted(ours.writes.items(), key=lambda item: -item[1])[:3]
            row.append(", ".join(f"{key} {count}" for key, count in top))
        else:
            row.append("")
        writes.add_row(*row)
    console.print(writes)
    gaps = Table(title="heartbeats: longest time any node went without a Lease renewal (s; "
                       "the node-lifecycle controller's grace is 50 s) / Ready nodes that "
                       "turned NotReady / Ready pods that turned not Ready / pods left not "
                       f"Ready {READY_GRACE:.0f} s after the phase")
    gaps.add_column("phase")
    renewing = [engine for engine in runs if engine != "ceiling"]
    for engine in renewing:
        gaps.add_column(engine, justify="right")
    for name in names:
        row = [name]
        for engine in renewing:
            phase = next((p for p in runs[engine].phases if p.name == name), None)
            left = "-" if phase is None or phase.pods_not_ready is None \
                else str(phase.pods_not_ready)
            row.append(f"{phase.lease_gap:.1f} / {phase.nodes_lost} / {phase.pods_lost} / {left}"
                       if phase and phase.lease_gap is not None else "-")
        gaps.add_row(*row)
    if renewing:
        console.print(gaps)
    fairness = Table(title="API Priority and Fairness during each phase: mean queue wait at "
                           "node-high (Leases, nodes) / system (the engine's pods) / "
                           "workload-high (scheduler, controllers), ms; requests answered 429")
    fairness.add_column("phase")
    for engine in runs:
        fairness.add_column(engine, justify="right")
    for name in names:
        row = [name]
        for run in runs.values():
            phase = next((p for p in run.phases if p.name == name), None)
            if phase is None:
                row.append("-")
                continue
            waits = " / ".join(f"{phase.queue_wait[level] * 1000:.0f}"
                               if level in phase.queue_wait else "-"
                               for level in ("node-high", "system", "workload-high"))
            row.append(f"{waits}; {sum(phase.throttled.values())}")
        fairness.add_row(*row)
    console.print(fairness)


def parse_limits(text: str) -> RequestLimits:
    read, _, mutating = text.partition(",")
    try:
        return RequestLimits(inflight=int(read), mutating=int(mutating))
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"--inflight {text!r}: expected two whole numbers above 0, READ,MUTATING, such as "
            f"60,40 ({error})") from None


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated subset of fakefleet,kwok,ceiling, and "
                             f"{TRACED} (fakefleet with tracing on)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="skip the Deployment (real scheduler) variant")
    parser.add_argument("--output", type=Path, default=None, help="write the JSON here too")
    parser.add_argument("--inflight", type=parse_limits, default=None, metavar="READ,MUTATING",
                        help="the API server's --max-requests-inflight and "
                             "--max-mutating-requests-inflight (default: the load profile's, "
                             "{0.inflight},{0.mutating})".format(LIMITS[Profile.LOAD]))
    parser.add_argument("--hog", action="store_true",
                        help="a reproducible slowdown: one busy process pinned to the last core "
                             "for the whole run (bench/hogging.py)")
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    unknown = set(engines) - {*ENGINES, TRACED}
    if unknown:
        parser.error(f"--engines: unknown {sorted(unknown)}; choose from "
                     f"{', '.join((*ENGINES, TRACED))}")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    binaries = binaries_.resolve()
    if "kwok" in engines:
        kwok.kwok_binary(progress=console.print)  # built (or found) before any timing starts
    runs: dict[str, EngineRun] = {}
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir, hog(args.hog):
        for engine in engines:
            console.print(f"[bold]{engine}[/]: {args.nodes} nodes, {args.pods} pods ...")
            runs[engine] = asyncio.run(run_engine(
                engine, binaries, Path(workdir), nodes=args.nodes, pods=args.pods,
                scheduler=not args.no_scheduler, limits=args.inflight))
    report(runs, console, nodes=args.nodes, pods=args.pods)
    payload = {
        "nodes": args.nodes, "pods": args.pods, "cpus": os.cpu_count(), "hog": args.hog,
        "requestLimits": dataclasses.asdict(args.inflight or LIMITS[Profile.LOAD]),
        "kwokVersion": kwok.KWOK_VERSION, "kubernetesVersion": binaries.version,
        "runs": {name: dataclasses.asdict(run) for name, run in runs.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"engines-{time.strftime('%Y%m%dT%H%M%S')}.json"
    for path in (out, args.output):
        if path is not None:
            path.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results: {out}")
    incomplete = [f"{name}: {p.name}" for name, run in runs.items() for p in run.phases
                  if p.seconds is None]
    if incomplete:
        raise SystemExit(f"phases that did not complete: {', '.join(incomplete)}")


if __name__ == "__main__":
    main()
