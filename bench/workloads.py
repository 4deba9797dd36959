"""Workloads of GPU Jobs over a fleet, placed by the hub and by Kueue MultiKueue:

    python -m bench.workloads [--jobs 1000] [--pods 8] [--clusters 3] [--nodes 100]
                              [--run-time 10] [--rate 10] [--scenarios hub,multikueue]

Everything is the product as a user runs it: ``fakefleet up`` (host control plane, operator,
hub), worker FakeClusters of ``--nodes`` H100 nodes (8 GPUs each) applied with kubectl, and a
workload submitted to the hub: ``--jobs`` Jobs of ``--pods`` pods x 8 GPUs (each pod a whole
node; each Job a gang), Poisson arrivals at ``--rate`` a second, run times uniform within 20 %
of ``--run-time``.

- ``hub``: the hub places each Job (spread) on a worker with room for the whole gang;
- ``multikueue``: Kueue v0.17.0 runs on every worker and on a manager FakeCluster (no nodes),
  the hub sends every Job to the manager's LocalQueue, and MultiKueue dispatches it to a worker.

Per scenario: seconds from submission to the last completion, Jobs admitted per second, p50/p99
from arrival to admission, to all pods running and to completion, GPU utilisation, and each
group of processes' peak RSS and CPU (fakefleet's own: daemon, operator, engines, hub; then the
Kubernetes control planes and Kueue, for context). Results also go to
``bench/results/workloads-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from bench.terminating import sigterm_interrupts
from federation.api import fleet_pb2
from federation.client.channels import HubAddress
from federation.client.discovery import HubFiles, HubInfo
from federation.client.fleet import FleetClient
from federation.hub.convert import seconds
from federation.hub.workloads import latency
from operators.controlplane.state import StateDir

BIN = Path(sys.executable).parent
RESULTS = Path(__file__).parent / "results"
NAMESPACE = "bench"
GPUS_PER_NODE = 8
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def sh(*argv: str, stdin: str | None = None, timeout: float = 900) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


class Host:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.kubeconfig = StateDir(state).host_kubeconfig

    def fakefleet(self, *args: str, timeout: float = 900) -> str:
        return sh(str(BIN / "fakefleet"), *args, "--state-dir", str(self.state),
                  timeout=timeout)

    def apply(self, manifest: str, kubeconfig: Path | None = None) -> None:
        sh(str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig), "apply",
           "--server-side", "-f", "-", stdin=manifest)

    def member(self, name: str) -> Path:
        path = self.state / f"{name}.kubeconfig"
        path.write_text(self.fakefleet("kubeconfig", f"{NAMESPACE}/{name}"))
        return path

    def fleet(self) -> FleetClient:
        files = HubFiles(StateDir(self.state).hub)
        info = HubInfo.read(files.info)
        assert info is not None, "fakefleet up started no hub"
        address = HubAddress.of(info.address, Path(info.ca) if info.ca else None)
        return FleetClient(address, files.fleet_token.read_text().strip())


# -- processes ---------------------------------------------------------------------------------

#: Group → the program (a binary's name, or the module after ``python -m``).
GROUPS = (("daemon", "operators.controlplane.daemon"), ("operator", "operators"),
          ("engines", "operators.engine"), ("hub", "federation.hub"), ("kueue", "kueue"),
          ("etcd", "etcd"), ("kube-apiservers", "kube-apiserver"),
          ("schedulers", "kube-scheduler"), ("controller-managers", "kube-controller-manager"))
FAKEFLEET_GROUPS = ("daemon", "operator", "engines", "hub")


def _group(argv: list[str]) -> str | None:
    program = Path(argv[0]).name if argv else ""
    if "-m" in argv[:-1]:
        program = argv[argv.index("-m") + 1]
    return next((group for group, name in GROUPS if name == program), None)


@dataclasses.dataclass
class Usage:
    """Per group: peak of the summed RSS (MiB), and CPU seconds over the window."""

    peak_rss: dict[str, float] = dataclasses.field(default_factory=dict)
    cpu_start: dict[int, tuple[str, float]] = dataclasses.field(default_factory=dict)
    cpu_now: dict[int, tuple[str, float]] = dataclasses.field(default_factory=dict)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    def sample(self, state: Path) -> None:
        rss: dict[str, float] = {}
        counts: dict[str, int] = {}
        marker = str(state)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
                if not any(marker in arg for arg in argv):
                    continue
                group = _group(argv)
                if group is None:
                    continue
                status = (entry / "status").read_text()
                stat = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            resident = next((int(line.split()[1]) / 1024 for line in status.splitlines()
                             if line.startswith("VmRSS:")), 0.0)
            rss[group] = rss.get(group, 0.0) + resident
            counts[group] = counts.get(group, 0) + 1
            cpu = (int(stat[11]) + int(stat[12])) / CLOCK_TICK
            pid = int(entry.name)
            self.cpu_start.setdefault(pid, (group, cpu))
            self.cpu_now[pid] = (group, cpu)
        for group, value in rss.items():
            self.peak_rss[group] = max(self.peak_rss.get(group, 0.0), value)
        for group, count in counts.items():
            self.counts[group] = max(self.counts.get(group, 0), count)

    def cpu(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for pid, (group, now) in self.cpu_now.items():
            used[group] = used.get(group, 0.0) + now - self.cpu_start[pid][1]
        return used


async def sampling(state: Path, usage: Usage, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.to_thread(usage.sample, state)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


# -- the fleet ---------------------------------------------------------------------------------

def workers_manifest(clusters: int, nodes: int, kueue: bool) -> str:
    docs = []
    for index in range(clusters):
        name = f"worker-{index}"
        addons = "  addons: {kueue: {}}\n" if kueue else ""
        docs.append(f"""apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  labels: {{role: worker}}
  controlPlane: {{profile: load}}
{addons}---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {name}-h100, namespace: {NAMESPACE}}}
spec:
  clusterRef: {name}
  replicas: {nodes}
  gpu: {{preset: H100-SXM5-80GB}}
  template:
    capacity: {{cpu: "224", memory: 2Ti, pods: "110"}}
