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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from federation.hub.membership import Identity, Inventory, Member, Pool, State
from federation.hub.runs import MemberPart, Part, Run
from federation.hub.workloads import JobRecord, JobState, Settings, Workload
from primitives.files import write_private

logger = logging.getLogger(__name__)

FORMAT = 1
#: After a write the store waits this many times as long as the state took to encode, so that
#: encoding (which holds the hub's loop) takes at most a fifth of the hub's time however large
#: the state grows; what changes meanwhile goes out together in the next write.
PACE = 4


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
    if data.get("format") != FORMAT:
        raise ValueError(f"state format {data.get('format')!r}; this hub reads {FORMAT}")
    return Snapshot(hub_id=data["hubId"],
                    members=[_read_member(m) for m in data.get("members", [])],
                    runs=[_read_run(r) for r in data.get("runs", [])],
                    workloads=[_read_workload(w) for w in data.get("workloads", [])])


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


class Store:
    """One state file, written by group commits from a background task."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        self._dirty = asyncio.Event()
        self._generation = 0  # changes made so far
        self._written = 0  # changes on disk
        self._done = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    def load(self) -> Snapshot:
        """What the file holds; a new hub id and nothing else when there is no file."""
        try:
            return decode(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return Snapshot(hub_id=secrets.token_hex(8), members=[], runs=[], workloads=[])

    def start(self, snapshot: Callable[[], Snapshot]) -> None:
        self._task = asyncio.create_task(self._write_loop(snapshot), name="hub-store")

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
        """Note a change (unless ``changed`` is False) and return once it is on disk."""
        target = self.changed() if changed else self._generation
        async with self._done:
            await self._done.wait_for(lambda: self._written >= target or
                                      self._failure is not None)
        if self._failure is not None and self._written < target:
            raise OSError(f"the hub cannot write {self.path}: {self._failure}")

    async def _write_loop(self, snapshot: Callable[[], Snapshot]) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            target = self._generation
            started = time.monotonic()
            text = json.dumps(encode(snapshot()), separators=(",", ":"))
            encoding = time.monotonic() - started
            try:
                await asyncio.to_thread(self._write, text)
            except OSError as error:
                logger.error("cannot write %s: %s (retrying)", self.path, error)
                self._failure = error
                self._dirty.set()
                async with self._done:
                    self._done.notify_all()
                await asyncio.sleep(1.0)
                continue
            self._failure = None
            async with self._done:
                self._written = target
                self._done.notify_all()
            await asyncio.sleep(PACE * encoding)

    def _write(self, text: str) -> None:
        write_private(self.path, text.encode(), durable=self.fsync)
