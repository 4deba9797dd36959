"""A replay carried out: the planned writes (:mod:`operators.recording.planning`) sent to one
member's API on their timeline, and what happened to each.

Each write goes out when it is due, without waiting for the ones before it to be answered
(at most ``concurrency`` in flight), except that the writes of one object go in the order
they were recorded, and a write into a namespace the replay creates goes after that create
was answered (the API server refuses an object whose namespace it has not got yet). A create
the plan makes only if missing (a namespace the trace lacks) is taken as done when an object
of that name stands there already, which is left as it is. What the API refuses for good (a
kind it does not serve, a name that exists, an invalid object) is a :class:`Refusal` naming
the object and the reason, and the replay goes on with the others; the later writes of an
object whose create was refused are left out with it. An API error that may pass (a 5xx, a
connection lost, throttling beyond the client's own retries) is tried again a few times
first. The lag of each write is when the API answered it less when it was due.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from operators.k8s import discovery
from operators.k8s.client import Client
from operators.k8s.errors import ApiError, Conflict, K8sError, NotFound, brief, transient
from operators.recording import planning
from operators.recording.planning import Plan, Write
from operators.recording.trace import Trace
from primitives.clocks import Clock

#: A write the API did not answer for good is tried this many times, 1 s doubling apart.
ATTEMPTS = 4
RETRY_BASE = 1.0


@dataclasses.dataclass(frozen=True)
class Refusal:
    write: Write
    reason: str

    def describe(self) -> str:
        return f"{self.write.describe()}: {self.reason}"


@dataclasses.dataclass
class Progress:
    """How far a replay got; updated as writes are answered."""

    total: int
    applied: int = 0
    #: Seconds each answered write came after it was due.
    lags: list[float] = dataclasses.field(default_factory=list)
    refused: list[Refusal] = dataclasses.field(default_factory=list)
    #: Writes of objects whose create was refused, left out with it.
    dropped: int = 0
    #: The creates-if-missing whose object stood there already (left as it was).
    present: list[Write] = dataclasses.field(default_factory=list)

    @property
    def done(self) -> int:
        return self.applied + len(self.refused) + self.dropped

    def lag(self) -> tuple[float, float, float]:
        """p50, p99 and max of the lags so far (seconds)."""
        if not self.lags:
            return 0.0, 0.0, 0.0
        ordered = sorted(self.lags)

        def at(share: float) -> float:
            return ordered[min(int(share * len(ordered)), len(ordered) - 1)]
        return at(0.50), at(0.99), ordered[-1]


class Replayer:
    """Sends one plan's writes to one member."""

    def __init__(self, client: Client, *, clock: Clock, concurrency: int = 16,
                 on_progress: Callable[[Progress], None] = lambda progress: None) -> None:
        self.client = client
        self._clock = clock
        self._concurrency = concurrency
        self._on_progress = on_progress
        self._known: discovery.Known = {}
        self._refused_chains: set[str] = set()

    async def run(self, plan: Plan) -> Progress:
        progress = Progress(total=len(plan.writes))
        started = self._clock.now()
        slots = asyncio.Semaphore(self._concurrency)
        last: dict[str, asyncio.Task[None]] = {}
        async with asyncio.TaskGroup() as group:
            for write in plan.writes:
                wait = started + write.due - self._clock.now()
                if wait > 0:
                    await self._clock.sleep(wait)
                await slots.acquire()
                chains = [write.chain]
                if write.namespace:
                    chains.append(planning.namespace_chain(write.namespace))
                before = [last[chain] for chain in chains if chain in last]
                task = group.create_task(self._after(before, write, started + write.due,
                                                     progress))
                task.add_done_callback(lambda _: slots.release())
                last[write.chain] = task
        return progress

    async def _after(self, before: list[asyncio.Task[None]], write: Write, due: float,
                     progress: Progress) -> None:
        if before:
            await asyncio.wait(before)
        if write.chain in self._refused_chains:
            progress.dropped += 1
        else:
            reason = await self._send(write, progress)
            if reason is None:
                progress.applied += 1
                progress.lags.append(max(self._clock.now() - due, 0.0))
            else:
                progress.refused.append(Refusal(write, reason))
                if write.method == "create":
                    # Not a lives set's owner: without its set, its pods run on defaults.
                    self._refused_chains.add(write.identity)
        self._on_progress(progress)

    async def _send(self, write: Write, progress: Progress) -> str | None:
        """None once the API took the write (or, for a create if missing, had the object
        already), else why it refused it."""
        for attempt in range(ATTEMPTS):
            try:
                path = await self._path(write)
                if write.method == "create":
                    await self.client.create(path, write.body, decode=False)
                elif write.method == "patch":
                    await self.client.patch(f"{path}/{write.name}", write.body or {})
                else:
                    await self.client.delete(f"{path}/{write.name}")
                return None
            except discovery.UnknownKind as error:
                return (f"{error}: install its CustomResourceDefinition first, or record a "
                        f"version of it this cluster serves")
            except Conflict as error:
                if write.if_missing and error.already_exists:
                    progress.present.append(write)
                    return None
                return _reason(write, error)
            except K8sError as error:
                if (isinstance(error, ApiError) and not transient(error)) or \
                        attempt == ATTEMPTS - 1:
                    return _reason(write, error)
                await self._clock.sleep(RETRY_BASE * 2 ** attempt)
        raise AssertionError("unreachable: the last attempt returns")

    async def _path(self, write: Write) -> str:
        """The collection the write goes to; the kind's plural and scope from the API's
        discovery when the trace named only the kind."""
        prefix = discovery.group_path(write.api_version)
        resource, namespaced = write.resource, bool(write.namespace)
        if not resource:
            resource, namespaced = await discovery.resource(
                self.client, write.api_version, write.kind, known=self._known)
        if namespaced and write.namespace:
            return f"{prefix}/namespaces/{write.namespace}/{resource}"
        return f"{prefix}/{resource}"


def _reason(write: Write, error: K8sError) -> str:
    """What a user reads about a refused write: the API's words, and what to do."""
    said = brief(error)
    if isinstance(error, Conflict) and error.already_exists:
        return (f"name collision: the cluster has one of that name already ({said}); replay "
                f"into a cluster without it, or delete it first")
    if isinstance(error, NotFound):
        if write.method == "create" and write.namespace and _missing(error) == "namespaces":
            return (f"its namespace {write.namespace} is not in the cluster ({said}): the "
                    f"trace deleted it, or its create was refused")
        if write.method == "create":
            return (f"the cluster serves no {write.resource or write.kind} in "
                    f"{write.api_version} ({said}): install its CustomResourceDefinition, "
                    f"or record a version this cluster serves")
        return f"not in the cluster ({said}): its create was not replayed"
    return said


def _missing(error: NotFound) -> str:
    """The resource the API server says it did not find (its Status's details)."""
    details = error.body.get("details") if isinstance(error.body, dict) else None
    return str(details.get("kind") or "") if isinstance(details, dict) else ""


async def replay(trace: Trace, options: planning.Options, client: Client, *, clock: Clock,
                 concurrency: int = 16,
                 on_progress: Callable[[Progress], None] = lambda progress: None,
                 ) -> tuple[Plan, Progress]:
    """Replay ``trace`` into ``client``'s cluster as ``options`` say: the plan, and what
    became of its writes."""
    plan = planning.plan(trace, options)
    return plan, await Replayer(client, clock=clock, concurrency=concurrency,
                                on_progress=on_progress).run(plan)