""")
    return "---\n".join(docs)


def manager_manifest(clusters: int) -> str:
    workers = ", ".join(f"worker-{index}" for index in range(clusters))
    return f"""apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: manager, namespace: {NAMESPACE}}}
spec:
  labels: {{role: manager}}
  controlPlane: {{profile: load}}
  addons:
    kueue:
      multiKueue: {{workers: [{workers}]}}
"""


def queues_manifest(gpus: int, *, manager: bool) -> str:
    check = """  admissionChecksStrategy:
    admissionChecks:
    - name: multikueue
""" if manager else ""
    admission = """---
apiVersion: kueue.x-k8s.io/v1beta2
kind: AdmissionCheck
metadata: {name: multikueue}
spec:
  controllerName: kueue.x-k8s.io/multikueue
  parameters: {apiGroup: kueue.x-k8s.io, kind: MultiKueueConfig, name: fakefleet}
""" if manager else ""
    return f"""apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{name: h100}}
{admission}---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{name: gpu}}
spec:
  namespaceSelector: {{}}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: h100
      resources:
      - {{name: nvidia.com/gpu, nominalQuota: "{gpus}"}}
{check}---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{name: gpu, namespace: default}}
spec: {{clusterQueue: gpu}}
"""


def workload_spec(args: argparse.Namespace, *, manager: bool) -> fleet_pb2.WorkloadSpec:
    target: dict[str, Any] = {"placement": "manager", "manager": "manager", "queue": "gpu",
                              "clusters": {"matchLabels": {"role": "worker"}}} if manager \
        else {"placement": "spread", "clusters": {"matchLabels": {"role": "worker"}}}
    return json_format.ParseDict({
        "jobs": args.jobs, "podsPerJob": args.pods,
        "resources": {"nvidia.com/gpu": str(GPUS_PER_NODE)},
        "runTime": {"distribution": "uniform", "low": args.run_time * 0.8,
                    "high": args.run_time * 1.2},
        "arrivals": {"process": "poisson", "rate": args.rate}, "seed": 1,
        "namespace": "default", "target": target}, fleet_pb2.WorkloadSpec())


async def scenario(host: Host, name: str, spec: fleet_pb2.WorkloadSpec,
                   console: Console, timeout: float) -> dict[str, Any]:
    usage = Usage()
    stop = asyncio.Event()
    sampler = asyncio.create_task(sampling(host.state, usage, stop))
    await asyncio.sleep(1.5)  # a first sample before the load
    async with host.fleet() as fleet:
        started = time.time()
        submitted = await fleet.submit_workload(spec, name=f"bench-{name}", start_delay=0)
        last = time.monotonic()
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                async for workload in fleet.watch_workload(submitted.id):
                    if time.monotonic() - last >= 15:
                        counts = workload.report.counts
                        console.print(f"  {name}: {time.time() - started:.0f}s  waiting "
                                      f"{counts.waiting} pending {counts.pending} running "
                                      f"{counts.running} succeeded {counts.succeeded} failed "
                                      f"{counts.failed}", highlight=False)
                        last = time.monotonic()
        except TimeoutError:
            # Report how far it got (and the processes' usage) rather than lose the run.
            timed_out = True
            console.print(f"  {name}: not finished after {timeout:.0f}s; reporting so far")
        final = await fleet.get_workload(submitted.id, jobs=True)
    stop.set()
    await sampler
    ends = [seconds(j.finished_at) for j in final.jobs if j.HasField("finished_at")]
    wall = (time.time() if timed_out or not ends else max(ends)) - started
    report = final.report
    cpu = usage.cpu()
    # Jobs a scheduler in the member placed elsewhere (MultiKueue): how long their pods ran on
    # the worker, and how much later the manager marked the Job finished.
    released = [(seconds(j.running_at), seconds(j.released_at), seconds(j.finished_at))
                for j in final.jobs if j.HasField("released_at") and j.HasField("running_at")]
    return {
        "scenario": name, "workload": submitted.id, "timedOut": timed_out,
        "phase": fleet_pb2.WorkloadPhase.Name(final.phase),
        "submissionToLastCompletion": round(wall, 1),
        "counts": json_format.MessageToDict(report.counts),
        "admittedPerSecond": round(report.admitted_per_second, 2),
        "toAdmission": json_format.MessageToDict(report.to_admission),
        "toRunning": json_format.MessageToDict(report.to_running),
        "toCompletion": json_format.MessageToDict(report.to_completion),
        "gpuUtilisationMean": round(report.gpu_utilisation_mean, 3),
        "gpuUtilisationPeak": round(report.gpu_utilisation_peak, 3),
        "perCluster": {c.cluster: c.counts.succeeded for c in report.clusters},
        "released": len(released),
        "podsRan": percentiles([end - run for run, end, _ in released]),
        "markedFinishedAfter": percentiles([done - end for _, end, done in released if done]),
        "processes": {group: {"count": usage.counts.get(group, 0),
                              "peakRssMiB": round(usage.peak_rss.get(group, 0.0)),
                              "cpuPercent": round(100 * cpu.get(group, 0.0) / max(wall, 1), 1)}
                      for group, _ in GROUPS if group in usage.peak_rss},
    }


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p99 and max, nearest-rank as in the hub's report ({} for none)."""
    found = latency(values)
    return {"p50": round(found.p50, 1), "p99": round(found.p99, 1),
            "max": round(found.max, 1)} if found.count else {}


