"""The node half's timers: Lease renewals, and the node stages (conditions, status reports,
heartbeat on or off), on connections and a dispatcher of their own.

Liveness travels through Leases, renewed every quarter of their duration as the kubelet does
(spread by ±4 % so renewals do not bunch up; at most every fifth of a node-monitor grace
shorter than the default), stretched while the API server cannot keep up
(:class:`Pace`: how much is due); as many in flight as the API server serves
(:class:`~operators.engine.windowing.Window`: how much goes out). The two are not one: Pace
makes fewer renewals due when they go out late or the server is slow, the window sends what is
due no faster than the server answers it without 429s. A renewal answered 429 is not waited out
(the client does not sleep its ``Retry-After`` holding a connection) nor backed off: it shrinks
the window and goes back into the queue at its due time, ahead of every renewal due after it,
and goes out as soon as the window has room, most overdue first. Node stages share the window
(the API server puts their writes in the same flow). A node's status is rewritten only when a
stage says so (every 5 minutes by default, at once when its conditions change). A restarted
engine resumes every renewal from its Lease's ``renewTime``, so no node waits longer than it
would have. Renewals have their own connections: pod churn must never delay them past the
node-lifecycle controller's grace period. How late they go out is measured (``lag``): the pod
half holds back while they are behind.

Every renewal gap is measured against the node-lifecycle controller's grace: one a renewal
closes, and every few seconds those still open (:class:`~operators.engine.alerting.GapAlarm`
says when a pool's heartbeats are at risk).

Every write is committed after it succeeded: a node's life changes only once its status says
so; a failed write is retried with back-off, from the life as it was (one answered 429 as
soon as the window has room).

A node's stages are those of the fault entries its fault sets carry for it
(:mod:`~operators.engine.faultsets`), then the defaults
(:class:`~operators.engine.stages.Rulebook`). A stage first takes GPUs out of service or
back (``gpus``: their DRA devices, :mod:`~operators.engine.publishing`), then writes the
status (conditions, allocatable), then, if it has any, the Node itself: taints and
spec.unschedulable, conditional on the resourceVersion the status write returned and computed
again after a 409 (:mod:`~operators.k8s.patching`). The life and facts are committed after;
an ``endFault`` stage's entry is done for the node only once everything it asked for is
written.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from operators.engine import nodes, stages
from operators.engine.alerting import NODE_GRACE, GapAlarm
from operators.engine.dispatching import Dispatcher
from operators.engine.faultsets import FaultSets
from operators.engine.inventory import NodeBook, NodeRecord
from operators.engine.nodes import NodeFacts
from operators.engine.queues import DelayQueue
from operators.engine.recording import EventRecorder
from operators.engine.stages import NodeRule, Rulebook
from operators.engine.tracing import FaultBatches
from operators.engine.windowing import Window
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound, TooManyRequests
from operators.k8s.patching import patch_until_current
from operators.k8s.requests import STRATEGIC_PATCH
from operators.k8s.retrying import Backoff
from operators.k8s.times import micro_time, parse, rfc3339
from operators.k8s.watching import list_all
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
NODES = "/api/v1/nodes"
RENEW_FRACTION = 0.25  # the kubelet renews its lease every quarter of its duration
RENEW_JITTER = 0.04
STRETCHED_SPREAD = 0.25
RETRY_BASE = 1.0
#: How often the gaps still open are measured (seconds).
GAP_CHECK = 2.5
#: How often, at most, a change of the renewal window is logged (seconds).
WINDOW_LOG = 10.0


class GPUService(Protocol):
    """Where a node's GPUs go out of service and back (:mod:`~operators.engine.publishing`)."""

    async def set_gpu_health(self, node: str, indices: Sequence[int], *, healthy: bool,
                             reason: str) -> None: ...


