"""The federation hub with a thousand members, over real gRPC and TLS on loopback:

    python -m bench.hub [--members 1000] [--runs 5] [--restarts 3] [--window 30]
                        [--fsync off|on|both] [--workdir DIR]

The hub runs as it runs in the product, ``python -m federation.hub`` in its own process, with
TLS from :func:`~operators.controlplane.pki.ensure_hub_pki`, heartbeats every 2 s and a 6 s
grace (its defaults), its state in a temporary directory. The members are
:class:`~federation.client.simulated.SimulatedMember` s with a
:class:`~federation.client.member.MemberLink` each (one channel, one TLS connection each), all
in one other process (``python -m bench.hub members ...``) that reports what it observed as
JSON when it is stopped. The harness (this process) speaks to the hub with the fleet API.

Measured, for the hub with its state written without fsync (``--unsafe-no-fsync``) and with
(``--fsync both``, the default, runs both one after the other):

- all members Ready after their process started (first registration, TLS handshakes included);
- steady state over ``--window`` seconds: the hub's RSS (VmRSS) and CPU (utime + stime over the
  window), the members process's CPU, heartbeats processed per second by the hub (the totals in
  its ``hub stats`` log lines at the window's ends) and sent per second by the members;
- fan-out, over ``--runs`` fleet-wide RunPlans one after the other: from the run's creation
  (``Run.created_at``, when the hub took the RunPlan, before it stored it) until each member
  received its command (the members' clock: same host), and until the hub recorded each
  acknowledgement (``acknowledged_at``: the ack, or the member's first result if that came
  first, as it does from a simulated member); the RunPlan call as the client saw it;
- ``--restarts`` times: the hub killed with SIGKILL and started again at once on the same port
  and state directory; seconds from the kill until it serves again, and until every member is
  Ready *again*: Ready with a heartbeat heard after the restart (a restarted hub shows its
  stored members Ready for a grace before any of them is back, so Ready alone would say
  nothing).

Results also go to ``bench/results/hub-<time>.json`` (git-ignored); ``--workdir`` keeps the
state directories and the logs of the hub and of the members (by default they are removed).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS
from bench.faults import percentile
from bench.terminating import sigterm_interrupts
from federation.api import common_pb2, fleet_pb2
from federation.client import tokens
from federation.client.channels import HubAddress
from federation.client.discovery import HubFiles, HubInfo
from federation.client.fleet import FleetClient
from federation.client.member import MemberLink
from federation.client.simulated import SimulatedMember
from operators.controlplane.pki import HubPKI, ensure_hub_pki

PLAN = json.dumps({"steps": [{"name": "xid", "target": {}, "fault": {"type": "GPUXid",
                                                                     "xid": 79}}]})
HEARTBEAT, GRACE = 2.0, 6.0
#: Time to let the fleet settle after it is Ready, before the steady-state window.
SETTLE = 10.0
TIMEOUT = 120.0
#: How often the harness lists the members while it waits (each listing costs the hub ~20 ms).
POLL = 0.5
_STATS = re.compile(r"^(\S+ \S+) INFO federation\.hub\.core: hub stats: .*\((\d+) heartbeats, "
                    r"(\d+) acks in all\)")


# -- the members process --------------------------------------------------------------------

class Recorded(SimulatedMember):
    """A simulated member that notes when its link came up and when it sent heartbeats."""

    def __init__(self, name: str, beats: collections.Counter[int]) -> None:
        super().__init__(name)
        self.ups: list[float] = []
        self._beats = beats

    async def inventory(self) -> common_pb2.Inventory | None:
        self._beats[int(time.time())] += 1  # the link asks once per heartbeat it sends
        return await super().inventory()

    def connected(self, up: bool, message: str) -> None:
        if up:
            self.ups.append(time.time())
        super().connected(up, message)


async def simulate(count: int, hub: HubAddress, key: bytes, report: Path) -> None:
    """Run ``count`` members until SIGTERM, then write what they observed to ``report``."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    beats: collections.Counter[int] = collections.Counter()
    members = [Recorded(f"m{index:04d}", beats) for index in range(count)]
    links = []
    for member in members:
        member.link = MemberLink(hub, tokens.member_token(key, member.name), member,
                                 member.name)
        links.append(asyncio.create_task(member.link.run(stop)))
    await stop.wait()
    await asyncio.gather(*links)
    for member in members:
        await member.stop()
    report.write_text(json.dumps({
        "received": {command_id: executed.received_at for member in members
                     for command_id, executed in member.executed.items()},
        "deliveries": sum(sum(member.deliveries.values()) for member in members),
        "ups": {member.name: member.ups for member in members},
        "beats": dict(beats),
    }))


