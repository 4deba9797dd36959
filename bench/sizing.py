"""What one member cluster, 1000 fake nodes and 1000 pods cost, the figures docs/scale-out.md
sizes a fleet with:

    python -m bench.sizing [--clusters 2] [--nodes 500] [--pods 500] [--window 60]

Members as a FakeCluster runs them by default (kube-apiserver, kube-scheduler and
kube-controller-manager on one shared etcd, default profile), each with its own engine process
(``python -m operators.engine``). Measured in four states, each after the cluster settled:
etcd alone; idle members whose engines serve one node each (what a member costs before its
nodes do); ``--nodes`` Ready nodes per member, their Leases renewed; and ``--pods`` bound pods
Running per member. In each: every process's resident memory (RSS, now,
not its peak) and CPU over a ``--window``-second window, and the bytes etcd holds per kind of
object under each member's prefix (keys and values as stored, Kubernetes protobuf) and in all
(its database file and how much of it is in use; etcd compacts and defragments nothing during
the run). Per-member, per-1000-node and per-1000-pod figures are differences between the
states, divided: measured at this size, extrapolated beyond it.

Results also go to ``bench/results/sizing-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from bench.engines import PHASE_TIMEOUT, RESULTS
from bench.fleet import Member
from bench.terminating import sigterm_interrupts
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import etcd_prefix
from operators.controlplane.etcd import EtcdEndpoint
from operators.controlplane.substrate import ClusterOptions, Substrate

#: Seconds the cluster is left alone before a state is measured (a burst of writes settles).
SETTLE = 30.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class ProcessSample:
    name: str
    role: str
    rss_mib: float
    cpu_per_second: float


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


async def sample(processes: dict[str, tuple[str, int]], window: float) -> list[ProcessSample]:
    """RSS at the end of ``window`` seconds and the CPU each process used during it."""
    before = {name: _cpu_seconds(pid) for name, (_, pid) in processes.items()}
    await asyncio.sleep(window)
    return [ProcessSample(name, role, round(_rss_mib(pid), 1),
                          round((_cpu_seconds(pid) - before[name]) / window, 4))
            for name, (role, pid) in processes.items()]


async def etcd_call(etcd: EtcdEndpoint, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            etcd.url + path, json=body, ssl=etcd.tls()) as response:
        response.raise_for_status()
        found: dict[str, Any] = await response.json()
        return found


async def etcd_bytes(etcd: EtcdEndpoint, prefix: str) -> dict[str, dict[str, int]]:
    """Per resource under ``prefix`` (its first path segment): keys, and bytes of keys and
    values as etcd stores them."""
    start, end = prefix + "/", prefix + "0"  # '0' follows '/': the whole subtree
    keys: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    key = start
    while True:
        page = await etcd_call(etcd, "/v3/kv/range", {
            "key": base64.b64encode(key.encode()).decode(),
            "range_end": base64.b64encode(end.encode()).decode(), "limit": 500})
        items = page.get("kvs") or []
        for item in items:
            name = base64.b64decode(item["key"]).decode()
            resource = name[len(start):].split("/", 1)[0]
            keys[resource] += 1
            sizes[resource] += len(name) + len(base64.b64decode(item.get("value", "")))
        if not page.get("more") or not items:
            break
        key = base64.b64decode(items[-1]["key"]).decode() + "\0"
    return {resource: {"keys": keys[resource], "bytes": sizes[resource]} for resource in keys}


async def etcd_status(etcd: EtcdEndpoint) -> dict[str, int]:
    found = await etcd_call(etcd, "/v3/maintenance/status", {})
    return {"dbSize": int(found.get("dbSize", 0)), "dbSizeInUse": int(found.get("dbSizeInUse", 0))}


async def measure(substrate: Substrate, members: list[Member], window: float,
                  state: str, settle: float) -> dict[str, Any]:
    await asyncio.sleep(settle)
    processes: dict[str, tuple[str, int]] = {}
    for component in substrate.components():
        if component.pid is not None:
            processes[f"{component.cluster or 'shared'} {component.name}"] = (
                component.name, component.pid)
    for member in members:
        if member.engine is not None:
            processes[f"{member.cluster.name} engine"] = ("engine", member.engine.pid)
    samples = await sample(processes, window)
    stored = {m.cluster.name: await etcd_bytes(substrate.etcd, etcd_prefix(m.cluster.name))
              for m in members}
    return {"state": state, "processes": [dataclasses.asdict(s) for s in samples],
            "etcdByCluster": stored, "etcd": await etcd_status(substrate.etcd)}


async def reach(members: list[Member], what: str, tally: str, count: int,
                timeout: float) -> None:
    """Until every member's ``tally`` (nodes Ready, pods Running) reaches ``count``; an engine
    that dies meanwhile ends the run, saying how."""
    async def one(member: Member) -> None:
        deadline = time.monotonic() + timeout
        counter = getattr(member, tally)
        while not await counter.until(lambda t: t.matching >= count, 5.0):
            engine = member.engine
            if engine is not None and engine.returncode is not None:
                log = (member.workdir / f"{member.cluster.name}-engine.log").read_text()
                raise SystemExit(f"{member.cluster.name}'s engine exited with "
                                 f"{engine.returncode} before {what}:\n{log[-2000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{member.cluster.name}: not {what} after {timeout:.0f}s "
                                 f"({counter.matching} of {count})")
    await asyncio.gather(*(one(member) for member in members))


async def stop_engine(member: Member) -> None:
    if member.engine is not None and member.engine.returncode is None:
        member.engine.terminate()
        await member.engine.wait()


async def run(binaries: binaries_.Binaries, workdir: Path, *, clusters: int, nodes: int,
              pods: int, window: float, settle: float = SETTLE) -> dict[str, Any]:
    states = []
    async with Substrate(workdir, binaries, fsync=False) as substrate:
        states.append(await measure(substrate, [], window, "etcd alone", settle))
        locals_ = [await substrate.add_cluster(f"member-{index}", ClusterOptions())
                   for index in range(clusters)]
        members = [Member(cluster, workdir) for cluster in locals_]
        try:
            for member in members:
                await member.start(nodes)
            # An engine serving one node: what a member costs before its nodes do.
            await asyncio.gather(*(m.spawn_engine(1) for m in members))
            await reach(members, "its first node was Ready", "nodes", 1, 120)
            states.append(await measure(substrate, members, window, "members, 1 node each",
                                        settle))
            for member in members:  # the next engine adopts that node and makes the rest
                await stop_engine(member)
            await asyncio.gather(*(m.spawn_engine(nodes) for m in members))
            await reach(members, "every node was Ready", "nodes", nodes, PHASE_TIMEOUT)
            states.append(await measure(substrate, members, window, "nodes Ready", settle))
            await asyncio.gather(*(m.make_pods(pods) for m in members))
            await reach(members, "every pod was Running", "pods", pods, PHASE_TIMEOUT)
            states.append(await measure(substrate, members, window, "pods Running", settle))
        finally:
            for member in members:
                await member.stop()
    return {"clusters": clusters, "nodesPerCluster": nodes, "podsPerCluster": pods,
            "window": window, "cpus": os.cpu_count(), "kubernetesVersion": binaries.version,
            "load": os.getloadavg(), "states": states}


def _by_role(state: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Total RSS (MiB) and CPU (cores) of each role, summed over its processes."""
    totals: dict[str, list[float]] = {}
    for process in state["processes"]:
        rss_cpu = totals.setdefault(process["role"], [0.0, 0.0])
        rss_cpu[0] += process["rss_mib"]
        rss_cpu[1] += process["cpu_per_second"]
    return {role: (rss, cpu) for role, (rss, cpu) in totals.items()}


