"""What the soak does to a running fleet: kills on a seeded schedule, a pool scaled to and fro,
workloads submitted to the hub; each keeps the record that ``bench.soakcheck`` judges.

Each activity takes its clock and its clients as arguments, so the unit tests
(``tests/test_soakdriving.py``) drive them on a fake clock, an in-memory API and a fake
process table. What none of them may do: record what did not happen, or lose what did. A
scale is recorded once its write succeeded, at the moment it was first asked for; a kill once
its signal went to a process that runs the target's program; a workload once the hub answered
with its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from bench.soakcheck import Kill, Scale
from federation.api import fleet_pb2
from operators.controlplane.state import StateDir, read_host, read_operator
from operators.k8s.client import Client
from operators.k8s.errors import K8sError
from primitives.clocks import Clock

#: The program each target runs (a binary's name, or the module after ``python -m``).
PROGRAMS = {"operator": "operators", "engine": "operators.engine", "hub": "federation.hub",
            "kube-apiserver": "kube-apiserver", "etcd": "etcd",
            "collector": "federation.telemetry.collector"}
TARGETS = tuple(PROGRAMS)
#: Targets that are one process per member cluster (the others are one per host).
MEMBER_TARGETS = ("engine", "kube-apiserver")
#: Seconds at the start and at the end of the run without kills: the fleet is seen whole
#: before the first, and the last one's aftermath falls inside the run.
QUIET = 60.0
#: Seconds between two looks at a target that is not running (an earlier kill's, or its
#: parent's: an operator takes its engines and member API servers with it), and how long a
#: kill looks before it counts as not done.
RETRY_EVERY, RETRY_FOR = 2.0, 60.0
#: Seconds a killed process has to be published again before it counts as not back, and
#: between two looks for it.
COMEBACK, POLL = 120.0, 0.5


@dataclass(frozen=True)
class Planned:
    """A kill as the seed drew it: when (seconds from the run's start), what, whose."""

    at: float
    target: str
    cluster: str  # for a member's process (engine, kube-apiserver); else ""


def schedule(seed: int, kills: int, duration: float, targets: Sequence[str],
             clusters: Sequence[str]) -> list[Planned]:
    """``kills`` moments between the quiet first and last minutes, each with a target and a
    cluster, all drawn from ``seed``: the same arguments give the same schedule."""
    draw = random.Random(seed)
    moments = sorted(draw.uniform(QUIET, duration - QUIET) for _ in range(kills))
    planned = []
    for at in moments:
        target, cluster = draw.choice(targets), draw.choice(clusters)
        planned.append(Planned(round(at, 1), target,
                               cluster if target in MEMBER_TARGETS else ""))
    return planned


class Processes(Protocol):
    """What a kill needs of the host's processes."""

    def running(self, target: str, cluster: str) -> int | None:
        """The pid of ``target`` (``cluster``'s, for a member's process) if it runs now."""
        ...

    def kill(self, pid: int) -> None:
        ...


def program_of(argv: Sequence[str]) -> str:
    if "-m" in argv[:-1]:
        return argv[list(argv).index("-m") + 1]
    return Path(argv[0]).name if argv else ""


class Published:
    """The processes a state directory publishes (``host.json``: the daemon's children;
    ``operator.json``: the operator's), each checked in /proc: a published pid may have died
    since, or be another program's by now."""

    def __init__(self, state: StateDir) -> None:
        self.state = state

    def running(self, target: str, cluster: str) -> int | None:
        for published in (read_host(self.state), read_operator(self.state)):
            for component in published.components if published else ():
                key = component.cluster or ""
                if component.name != target or component.pid is None or (
                        target in MEMBER_TARGETS and key.rsplit(".", 1)[-1] != cluster):
                    continue
                if self.runs(component.pid, PROGRAMS[target]):
                    return component.pid
        return None

    @staticmethod
    def runs(pid: int, program: str) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False
        return program_of(argv.rstrip("\0").split("\0")) == program

    def kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Killer:
    """The kills of a schedule, each started at its seeded moment in a task of its own: a kill
    that waits for its target to run again, or for its successor, never holds back the next.
    A kill whose target is not running (an earlier kill took it down) looks again every
    :data:`RETRY_EVERY` seconds for up to :data:`RETRY_FOR`; how late it went is its drift."""

    def __init__(self, processes: Processes, *, clock: Clock, started: float,
                 say: Callable[[str], None]) -> None:
        self.processes, self.clock, self.started, self.say = processes, clock, started, say
        self.kills: list[Kill] = []
        self._killed: set[int] = set()
        self._planned = 0

    def elapsed(self) -> float:
        return self.clock.now() - self.started

    async def run(self, planned: Sequence[Planned]) -> None:
        """Every kill of ``planned``, until the last one's successor is back (or not)."""
        self._planned = len(planned)
        strikes: list[asyncio.Task[None]] = []
        try:
            for item in planned:
                await self.clock.sleep(item.at - self.elapsed())
                strikes.append(asyncio.create_task(self.strike(item)))
            await asyncio.gather(*strikes)
        finally:
            for strike in strikes:
                strike.cancel()
            await asyncio.gather(*strikes, return_exceptions=True)

    async def strike(self, planned: Planned) -> None:
        tries, deadline = 0, self.clock.now() + RETRY_FOR
        while True:
            tries += 1
            pid = self.processes.running(planned.target, planned.cluster)
            # Nothing is awaited from here to the kill: two kills of one target never both
            # pick the same process.
            if pid is not None and pid not in self._killed:
                break
            if self.clock.now() >= deadline:
                self.record(Kill(planned.at, planned.target, planned.cluster, 0, None, tries,
                                 None))
                return
            await self.clock.sleep(RETRY_EVERY)
        self.processes.kill(pid)
        self._killed.add(pid)
        killed_at = round(self.elapsed(), 1)
        back_after = None
        while self.elapsed() - killed_at < COMEBACK:
            await self.clock.sleep(POLL)
            again = self.processes.running(planned.target, planned.cluster)
            if again is not None and again != pid:
                back_after = round(self.elapsed() - killed_at, 1)
                break
        self.record(Kill(planned.at, planned.target, planned.cluster, pid, killed_at, tries,
                         back_after))

    def record(self, kill: Kill) -> None:
        self.kills.append(kill)
        what = (f"not running for {RETRY_FOR:.0f}s: not killed" if kill.killed_at is None
                else f"pid {kill.pid} killed {kill.killed_at - kill.at:+.1f}s from its moment"
                + (f" ({kill.tries} looks)" if kill.tries > 1 else "") + ", "
                + (f"back after {kill.back_after}s" if kill.back_after is not None
                   else f"NOT BACK within {COMEBACK:.0f}s"))
        self.say(f"kill {len(self.kills)}/{self._planned} (planned at {kill.at:.0f}s): "
                 f"{kill.name}: {what}")


async def scaling(host: Client, path: str, cluster: str, pool: str, sizes: tuple[int, int], *,
                  every: float, clock: Clock, started: float, stop: asyncio.Event,
                  scales: list[Scale], say: Callable[[str], None]) -> None:
    """Set ``cluster``'s ``pool`` (at ``path``) to the other of ``sizes`` every
    ``every`` seconds until ``stop``. A write that fails (the host API down: a kill of etcd) is
    tried again every :data:`RETRY_EVERY` seconds, also after ``stop``: one whose answer was
    lost may have been applied, and only a recorded size excuses the nodes it deletes. Each is
    recorded once it succeeded, at the moment it was first asked for."""
    size = sizes[0]
    while not await clock.wait(stop, every):
        size = sizes[1] if size == sizes[0] else sizes[0]
        # Not rounded: the engine deletes within tens of milliseconds, so a moment rounded up
        # can come after the deletions it caused, which then look unasked.
        asked = clock.now() - started
        while True:
            try:
                await host.patch(path, {"spec": {"replicas": size}})
                break
            except K8sError as error:
                say(f"scale {pool} to {size}: {error}; trying again")
                await clock.sleep(RETRY_EVERY)
        scales.append(Scale(asked, cluster, pool, size))


class Hub(Protocol):
    """What submitting needs of :class:`~federation.client.fleet.FleetClient`."""

    async def list_workloads(self) -> list[fleet_pb2.Workload]:
        ...

    async def submit_workload(self, spec: fleet_pb2.WorkloadSpec, *, name: str = "",
                              start_delay: float | None = None,
                              traceparent: str = "") -> fleet_pb2.Workload:
        ...


async def submitting(hub: Callable[[], AbstractAsyncContextManager[Hub]],
                     spec: Callable[[int], fleet_pb2.WorkloadSpec], *, every: float,
                     last: float, clock: Clock, started: float, stop: asyncio.Event,
                     submitted: list[str], say: Callable[[str], None]) -> None:
    """Submit workload ``soak-<n>`` every ``every`` seconds while the run is younger than
    ``last`` and until ``stop``. A hub that does not answer (killed) is asked again every
    :data:`RETRY_EVERY` seconds, also after ``stop``, so that no workload it may have made goes
    unrecorded; one whose answer was lost is found by its name, never submitted twice."""
    index = 0
    while True:
        name = f"soak-{index}"
        while True:
            try:
                async with hub() as fleet:
                    known = {w.name: w.id for w in await fleet.list_workloads()}
                    if name not in known:
                        known[name] = (await fleet.submit_workload(
                            spec(index), name=name, start_delay=0)).id
                break
            except (grpc.RpcError, OSError) as error:
                say(f"submit {name}: {error!r:.160}; trying again")
                await clock.sleep(RETRY_EVERY)
        submitted.append(known[name])
        index += 1
        if clock.now() - started + every > last or await clock.wait(stop, every):
            return