class Heartbeats:
    """Leases and node stages of one cluster's nodes."""

    def __init__(
        self,
        cluster: str,
        client: Client,
        book: NodeBook,
        rules: Rulebook,
        recorder: EventRecorder,
        *,
        faults: FaultSets,
        clock: Clock,
        rng: random.Random,
        connections: int,
        batch: int,
        slack: float,
        loaded: Callable[[], bool] = lambda: False,
        traces: FaultBatches,
        gpus: GPUService | None = None,
        alarm: GapAlarm | None = None,
    ) -> None:
        self.cluster = cluster
        self._gpus = gpus
        self.alarm = alarm or GapAlarm(cluster)
        # 429s come back to the heartbeats at once: they steer the window by them.
        self.client = client.self_paced()
        self._traces = traces
        self._book = book
        self._rules = rules
        self._faults = faults
        self._recorder = recorder
        self._clock = clock
        self._rng = rng
        self._slack = slack
        self._loaded = loaded
        self.pace = Pace(clock, grace=self.alarm.grace)
        self._timers: DelayQueue[tuple[str, str]] = DelayQueue(clock)
        self.window = Window(connections)
        self._dispatcher = Dispatcher(self._timers, self._due, clock=clock, limit=connections,
                                      batch=batch, name=f"engine {cluster}: heartbeats",
                                      window=self.window)
        self._logged_window = (self.window.limit, 0)  # (size, 429s) as last logged
        self._window_logged_at = float("-inf")
        self._pending: dict[str, NodeRule] = {}
        self._resumed = False
        self.lag = 0.0  # how late the latest renewal went out

    def behind(self) -> bool:
        """True while Lease renewals go out more than ``slack`` seconds late."""
        return self.lag > self._slack

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._dispatcher.run())
            group.create_task(self._measure_open_gaps())

    async def _measure_open_gaps(self) -> None:
        """Every GAP_CHECK seconds: how long each heartbeating node's Lease has gone without
        a renewal (a renewal late in a queue, or failing, must not wait for its end to tell)."""
        while True:
            await self._clock.sleep(GAP_CHECK)
            now = self._clock.now()
            for name, record in self._book.records.items():
                if record.life.heartbeat and record.renewed_at:
                    self.alarm.measured(record.pool, name, now - record.renewed_at, now)
            self.alarm.review(now)
            self._log_window(now)

    def _log_window(self, now: float) -> None:
        """Say how the window moved, at most every WINDOW_LOG seconds and only if it did."""
        size, throttled = self.window.limit, self.window.throttled_total
        was, throttled_before = self._logged_window
        if size == was or now - self._window_logged_at < WINDOW_LOG:
            return
        self._logged_window, self._window_logged_at = (size, throttled), now
        logger.info("engine %s: heartbeats: %d renewals in flight at most (was %d; %d answered "
                    "429 since; the latest went out %.1fs late)", self.cluster, size, was,
                    throttled - throttled_before, self.lag)

    # -- what the book tells ------------------------------------------------------------------

    def track(self, name: str) -> None:
        """A node to keep alive (created, or adopted)."""
        record = self._book.records[name]
        if self._resumed and not record.renew_at:
            # Adopted after the Leases were read: renew now rather than guess its renewTime.
            record.renew_at = self._clock.now()
            self._schedule(("lease", name), record.renew_at)
        self.evaluate(name)

    def untrack(self, name: str) -> None:
        self._timers.cancel(("lease", name))
        self._timers.cancel(("stage", name))
        self._pending.pop(name, None)

    def evaluate(self, name: str) -> None:
        """Choose the node's next stage (its facts or life changed); a hold chooses none."""
        record = self._book.records.get(name)
        facts = self._book.facts.get(name)
        if record is None or facts is None:
            return
        rule = stages.match_node(self._rules(self._faults.node(name)).nodes, facts,
                                 record.life)
        if rule is None or rule.is_hold:
            self._pending.pop(name, None)
            self._timers.cancel(("stage", name))
            return
        if self._pending.get(name) is rule and ("stage", name) in self._timers:
            return  # already due at the right time: a status echo must not postpone it
        self._pending[name] = rule
        self._schedule(("stage", name), stages.node_due(rule, record.life, self._rng))

    async def resume(self) -> None:
        """Read every Lease once and schedule each node's renewal from its ``renewTime``."""
        backoff = Backoff()
        while True:
            try:
                _, leases = await list_all(self.client, LEASES, {})
                break
            except K8sError as error:
                delay = backoff.next()
                logger.warning("engine %s: listing leases failed, retrying in %.1fs: %s",
                               self.cluster, delay, error)
                await self._clock.sleep(delay)
        by_name = {lease["metadata"]["name"]: lease for lease in leases}
        now = self._clock.now()
        for name, record in self._book.records.items():
            lease = by_name.get(name)
            if lease is None:
                record.leased, record.renew_at = False, now
            else:
                spec = lease.get("spec") or {}
                record.lease_duration = int(spec.get("leaseDurationSeconds")
                                            or record.lease_duration)
                renewed = parse(spec["renewTime"]) if spec.get("renewTime") else 0.0
                record.renewed_at = renewed  # the gap across the restart counts too
                record.renew_at = max(now, renewed + self._interval(record))
            self._schedule(("lease", name), record.renew_at)
        self._resumed = True

    # -- writes --------------------------------------------------------------------------------

    async def create_lease(self, name: str, record: NodeRecord) -> None:
        """Register, then hold a Lease, as the kubelet does: a new node whose Lease waited
        behind thousands of renewals would be marked NotReady before it ever renewed."""
        try:
            await self._create_lease(name, record)
        except K8sError as error:
            logger.debug("engine %s: lease of %s not created yet: %s", self.cluster, name, error)
            # The node-lifecycle controller counts a new node's grace from its creation.
            record.renewed_at = record.renewed_at or self._clock.now()
            record.leased = False
            record.renew_at = self._clock.now()
            self._schedule(("lease", name), record.renew_at)
            return
        self._renewed(name, record)

    def _due(self, key: tuple[str, str]) -> Coroutine[Any, Any, None] | None:
        kind, name = key
        record = self._book.records.get(name)
        if record is None:
            return None
        if kind == "lease":
            return self._renew(name, record) if record.life.heartbeat else None
        rule = self._pending.get(name)
        if rule is None:
            return None
        if rule.traceparent:
            return self._traced_stage(name, record, rule)
        return self._stage(name, record, rule)

    async def _traced_stage(self, name: str, record: NodeRecord, rule: NodeRule) -> None:
        """A fault's stage, in the batch span of its entry's trace context."""
        with self._traces.writing(rule.traceparent, kind="Node", name=name, stage=rule.name,
                                  entry=rule.entry):
            await self._stage(name, record, rule)

    async def _renew(self, name: str, record: NodeRecord) -> None:
        if not record.life.heartbeat:
            return  # stopped by a stage that came due with it (a restart adopting it silent)
        started = self._clock.now()
        lag = max(0.0, started - record.renew_at) if record.renew_at else 0.0
        self.lag = lag
        epoch = self.window.epoch
        try:
            if record.leased:
                try:
                    await self.client.patch(f"{LEASES}/{name}",
                                            {"spec": {"renewTime": micro_time(started)}},
                                            decode=False)
                except NotFound:
                    await self._create_lease(name, record)
            else:
                await self._create_lease(name, record)
        except TooManyRequests as error:
            self.window.throttled(epoch, self._clock.now(), error.retry_after)
            # Not backed off: back in the queue at its due time, before those due after it.
            self._schedule(("lease", name), record.renew_at or self._clock.now())
            return
        except K8sError as error:
            self._retry(("lease", name), record, f"renewing the lease of {name}", error)
            return
        self.window.succeeded(self._dispatcher.in_flight)
        self.pace.observe(lag, self._clock.now() - started, loaded=self._loaded())
        record.failures = 0
        self._renewed(name, record)

    async def _create_lease(self, name: str, record: NodeRecord) -> None:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name, "namespace": LEASE_NAMESPACE,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                     "uid": record.uid}],
            },
            "spec": {"holderIdentity": name, "leaseDurationSeconds": record.lease_duration,
                     "renewTime": micro_time(self._clock.now())},
        }
        try:
            await self.client.create(LEASES, lease, decode=False)
        except Conflict:  # there already (a lost answer, or a restart): renew it
            await self.client.patch(f"{LEASES}/{name}",
                                    {"spec": {"renewTime": micro_time(self._clock.now()),
                                              "leaseDurationSeconds": record.lease_duration}},
                                    decode=False)
        record.leased = True

    def _renewed(self, name: str, record: NodeRecord) -> None:
        now = self._clock.now()
        if record.renewed_at:
            self.alarm.measured(record.pool, name, now - record.renewed_at, now)
        record.renewed_at = now
        record.renew_at = now + self._interval(record)
        self._schedule(("lease", name), record.renew_at)

    def _interval(self, record: NodeRecord) -> float:
        interval = self.pace.interval(record.lease_duration)
        if self.pace.stretch > 1.0:
            # Stretched, the interval is a longest gap: renewals anywhere in its last quarter
            # spread the nodes of a burst (thousands made in seconds) over the whole interval
            # within a few rounds, so they do not all come due in the same seconds.
            return interval * self._rng.uniform(1 - STRETCHED_SPREAD, 1.0)
        return interval * self._rng.uniform(1 - RENEW_JITTER, 1 + RENEW_JITTER)

    async def _stage(self, name: str, record: NodeRecord, rule: NodeRule) -> None:
        facts = self._book.facts.get(name)
        if facts is None:
            return
        now = rfc3339(self._clock.now())
        effect = rule.stage.effect
        before = record.life
        after = stages.apply_node(effect, before, now, facts.conditions)
        status = stages.node_status(effect, facts, before, after)
        whole = stages.writes_node(effect) or bool(effect.allocatable)
        seen: NodeFacts | None = None  # the node as a write answered, when it matters
        gpus = effect.gpus
        epoch = self.window.epoch
        try:
            if gpus is not None and (gpus.healthy is not None or gpus.reset) \
                    and self._gpus is not None:
                # First: a stage whose status is written is not chosen again, so what it does
                # to the devices must be done by then (done twice, it changes nothing).
                await self._gpus.set_gpu_health(
                    name, gpus.indices, healthy=gpus.reset or bool(gpus.healthy),
                    reason=f"Xid{gpus.xid}" if gpus.xid else "Unhealthy")
            if status is not None:
                written = await self.client.patch(f"{NODES}/{name}/status", {"status": status},
                                                  content_type=STRATEGIC_PATCH, decode=whole)
                seen = nodes.observe(written, self.cluster) if whole else None
            if stages.writes_node(effect):
                seen = await self._write_node(name, rule, seen or facts, now)
        except NotFound:
            return  # deleted: the watch takes it from here
        except TooManyRequests as error:
            self._traces.failed(error)
            self.window.throttled(epoch, self._clock.now(), error.retry_after)
            self._schedule(("stage", name), self._clock.now())  # when the window has room
            return
        except K8sError as error:
            self._traces.failed(error)
            self._retry(("stage", name), record, f"{rule.name} on {name}", error)
            return
        self.window.succeeded(self._dispatcher.in_flight)
        record.failures = 0
        self._book.wrote(name, after, seen)
        if effect.endFault and rule.entry:
            self._faults.finished(rule.entry, rule.state, "Node", name)
        logger.debug("engine %s: %s on %s", self.cluster, rule.name, name)
        for event in rule.stage.effect.events:
            self._recorder.emit(kind="Node", name=name, uid=record.uid, event_type=event.type,
                                reason=event.reason, message=event.message, host=name)
        if after.heartbeat and not before.heartbeat:
            record.renewed_at = 0.0  # its silence was asked for: no gap to measure
            self._schedule(("lease", name), self._clock.now())
        self._pending.pop(name, None)
        self.evaluate(name)  # the next stage, from the life just committed

    async def _write_node(self, name: str, rule: NodeRule, facts: NodeFacts,
                          now: str) -> NodeFacts:
        """Write what ``rule`` changes of the Node itself; the node as last written or read."""
        path = f"{NODES}/{name}"

        def reread(node: Any) -> NodeFacts | None:
            fresh = nodes.observe(node, self.cluster)
            return fresh if fresh is not None and fresh.uid == facts.uid else None

        written, latest = await patch_until_current(
            self.client, path, facts, lambda node: stages.node_object(rule, node, now), reread)
        if written is None:
            return latest
        return nodes.observe(written, self.cluster) or latest

    def _retry(self, key: tuple[str, str], record: NodeRecord, what: str,
               error: K8sError) -> None:
        record.failures += 1
        delay = min(RETRY_BASE * 2 ** (record.failures - 1), record.lease_duration * 0.25)
        logger.debug("engine %s: %s failed (retry in %.1fs): %s", self.cluster, what, delay,
                     error)
        self._schedule(key, self._clock.now() + delay * self._rng.uniform(0.5, 1.0))

    def _schedule(self, key: tuple[str, str], when: float) -> None:
        self._timers.schedule_at(key, when)
        self._dispatcher.wake()


