"""The fake kubelet of one member cluster, wired together: :class:`ClusterEngine`.

What it runs, and in which order (observe, then act):

1. the node watch fills the book (:mod:`~operators.engine.inventory`): the engine's own nodes
   are adopted as they are, foreign ones reported;
2. every Lease is read once and each renewal resumes from its ``renewTime``
   (:mod:`~operators.engine.heartbeating`), so adopted nodes heartbeat before anything else;
3. once the desired pools are known (:mod:`~operators.engine.pooling`), the reconcile loop
   makes the nodes match them (:mod:`~operators.engine.registering`), then the DRA devices of
   their GPUs (:mod:`~operators.engine.publishing`), and the pods bound to the nodes live
   through their stages (:mod:`~operators.engine.lifecycle`).

All along, the member's fault sets are watched (:mod:`~operators.engine.faultsets`): the fault
entries they carry for a node or pod come before its default stages, so nothing of 2. and 3.
starts before they are listed.

Design for scale: node state is a small slotted record per node, all timers live in delay
queues, requests go through bounded connection pools (heartbeats on their own), a node's status
is rewritten rarely. Only fault stages whose entry carries a trace context are traced, a span per
batch of them (:mod:`~operators.engine.tracing`); everything else makes no span.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace

from operators.api.durations import parse_duration
from operators.api.faultsets import Kind
from operators.api.injections import FaultEntry
from operators.api.nodepools import FakeNodePoolSpec
from operators.controlplane.pki import KubeletPKI
from operators.engine import nodes, streaming
from operators.engine.alerting import NODE_GRACE, GapAlarm
from operators.engine.caching import Bodies
from operators.engine.certifying import NodeCertificates
from operators.engine.faultsets import FaultSets
from operators.engine.heartbeating import NODES, Heartbeats
from operators.engine.inventory import NodeBook
from operators.engine.kubeletapi import KubeletAPIServer
from operators.engine.lifecycle import PodLifecycle
from operators.engine.logserving import LogServer
from operators.engine.nodes import NodeFacts
from operators.engine.pods import PodFacts, PodLife
from operators.engine.pooling import ClusterRef, Pools
from operators.engine.publishing import Publisher
from operators.engine.recording import EventRecorder
from operators.engine.registering import Registrar
from operators.engine.scripting import GPU, PodSight, Scripts, gpus_on, sight
from operators.engine.serving import KubeletServer
from operators.engine.stages import (
    LogRule,
    Rulebook,
    Rules,
    Timing,
    default_lifecycle,
    default_rules,
)
from operators.engine.timers import ClockTimers
from operators.engine.tracing import FaultBatches
from operators.engine.usage import UsageBook
from operators.k8s.client import Client
from operators.k8s.errors import K8sError
from operators.k8s.retrying import Backoff
from operators.k8s.watching import list_and_watch
from operators.metrics import application, dcgm, kubelet
from primitives.clocks import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)


def pod_timing(spec: FakeNodePoolSpec) -> Timing:
    """The pool's pod timing, in seconds."""
    behaviour = spec.pods
    return Timing(
        start_delay=parse_duration(behaviour.startDelay),
        start_jitter=parse_duration(behaviour.startJitter),
        init_delay=parse_duration(behaviour.initDelay),
        job_run_time=parse_duration(behaviour.jobRunTime),
        job_run_jitter=parse_duration(behaviour.jobRunJitter),
        grace_cap=parse_duration(behaviour.terminationGracePeriodCap),
    )


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    concurrency: int = 32
    pod_concurrency: int = 64
    #: The heartbeats' connections, and the most renewals in flight: the ceiling of the window
    #: that the API server's 429s shrink (:mod:`~operators.engine.windowing`).
    heartbeat_connections: int = 384
    resync_interval: float = 30.0
    heartbeat_batch: int = 256
    #: Heartbeats this late (seconds past due) hold the pod lifecycle back until they catch
    #: up: with renewals stretched to at most 35 s, still inside the node-lifecycle
    #: controller's 50 s grace (node-monitor-grace-period); a tenth of a shorter grace.
    heartbeat_slack: float = 5.0
    status_interval: float = 1.0
    #: The member's node-lifecycle controller's grace period (``--node-monitor-grace-period``):
    #: a renewal gap past 3/4 of it says the pool's heartbeats are at risk.
    node_grace: float = NODE_GRACE
    #: The port of the nodes' kubelet endpoints and the DCGM endpoint (0: any free one);
    #: None: no usage is measured and nothing is served.
    kubelet_port: int | None = None
    #: The port of the nodes' kubelet API over TLS (0: any free one), served when the engine
    #: has the member's kubelet PKI.
    kubelet_tls_port: int = 0


