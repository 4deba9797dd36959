"""The hub's memory across restarts: members and runs in one JSON file, written whole.

``<state dir>/state.json`` is replaced atomically (written aside, flushed to disk, renamed), so
a hub killed at any moment finds the last complete state. Writes are group commits: any number
of changes made while one write is under way go out together in the next one, and
:meth:`Store.commit` returns once a write that includes the caller's change is on disk — which
is when the hub may act on it (a run's commands go out only after the run is stored). Writes
are paced by what encoding the state costs (:data:`PACE`), so that a hub with much state and
many changes still spends most of its time serving.

Liveness (when a member was last heard) is not stored: a restarted hub gives every member its
grace from the restart.

Trace context (the traceparents of runs, workloads and the first sending of each command) is
stored with what it belongs to, so that a restarted hub's commands stay in their run's trace;
a file written before it was kept reads as untraced. Likewise a workload from a file written
before the hub could stop one reads as not stopped.

Format 1 named members by their FakeCluster's name alone; format 2 by their name in the fleet
(``namespace/name``). A format-1 file is read as what its hub meant: a member's namespace is
the one in the host id its operator then sent (``<hostname>:<state dir>:<namespace>``), else
default, and the runs and workloads that name it are renamed with it. Such a member keeps no
host (the operator now sends a stable host id), so its own host registers it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.hub.membership import Identity, Inventory, Member, Pool, State
from federation.hub.runs import MemberPart, Part, Run
from federation.hub.workloads import JobRecord, JobState, Settings, Workload
from primitives.clocks import SYSTEM_CLOCK, Clock
from primitives.files import write_private
from primitives.names import DEFAULT_NAMESPACE, member_name
from primitives.tasks import spawn

logger = logging.getLogger(__name__)

FORMAT = 2
#: The host id operators sent while members were named by their FakeCluster's name alone.
_FORMAT_1_HOST = re.compile(r"^[^:]*:/.*:(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\Z")
#: After a write the store waits this many times as long as the state took to encode, so that
#: encoding (which holds the hub's loop) takes at most a fifth of the hub's time however large
#: the state grows; what changes meanwhile goes out together in the next write.
PACE = 4
#: After a failed write, the writer tries again this soon, and (a defect that repeats) at
#: most this rarely (s).
WRITE_RETRY = 1.0
MAX_WRITE_RETRY = 30.0


@dataclasses.dataclass
class Snapshot:
    hub_id: str
    members: list[Member]
    runs: list[Run]
    workloads: list[Workload] = dataclasses.field(default_factory=list)


def encode(snapshot: Snapshot) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "hubId": snapshot.hub_id,
        "members": [_member(m) for m in snapshot.members],
        "runs": [_run(r) for r in snapshot.runs],
        "workloads": [_workload(w) for w in snapshot.workloads],
    }


def decode(data: dict[str, Any]) -> Snapshot:
    if data.get("format") == 1:
        data = _from_format_1(data)
    if data.get("format") != FORMAT:
        raise ValueError(f"state format {data.get('format')!r}; this hub reads {FORMAT} "
                         f"(and 1)")
    return Snapshot(hub_id=data["hubId"],
                    members=[_read_member(m) for m in data.get("members", [])],
                    runs=[_read_run(r) for r in data.get("runs", [])],
                    workloads=[_read_workload(w) for w in data.get("workloads", [])])


def _from_format_1(data: dict[str, Any]) -> dict[str, Any]:
    """A format-1 state in format 2: every member named as the fleet names it now."""
    renamed: dict[str, str] = {}
    for member in data.get("members", []):
        identity = member["identity"]
        found = _FORMAT_1_HOST.match(identity.get("host", ""))
        identity["namespace"] = found["namespace"] if found else DEFAULT_NAMESPACE
        identity["host"] = ""
        renamed[identity["name"]] = member_name(identity["namespace"], identity["name"])

    def name(value: str) -> str:
        return renamed.get(value, value)

    def selector(value: dict[str, Any]) -> None:
        if value.get("names"):
            value["names"] = [name(n) for n in value["names"]]

    for run in data.get("runs", []):
        selector(run["selector"])
        for part in run["parts"]:
            part["cluster"] = name(part["cluster"])
    for workload in data.get("workloads", []):
        if "lastTurn" in workload:
            workload["lastTurn"] = name(workload["lastTurn"])
        settings = workload["settings"]
        selector(settings["selector"])
        settings["manager"] = name(settings.get("manager", ""))
        settings["weights"] = {name(n): w for n, w in settings.get("weights", {}).items()}
        for job in workload["jobs"]:
            for field in ("cluster", "avoid"):
                if field in job:
                    job[field] = name(job[field])
    return data | {"format": FORMAT}


# The encoders take each dataclass's fields as they are (vars) rather than through
# dataclasses.asdict, which deep-copies: at 1000 members and a few fleet-wide runs asdict took
# ~90 ms of every write, all of it blocking the hub's loop, and the hub writes after every
# change. What vars returns is only read, by json.dumps, before the loop runs anything else.

def _member(member: Member) -> dict[str, Any]:
    inventory = member.inventory
    return {
        "identity": vars(member.identity),
        "state": member.state.value, "reason": member.reason, "message": member.message,
        "registeredAt": member.registered_at, "stateSince": member.state_since,
        "lastHeartbeat": member.last_heartbeat,
        "inventory": vars(inventory) | {"pools": [vars(pool) for pool in inventory.pools]},
    }


def _read_member(data: dict[str, Any]) -> Member:
    raw = data["inventory"]
    inventory = Inventory(pools=tuple(Pool(**p) for p in raw["pools"]),
                          nodes_ready=raw["nodes_ready"], nodes_total=raw["nodes_total"],
                          allocatable=raw["allocatable"], pods_by_phase=raw["pods_by_phase"])
    return Member(identity=Identity(**data["identity"]), state=State(data["state"]),
                  reason=data["reason"], message=data["message"],
                  registered_at=data["registeredAt"], state_since=data["stateSince"],
                  last_heartbeat=data.get("lastHeartbeat", 0.0), inventory=inventory)


def _run(run: Run) -> dict[str, Any]:
    return {
        "id": run.id, "name": run.name, "plan": run.plan, "selector": run.selector,
        "createdAt": run.created_at, "startAt": run.start_at, "cancelled": run.cancelled,
        "finishedAt": run.finished_at, "traceparent": run.traceparent,
        "parts": [vars(part) | {"state": part.state.value} for part in run.parts.values()],
    }


def _read_run(data: dict[str, Any]) -> Run:
    parts = {}
    for raw in data["parts"]:
        part = MemberPart(**(raw | {"state": Part(raw["state"])}))
        parts[part.cluster] = part
    return Run(id=data["id"], name=data["name"], plan=data["plan"], selector=data["selector"],
               created_at=data["createdAt"], start_at=data["startAt"], parts=parts,
               cancelled=data["cancelled"], finished_at=data["finishedAt"],
               traceparent=data.get("traceparent", ""))


def _workload(workload: Workload) -> dict[str, Any]:
    return {
        "id": workload.id, "name": workload.name, "spec": workload.spec,
        "settings": vars(workload.settings), "createdAt": workload.created_at,
        "startAt": workload.start_at, "finishedAt": workload.finished_at,
        "samples": workload.samples, "sampleEvery": workload.sample_every,
        "lastTurn": workload.last_turn, "traceparent": workload.traceparent,
        "reason": workload.reason, "message": workload.message, "deleting": workload.deleting,
        "jobs": [vars(job) | {"state": job.state.value} for job in workload.jobs],
    }


def _read_workload(data: dict[str, Any]) -> Workload:
    return Workload(id=data["id"], name=data["name"], spec=data["spec"],
                    settings=Settings(**data["settings"]), created_at=data["createdAt"],
                    start_at=data["startAt"], finished_at=data["finishedAt"],
                    samples=data["samples"], sample_every=data["sampleEvery"],
                    last_turn=data["lastTurn"], traceparent=data.get("traceparent", ""),
                    reason=data.get("reason", ""), message=data.get("message", ""),
                    deleting=data.get("deleting", {}),
                    jobs=[JobRecord(**(raw | {"state": JobState(raw["state"])}))
                          for raw in data["jobs"]])


class StoreError(OSError):
    """The state cannot be written now: a commit that waited for it fails."""


class Store:
    """One state file, written by group commits from a background task.

    The writer is supervised: an error it does not expect is logged with its traceback and it
    starts again after a back-off. Meanwhile, and whenever it is not running, a commit fails
    at once (:class:`StoreError`) rather than waiting for a write that may never come; the
    change stays noted, and goes out with the next write that succeeds."""

    def __init__(self, path: Path, *, fsync: bool = True, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.fsync = fsync
        self.clock = clock
        self._dirty = asyncio.Event()
        self._generation = 0  # changes made so far
        self._written = 0  # changes on disk
        #: Set (and replaced) whenever a write ends, well or not, or the writer stops.
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    def load(self) -> Snapshot:
        """What the file holds; a new hub id and nothing else when there is no file."""
        try:
            return decode(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return Snapshot(hub_id=secrets.token_hex(8), members=[], runs=[], workloads=[])

    def start(self, snapshot: Callable[[], Snapshot]) -> None:
        self._failure = None
        self._task = spawn("hub-store", lambda: self._write_loop(snapshot), clock=self.clock,
                           first=WRITE_RETRY, cap=MAX_WRITE_RETRY, on_failure=self._failed)
        self._task.add_done_callback(lambda task: self._wake())

    async def stop(self) -> None:
        """Write what is pending, then stop."""
        if self._task is None:
            return
        if self._generation != self._written and self._failure is None:
            with contextlib.suppress(OSError):
                await self.commit(changed=False)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def changed(self) -> int:
        """Note a change to be written soon; returns its number, for :meth:`commit`."""
        self._generation += 1
        self._dirty.set()
        return self._generation

    async def commit(self, *, changed: bool = True) -> None:
        """Note a change (unless ``changed`` is False) and return once it is on disk; a
        :class:`StoreError` when the writer cannot write it now."""
        target = self.changed() if changed else self._generation
        while self._written < target:
            if self._failure is not None:
                raise StoreError(f"the hub cannot write {self.path}: {self._failure}")
            if self._task is None or self._task.done():
                raise StoreError(f"the hub cannot write {self.path}: its writer is not running")
            await self._progress.wait()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def _failed(self, error: BaseException) -> None:
        self._failure = error
        self._wake()

    async def _write_loop(self, snapshot: Callable[[], Snapshot]) -> None:
        if self._generation != self._written:
            self._dirty.set()  # started again: what was pending is still to be written
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            # A commit made from now on waits for this attempt; one made while the last one
            # had failed, and no other had begun, failed at once.
            self._failure = None
            target = self._generation
            started = time.monotonic()
            text = json.dumps(encode(snapshot()), separators=(",", ":"))
            encoding = time.monotonic() - started
            try:
                await asyncio.to_thread(self._write, text)
            except OSError as error:  # a full disk, say: expected, and retried as it is
                logger.error("cannot write %s: %s (retrying)", self.path, error)
                self._dirty.set()
                self._failed(error)
                await self.clock.sleep(WRITE_RETRY)
                continue
            self._written = target
            self._wake()
            await asyncio.sleep(PACE * encoding)

    def _write(self, text: str) -> None:
        write_private(self.path, text.encode(), durable=self.fsync)
