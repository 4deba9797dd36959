"""One Replay's run: observe the cluster and the trace, then replay, recording progress in the
status as it goes. What ``fakefleet replay`` does from a terminal, done for an object: the same
loading (:mod:`~operators.recording.loading`), planning (:mod:`~operators.recording.planning`)
and replaying (:class:`~operators.recording.replaying.Replayer`); this module adds only where
the trace comes from, when to start, and the status.

The order, each time the runner starts (the operator started, or restarted):

1. the FakeCluster (``spec.clusterRef``) must exist and be Ready, and the trace's ConfigMap key
   be there: until then the Replay is Pending, says what it waits for, and looks again every
   :data:`WAIT` seconds;
2. the trace is read and planned (off the event loop: a trace may be large); one that cannot be
   read, or planned as the spec asks, fails the Replay with the reason and the fix, and so does
   a trace whose SHA-256 is not the one recorded when the replay started;
3. a first run records its time zero (``spec.startAt``, or now), run id, the trace's digest and
   the plan's size (Running) before it sends a write: the run id names its lives sets and
   marks what it creates, so a restarted operator plans the same writes and knows its own;
4. the writes go out on their timeline; the status is written at most every
   :data:`STATUS_INTERVAL` seconds while they do, and at the end: Succeeded when the API took
   every write, Failed when it refused some (the replay went on with the others).

**Restarts.** The status counts only the writes answered in the plan's order without a gap
(:class:`~operators.recording.replaying.Settled`), and ``resumeFrom`` says where that ends. A
restarted operator carries on there, on the timeline shifted by the time it was away: the
write at ``resumeFrom`` is due at once, the next ones as far apart as recorded. Writes after it
that the earlier operator sent are sent again and recognised (the Replayer's ``owner``).
Deleting the Replay stops it (the daemon is stopped; what was replayed stays in the member).

Knows nothing of kopf: the operator's handler passes the host client, how to reach a member
(``connect``) and the clock.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import gzip
import hashlib
import io
import secrets
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

from operators.api.base import API_VERSION, Condition
from operators.api.clusters import FakeCluster
from operators.api.replays import (
    MAX_REASON_LENGTH,
    MAX_REFUSED_LISTED,
    RefusedWrite,
    Replay,
    ReplayStatus,
    speed_factor,
)
from operators.api.status import condition
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.k8s.times import micro_time, parse
from operators.recording import loading, planning, replaying
from operators.recording.files import TraceError
from operators.recording.planning import Plan
from operators.recording.trace import Trace
from primitives.clocks import Clock

REPLAY = f"/apis/{API_VERSION}/namespaces/{{namespace}}/replays/{{name}}"
CLUSTER = f"/apis/{API_VERSION}/namespaces/{{namespace}}/fakeclusters/{{name}}"
CONFIGMAP = "/api/v1/namespaces/{namespace}/configmaps/{name}"
#: The status is written at most this often while writes go out (s).
STATUS_INTERVAL = 2.0
#: A Replay waiting for its cluster or its trace looks again this often (s).
WAIT = 5.0
#: How often a waiting runner looks whether it was stopped (s).
STOP_POLL = 0.2
#: A gzipped trace in a ConfigMap unpacks to at most this many bytes: a ConfigMap holds 1 MiB,
#: and what it unpacks to is read in memory.
MAX_UNPACKED = 256 << 20
GZIP_MAGIC = b"\x1f\x8b"
#: A condition's message is cut to this many characters (a plan error lists the trace's
#: clusters, which a fleet trace has many of): the status stays small.
MAX_MESSAGE_LENGTH = 1024

#: Reaches a member cluster: a client of its API server, None while it cannot be reached yet.
Connect = Callable[[FakeCluster, str], Client | None]


class Waiting(Exception):
    """The replay cannot start yet (Pending): ``reason`` and ``message`` say for what."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Unreplayable(Waiting):
    """The replay cannot go on, whatever the runner waits for (Failed)."""