class ClusterEngine:
    """Nodes and pods of one member cluster; :meth:`run` until cancelled."""

    def __init__(
        self,
        cluster: str,
        client: Client,
        *,
        heartbeat_client: Client | None = None,
        host: Client | None = None,
        serves: ClusterRef | None = None,
        pools: Mapping[str, FakeNodePoolSpec] | None = None,
        settings: EngineSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
        rules: Rules | None = None,
        on_latency: Callable[[float], None] | None = None,
        tracer: trace.Tracer | None = None,
        kubelet_pki: KubeletPKI | None = None,
        scripts: Scripts | None = None,
    ) -> None:
        """``tracer`` makes the spans of fault writes (default: the API's global one, which
        makes none until the entry point configured the SDK); ``kubelet_pki``: the member's
        kubelets' CA, with which the engine serves the kubelet API over TLS (None: it serves
        none, and the nodes advertise the plain port); ``scripts``: what exec'd commands and
        forwarded ports answer (default: the default Lifecycle's)."""
        self.cluster = cluster
        self.client = client
        self.settings = settings = settings or EngineSettings()
        self._clock = clock
        self.rulebook = rulebook = Rulebook(rules or default_rules())
        rng = rng or random.Random()
        # Heartbeats have connections of their own: pod churn must never delay a renewal
        # past the node-monitor grace period.
        self.heartbeat_client = heartbeat_client or client
        self.recorder = EventRecorder(cluster, client, clock=clock)
        # Spans name the FakeCluster (as the plan's spans do), not the engine's own name.
        self.traces = FaultBatches(serves.name if serves else cluster, clock=clock,
                                   tracer=tracer)
        self.faults = FaultSets(cluster, client, self, self.recorder, clock=clock)
        self.book = NodeBook(cluster, self)
        self.publisher = Publisher(cluster, client, self.book, clock=clock,
                                   concurrency=settings.concurrency, on_change=self._changed,
                                   recorder=self.recorder)
        self.alarm = GapAlarm(cluster, grace=settings.node_grace,
                              on_change=lambda: self.pools.touch())
        self.heartbeats = Heartbeats(cluster, self.heartbeat_client, self.book, rulebook,
                                     self.recorder, faults=self.faults, clock=clock, rng=rng,
                                     connections=settings.heartbeat_connections,
                                     batch=settings.heartbeat_batch,
                                     slack=min(settings.heartbeat_slack,
                                               settings.node_grace / 10),
                                     loaded=self._loaded,
                                     traces=self.traces, gpus=self.publisher,
                                     alarm=self.alarm)
        self.registrar = Registrar(cluster, client, self.book, self.heartbeats, clock=clock,
                                   concurrency=settings.concurrency)
        self.pools = Pools(clock=clock, counts=self.book.counts, problem=self._problem,
                           on_change=self._changed, host=host, cluster=serves, fixed=pools,
                           interval=settings.status_interval, on_latency=on_latency,
                           heartbeats=self.alarm.condition)
        serving = settings.kubelet_port is not None
        self.usage = UsageBook(pool_of=self._pool_of, created=self._created) \
            if serving else None
        self.bodies = Bodies(self._render_node, clock=clock)
        self.server = KubeletServer(self, port=settings.kubelet_port or 0) if serving else None
        self.logs = LogServer(self, clock=clock)
        self.session_timers = ClockTimers(clock=clock)
        upgrader = streaming.Upgrader(pods=self, scripts=scripts or Scripts(default_lifecycle()),
                                      timers=self.session_timers)
        self.kubelet_api = KubeletAPIServer(
            self.node_at, self.logs, NodeCertificates(kubelet_pki, self.node_at),
            upgrader=upgrader, metrics=self.resource_metrics if serving else None,
            port=settings.kubelet_tls_port) if kubelet_pki is not None else None
        self.pods = PodLifecycle(cluster, client, self, self.recorder, clock=clock,
                                 rules=rulebook, faults=self.faults,
                                 concurrency=settings.pod_concurrency,
                                 throttle=self.heartbeats.behind, traces=self.traces,
                                 usage=self.usage, on_life=self.logs.changed)
        self._timings: dict[str, tuple[FakeNodePoolSpec, Timing]] = {}
        self._warned: set[str] = set()
        self._listed = asyncio.Event()
        self._dirty = asyncio.Event()
        self.synced = asyncio.Event()  # the nodes match the pools once

    async def close(self) -> None:
        """Release the engine's connections (after :meth:`run` was cancelled)."""
        await self.client.close()
        if self.heartbeat_client is not self.client:
            await self.heartbeat_client.close()

    # -- the loops ----------------------------------------------------------------------------

    async def run(self) -> None:
        await self._connect()
        async with contextlib.AsyncExitStack() as servers:
            # Before any node is made: each advertises the port as its kubelet's, the TLS
            # one when there is one (the API server's way in; scrapers are given the plain
            # one).
            for server in (self.server, self.kubelet_api):
                if server is not None:
                    self.registrar.kubelet_port = await server.start()
                    servers.push_async_callback(server.close)
            await self._run()

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.recorder.run(), name=f"engine:{self.cluster}:events")
            group.create_task(self.traces.run(), name=f"engine:{self.cluster}:traces")
            group.create_task(self.pools.run(), name=f"engine:{self.cluster}:pools")
            group.create_task(self.publisher.run(), name=f"engine:{self.cluster}:slices")
            group.create_task(self.faults.run(), name=f"engine:{self.cluster}:faults")
            group.create_task(self.logs.run(), name=f"engine:{self.cluster}:logs")
            group.create_task(self.session_timers.run(),
                              name=f"engine:{self.cluster}:session-timers")
            group.create_task(list_and_watch(
                self.client, NODES, {"labelSelector": nodes.MANAGED_SELECTOR},
                on_list=self._nodes_listed, on_event=self.book.changed, clock=self._clock),
                name=f"engine:{self.cluster}:nodes")
            await self._listed.wait()
            # Not one stage before the faults are known: the defaults would undo them.
            await self.faults.listed.wait()
            self._restore_gpus()
            await self.heartbeats.resume()
            group.create_task(self.heartbeats.run(), name=f"engine:{self.cluster}:heartbeats")
            await self.pools.known.wait()
            group.create_task(self._reconcile_loop(), name=f"engine:{self.cluster}:reconcile")
            group.create_task(self.pods.run(), name=f"engine:{self.cluster}:pods")

    async def _connect(self) -> None:
        """Learn the member's version (the nodes' kubeletVersion); wait for it to answer."""
        backoff = Backoff()
        while True:
            try:
                version = await self.client.get("/version")
                break
            except K8sError as error:
                delay = backoff.next()
                logger.warning("engine %s: the API server does not answer yet, retrying in "
                               "%.1fs: %s", self.cluster, delay, error)
                await self._clock.sleep(delay)
        self.registrar.kubelet_version = str(version.get("gitVersion", ""))

    def _nodes_listed(self, items: list[Any]) -> None:
        self.book.relisted(items)
        self._listed.set()
        self._dirty.set()

    def _changed(self) -> None:
        self._dirty.set()

    def _loaded(self) -> bool:
        """More is due than the API server takes: pods wait for a connection, or nodes (or
        their slices) come in a burst."""
        return self.pods.busy() or self.registrar.busy or self.publisher.busy

    def _problem(self, pool: str) -> str:
        """Why the pool's nodes are not as it asks (its Stalled condition), "" if they are."""
        return self.registrar.problems.get(pool) or self.publisher.problems.get(pool, "")

    async def _reconcile_loop(self) -> None:
        backoff = Backoff(base=1.0, cap=30.0)
        while True:
            await self._clock.wait(self._dirty, self.settings.resync_interval)
            self._dirty.clear()
            desired = self.pools.desired
            done = await self.registrar.reconcile(desired, self.pools.held)
            # The devices of the nodes just made, after them: a slice needs its owner's uid.
            done &= await self.publisher.reconcile(desired)
            self.pools.acted(desired)
            if done:
                backoff.reset()
                self.synced.set()
                continue
            delay = backoff.next()
            logger.info("engine %s: some node writes failed; reconciling again in %.1fs",
                        self.cluster, delay)
            await self._clock.sleep(delay)
            self._dirty.set()

    # -- what the book tells (inventory.Listener) -------------------------------------------

    def adopted(self, name: str) -> None:
        self.heartbeats.track(name)
        self.pools.touch()
        self.pods.node_played(name)  # pods bound to it before its record came

    def updated(self, name: str) -> None:
        self.heartbeats.evaluate(name)
        self.pools.touch()
        if self.node_ready(name):
            self.pods.node_recovered(name)

    def forgotten(self, name: str) -> None:
        self.heartbeats.untrack(name)
        if self.usage is not None:
            self.usage.node_gone(name)
        self.pools.touch()
        self._dirty.set()  # deleted by someone else: made again if still wanted

    def vanished(self, name: str) -> None:
        self.pods.node_gone(name)

    def provisioned(self, facts: NodeFacts) -> None:
        self._dirty.set()  # taken over in the next reconcile

    def foreign(self, facts: NodeFacts) -> None:
        self.pods.node_gone(facts.name)  # never played as it is: its pods are not kept
        if facts.uid in self._warned:
            return
        self._warned.add(facts.uid)
        logger.warning("engine %s: %s", self.cluster, facts.problem)
        self.recorder.emit(kind="Node", name=facts.name, uid=facts.uid, event_type="Warning",
                           reason="NodeNotManaged", message=facts.problem, host=facts.name)
        self._dirty.set()

    def carried(self, name: str) -> Iterable[FaultEntry]:
        return [carried.entry for carried in self.faults.node(name)]

    # -- what the fault sets tell, and ask (faultsets.Listener) ------------------------------

    def faults_changed(self, kind: Kind, targets: Iterable[str]) -> None:
        for target in targets:
            if kind == "Node":
                self.heartbeats.evaluate(target)
            else:
                self.pods.faults_changed(target)

    def present(self, kind: Kind, target: str) -> bool | None:
        if kind == "Pod":
            return self.pods.runs(target)
        return target in self.book.records if self._listed.is_set() else None

    def _restore_gpus(self) -> None:
        """Nodes adopted before the sets were known get their GPUs as the entries in force
        left them (after a restart)."""
        for name, record in self.book.records.items():
            record.life = dataclasses.replace(
                record.life, gpus=nodes.gpus_from_entries(self.carried(name)))

    # -- what the pod half asks of the nodes (lifecycle.NodeDirectory) ----------------------

    def node_slot(self, node: str) -> int | None:
        record = self.book.records.get(node)
        return record.slot if record is not None else None

    def node_coming(self, node: str) -> bool:
        return self.book.coming(node)

    def node_ip(self, node: str) -> str:
        record = self.book.records.get(node)
        return nodes.node_ip(record.slot) if record is not None else ""

    def node_ready(self, node: str) -> bool:
        record = self.book.records.get(node)
        facts = self.book.facts.get(node)
        return record is not None and record.life.heartbeat and facts is not None and \
            facts.ready == "True"

    # -- what the logs are made of (logserving.Pods) -----------------------------------------

    def named(self, namespace: str, name: str) -> tuple[PodFacts, PodLife] | None:
        return self.pods.named(namespace, name)

    def log_rules(self, uid: str) -> Sequence[LogRule]:
        return self.rulebook(self.faults.pod(uid)).logs

    # -- what exec, attach and port-forward see (streaming.Pods) ---------------------------

    def pod(self, node: str, namespace: str, name: str) -> PodSight | None:
        found = self.pods.named(namespace, name)
        if found is None or found[0].node != node:
            return None
        facts, life = found
        return sight(facts, life, self._gpus_held(facts.uid, node))

    def _gpus_held(self, uid: str, node: str) -> dict[str, tuple[GPU, ...]]:
        """The GPUs each container of pod ``uid`` holds, as the DCGM endpoint allocates them
        (none known when the engine measures no usage)."""
        record = self.book.records.get(node)
        spec = self.pools.spec(record.pool) if record is not None else None
        if self.usage is None or record is None or spec is None or spec.gpu is None:
            return {}
        preset = spec.gpu.preset
        return {container: gpus_on(self.cluster, node, preset, indices)
                for container, indices in self.usage.held(uid, spec.gpus_per_node,
                                                          record.life).items()}

    # -- what the endpoints show (serving.Source) --------------------------------------------

    def node_at(self, address: str) -> str | None:
        slot = nodes.slot_of(address)
        return self.book.by_slot.get(slot) if slot is not None else None

    def resource_metrics(self, node: str) -> bytes:
        assert self.usage is not None, "served only when usage is measured"
        return self.bodies.get(node, self.usage.version(node))

    def _render_node(self, node: str, now: float) -> bytes:
        assert self.usage is not None, "served only when usage is measured"
        return kubelet.render(self.usage.node_sample(node, now)).encode()

    def dcgm_metrics(self) -> bytes:
        assert self.usage is not None, "served only when usage is measured"
        now = self._clock.now()
        samples: list[dcgm.GPUSample] = []
        for name in sorted(self.book.records):
            record = self.book.records[name]
            spec = self.pools.spec(record.pool)
            if spec is not None and spec.gpu is not None:
                samples += self.usage.gpu_samples(self.cluster, name, spec, record.life, now)
        return dcgm.render(samples).encode()

    def pod_metrics(self, node: str, namespace: str, name: str) -> bytes | None:
        assert self.usage is not None, "served only when usage is measured"
        sample = self.usage.application_sample(node, namespace, name, self._clock.now())
        return application.render(sample).encode() if sample is not None else None

    def _pool_of(self, node: str) -> tuple[str, FakeNodePoolSpec] | None:
        record = self.book.records.get(node)
        spec = self.pools.spec(record.pool) if record is not None else None
        return (record.pool, spec) if record is not None and spec is not None else None

    def _created(self, node: str) -> str:
        facts = self.book.facts.get(node)
        return facts.created if facts is not None else ""

    def pod_timing(self, node: str) -> tuple[Timing, int]:
        record = self.book.records.get(node)
        spec = self.pools.spec(record.pool) if record is not None else None
        if spec is None or record is None:
            return Timing(), 0
        cached = self._timings.get(record.pool)
        if cached is None or cached[0] is not spec:
            cached = (spec, pod_timing(spec))
            self._timings[record.pool] = cached
        return cached[1], spec.pods.seed