# -- the harness ----------------------------------------------------------------------------

class Process:
    """A child process of the bench, its log appended to a file."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("a") as output:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=output)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mib(self, field: str = "VmRSS") -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return 0.0

    async def stop(self, signum: int = signal.SIGTERM, timeout: float = 60) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signum)
        try:
            await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


def hub_argv(state: Path, listen: str, pki: HubPKI, *, fsync: bool) -> list[str]:
    return [sys.executable, "-m", "federation.hub", "--state-dir", str(state),
            "--listen", listen, "--tls-cert", str(pki.serving_cert),
            "--tls-key", str(pki.serving_key), "--tls-ca", str(pki.ca_cert),
            "--heartbeat-interval", f"{HEARTBEAT:g}", "--grace", f"{GRACE:g}",
            *([] if fsync else ["--unsafe-no-fsync"])]


async def serving(hub: Process, files: HubFiles) -> HubInfo:
    """The hub's published info, once this process of it serves."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        info = HubInfo.read(files.info)
        if info is not None and info.pid == hub.pid:
            return info
        assert hub.process is not None
        if hub.process.returncode is not None or time.monotonic() > deadline:
            raise SystemExit(f"the hub did not start; see {hub.log}")
        await asyncio.sleep(0.02)


async def all_ready(fleet: FleetClient, members: int, *, heard_since: float) -> float:
    """When every member is Ready with a heartbeat heard after ``heard_since``."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.aio.AioRpcError):
            listed = await fleet.list_clusters()
            back = sum(member.state == common_pb2.MEMBER_STATE_READY
                       and member.last_heartbeat.ToNanoseconds() / 1e9 >= heard_since
                       for member in listed)
            if back == members:
                return time.time()
        await asyncio.sleep(POLL)
    raise SystemExit(f"the members were not all Ready within {TIMEOUT:g}s")


def hub_totals(log: Path, start: float, end: float) -> list[tuple[float, int]]:
    """(when, heartbeats in all) of the hub's stats lines logged between start and end."""
    lines = []
    for line in log.read_text().splitlines():
        match = _STATS.match(line)
        if match:
            when = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if start <= when <= end:
                lines.append((when, int(match.group(2))))
    return lines


def sent_rate(beats: dict[str, int], start: float, end: float) -> float:
    """Heartbeats per second the members sent, over whole heartbeat intervals: they come in
    bursts, so a window with half an interval more would count half a burst too many."""
    first = math.ceil(start)
    last = first + int((end - first) // HEARTBEAT * HEARTBEAT)
    return sum(n for second, n in beats.items() if first <= int(second) < last) / (last - first)


def stats(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 0.5), 3), "p99": round(percentile(values, 0.99), 3),
            "max": round(max(values), 3), "samples": len(values)}


@dataclasses.dataclass
class Rig:
    """The hub process, the members process, and the harness's fleet client."""

    hub: Process
    swarm: Process
    files: HubFiles
    fleet: FleetClient
    members: int


async def steady(rig: Rig, window: float) -> dict[str, Any]:
    """Usage over ``window`` seconds of a settled fleet, and the heartbeats it carried."""
    await asyncio.sleep(SETTLE)
    begin, hub_cpu, swarm_cpu = time.time(), rig.hub.cpu_seconds(), rig.swarm.cpu_seconds()
    await asyncio.sleep(window)
    end = time.time()
    result = {
        "hubCpuPercent": round(100 * (rig.hub.cpu_seconds() - hub_cpu) / (end - begin), 1),
        "membersCpuPercent": round(100 * (rig.swarm.cpu_seconds() - swarm_cpu) / (end - begin),
                                   1),
        "hubRssMib": round(rig.hub.memory_mib(), 1),
        "window": [begin, end],
    }
    totals = hub_totals(rig.files.log, begin, end)
    if len(totals) < 2:
        raise SystemExit(f"fewer than two hub stats lines in the window; see {rig.files.log}")
    (first, before), (last, after) = totals[0], totals[-1]
    result["heartbeatsPerSecond"] = round((after - before) / (last - first), 1)
    return result


