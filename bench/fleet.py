"""Several member clusters at once, each with its own engine process, on one shared etcd:

    python -m bench.fleet [--clusters 4] [--nodes 1250] [--pods 2500]

Every cluster is a real kube-apiserver and kube-controller-manager (its node-lifecycle
controller watches the Leases) on one etcd, with the load profile; every engine is a
``python -m operators.engine`` process started at the same moment. Phases, each timed until
every object of every cluster reached its state: all nodes Ready; ``--pods`` bound pods per
cluster Running; those pods deleted. Per phase, the longest time any node went without a Lease
renewal and how many Ready nodes turned NotReady; at the end, each process's peak RSS (and CPU
seconds for the engines).

Results also go to ``bench/results/fleet-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engines import (
    CONCURRENCY,
    NAMESPACE,
    PHASE_TIMEOUT,
    POOL,
    RESULTS,
    LeaseGaps,
    Tally,
    bounded,
    node_ready,
    pod_body,
    pod_running,
)
from bench.terminating import sigterm_interrupts
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import Profile
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import NotFound


@dataclasses.dataclass
class FleetPhase:
    name: str
    objects: int
    seconds: float | None
    lease_gap: float | None
    nodes_lost: int


@dataclasses.dataclass
class ProcessUsage:
    name: str
    peak_rss_mib: float
    cpu_seconds: float


def usage(name: str, pid: int) -> ProcessUsage:
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return ProcessUsage(name, round(peak, 1), round(cpu, 1))


class Member:
    """One cluster of the fleet: its clients, watches and engine process."""

    def __init__(self, cluster: LocalCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        self.client = Client.connect(access, connections=CONCURRENCY // 2, timeout=300)
        self.watcher = Client.connect(access, connections=4)
        self.nodes = Tally(self.watcher, "/api/v1/nodes", {}, node_ready)
        self.pods = Tally(self.watcher, "/api/v1/pods", {}, pod_running)
        self.leases = LeaseGaps(self.watcher)
        self.engine: asyncio.subprocess.Process | None = None

    async def start(self, nodes: int) -> None:
        for watch in (self.nodes, self.pods, self.leases):
            watch.start()
        deadline = time.monotonic() + 60
        while True:  # pods need the default ServiceAccount, made by the controller-manager
            try:
                await self.client.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                break
            except NotFound:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def spawn_engine(self, nodes: int) -> None:
        with (self.workdir / f"{self.cluster.name}-engine.log").open("wb") as log:
            self.engine = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "operators.engine",
                "--kubeconfig", str(self.cluster.kubeconfig_path),
                "--pool", f"{POOL}={nodes}", "--grace-cap", "0s",
                "--concurrency", str(CONCURRENCY), stdout=log, stderr=asyncio.subprocess.STDOUT)

    async def make_pods(self, pods: int) -> None:
        listed = await self.client.get("/api/v1/nodes")
        names = sorted(item["metadata"]["name"] for item in listed["items"])
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        await bounded([lambda i=index: self.client.create(path, pod_body(
            f"bench-{i}", names[i % len(names)])) for index in range(pods)], CONCURRENCY // 2)

    async def delete_pods(self, pods: int) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"

        async def delete(index: int) -> None:
            with contextlib.suppress(NotFound):
                await self.client.delete(f"{path}/bench-{index}")

        await bounded([lambda i=index: delete(i) for index in range(pods)], CONCURRENCY // 2)

    async def stop(self) -> None:
        for watch in (self.nodes, self.pods, self.leases):
            await watch.stop()
        if self.engine is not None and self.engine.returncode is None:
            self.engine.terminate()
            await self.engine.wait()
        await self.client.close()
        await self.watcher.close()


async def phase(members: list[Member], name: str, objects: int,
                act: Callable[[Member], Awaitable[None]],
                done: Callable[[Member], Awaitable[bool]]) -> FleetPhase:
    lost = sum(m.nodes.lost for m in members)
    for member in members:
        member.leases.restart()
    started = time.monotonic()
    waiting = [asyncio.create_task(done(member)) for member in members]
    await asyncio.gather(*(act(member) for member in members))
    completed = all(await asyncio.gather(*waiting))
    seconds = time.monotonic() - started if completed else None
    gaps = [gap for m in members if (gap := m.leases.phase_worst()) is not None]
    return FleetPhase(name, objects, round(seconds, 1) if seconds else None,
                      round(max(gaps), 1) if gaps else None,
                      sum(m.nodes.lost for m in members) - lost)


async def run(binaries: binaries_.Binaries, workdir: Path, *, clusters: int, nodes: int,
              pods: int) -> dict[str, Any]:
    async with Substrate(workdir, binaries, fsync=False) as substrate:
        locals_ = [await substrate.add_cluster(f"member-{index}", ClusterOptions(
            profile=Profile.LOAD, scheduler=False)) for index in range(clusters)]
        members = [Member(cluster, workdir) for cluster in locals_]
        phases: list[FleetPhase] = []
        try:
            for member in members:
                await member.start(nodes)
            phases.append(await phase(
                members, "nodes Ready", clusters * nodes,
                lambda m: m.spawn_engine(nodes),
                lambda m: m.nodes.until(lambda t: t.matching >= nodes, PHASE_TIMEOUT)))
            phases.append(await phase(
                members, "pods Running (bound)", clusters * pods, lambda m: m.make_pods(pods),
                lambda m: m.pods.until(lambda t: t.matching >= pods, PHASE_TIMEOUT)))
            phases.append(await phase(
                members, "pods deleted (bound)", clusters * pods,
                lambda m: m.delete_pods(pods),
                lambda m: m.pods.until(lambda t: t.present == 0, PHASE_TIMEOUT)))
            processes = [usage(f"{m.cluster.name} engine", m.engine.pid)
                         for m in members if m.engine is not None]
            for component in substrate.components():
                if component.pid is not None:
                    processes.append(usage(f"{component.cluster or 'shared'} {component.name}",
                                           component.pid))
        finally:
            for member in members:
                await member.stop()
    return {"clusters": clusters, "nodesPerCluster": nodes, "podsPerCluster": pods,
            "cpus": os.cpu_count(), "kubernetesVersion": binaries.version,
            "phases": [dataclasses.asdict(p) for p in phases],
            "processes": [dataclasses.asdict(p) for p in processes]}


def report(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{result['clusters']} clusters x {result['nodesPerCluster']} nodes, "
                        f"{result['podsPerCluster']} pods each, one engine process per "
                        f"cluster, {result['cpus']} CPUs")
    for column in ("phase", "objects", "seconds", "objects/s", "longest Lease gap (s)",
                   "nodes turned NotReady"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for item in result["phases"]:
        seconds = item["seconds"]
        table.add_row(item["name"], str(item["objects"]),
                      f"{seconds:.1f}" if seconds else "timeout",
                      f"{item['objects'] / seconds:.0f}" if seconds else "-",
                      f"{item['lease_gap']:.1f}" if item["lease_gap"] is not None else "-",
                      str(item["nodes_lost"]))
    console.print(table)
    usage_table = Table(title="processes: peak RSS and CPU over the whole run")
    for column in ("process", "peak RSS (MiB)", "CPU (s)"):
        usage_table.add_column(column, justify="left" if column == "process" else "right")
    for item in sorted(result["processes"], key=lambda p: p["name"]):
        usage_table.add_row(item["name"], f"{item['peak_rss_mib']:.0f}",
                            f"{item['cpu_seconds']:.0f}")
    console.print(usage_table)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=1250, help="per cluster")
    parser.add_argument("--pods", type=int, default=2500, help="per cluster")
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=160)
    binaries = binaries_.resolve()
    console.print(f"[bold]{args.clusters} clusters[/] x {args.nodes} nodes, {args.pods} pods "
                  f"each ...")
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir:
        result = asyncio.run(run(binaries, Path(workdir), clusters=args.clusters,
                                 nodes=args.nodes, pods=args.pods))
    report(result, console)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"fleet-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"results: {out}")
    if any(item["seconds"] is None for item in result["phases"]):
        raise SystemExit("some phases did not complete in time")


if __name__ == "__main__":
    main()