def _etcd_kinds(state: dict[str, Any]) -> Counter[str]:
    total: Counter[str] = Counter()
    for resources in state["etcdByCluster"].values():
        for resource, found in resources.items():
            total[resource] += found["bytes"]
    return total


def sizing(result: dict[str, Any]) -> list[tuple[str, str, float, float]]:
    """(what, role, RSS MiB, CPU cores) per member, per 1000 nodes, per 1000 pods."""
    etcd_only, idle, with_nodes, with_pods = result["states"]
    clusters = result["clusters"]
    nodes = clusters * (result["nodesPerCluster"] - 1)
    pods = clusters * result["podsPerCluster"]
    rows: list[tuple[str, str, float, float]] = []
    for what, after, before, count in (
            ("per member cluster (idle, 1 node)", idle, etcd_only, clusters),
            ("per 1000 Ready nodes", with_nodes, idle, nodes / 1000),
            ("per 1000 Running pods", with_pods, with_nodes, pods / 1000)):
        now, then = _by_role(after), _by_role(before)
        for role in sorted(now):
            rss = (now[role][0] - then.get(role, (0.0, 0.0))[0]) / count
            cpu = (now[role][1] - then.get(role, (0.0, 0.0))[1]) / count
            rows.append((what, role, rss, cpu))
    return rows