async def fan_out(rig: Rig, runs: int) -> list[tuple[fleet_pb2.Run, float]]:
    """Fleet-wide runs one after the other: each as it finished, and its RunPlan call's time."""
    made = []
    for index in range(runs):
        called = time.monotonic()
        run = await rig.fleet.run_plan(PLAN, start_delay=0, name=f"bench-{index}")
        call = time.monotonic() - called
        async with asyncio.timeout(TIMEOUT):
            async for finished in rig.fleet.watch_run(run.id):
                if finished.phase != fleet_pb2.RUN_PHASE_RUNNING:
                    break
        if finished.phase != fleet_pb2.RUN_PHASE_SUCCEEDED:
            raise SystemExit(f"run {run.id} ended {fleet_pb2.RunPhase.Name(finished.phase)}")
        made.append((finished, call))
        await asyncio.sleep(2.0)
    return made


async def restart(rig: Rig) -> dict[str, float]:
    """SIGKILL the hub and start it again at once: when it serves, when all are back."""
    killed = time.time()
    await rig.hub.stop(signal.SIGKILL)
    await rig.hub.start()
    await serving(rig.hub, rig.files)
    serves = time.time()
    back = await all_ready(rig.fleet, rig.members, heard_since=killed)
    return {"serving": round(serves - killed, 2), "ready": round(back - killed, 2),
            "killedAt": killed}


async def bench(workdir: Path, *, members: int, runs: int, restarts: int, window: float,
                fsync: bool, console: Console) -> dict[str, Any]:
    pki = ensure_hub_pki(workdir / "pki")
    state = workdir / ("hub-fsync" if fsync else "hub-no-fsync")
    files = HubFiles(state)
    state.mkdir(mode=0o700)
    hub = Process(hub_argv(state, "127.0.0.1:0", pki, fsync=fsync), files.log)
    await hub.start()
    info = await serving(hub, files)
    hub.argv = hub_argv(state, info.address, pki, fsync=fsync)  # restarts keep the port
    report = workdir / f"members-{'fsync' if fsync else 'no-fsync'}.json"
    swarm = Process([sys.executable, "-m", "bench.hub", "members", "--count", str(members),
                     "--address", info.address, "--ca", str(pki.ca_cert),
                     "--key", str(files.key), "--report", str(report)],
                    workdir / "members.log")
    fleet = FleetClient(HubAddress.of(info.address, pki.ca_cert),
                        files.fleet_token.read_text().strip(), timeout=30)
    rig = Rig(hub=hub, swarm=swarm, files=files, fleet=fleet, members=members)
    result: dict[str, Any] = {"fsync": fsync, "members": members}
    try:
        started = time.time()
        await swarm.start()
        console.print(f"  {members} members joining ...")
        result["joined"] = round(await all_ready(fleet, members, heard_since=started)
                                 - started, 2)
        console.print(f"  settling {SETTLE:g}s, then a {window:g}s steady-state window ...")
        result |= await steady(rig, window)
        console.print(f"  {runs} fleet-wide runs ...")
        made = await fan_out(rig, runs)
        result["hubPeakRssMib"] = round(hub.memory_mib("VmHWM"), 1)
        console.print(f"  {restarts} hub restarts (SIGKILL) ...")
        result["restarts"] = []
        for _ in range(restarts):
            result["restarts"].append(await restart(rig))
            await asyncio.sleep(SETTLE)
    finally:
        await fleet.close()
        await swarm.stop()
        await hub.stop()
    observed = json.loads(report.read_text())
    received, acknowledged = [], []
    for run, _ in made:
        created = run.created_at.ToNanoseconds() / 1e9
        for part in run.members:
            received.append(observed["received"][part.command_id] - created)
            acknowledged.append(part.acknowledged_at.ToNanoseconds() / 1e9 - created)
    result["received"], result["acknowledged"] = stats(received), stats(acknowledged)
    result["runPlanCall"] = stats([call for _, call in made])
    result["duplicates"] = observed["deliveries"] - len(observed["received"])
    result["heartbeatsSentPerSecond"] = round(sent_rate(observed["beats"], *result["window"]),
                                              1)
    for each in result["restarts"]:
        # The members' own view: when the last of them had its session up again.
        killed = each.pop("killedAt")
        each["membersUp"] = round(max(
            min((up for up in ups if up > killed), default=math.inf) - killed
            for ups in observed["ups"].values()), 2)
    return result


