"""What usage metrics cost the engine, and how fast its endpoints answer:

    python -m bench.usage [--nodes 5000] [--pods 10000] [--gpu-nodes 1000] [--window 60]
                          [--resolution 15] [--samples 200] [--modes off,on]

Two modes, each on a fresh control plane (load profile) with the same workload: ``--nodes``
nodes of one pool Ready and ``--pods`` pods bound to them round-robin, Running, half of them
annotated with a usage profile (``fakefleet.dev/usage-cpu: sine(100m, 900m, 2m)``, memory 256Mi),
plus ``--gpu-nodes`` H100 nodes (8 GPUs each) with one pod holding all 8 of each node's GPUs.

- ``off``: ``python -m operators.engine --no-metrics``: nothing measured, nothing served;
- ``on``: the engine serves its kubelet and DCGM endpoints, and the real metrics-server v0.8.0
  (``--metric-resolution`` ``--resolution`` seconds, flags as the operator runs it) scrapes
  every node's ``/metrics/resource`` each round.

Then, over a steady ``--window`` of seconds (several scrape rounds), the engine's RSS (at the end
and its peak) and CPU seconds; in mode ``on`` also the latency of ``--samples`` sequential GETs of
one node's ``/metrics/resource`` and of 20 GETs of the cluster's DCGM endpoint (p50/p99/max, with
their sizes), taken while metrics-server keeps scraping, and every round metrics-server finished
in the window, from its own log (run at ``--v=1``, which logs each round's start and end; see
:mod:`bench.scrapelog`): the nodes it scraped of those it tried, and its failures by kind
(timeout, reset, refused, EOF, other). The goal at 6000 nodes: at least 99 % of the nodes
scraped in every round, and one node's scrape p99 under 1 s.

Results also go to ``bench/results/usage-<time>.json`` (git-ignored), and metrics-server's log
of each run next to it (``usage-<time>-<mode>-metrics-server.log``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table

from bench import scrapelog
from bench.engines import RESULTS, Tally, bounded, node_ready, pod_running, untraced_environment
from bench.terminating import sigterm_interrupts
from operators.addons.metricsserver import TOOL as METRICS_SERVER
from operators.addons.metricsserver import rendering
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import Profile
from operators.controlplane.pki import ensure_addon_pki
from operators.controlplane.ports import free_port
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file

MODES = ("off", "on")
NAMESPACE = "default"
CPU_POOL, GPU_POOL = "cpu", "h100"
PHASE_TIMEOUT = 900.0
DCGM_SAMPLES = 20
PROFILE = {"fakefleet.dev/usage-cpu": "sine(100m, 900m, 2m)",
           "fakefleet.dev/usage-memory": "256Mi"}
#: metrics-server's verbosity here: 1 logs the start and the end of each round.
VERBOSITY = "--v=1"
#: The share of nodes every round should scrape.
GOAL = 0.99


@dataclasses.dataclass
class Latency:
    samples: int
    bytes: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: list[float], size: int) -> Latency:
        ordered = sorted(seconds)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return cls(len(ordered), size, statistics.median(ordered) * 1000, p99 * 1000,
                   ordered[-1] * 1000)


@dataclasses.dataclass
class Run:
    mode: str
    setup_seconds: float | None = None
    rss_mib: float | None = None
    peak_rss_mib: float | None = None
    window_cpu_seconds: float | None = None
    #: How long the window lasted: the latency samples wait for each answer, so a slow engine
    #: stretches it past ``--window``.
    window_seconds: float | None = None
    metrics_server_rss_mib: float | None = None
    #: metrics-server's rounds that started and finished in the window.
    rounds: list[scrapelog.Round] | None = None
    #: Where metrics-server's log was kept.
    metrics_server_log: str = ""
    node_scrape: Latency | None = None
    dcgm_scrape: Latency | None = None
    error: str = ""


def process_usage(pid: int) -> tuple[float, float, float]:
    """(RSS MiB, peak RSS MiB, CPU seconds) of a live process."""
    rss = peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return rss, peak, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pod_body(name: str, node: str, *, annotated: bool, gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "fake"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"},
                         "annotations": PROFILE if annotated else {}},
            "spec": {"nodeName": node, "containers": [container],
                     "tolerations": [{"operator": "Exists"}]}}


class Bench:
    def __init__(self, mode: str, cluster: LocalCluster, workdir: Path, args: argparse.Namespace,
                 metrics_server: Path | None) -> None:
        self.mode, self.cluster, self.workdir, self.args = mode, cluster, workdir, args
        self.metrics_server_binary = metrics_server
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        self.client = Client.connect(access, connections=64, timeout=300)
        self.watcher = Client.connect(access, connections=4)
        self.processes: list[asyncio.subprocess.Process] = []
        self.port = free_port()

    async def run(self) -> Run:
        result = Run(self.mode)
        nodes = Tally(self.watcher, "/api/v1/nodes", {}, node_ready)
        pods = Tally(self.watcher, "/api/v1/pods", {}, pod_running)
        nodes.start()
        pods.start()
        try:
            engine = await self._start_engine()
            started = time.monotonic()
            total_nodes = self.args.nodes + self.args.gpu_nodes
            if not await nodes.until(lambda t: t.matching >= total_nodes, PHASE_TIMEOUT):
                result.error = "the nodes did not all get Ready"
                return result
            await self._make_pods()
            total_pods = self.args.pods + self.args.gpu_nodes
            if not await pods.until(lambda t: t.matching >= total_pods, PHASE_TIMEOUT):
                result.error = "the pods did not all get Running"
                return result
            result.setup_seconds = time.monotonic() - started
            scraper = await self._start_metrics_server() if self.mode == "on" else None
            _, _, cpu_before = process_usage(engine.pid)
            window_started = time.monotonic()
            log_from = self._log_size()
            window = self.args.window
            if self.mode == "on":
                async with aiohttp.ClientSession() as http:
                    result.node_scrape = await self._latency(
                        http, f"http://127.64.0.1:{self.port}/metrics/resource",
                        self.args.samples, pause=window / 2 / self.args.samples)
                    result.dcgm_scrape = await self._latency(
                        http, f"http://127.0.0.1:{self.port}/metrics", DCGM_SAMPLES,
                        pause=window / 2 / DCGM_SAMPLES)
            else:
                await asyncio.sleep(window)
            result.rss_mib, result.peak_rss_mib, cpu_after = process_usage(engine.pid)
            result.window_cpu_seconds = cpu_after - cpu_before
            result.window_seconds = time.monotonic() - window_started
            if scraper is not None:
                result.metrics_server_rss_mib = process_usage(scraper.pid)[0]
                result.rounds = self._rounds(log_from)
        finally:
            await nodes.stop()
            await pods.stop()
            for process in self.processes:
                if process.returncode is None:
                    process.terminate()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(process.wait(), 15)
            await self.client.close()
            await self.watcher.close()
        return result

    @property
    def metrics_server_log(self) -> Path:
        return self.workdir / "metrics-server.log"

    def _log_size(self) -> int:
        log = self.metrics_server_log
        return log.stat().st_size if log.exists() else 0

    def _rounds(self, start: int) -> list[scrapelog.Round]:
        """The rounds metrics-server logged from byte ``start`` on, whole ones only."""
        with self.metrics_server_log.open("rb") as log:
            log.seek(start)
            return scrapelog.rounds(log.read().decode(errors="replace"))

    async def _spawn(self, name: str, argv: list[str]) -> asyncio.subprocess.Process:
        with (self.workdir / f"{name}.log").open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env=untraced_environment())
        self.processes.append(process)
        return process

    async def _start_engine(self) -> asyncio.subprocess.Process:
        argv = [sys.executable, "-m", "operators.engine",
                "--kubeconfig", str(self.cluster.kubeconfig_path),
                "--pool", f"{CPU_POOL}={self.args.nodes}", "--grace-cap", "0s",
                "--concurrency", "64"]
        if self.args.gpu_nodes:
            argv += ["--pool", f"{GPU_POOL}={self.args.gpu_nodes}:H100-SXM5-80GB"]
        argv += ["--no-metrics"] if self.mode == "off" else ["--kubelet-port", str(self.port)]
        return await self._spawn("engine", argv)

    async def _make_pods(self) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        nodes, gpu_nodes = self.args.nodes, self.args.gpu_nodes
        calls = [lambda i=index: self.client.create(path, pod_body(
            f"bench-{i}", f"{CPU_POOL}-{i % nodes}", annotated=i % 2 == 0))
            for index in range(self.args.pods)]
        calls += [lambda i=index: self.client.create(path, pod_body(
            f"train-{i}", f"{GPU_POOL}-{i}", annotated=True, gpus=8))
            for index in range(gpu_nodes)]
        await bounded(calls)

    async def _start_metrics_server(self) -> asyncio.subprocess.Process:
        assert self.metrics_server_binary is not None
        pki = ensure_addon_pki(self.workdir / "metrics-server-pki", self.cluster.pki,
                               "fakefleet-admin", ca_name="bench-ca",
                               serving_name=rendering.SERVICE_HOST,
                               hosts=(rendering.SERVICE_HOST, "127.0.0.1"))
        # Its own certificate is for serving only: it reads the cluster as the admin.
        return await self._spawn("metrics-server", [*rendering.argv(
            self.metrics_server_binary, kubeconfig=self.cluster.kubeconfig_path,
            port=free_port(), cert=pki.serving_cert, key=pki.serving_key,
            resolution=f"{self.args.resolution}s", kubelet_port=self.port), VERBOSITY])

    @staticmethod
    async def _latency(http: aiohttp.ClientSession, url: str, count: int, *,
                       pause: float) -> Latency:
        seconds: list[float] = []
        size = 0
        for _ in range(count):
            started = time.perf_counter()
            async with http.get(url) as response:
                body = await response.read()
                response.raise_for_status()
            seconds.append(time.perf_counter() - started)
            size = len(body)
            await asyncio.sleep(pause)
        return Latency.of(seconds, size)


async def run_mode(mode: str, binaries: binaries_.Binaries, workdir: Path,
                   args: argparse.Namespace, metrics_server: Path | None, *,
                   keep_log: Path) -> Run:
    """One mode on a fresh control plane; metrics-server's log (if it ran) copied to
    ``keep_log``."""
    state = workdir / mode
    state.mkdir(parents=True)
    async with Substrate(state, binaries, fsync=False,
                         environ=untraced_environment()) as substrate:
        cluster = await substrate.add_cluster("bench", ClusterOptions(profile=Profile.LOAD))
        bench = Bench(mode, cluster, state, args, metrics_server)
        try:
            return await bench.run()
        finally:
            if bench.metrics_server_log.exists():
                keep_log.parent.mkdir(exist_ok=True)
                shutil.copyfile(bench.metrics_server_log, keep_log)


def report(runs: dict[str, Run], console: Console, args: argparse.Namespace) -> None:
    table = Table(title=f"usage metrics: {args.nodes} nodes + {args.gpu_nodes} H100 nodes, "
                        f"{args.pods} pods (+{args.gpu_nodes} GPU pods), {args.window:.0f} s "
                        f"window, metrics-server every {args.resolution} s, "
                        f"{os.cpu_count()} CPUs")
    table.add_column("")
    for mode in runs:
        table.add_column(f"metrics {mode}", justify="right")

    def cell(value: float | None, form: str = "{:.0f}") -> str:
        return form.format(value) if value is not None else "-"

    rows: list[tuple[str, list[str]]] = [
        ("nodes Ready + pods Running (s)", [cell(r.setup_seconds, "{:.1f}")
                                            for r in runs.values()]),
        ("engine RSS at the end (MiB)", [cell(r.rss_mib) for r in runs.values()]),
        ("engine peak RSS (MiB)", [cell(r.peak_rss_mib) for r in runs.values()]),
        ("engine CPU in the window (s)", [cell(r.window_cpu_seconds, "{:.1f}")
                                          for r in runs.values()]),
        ("window (s) / engine CPU (cores)", [
            f"{r.window_seconds:.0f} / {r.window_cpu_seconds / r.window_seconds:.2f}"
            if r.window_seconds and r.window_cpu_seconds is not None else "-"
            for r in runs.values()]),
        ("metrics-server RSS (MiB)", [cell(r.metrics_server_rss_mib) for r in runs.values()]),
        (f"nodes scraped per round, worst / median (goal >= {GOAL:.0%})",
         [success_cell(r.rounds) for r in runs.values()]),
        ("failed node scrapes in the rounds: " + " / ".join(scrapelog.KINDS),
         [" / ".join(str(n) for n in failures(r.rounds).values()) if r.rounds else "-"
          for r in runs.values()]),
    ]
    for label, attribute in (("one node's /metrics/resource", "node_scrape"),
                             ("the DCGM endpoint", "dcgm_scrape")):
        values = []
        for run in runs.values():
            latency: Latency | None = getattr(run, attribute)
            values.append(f"p50 {latency.p50_ms:.1f} / p99 {latency.p99_ms:.1f} / max "
                          f"{latency.max_ms:.1f} ms, {latency.bytes / 1024:.0f} KiB"
                          if latency else "-")
        rows.append((label, values))
    for label, values in rows:
        table.add_row(label, *values)
    console.print(table)
    for mode, run in runs.items():
        if run.rounds:
            console.print(rounds_table(mode, run.rounds))
        if run.metrics_server_log:
            console.print(f"{mode}: metrics-server's log: {run.metrics_server_log}")
        if run.error:
            console.print(f"[red]{mode}: {run.error}[/]")


def failures(rounds: list[scrapelog.Round] | None) -> dict[str, int]:
    """Failures of all ``rounds`` by kind."""
    total = dict.fromkeys(scrapelog.KINDS, 0)
    for round_ in rounds or ():
        for kind, count in round_.failures.items():
            total[kind] += count
    return total


def success_cell(rounds: list[scrapelog.Round] | None) -> str:
    if not rounds:
        return "- (no whole round in the window)" if rounds is not None else "-"
    shares = sorted(round_.success for round_ in rounds)
    worst, median = shares[0], statistics.median(shares)
    mark = "" if worst >= GOAL else " [red](below the goal)[/]"
    return f"{worst:.2%} / {median:.2%} of {len(rounds)} rounds{mark}"


def rounds_table(mode: str, rounds: list[scrapelog.Round]) -> Table:
    table = Table(title=f"metrics {mode}: metrics-server's rounds in the window, from its log")
    for column in ("started", "took (s)", "nodes", "scraped", "share", *scrapelog.KINDS):
        table.add_column(column, justify="left" if column == "started" else "right")
    for round_ in rounds:
        table.add_row(round_.at, f"{round_.seconds:.1f}", str(round_.nodes),
                      str(round_.scraped), f"{round_.success:.2%}",
                      *(str(round_.failures[kind]) for kind in scrapelog.KINDS))
    return table


def payload_of(run: Run) -> dict[str, Any]:
    """The run as JSON: each round with its share of nodes scraped, and the failures of all
    rounds by kind."""
    payload = dataclasses.asdict(run)
    if run.rounds is not None:
        payload["rounds"] = [{**dataclasses.asdict(round_), "success": round_.success}
                             for round_ in run.rounds]
        payload["failures"] = failures(run.rounds)
    return payload


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--gpu-nodes", type=int, default=1000)
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds of steady state measured")
    parser.add_argument("--resolution", type=int, default=15,
                        help="metrics-server's --metric-resolution in seconds (at least 10)")
    parser.add_argument("--samples", type=int, default=200,
                        help="GETs of one node's /metrics/resource")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--output", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    modes = [mode for mode in args.modes.split(",") if mode]
    if set(modes) - set(MODES) or not modes:
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    if args.resolution < 10:
        parser.error("--resolution: metrics-server scrapes at most every 10 s")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    binaries = binaries_.resolve()
    metrics_server = METRICS_SERVER.ensure(progress=console.print) \
        if "on" in modes else None
    runs: dict[str, Run] = {}
    stamp = time.strftime('%Y%m%dT%H%M%S')
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir:
        for mode in modes:
            console.print(f"[bold]metrics {mode}[/] ...")
            log = RESULTS / f"usage-{stamp}-{mode}-metrics-server.log"
            runs[mode] = asyncio.run(run_mode(mode, binaries, Path(workdir), args,
                                              metrics_server, keep_log=log))
            if log.exists():
                runs[mode].metrics_server_log = str(log)
    report(runs, console, args)
    payload = {"nodes": args.nodes, "pods": args.pods, "gpuNodes": args.gpu_nodes,
               "window": args.window, "resolution": args.resolution, "cpus": os.cpu_count(),
               "loadavg": os.getloadavg(),
               "runs": {mode: payload_of(run) for mode, run in runs.items()}}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"usage-{stamp}.json"
    for path in (out, args.output):
        if path is not None:
            path.write_text(json.dumps(payload, indent=2) + "\n")
    console.print(f"results: {out}")
    failed = [f"{mode}: {run.error}" for mode, run in runs.items() if run.error]
    if failed:
        raise SystemExit("; ".join(failed))


if __name__ == "__main__":
    main()