class Pace:
    """How often Leases are renewed: every quarter of their duration, as the kubelet renews,
    while the API server keeps up; stretched while it does not.

    The API server has a throughput, and a renewal that waits for it counts against the
    node-lifecycle controller's grace period (50 s) as much as one not sent. While the server
    is busy (renewals answered slowly, or pods waiting for it) the interval is at least
    LOADED times the kubelet's, giving the writes to the workload; while renewals go out late
    it grows by a quarter a second until demand fits what the server takes; once the server
    is quick and renewals punctual it shrinks back. It never exceeds 35 s nor seven eighths of
    the lease: past what the server takes, a longer interval is what keeps renewals from
    queueing, and a renewal that does not queue is within the grace period with room to spare
    (measured: at 30 s, renewals on two saturated cores queued up to 15 s).

    These bounds are those of the default grace (50 s). A shorter grace (the FakeCluster's
    ``spec.controlPlane.nodeMonitorGracePeriod``) scales them down with it: the interval is at
    most a fifth of the grace while the server keeps up (10 s of 50 s, the kubelet's own; 4 s
    of 20 s) and never more than 7/10 of it stretched (35 s of 50 s, 14 s of 20 s), below the
    3/4 at which the pool's heartbeats are at risk. A longer grace changes nothing: the
    kubelet does not renew less often for it.

    The renewal window (:mod:`~operators.engine.windowing`) does not replace it: the window
    keeps what goes out within what the server serves, and what does not go out waits in the
    engine's queue, which shows here as renewals late; only a longer interval makes less due.
    """

    LATE = 5.0  # renewals this late (s): more demand than the server takes
    ON_TIME = 1.0
    SLOW = 0.1  # renewals answered this slowly (s, on average): the server is busy
    LOADED = 2.5
    MOST = 3.5
    CEILING = 35.0
    LONGEST = 0.875  # of the lease
    NOMINAL_OF_GRACE = 0.2  # the kubelet's 10 s of the default grace
    CEILING_OF_GRACE = CEILING / NODE_GRACE  # 0.7

    def __init__(self, clock: Clock, *, grace: float = NODE_GRACE) -> None:
        """``grace``: the node-lifecycle controller's grace period (seconds)."""
        self._clock = clock
        self.grace = grace
        self._nominal_cap = grace * self.NOMINAL_OF_GRACE
        self._ceiling = min(self.CEILING, grace * self.CEILING_OF_GRACE)
        self.stretch = 1.0
        self.latency = 0.0  # moving average of renewal round trips
        self._adjusted = float("-inf")

    def observe(self, lag: float, latency: float, *, loaded: bool) -> None:
        """A renewal went out ``lag`` seconds late and took ``latency`` seconds."""
        self.latency += (latency - self.latency) * 0.05
        now = self._clock.now()
        if now - self._adjusted < 1.0:
            return
        self._adjusted = now
        if lag > self.LATE:
            self.stretch = min(self.MOST, max(self.stretch, 1.0) * 1.25)
        elif loaded or self.latency > self.SLOW:
            self.stretch = max(self.stretch, self.LOADED)
        elif lag < self.ON_TIME:
            self.stretch = max(1.0, self.stretch * 0.9)

    def interval(self, lease_duration: float) -> float:
        nominal = min(lease_duration * RENEW_FRACTION, self._nominal_cap)
        return max(nominal, min(nominal * self.stretch, lease_duration * self.LONGEST,
                                self._ceiling))