async def run(args: argparse.Namespace, state: Path, console: Console) -> dict[str, Any]:
    host = Host(state)
    console.print("fakefleet up ...")
    host.fakefleet("up", "--unsafe-no-fsync")
    results: list[dict[str, Any]] = []
    scenarios = args.scenarios.split(",")
    try:
        host.apply(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}\n")
        host.apply(workers_manifest(args.clusters, args.nodes, kueue=False))
        console.print(f"{args.clusters} workers x {args.nodes} H100 nodes ...")
        host.fakefleet("wait", "--timeout", "900", timeout=960)
        if "hub" in scenarios:
            console.print(f"hub placement: {args.jobs} Jobs x {args.pods} pods x 8 GPUs ...")
            results.append(await scenario(host, "hub", workload_spec(args, manager=False),
                                          console, args.timeout))
        if "multikueue" in scenarios:
            console.print("Kueue on every worker and a MultiKueue manager ...")
            host.apply(workers_manifest(args.clusters, args.nodes, kueue=True))
            host.apply(manager_manifest(args.clusters))
            host.fakefleet("wait", "--timeout", "900", timeout=960)
            gpus = args.nodes * GPUS_PER_NODE
            for index in range(args.clusters):
                host.apply(queues_manifest(gpus, manager=False), host.member(f"worker-{index}"))
            host.apply(queues_manifest(gpus * args.clusters, manager=True),
                       host.member("manager"))
            await asyncio.sleep(10)  # MultiKueue connects to its workers
            console.print(f"MultiKueue: {args.jobs} Jobs to the manager ...")
            results.append(await scenario(host, "multikueue", workload_spec(args, manager=True),
                                          console, args.timeout))
    finally:
        with contextlib.suppress(SystemExit):
            host.fakefleet("down")
    return {"jobs": args.jobs, "podsPerJob": args.pods, "clusters": args.clusters,
            "nodesPerCluster": args.nodes, "runTime": args.run_time, "rate": args.rate,
            "cpus": os.cpu_count(), "scenarios": results}