def report(results: list[dict[str, Any]], console: Console) -> None:
    members = results[0]["members"]
    table = Table(title=f"Federation hub, {members} simulated members over TLS on loopback "
                        f"({os.cpu_count()} CPUs), heartbeats every {HEARTBEAT:g}s")
    table.add_column("")
    for result in results:
        table.add_column("fsync" if result["fsync"] else "no fsync", justify="right")
    table.add_column("goal", justify="right")

    def row(label: str, cell: Any, goal: str = "") -> None:
        table.add_row(label, *(cell(result) for result in results), goal)

    def spread(key: str) -> Any:
        return lambda r: f"{r[key]['p50']:.2f} / {r[key]['p99']:.2f} / {r[key]['max']:.2f}"

    row("all Ready after the members start (s)", lambda r: f"{r['joined']:.1f}")
    row("hub RSS, steady / peak (MiB)",
        lambda r: f"{r['hubRssMib']:.0f} / {r['hubPeakRssMib']:.0f}")
    row("hub CPU, steady (% of one core)", lambda r: f"{r['hubCpuPercent']:.1f}")
    row("members process CPU (% of one core)", lambda r: f"{r['membersCpuPercent']:.1f}")
    row("heartbeats/s processed by the hub", lambda r: f"{r['heartbeatsPerSecond']:.1f}",
        f"{members / HEARTBEAT:g}")
    row("heartbeats/s sent by the members", lambda r: f"{r['heartbeatsSentPerSecond']:.1f}")
    row("RunPlan call p50 / p99 / max (s)", spread("runPlanCall"))
    row("RunPlan → member has it p50 / p99 / max (s)", spread("received"), "p99 ≤ 1")
    row("RunPlan → hub has the ack p50 / p99 / max (s)", spread("acknowledged"), "p99 ≤ 1")
    row("commands delivered twice", lambda r: str(r["duplicates"]), "0")
    row("SIGKILL → hub serves again (s)",
        lambda r: " / ".join(f"{x['serving']:.1f}" for x in r["restarts"]))
    row("SIGKILL → all Ready again, hub's view (s)",
        lambda r: " / ".join(f"{x['ready']:.1f}" for x in r["restarts"]), "≤ 10")
    row("SIGKILL → all sessions up, members' view (s)",
        lambda r: " / ".join(f"{x['membersUp']:.1f}" for x in r["restarts"]))
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0,
                        help="steady-state seconds (at least 25: two stats lines fall in it)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep state and logs here (default: a temporary directory)")
    parser.add_argument("--fsync", choices=("off", "on", "both"), default="both",
                        help="whether the hub fsyncs its state file (default: both, one after "
                             "the other)")
    sub = parser.add_subparsers(dest="command")
    members = sub.add_parser("members", help="(internal) the members process")
    members.add_argument("--count", type=int, required=True)
    members.add_argument("--address", required=True)
    members.add_argument("--ca", type=Path, required=True)
    members.add_argument("--key", type=Path, required=True, help="the hub's key, for tokens")
    members.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "members":
        asyncio.run(simulate(args.count, HubAddress.of(args.address, args.ca),
                             args.key.read_bytes(), args.report))
        return
    sigterm_interrupts()
    if args.window < 25:
        parser.error(f"--window {args.window:g}: at least 25 s, so that two of the hub's "
                     f"stats lines (every 10 s) fall in it")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.fsync]
    results = []
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="fakefleet-bench-hub-"))
        Path(workdir).mkdir(parents=True, exist_ok=True)
        for fsync in modes:
            console.print(f"[bold]hub {'with' if fsync else 'without'} fsync[/]")
            results.append(asyncio.run(bench(
                Path(workdir), members=args.members, runs=args.runs, restarts=args.restarts,
                window=args.window, fsync=fsync, console=console)))
    report(results, console)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"hub-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
