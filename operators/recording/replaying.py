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

A replay can be carried on after a restart (the Replay kind's runner,
:mod:`operators.recording.running`): :attr:`Progress.settled` says up to which write every
write was answered, and :meth:`Replayer.run` starts there, on a timeline shifted as its caller
says. The writes after it that were sent before the restart are sent again; a create of an
object marked as the replay's own (:attr:`operators.recording.planning.Options.mark`) and a
delete of one that is gone count as applied, and a patch is a merge patch, the same again.
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
from primitives import keys
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
class Settled:
    """What became of every write before :attr:`through` (in the plan's order): all of them
    were answered, so a replay carried on after a restart starts there
    (:meth:`Replayer.run`'s ``start``). A write answered after one that is not answered yet is
    counted here once that one is."""

    through: int = 0
    applied: int = 0
    dropped: int = 0
    refused: list[Refusal] = dataclasses.field(default_factory=list)


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
    #: The writes answered in the plan's order, without a gap: what a replay carried on after
    #: a restart takes as done.
    settled: Settled = dataclasses.field(default_factory=Settled)

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
    """Sends one plan's writes to one member.

    ``owner``: the writer the plan marked its creates with (``fakefleet.dev/owned-by``,
    :attr:`operators.recording.planning.Options.mark`); a create the API answers
    AlreadyExists for an object that carries it was this replay's own, sent before a restart,
    and counts as applied."""

    def __init__(self, client: Client, *, clock: Clock, concurrency: int = 16,
                 on_progress: Callable[[Progress], None] = lambda progress: None,
                 owner: str = "") -> None:
        self.client = client
        self._clock = clock
        self._concurrency = concurrency
        self._on_progress = on_progress
        self._owner = owner
        self._known: discovery.Known = {}
        self._refused_chains: set[str] = set()
        #: What became of each write answered after one that is not answered yet: a
        #: Refusal, "applied" or "dropped".
        self._answered: dict[int, Refusal | str] = {}
        self._resumed = False

    async def run(self, plan: Plan, *, start: int = 0, zero: float | None = None) -> Progress:
        """Send the writes from ``start`` on (those before it were answered before a restart),
        each due its ``due`` seconds after ``zero`` (default: now). After a restart, a delete
        answered NotFound counts as applied: the one sent before the restart may have been
        taken (the object is gone, as the write wanted)."""
        progress = Progress(total=len(plan.writes), settled=Settled(through=start))
        started = self._clock.now() if zero is None else zero
        self._resumed = start > 0
        slots = asyncio.Semaphore(self._concurrency)
        last: dict[str, asyncio.Task[None]] = {}
        async with asyncio.TaskGroup() as group:
            for index in range(start, len(plan.writes)):
                write = plan.writes[index]
                wait = started + write.due - self._clock.now()
                if wait > 0:
                    await self._clock.sleep(wait)
                await slots.acquire()
                chains = [write.chain]
                if write.namespace:
                    chains.append(planning.namespace_chain(write.namespace))
                before = [last[chain] for chain in chains if chain in last]
                task = group.create_task(self._after(before, index, write, started + write.due,
                                                     progress))
                task.add_done_callback(lambda _: slots.release())
                last[write.chain] = task
        return progress

    async def _after(self, before: list[asyncio.Task[None]], index: int, write: Write,
                     due: float, progress: Progress) -> None:
        if before:
            await asyncio.wait(before)
        outcome: Refusal | str
        if write.chain in self._refused_chains:
            progress.dropped += 1
            outcome = "dropped"
        else:
            reason = await self._send(write, progress)
            if reason is None:
                progress.applied += 1
                progress.lags.append(max(self._clock.now() - due, 0.0))
                outcome = "applied"
            else:
                outcome = Refusal(write, reason)
                progress.refused.append(outcome)
                if write.method == "create":
                    # Not a lives set's owner: without its set, its pods run on defaults.
                    self._refused_chains.add(write.identity)
        self._answered[index] = outcome
        settled = progress.settled
        while settled.through in self._answered:
            done = self._answered.pop(settled.through)
            if isinstance(done, Refusal):
                settled.refused.append(done)
            elif done == "applied":
                settled.applied += 1
            else:
                settled.dropped += 1
            settled.through += 1
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
                if await self._taken_before(write, error):
                    return None
                return _reason(write, error)
            except K8sError as error:
                if await self._taken_before(write, error):
                    return None
                if (isinstance(error, ApiError) and not transient(error)) or \
                        attempt == ATTEMPTS - 1:
                    return _reason(write, error)
                await self._clock.sleep(RETRY_BASE * 2 ** attempt)
        raise AssertionError("unreachable: the last attempt returns")

    async def _taken_before(self, write: Write, error: K8sError) -> bool:
        """Whether the API refused ``write`` only because it took the same write before: a
        create of an object that carries this replay's mark, a delete after a restart."""
        if isinstance(error, NotFound) and write.method == "delete":
            return self._resumed
        if not (self._owner and write.method == "create" and isinstance(error, Conflict) and
                error.already_exists):
            return False
        try:
            found = await self.client.get(f"{await self._path(write)}/{write.name}")
        except K8sError:
            return False
        annotations = (found.get("metadata") or {}).get("annotations") or {}
        return bool(annotations.get(keys.OWNED_BY) == self._owner)

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