def report(result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{result['jobs']} Jobs x {result['podsPerJob']} pods x 8 GPUs over "
                        f"{result['clusters']} clusters x {result['nodesPerCluster']} H100 "
                        f"nodes (run time ~{result['runTime']}s, {result['rate']} Jobs/s "
                        f"Poisson), {result['cpus']} CPUs")
    for column in ("scenario", "submission → last completion (s)", "Jobs admitted/s",
                   "to admission p50/p99 (s)", "to running p50/p99 (s)",
                   "to completion p50/p99 (s)", "GPU util mean/peak", "succeeded/failed",
                   "per cluster"):
        table.add_column(column)
    for item in result["scenarios"]:
        def pair(key: str, row: dict[str, Any] = item) -> str:
            return f"{row[key].get('p50', 0):.1f} / {row[key].get('p99', 0):.1f}"
        table.add_row(item["scenario"], f"{item['submissionToLastCompletion']:.0f}",
                      f"{item['admittedPerSecond']:.2f}", pair("toAdmission"),
                      pair("toRunning"), pair("toCompletion"),
                      f"{item['gpuUtilisationMean']:.0%} / {item['gpuUtilisationPeak']:.0%}",
                      f"{item['counts'].get('succeeded', 0)}/{item['counts'].get('failed', 0)}",
                      ", ".join(f"{k} {v}" for k, v in sorted(item["perCluster"].items())))
    console.print(table)
    for item in result["scenarios"]:
        if item.get("released"):
            ran, later = item["podsRan"], item["markedFinishedAfter"]
            console.print(
                f"{item['scenario']}: {item['released']} Jobs ran on a worker: their pods ran "
                f"p50/p99 {ran['p50']:.1f} / {ran['p99']:.1f} s there, and the manager marked "
                f"them finished p50/p99 {later.get('p50', 0):.1f} / {later.get('p99', 0):.1f} s "
                f"after they ended", highlight=False)
    usage = Table(title="processes during each scenario: peak RSS (summed over the group) and "
                        "CPU (% of one core, averaged)")
    for column in ("scenario", "group", "processes", "peak RSS (MiB)", "CPU %"):
        usage.add_column(column)
    for item in result["scenarios"]:
        for group, values in item["processes"].items():
            mine = " (fakefleet)" if group in FAKEFLEET_GROUPS else ""
            usage.add_row(item["scenario"], group + mine, str(values["count"]),
                          str(values["peakRssMiB"]), f"{values['cpuPercent']:.0f}")
    console.print(usage)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=8, help="per Job (8 GPUs each)")
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=100, help="H100 nodes per cluster")
    parser.add_argument("--run-time", type=float, default=10.0, help="seconds (±20 %%)")
    parser.add_argument("--rate", type=float, default=10.0, help="Jobs per second (Poisson)")
    parser.add_argument("--scenarios", default="hub,multikueue")
    parser.add_argument("--timeout", type=float, default=3600.0, help="per scenario")
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=200)
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as state:
        result = asyncio.run(run(args, Path(state), console))
    report(result, console)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"workloads-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"results: {out}")
    if any(item["phase"] != "WORKLOAD_PHASE_SUCCEEDED" for item in result["scenarios"]):
        raise SystemExit("a workload did not complete")


if __name__ == "__main__":
    main()