class ReplayRun:
    """One Replay's progress: its status, and the client of its member while it replays."""

    def __init__(self, replay: Replay, *, host: Client, connect: Connect, clock: Clock,
                 interval: float = STATUS_INTERVAL) -> None:
        self.replay = replay
        self.spec = replay.spec
        self.host = host
        self.clock = clock
        self.namespace: str = replay.metadata["namespace"]
        self.name: str = replay.metadata["name"]
        self.generation = int(replay.metadata.get("generation", 0))
        self.status = replay.status or ReplayStatus()
        self._connect = connect
        self._interval = interval
        self._client: Client | None = None
        self._written = self.status.model_dump(mode="json")

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, stopped: Callable[[], bool]) -> None:
        """Until the replay ends or the runner is stopped (the operator stops, the Replay is
        deleted)."""
        try:
            while not stopped() and self.status.phase in ("Pending", "Running"):
                try:
                    await self.attempt(stopped)
                except Unreplayable as error:
                    await self.write(self._failed(error.reason, error.message))
                except Waiting as error:
                    await self.write(self._pending(error.reason, error.message))
                    await self._sleep(WAIT, stopped)
        finally:
            await self.close()

    async def attempt(self, stopped: Callable[[], bool]) -> None:
        """Observe what the replay needs, then replay (from where the status says)."""
        cluster = await self._cluster()
        data = await self._trace_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if self.status.traceSha256 and digest != self.status.traceSha256:
            raise Unreplayable("TraceChanged", (
                f"the trace in {self._source()} changed while the replay ran (SHA-256 "
                f"{digest[:12]}…, it started with {self.status.traceSha256[:12]}…): put the "
                f"trace it started with back, or delete the Replay and apply it again"))
        trace = await asyncio.to_thread(read_trace, data, self._source())
        run = self.status.run or secrets.token_hex(4)
        plan = await asyncio.to_thread(self._plan, trace, run)
        client = self._member(cluster)
        first = not self.status.startedAt
        if first:
            zero = parse(self.spec.startAt) if self.spec.startAt else self.clock.now()
            if zero > self.clock.now():
                await self.write(self._pending(
                    "Scheduled", f"starts at spec.startAt {self.spec.startAt}: {len(plan.writes)} "
                                 f"writes planned into FakeCluster {self.spec.clusterRef}"))
                await self._sleep(zero - self.clock.now(), stopped)
                if stopped():
                    return
            start = 0
            await self.write(self.status.model_copy(update={
                "phase": "Running", "run": run, "traceSha256": digest,
                "startedAt": micro_time(zero), "total": len(plan.writes),
                "leftOut": len(plan.skipped), "progress": f"0/{len(plan.writes)}",
                "conditions": self._conditions(
                    "Replaying", f"replaying {len(plan.writes)} writes into FakeCluster "
                                 f"{self.spec.clusterRef}", reconciling=True)}))
        else:
            start = min(self.status.resumeFrom, len(plan.writes))
            # Shifted by the time the operator was away: the first write not answered is due now.
            zero = self.clock.now() - (plan.writes[start].due if start < len(plan.writes) else 0)
            await self.write(self.status.model_copy(update={
                "phase": "Running", "resumes": self.status.resumes + 1,
                "conditions": self._conditions(
                    "Resumed", f"carried on at write {start} of {len(plan.writes)} after a "
                               f"restart (of the operator, or of the replay after an error), "
                               f"the timeline shifted by the pause",
                    reconciling=True)}))
        await self._replay(client, plan, run, start, zero, stopped)

    async def _replay(self, client: Client, plan: Plan, run: str, start: int, zero: float,
                      stopped: Callable[[], bool]) -> None:
        base = self.status
        seen: dict[str, replaying.Progress] = {}

        def progress(now: replaying.Progress) -> None:
            seen["latest"] = now
        replayer = replaying.Replayer(client, clock=self.clock, on_progress=progress,
                                      owner=planning.writer(run))
        task = asyncio.create_task(replayer.run(plan, start=start, zero=zero))
        ended = asyncio.Event()
        task.add_done_callback(lambda _: ended.set())
        try:
            due = self.clock.now() + self._interval
            while not task.done() and not stopped():
                await self.clock.wait(ended, STOP_POLL)
                if "latest" in seen and self.clock.now() >= due:
                    await self.write(progressed(base, seen["latest"]))
                    due = self.clock.now() + self._interval
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if "latest" in seen:
            self.status = progressed(base, seen["latest"])
        if task.cancelled():  # stopped: what was settled, for whoever carries on
            with contextlib.suppress(NotFound):
                await self.write()
            return
        final = progressed(base, task.result())
        await self.write(self._finished(final))

    # -- what the replay needs ------------------------------------------------------------------

    async def _cluster(self) -> FakeCluster:
        name = self.spec.clusterRef
        try:
            cluster = FakeCluster.model_validate(await self.host.get(
                CLUSTER.format(namespace=self.namespace, name=name)))
        except NotFound:
            raise Waiting("ClusterNotFound", (
                f"FakeCluster {name} is not in namespace {self.namespace}: create it, or name "
                f"another in spec.clusterRef (delete the Replay and apply it again)")) from None
        phase = cluster.status.phase if cluster.status else "Pending"
        if phase != "Ready":
            raise Waiting("ClusterNotReady", f"FakeCluster {name} is {phase}, not Ready yet")
        return cluster

    def _member(self, cluster: FakeCluster) -> Client:
        if self._client is None:
            self._client = self._connect(cluster, self.spec.clusterRef)
        if self._client is None:
            raise Waiting("ClusterNotReady", f"FakeCluster {self.spec.clusterRef} has no API "
                                             f"server this operator reaches yet")
        return self._client

    def _source(self) -> str:
        ref = self.spec.trace.configMapRef
        return f"ConfigMap {self.namespace}/{ref.name} key {ref.key}"

    async def _trace_bytes(self) -> bytes:
        ref = self.spec.trace.configMapRef
        try:
            found = await self.host.get(CONFIGMAP.format(namespace=self.namespace,
                                                         name=ref.name))
        except NotFound:
            raise Waiting("TraceNotFound", (
                f"ConfigMap {ref.name} (spec.trace.configMapRef) is not in namespace "
                f"{self.namespace}: create it with the trace under key {ref.key}, e.g. "
                f"kubectl create configmap {ref.name} --from-file={ref.key}=FILE")) from None
        binary = (found.get("binaryData") or {}).get(ref.key)
        if binary is not None:
            try:
                return base64.b64decode(binary, validate=True)
            except binascii.Error as error:
                raise Unreplayable("TraceUnreadable", f"{self._source()}: binaryData is not "
                                                      f"base64 ({error})") from error
        text = (found.get("data") or {}).get(ref.key)
        if text is not None:
            return str(text).encode()
        keys = sorted({*(found.get("data") or {}), *(found.get("binaryData") or {})})
        raise Waiting("TraceNotFound", (
            f"ConfigMap {ref.name} has no key {ref.key} (it has {', '.join(keys) or 'none'}): "
            f"put the trace there, or name its key in spec.trace.configMapRef.key"))

    def _plan(self, trace: Trace, run: str) -> Plan:
        try:
            options = planning.Options(
                speed=speed_factor(self.spec.speed), cluster=self.spec.from_,
                raw_pods=self.spec.rawPods, run=run, seed=self.spec.seed, mark=True)
            return planning.plan(trace, options)
        except planning.PlanError as error:
            said = str(error).replace("(--from)", "in spec.from")
            raise Unreplayable("PlanRefused", f"{self._source()}: {said}") from error
        except ValueError as error:
            raise Unreplayable("PlanRefused", f"spec.speed {error}") from error

    # -- status ---------------------------------------------------------------------------------

    def _conditions(self, reason: str, message: str, *, ready: bool = False,
                    reconciling: bool = False, stalled: bool = False) -> list[Condition]:
        now = micro_time(self.clock.now())
        previous = self.status.conditions
        message = _cut(message, MAX_MESSAGE_LENGTH)
        return [condition(kind, holds, reason=reason, message=message,
                          generation=self.generation, now=now, previous=previous)
                for kind, holds in (("Ready", ready), ("Reconciling", reconciling),
                                    ("Stalled", stalled))]

    def _pending(self, reason: str, message: str) -> ReplayStatus:
        return self.status.model_copy(update={
            "phase": "Pending" if not self.status.startedAt else self.status.phase,
            "conditions": self._conditions(reason, message, reconciling=True)})

    def _failed(self, reason: str, message: str) -> ReplayStatus:
        return self.status.model_copy(update={
            "phase": "Failed", "finishedAt": micro_time(self.clock.now()),
            "conditions": self._conditions(reason, message, stalled=True)})

    def _finished(self, status: ReplayStatus) -> ReplayStatus:
        now = micro_time(self.clock.now())
        summary = (f"{status.applied} of {status.total} writes applied into FakeCluster "
                   f"{self.spec.clusterRef}, lag at most {status.maxLagSeconds:.3f}s")
        if status.dropped:
            summary += f", {status.dropped} left out with a refused create"
        if not status.refusedCount:
            return status.model_copy(update={
                "phase": "Succeeded", "finishedAt": now,
                "conditions": self._conditions("Replayed", summary, ready=True)})
        first = status.refused[0] if status.refused else None
        said = f"; the first: {first.write}: {first.reason}" if first else ""
        return status.model_copy(update={
            "phase": "Failed", "finishedAt": now,
            "conditions": self._conditions(
                "WritesRefused", f"{summary}; the API refused {status.refusedCount} (status."
                                 f"refused lists them){said}", stalled=True)})

    async def write(self, status: ReplayStatus | None = None) -> None:
        """Write ``status`` (default: the runner's) if it changed; it is the runner's only
        once written."""
        status = (self.status if status is None else status).model_copy(
            update={"observedGeneration": self.generation})
        body = status.model_dump(mode="json")
        if body != self._written:
            await self.host.patch(REPLAY.format(namespace=self.namespace, name=self.name) +
                                  "/status", {"status": body})
            self._written = body
        self.status = status

    async def _sleep(self, seconds: float, stopped: Callable[[], bool]) -> None:
        deadline = self.clock.now() + seconds
        while not stopped() and self.clock.now() < deadline:
            await self.clock.sleep(min(STOP_POLL, max(0.0, deadline - self.clock.now())))

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(K8sError, OSError):
                await self._client.close()
            self._client = None


