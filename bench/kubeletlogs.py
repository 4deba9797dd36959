"""What ``kubectl logs`` on a fake pod costs at scale: the member's real API server reaching the
engine's TLS kubelet API at each node's InternalIP:

    python -m bench.kubeletlogs [--nodes 5000] [--kubectl 200] [--concurrency 16]

One fresh control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, the
load profile as in ``bench.engines``; the API server with its kubelet CA and client
certificate, as every member's) and one engine process with the member's kubelet PKI
(``--kubelet-pki``) and a pool of N CPU nodes. Then one pod bound to each node, with a log
script (a start line and a line every 10 s), until all are Running. Then, timed from outside:

1. the API, first contact: ``GET pods/<pod>/log`` for every pod, ``--concurrency`` at a time:
   each reaches a node the API server has not called yet, so each is a new TLS connection and
   the engine issues that node's certificate on it;
2. the API, again: the same requests, now over the API server's kept connections (until the
   engine closes them after 15 s idle);
3. the real kubectl 1.36.3: ``kubectl logs <pod>`` for ``--kubectl`` pods spread over the
   nodes, one after another (the process's start included, as a user waits for it).

Reported per pass: requests, failures, p50/p99/max (ms) and requests/s; then the engine's RSS
before and after and its CPU seconds over the API passes, and the TLS connections open to it at
the end. Results also go to ``bench/results/kubeletlogs-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.dra import node_ready, pod_running, usage
from bench.engines import CONCURRENCY, PHASE_TIMEOUT, Tally, bounded, untraced_environment
from bench.terminating import sigterm_interrupts
from federation.hub.workloads import latency
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import Profile
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import Conflict, K8sError, NotFound
from primitives import keys

RESULTS = Path(__file__).parent / "results"
KUBECTL = Path(sys.executable).parent / "kubectl"
NAMESPACE = "default"
POOL = "cpu"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
SCRIPT = json.dumps({"start": ["serving {pod} on {node}"],
                     "every": {"interval": "10s", "lines": ["tick {n}: {rand:100..900} req/s"]}})


@dataclasses.dataclass
class Pass:
    name: str
    requests: int
    failures: int = 0
    seconds: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    first_failure: str = ""

    @property
    def rate(self) -> float | None:
        return self.requests / self.seconds if self.seconds else None


@dataclasses.dataclass
class Run:
    nodes: int
    concurrency: int
    ready_seconds: float | None = None  # nodes Ready and pods Running
    passes: list[Pass] = dataclasses.field(default_factory=list)
    engine_rss_before_mib: float | None = None
    engine_rss_after_mib: float | None = None
    engine_peak_rss_mib: float | None = None
    engine_cpu_seconds: float | None = None  # over the API passes
    tls_connections: int | None = None  # open to the engine's TLS port at the end
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)


def pod_body(index: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"talker-{index}", "namespace": NAMESPACE,
                         "annotations": {keys.LOGS: SCRIPT}},
            "spec": {"nodeName": f"{POOL}-{index}", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": "fake"}]}}


def rss(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) / 1024 for line in status
                 if line.startswith("VmRSS:")), None)


def established(port: int) -> int:
    """TCP connections established to local ``port`` (the engine's side of each)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


def summarize(name: str, took: list[float], failures: list[str], seconds: float) -> Pass:
    found = latency(took)
    return Pass(name, len(took) + len(failures), len(failures), seconds,
                round(found.p50 * 1000, 1), round(found.p99 * 1000, 1),
                round(found.max * 1000, 1), failures[0] if failures else "")


class Harness:
    def __init__(self, cluster: LocalCluster, workdir: Path, *, nodes: int, kubectl: int,
                 concurrency: int) -> None:
        self.cluster, self.workdir = cluster, workdir
        self.run = Run(nodes, concurrency)
        self.kubectl = kubectl
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        self.client = Client.connect(access, connections=max(CONCURRENCY, concurrency),
                                     timeout=300)
        self.watcher = Client.connect(access, connections=4)
        self.process: asyncio.subprocess.Process | None = None

    async def measure(self) -> Run:
        run = self.run
        nodes = Tally(self.watcher, "/api/v1/nodes", {}, node_ready)
        pods = Tally(self.watcher, PODS, {}, pod_running)
        for tally in (nodes, pods):
            tally.start()
        try:
            await self._service_account()
            started = time.monotonic()
            await self._start_engine()
            if not await nodes.until(lambda t: t.matching >= run.nodes, PHASE_TIMEOUT):
                raise RuntimeError(f"only {nodes.matching} of {run.nodes} nodes got Ready")
            await bounded([functools.partial(self._make_pod, i) for i in range(run.nodes)])
            if not await pods.until(lambda t: t.matching >= run.nodes, PHASE_TIMEOUT):
                raise RuntimeError(f"only {pods.matching} of {run.nodes} pods got Running")
            run.ready_seconds = time.monotonic() - started
            assert self.process is not None
            pid = self.process.pid
            run.engine_rss_before_mib = rss(pid)
            _, cpu_before = usage(pid)
            run.passes.append(await self._api_pass("API, first contact (new TLS)"))
            run.passes.append(await self._api_pass("API, kept connections"))
            run.engine_peak_rss_mib, cpu_after = usage(pid)
            if cpu_before is not None and cpu_after is not None:
                run.engine_cpu_seconds = cpu_after - cpu_before
            run.engine_rss_after_mib = rss(pid)
            run.tls_connections = established(await self._tls_port())
            run.passes.append(await asyncio.to_thread(self._kubectl_pass))
            run.load_average = os.getloadavg()
        finally:
            for tally in (nodes, pods):
                await tally.stop()
            await self._stop_engine()
            await self.client.close()
            await self.watcher.close()
        return run

    async def _api_pass(self, name: str) -> Pass:
        took: list[float] = []
        failures: list[str] = []

        async def fetch(index: int) -> None:
            started = time.monotonic()
            try:
                text = await self.client.get_text(f"{PODS}/talker-{index}/log")
            except K8sError as error:
                failures.append(f"talker-{index}: {error}")
                return
            if not text.startswith(f"serving talker-{index} on "):
                failures.append(f"talker-{index}: log begins {text[:60]!r}")
                return
            took.append(time.monotonic() - started)
        began = time.monotonic()
        await bounded([functools.partial(fetch, i) for i in range(self.run.nodes)],
                      limit=self.run.concurrency)
        return summarize(name, took, failures, time.monotonic() - began)

    def _kubectl_pass(self) -> Pass:
        count = min(self.kubectl, self.run.nodes)
        step = self.run.nodes / count if count else 1
        took: list[float] = []
        failures: list[str] = []
        started = time.monotonic()
        for sample in range(count):
            name = f"talker-{int(sample * step)}"
            began = time.monotonic()
            done = subprocess.run(
                [str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig_path), "logs", name],
                capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0 or not done.stdout.startswith(f"serving {name} on "):
                failures.append(f"{name}: {done.stderr.strip() or done.stdout[:60]!r}")
                continue
            took.append(time.monotonic() - began)
        return summarize("kubectl logs (process included)", took, failures,
                         time.monotonic() - started)

    async def _tls_port(self) -> int:
        node = await self.watcher.get(f"/api/v1/nodes/{POOL}-0")
        return int(node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"])

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

    async def _start_engine(self) -> None:
        log = (self.workdir / "engine.log").open("wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "operators.engine",
            "--kubeconfig", str(self.cluster.kubeconfig_path),
            "--pool", f"{POOL}={self.run.nodes}", "--grace-cap", "0s",
            "--concurrency", str(CONCURRENCY),
            "--kubelet-pki", str(self.cluster.kubelet_pki.directory),
            stdout=log, stderr=asyncio.subprocess.STDOUT, env=untraced_environment())
        log.close()

    async def _make_pod(self, index: int) -> None:
        with contextlib.suppress(Conflict):
            await self.client.create(PODS, pod_body(index), decode=False)

    async def _stop_engine(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 15)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def measure(binaries: binaries_.Binaries, workdir: Path, *, nodes: int, kubectl: int,
                  concurrency: int) -> Run:
    async with Substrate(workdir, binaries, fsync=False,
                         environ=untraced_environment()) as substrate:
        cluster = await substrate.add_cluster("logs", ClusterOptions(profile=Profile.LOAD))
        return await Harness(cluster, workdir, nodes=nodes, kubectl=kubectl,
                             concurrency=concurrency).measure()


def report(run: Run, console: Console) -> None:
    table = Table(title=f"kubectl logs: {run.nodes} nodes, a pod each, {run.concurrency} API "
                        f"requests in flight, {os.cpu_count()} CPUs, load "
                        f"{run.load_average[0]:.1f} at the end")
    for column in ("pass", "requests", "failed", "p50 ms", "p99 ms", "max ms", "req/s"):
        table.add_column(column, justify="left" if column == "pass" else "right")
    for found in run.passes:
        table.add_row(found.name, str(found.requests), str(found.failures),
                      f"{found.p50_ms:.1f}", f"{found.p99_ms:.1f}", f"{found.max_ms:.1f}",
                      f"{found.rate:.0f}" if found.rate else "-")
    console.print(table)
    for found in run.passes:
        if found.first_failure:
            console.print(f"[red]{found.name}: first failure: {found.first_failure}")
    facts = Table(title="the engine")
    facts.add_column("what")
    facts.add_column("value", justify="right")
    facts.add_row("nodes Ready and pods Running (s)",
                  f"{run.ready_seconds:.1f}" if run.ready_seconds else "-")
    for label, value in (("RSS before the passes (MiB)", run.engine_rss_before_mib),
                         ("RSS after the API passes (MiB)", run.engine_rss_after_mib),
                         ("peak RSS (MiB)", run.engine_peak_rss_mib),
                         ("CPU over the API passes (s)", run.engine_cpu_seconds)):
        facts.add_row(label, f"{value:.1f}" if value is not None else "-")
    facts.add_row("TLS connections open after the API passes",
                  str(run.tls_connections) if run.tls_connections is not None else "-")
    console.print(facts)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--kubectl", type=int, default=200,
                        help="kubectl logs runs, one after another (default 200)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="API log requests in flight (default 16)")
    parser.add_argument("--output", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    if args.nodes < 1 or args.kubectl < 0 or args.concurrency < 1:
        parser.error("--nodes and --concurrency take at least 1, --kubectl at least 0")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    binaries = binaries_.resolve()
    console.print(f"[bold]kubectl logs[/]: {args.nodes} nodes ...")
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir:
        run = asyncio.run(measure(binaries, Path(workdir), nodes=args.nodes,
                                  kubectl=args.kubectl, concurrency=args.concurrency))
    report(run, console)
    payload = {"cpus": os.cpu_count(), "kubernetesVersion": binaries.version,
               "run": dataclasses.asdict(run)}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"kubeletlogs-{time.strftime('%Y%m%dT%H%M%S')}.json"
    for path in (out, args.output):
        if path is not None:
            path.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results: {out}")
    if any(found.failures for found in run.passes):
        sys.exit(1)


if __name__ == "__main__":
    main()
