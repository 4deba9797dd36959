"""What DRA costs at scale: fakefleet's engine with a pool of GPU nodes offered through DRA, and
the real scheduler allocating claims on them:

    python -m bench.dra [--nodes 5000] [--pods 2000] [--gpus-per-claim 1]

One fresh control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, the
load profile as in ``bench.engines``) and one engine process (``--pool
gpu=N:H100-SXM5-80GB:dra``: 8 GPUs a node). Phases, each timed until every object got there:

1. nodes: N nodes Ready, and their N ResourceSlices published (the engine writes each slice
   after its node);
2. claims: P pods, each with a claim of ``--gpus-per-claim`` GPUs from a ResourceClaimTemplate
   of DeviceClass gpu.fakefleet.dev, created at once; the controller-manager makes the claims,
   the scheduler allocates them and binds the pods, the engine checks the claims and runs the
   pods: until all P are Running;
3. delete: the pods deleted; until they and their claims are gone.

Reported per phase: seconds, objects/s, and the API server's mutating requests per object by
kind (from its own apiserver_request_total); then the engine's peak RSS and CPU seconds, the
bytes of all slices as the API serves them (JSON), and the API server's RSS. Results also go
to ``bench/results/dra-<time>.json`` (git-ignored).
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
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engines import CONCURRENCY, PHASE_TIMEOUT, Tally, bounded, untraced_environment
from bench.metrics import mutating_requests
from bench.terminating import sigterm_interrupts
from operators.api.gpus import DEVICE_CLASS
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import Profile
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate
from operators.engine.devices import SLICES
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import Conflict, NotFound

RESULTS = Path(__file__).parent / "results"
NAMESPACE = "default"
POOL = "gpu"
PRESET = "H100-SXM5-80GB"
GPUS_PER_NODE = 8
TEMPLATE = "gpus"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
TEMPLATES = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates"


@dataclasses.dataclass
class Phase:
    name: str
    objects: int
    seconds: float | None = None  # None: did not complete in time
    writes: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        return self.objects / self.seconds if self.seconds else None


@dataclasses.dataclass
class Run:
    nodes: int
    pods: int
    gpus_per_claim: int
    phases: list[Phase] = dataclasses.field(default_factory=list)
    slices_seconds: float | None = None  # phase 1: until every slice was published
    slice_bytes: int = 0
    engine_peak_rss_mib: float | None = None
    engine_cpu_seconds: float | None = None
    apiserver_rss_mib: float | None = None
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)


def node_ready(node: Any) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or ())


def pod_running(pod: Any) -> bool:
    return bool((pod.get("status") or {}).get("phase") == "Running")


def template_body(gpus: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": DEVICE_CLASS, "count": gpus}}]}}}}


def pod_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"tolerations": [{"operator": "Exists"}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": TEMPLATE}],
                     "containers": [{"name": "c", "image": "fake",
                                     "resources": {"claims": [{"name": "gpus"}]}}]}}


def usage(pid: int) -> tuple[float | None, float | None]:
    """Peak RSS (MiB) and CPU seconds of a live process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except OSError:
        return None, None
    peak = next((int(line.split()[1]) / 1024 for line in status
                 if line.startswith("VmHWM:")), None)
    return peak, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def apiserver_rss(cluster: LocalCluster) -> float | None:
    """The member kube-apiserver's RSS (MiB)."""
    pid = cluster.apiserver.pid
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