def progressed(base: ReplayStatus, progress: replaying.Progress) -> ReplayStatus:
    """``base`` (the status when this runner started replaying) with what ``progress``
    settled since: counts, the first refused writes (bounded), the lag."""
    settled = progress.settled
    listed = [*base.refused, *(RefusedWrite(write=_cut(r.write.describe(), 200),
                                            reason=_cut(r.reason, MAX_REASON_LENGTH))
                               for r in settled.refused[:MAX_REFUSED_LISTED])]
    lag = round(progress.lags[-1], 3) if progress.lags else base.lagSeconds
    return base.model_copy(update={
        "applied": base.applied + settled.applied,
        "refusedCount": base.refusedCount + len(settled.refused),
        "dropped": base.dropped + settled.dropped,
        "refused": listed[:MAX_REFUSED_LISTED],
        "resumeFrom": settled.through,
        "progress": f"{settled.through}/{progress.total}",
        "lagSeconds": lag,
        "maxLagSeconds": round(max(base.maxLagSeconds, *progress.lags, 0.0), 3),
    })


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def read_trace(data: bytes, source: str) -> Trace:
    """The trace in ``data`` (a ConfigMap key's bytes, ``source`` names it in errors),
    gzipped or not, read as ``fakefleet replay`` reads a file
    (:func:`operators.recording.loading.load`). Blocking: run it in a thread."""
    if data.startswith(GZIP_MAGIC):
        data = _gunzip(data, source)
    with tempfile.TemporaryDirectory(prefix="fakefleet-replay-") as directory:
        path = Path(directory) / "trace"
        path.write_bytes(data)
        try:
            return loading.load(path)
        except TraceError as error:
            raise Unreplayable("TraceUnreadable", (
                f"{str(error).replace(str(path), source)}; then delete the Replay and apply "
                f"it again")) from error


def _gunzip(data: bytes, source: str) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unpacking:
            unpacked = unpacking.read(MAX_UNPACKED + 1)
    except (OSError, EOFError, zlib.error) as error:
        raise Unreplayable("TraceUnreadable", f"{source} starts as gzip but does not unpack "
                                              f"({error}): put the whole file there") from error
    if len(unpacked) > MAX_UNPACKED:
        raise Unreplayable("TraceTooLarge", (
            f"{source} unpacks to more than {MAX_UNPACKED >> 20} MiB: replay it with "
            f"'fakefleet replay FILE --into CLUSTER'"))
    return unpacked