def report(result: dict[str, Any], console: Console) -> None:
    title = (f"{result['clusters']} members x {result['nodesPerCluster']} nodes, "
             f"{result['podsPerCluster']} pods each, {result['cpus']} CPUs, "
             f"CPU over {result['window']:.0f} s windows")
    states = Table(title=f"measured: {title}")
    for column in ("state", "RSS all (MiB)", "CPU all (cores)", "etcd in use (MiB)",
                   "etcd file (MiB)"):
        states.add_column(column, justify="left" if column == "state" else "right")
    for state in result["states"]:
        roles = _by_role(state)
        states.add_row(state["state"], f"{sum(r for r, _ in roles.values()):.0f}",
                       f"{sum(c for _, c in roles.values()):.3f}",
                       f"{state['etcd']['dbSizeInUse'] / 2**20:.1f}",
                       f"{state['etcd']['dbSize'] / 2**20:.1f}")
    console.print(states)
    derived = Table(title="derived: what each member, 1000 nodes and 1000 pods add")
    for column in ("per", "process", "RSS (MiB)", "CPU (cores)"):
        derived.add_column(column, justify="left" if column in ("per", "process") else "right")
    for what, role, rss, cpu in sizing(result):
        derived.add_row(what, role, f"{rss:.0f}", f"{cpu:.3f}")
    console.print(derived)
    _, idle, with_nodes, with_pods = result["states"]
    clusters = result["clusters"]
    nodes = clusters * (result["nodesPerCluster"] - 1)
    pods = clusters * result["podsPerCluster"]
    stored = Table(title="etcd: bytes stored (keys and values) per kind, all members")
    for column in ("kind", "after members", "after nodes", "after pods", "per 1000 nodes (KiB)",
                   "per 1000 pods (KiB)"):
        stored.add_column(column, justify="left" if column == "kind" else "right")
    at_idle, at_nodes, at_pods = (_etcd_kinds(s) for s in (idle, with_nodes, with_pods))
    for kind in sorted(set(at_idle) | set(at_nodes) | set(at_pods)):
        stored.add_row(kind, f"{at_idle[kind]}", f"{at_nodes[kind]}", f"{at_pods[kind]}",
                       f"{(at_nodes[kind] - at_idle[kind]) / nodes * 1000 / 1024:.0f}",
                       f"{(at_pods[kind] - at_nodes[kind]) / pods * 1000 / 1024:.0f}")
    total = [sum(c.values()) for c in (at_idle, at_nodes, at_pods)]
    stored.add_row("all", *(str(t) for t in total),
                   f"{(total[1] - total[0]) / nodes * 1000 / 1024:.0f}",
                   f"{(total[2] - total[1]) / pods * 1000 / 1024:.0f}")
    console.print(stored)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=500, help="per cluster")
    parser.add_argument("--pods", type=int, default=500, help="per cluster")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds over which each state's CPU is measured")
    parser.add_argument("--settle", type=float, default=SETTLE,
                        help="seconds each state is left alone before it is measured")
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=160)
    binaries = binaries_.resolve()
    console.print(f"[bold]{args.clusters} members[/] x {args.nodes} nodes, {args.pods} pods "
                  f"each; load {os.getloadavg()[0]:.2f} at the start")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir:
        result = asyncio.run(run(binaries, Path(workdir), clusters=args.clusters,
                                 nodes=args.nodes, pods=args.pods, window=args.window,
                                 settle=args.settle))
    report(result, console)
    console.print(f"{time.monotonic() - started:.0f} s in all; load average at the end "
                  f"{' / '.join(f'{x:.2f}' for x in result['load'])} (1, 5, 15 min)")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"sizing-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