class Harness:
    def __init__(self, cluster: LocalCluster, workdir: Path, *, nodes: int, pods: int,
                 gpus: int) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.run = Run(nodes, pods, gpus)
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        self.client = Client.connect(access, connections=CONCURRENCY, timeout=300)
        self.watcher = Client.connect(access, connections=8)  # 4 watches, and /metrics
        self.process: asyncio.subprocess.Process | None = None

    async def measure(self) -> Run:
        run = self.run
        nodes = Tally(self.watcher, "/api/v1/nodes", {}, node_ready)
        slices = Tally(self.watcher, SLICES, {}, lambda _: True)
        pods = Tally(self.watcher, PODS, {}, pod_running)
        claims = Tally(self.watcher, CLAIMS, {}, lambda _: True)
        watched = (nodes, slices, pods, claims)
        for tally in watched:
            tally.start()
        try:
            await self._service_account()
            await self.client.create(TEMPLATES, template_body(run.gpus_per_claim))
            started = time.monotonic()

            async def published() -> bool:
                done = await slices.until(lambda t: t.present >= run.nodes, PHASE_TIMEOUT)
                run.slices_seconds = time.monotonic() - started if done else None
                return done

            async def nodes_and_slices() -> bool:
                both = await asyncio.gather(
                    nodes.until(lambda t: t.matching >= run.nodes, PHASE_TIMEOUT), published())
                return all(both)

            run.phases.append(await self._phase(
                "nodes Ready, slices published", run.nodes, self._start_engine,
                nodes_and_slices))
            run.slice_bytes = await self._slice_bytes()
            run.phases.append(await self._phase(
                "claims allocated, pods Running", run.pods, self._make_pods,
                lambda: pods.until(lambda t: t.matching >= run.pods, PHASE_TIMEOUT)))
            run.phases.append(await self._phase(
                "pods and claims deleted", run.pods, self._delete_pods,
                lambda: pods.until(lambda t: t.present == 0, PHASE_TIMEOUT)))
            await claims.until(lambda t: t.present == 0, PHASE_TIMEOUT)
            if self.process is not None:
                run.engine_peak_rss_mib, run.engine_cpu_seconds = usage(self.process.pid)
            run.apiserver_rss_mib = apiserver_rss(self.cluster)
            run.load_average = os.getloadavg()
        finally:
            for tally in watched:
                await tally.stop()
            await self._stop_engine()
            await self.client.close()
            await self.watcher.close()
        return run

    async def _phase(self, name: str, objects: int, act: Any, done: Any) -> Phase:
        before = mutating_requests(await self.watcher.get_text("/metrics"))
        started = time.monotonic()
        waiting = asyncio.create_task(done())
        await act()
        completed = await waiting
        seconds = time.monotonic() - started if completed else None
        after = mutating_requests(await self.watcher.get_text("/metrics"))
        writes = {key: after[key] - before.get(key, 0) for key in sorted(after)
                  if after[key] > before.get(key, 0)}
        return Phase(name, objects, seconds, writes)

    async def _service_account(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                await self.client.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                return
            except NotFound:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _slice_bytes(self) -> int:
        text = await self.watcher.get_text(SLICES)
        return len(text.encode())

    async def _start_engine(self) -> None:
        log = (self.workdir / "engine.log").open("wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "operators.engine",
            "--kubeconfig", str(self.cluster.kubeconfig_path),
            "--pool", f"{POOL}={self.run.nodes}:{PRESET}:dra", "--grace-cap", "0s",
            "--concurrency", str(CONCURRENCY),
            stdout=log, stderr=asyncio.subprocess.STDOUT, env=untraced_environment())
        log.close()

    async def _make_pods(self) -> None:
        async def make(index: int) -> None:
            with contextlib.suppress(Conflict):
                await self.client.create(PODS, pod_body(f"claim-{index}"), decode=False)
        await bounded([lambda i=i: make(i) for i in range(self.run.pods)])

    async def _delete_pods(self) -> None:
        async def delete(index: int) -> None:
            with contextlib.suppress(NotFound):
                await self.client.delete(f"{PODS}/claim-{index}", decode=False)
        await bounded([lambda i=i: delete(i) for i in range(self.run.pods)])

    async def _stop_engine(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def measure(binaries: binaries_.Binaries, workdir: Path, *, nodes: int, pods: int,
                  gpus: int) -> Run:
    async with Substrate(workdir, binaries, fsync=False,
                         environ=untraced_environment()) as substrate:
        cluster = await substrate.add_cluster("dra", ClusterOptions(profile=Profile.LOAD))
        return await Harness(cluster, workdir, nodes=nodes, pods=pods, gpus=gpus).measure()


def report(run: Run, console: Console) -> None:
    table = Table(title=f"DRA: {run.nodes} nodes of {GPUS_PER_NODE} GPUs, {run.pods} pods with "
                        f"a claim of {run.gpus_per_claim} GPU(s), {os.cpu_count()} CPUs, load "
                        f"{run.load_average[0]:.1f} at the end")
    for column in ("phase", "s", "obj/s", "writes/obj", "largest shares"):
        table.add_column(column, justify="left" if column in ("phase", "largest shares")
                         else "right")
    for phase in run.phases:
        top = sorted(phase.writes.items(), key=lambda item: -item[1])[:4]
        table.add_row(phase.name, f"{phase.seconds:.1f}" if phase.seconds else "timeout",
                      f"{phase.rate:.0f}" if phase.rate else "-",
                      f"{sum(phase.writes.values()) / phase.objects:.1f}",
                      ", ".join(f"{key} {count}" for key, count in top))
    console.print(table)
    facts = Table(title="footprint")
    facts.add_column("what")
    facts.add_column("value", justify="right")
    facts.add_row("slices published (s from the engine's start)",
                  f"{run.slices_seconds:.1f}" if run.slices_seconds else "timeout")
    facts.add_row("all slices as JSON (MiB)", f"{run.slice_bytes / 2**20:.1f}")
    facts.add_row("bytes per slice", f"{run.slice_bytes / max(run.nodes, 1):.0f}")
    for label, value in (("engine peak RSS (MiB)", run.engine_peak_rss_mib),
                         ("engine CPU (s)", run.engine_cpu_seconds),
                         ("kube-apiserver RSS at the end (MiB)", run.apiserver_rss_mib)):
        facts.add_row(label, f"{value:.0f}" if value is not None else "-")
    console.print(facts)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--gpus-per-claim", type=int, default=1, choices=range(1, 9),
                        metavar="1..8")
    parser.add_argument("--output", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    if args.pods * args.gpus_per_claim > args.nodes * GPUS_PER_NODE:
        parser.error(f"--pods {args.pods} with --gpus-per-claim {args.gpus_per_claim} need "
                     f"more GPUs than {args.nodes} nodes of {GPUS_PER_NODE} have")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    binaries = binaries_.resolve()
    console.print(f"[bold]DRA[/]: {args.nodes} nodes, {args.pods} pods ...")
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir:
        run = asyncio.run(measure(binaries, Path(workdir), nodes=args.nodes, pods=args.pods,
                                  gpus=args.gpus_per_claim))
    report(run, console)
    payload = {"cpus": os.cpu_count(), "kubernetesVersion": binaries.version,
               "run": dataclasses.asdict(run)}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"dra-{time.strftime('%Y%m%dT%H%M%S')}.json"
    for path in (out, args.output):
        if path is not None:
            path.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results: {out}")
    if any(phase.seconds is None for phase in run.phases) or run.slices_seconds is None:
        sys.exit(1)


if __name__ == "__main__":
    main()
