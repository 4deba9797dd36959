"""How fast an HPA follows an application metric through the custom-metrics path, and what the
path's processes cost:

    python -m bench.hpa [--rounds 5] [--scrape-interval 5s] [--unsafe-no-fsync] [--output P]

Through the whole product: ``fakefleet up``, a FakeCluster with ``spec.addons.customMetrics``
(Prometheus and the custom-metrics adapter), a pool of 2 CPU nodes, a Deployment whose pods
serve ``vllm_num_requests_waiting`` (its template says 10, and ``prometheus.io/scrape:
"true"``) and an HPA on it (type Pods, averageValue 10, 2 to 4 replicas, no stabilization
window). Each round, from 2 replicas at 10:

1. up: every pod annotated 20 (the engine serves a changed annotation at once): seconds until
   the HPA's ``status.desiredReplicas`` is 4 (2 x 20 / 10);
2. down, once 4 replicas are Ready (the 2 new ones say 10: the average, 15, keeps 4): every pod
   annotated 5: seconds until ``desiredReplicas`` is 2 (the minimum); then the 2 left are
   annotated 10 again.

A step is bounded by the scrape interval, plus the HPA controller's sync period (5 s in
fakefleet's members), plus the HPA's status write, read every :data:`POLL` s: about 5-10 s
with the defaults. Then the RSS (now, and peak) of Prometheus, the adapter and the member's
engine, and Prometheus' TSDB on disk. The binaries must be built (``make setup``): a build is
not what this measures.

Results also go to ``bench/results/hpa-<time>.json`` (git-ignored), or ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS, untraced_environment
from bench.terminating import sigterm_interrupts
from bench.usage import process_usage
from operators.api.durations import parse_duration
from operators.controlplane.state import StateDir, read_operator
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import NotFound

BIN = Path(sys.executable).parent
KUBECTL, FAKEFLEET = BIN / "kubectl", BIN / "fakefleet"
CLUSTER, POOL, NAME = "hpa", "hpa-cpu", "vllm"
METRIC = "vllm_num_requests_waiting"
ANNOTATION = f"fakefleet.dev/metric.{METRIC}"
HPA = f"/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/{NAME}"
PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENT = f"/apis/apps/v1/namespaces/default/deployments/{NAME}"
#: How often the HPA's status is read while a step is timed (s).
POLL = 0.2
STEP_TIMEOUT = 120.0
SETUP_TIMEOUT = 600.0
COMPONENTS = ("prometheus", "custom-metrics-adapter", "engine")


@dataclasses.dataclass
class Step:
    name: str
    seconds: float | None = None  # None: not reached within STEP_TIMEOUT


@dataclasses.dataclass
class Usage:
    rss_mib: float
    peak_rss_mib: float
    cpu_seconds: float


@dataclasses.dataclass
class Result:
    rounds: int
    scrape_interval: str
    setup_seconds: float | None = None
    steps: list[Step] = dataclasses.field(default_factory=list)
    processes: dict[str, Usage] = dataclasses.field(default_factory=dict)
    tsdb_bytes: int = 0
    error: str = ""


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, check=True, timeout=300).stdout


def manifests(scrape_interval: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
         "metadata": {"name": CLUSTER, "namespace": "default"},
         "spec": {"addons": {"customMetrics": {"scrapeInterval": scrape_interval}}}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": POOL, "namespace": "default"},
         "spec": {"clusterRef": CLUSTER, "replicas": 2,
                  "pods": {"terminationGracePeriodCap": "0s"}}}]})


def workload() -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": NAME}}, "template": {
             "metadata": {"labels": {"app": NAME}, "annotations": {
                 "prometheus.io/scrape": "true", ANNOTATION: "10"}},
             "spec": {"containers": [{"name": "engine", "image": "vllm"}]}}}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
         "metadata": {"name": NAME},
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": NAME},
                  "minReplicas": 2, "maxReplicas": 4,
                  "metrics": [{"type": "Pods", "pods": {
                      "metric": {"name": METRIC},
                      "target": {"type": "AverageValue", "averageValue": "10"}}}],
                  "behavior": {
                      "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [
                          {"type": "Percent", "value": 100, "periodSeconds": 1}]},
                      "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [
                          {"type": "Percent", "value": 100, "periodSeconds": 1}]}}}}]})


async def until(what: str, check: Callable[[], Awaitable[bool]],
                timeout: float = SETUP_TIMEOUT) -> float:
    """Seconds until ``await check()`` is true, polled every :data:`POLL` s."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await check():
            return time.monotonic() - started
        await asyncio.sleep(POLL)
    raise TimeoutError(f"{what}: not reached within {timeout:.0f}s")


def member_kubeconfig(state: Path) -> str:
    return subprocess.run([str(FAKEFLEET), "kubeconfig", "--state-dir", str(state), CLUSTER],
                          capture_output=True, text=True, check=True, timeout=60).stdout


def addon_ready(host: Path, kind: str) -> bool:
    found = json.loads(kubectl(host, "get", "fc", CLUSTER, "-o", "json"))
    return any(c["type"] == kind and c["status"] == "True"
               for c in (found.get("status") or {}).get("conditions") or ())


async def annotate_all(client: Client, value: str) -> None:
    """Every pod of the Deployment that is not going says ``value`` from now on."""
    listed = await client.get(PODS, {"labelSelector": f"app={NAME}"})
    for pod in listed.get("items") or []:
        if not pod["metadata"].get("deletionTimestamp"):
            await client.patch(f"{PODS}/{pod['metadata']['name']}",
                               {"metadata": {"annotations": {ANNOTATION: value}}})


def desired(client: Client, replicas: int) -> Callable[[], Awaitable[bool]]:
    """Whether the HPA's status wants ``replicas``."""
    async def check() -> bool:
        status = (await client.get(HPA)).get("status") or {}
        return int(status.get("desiredReplicas") or 0) == replicas
    return check


def ready(client: Client, replicas: int) -> Callable[[], Awaitable[bool]]:
    """Whether the Deployment has ``replicas``, all Ready, and no other."""
    async def check() -> bool:
        deployment = await client.get(DEPLOYMENT)
        status = deployment.get("status") or {}
        return int(deployment["spec"]["replicas"]) == replicas and \
            int(status.get("readyReplicas") or 0) == replicas == int(status.get("replicas") or 0)
    return check


async def step(client: Client, result: Result, console: Console, name: str, value: str,
               replicas: int) -> None:
    await annotate_all(client, value)
    started = time.monotonic()
    found = Step(name)
    try:
        await until(name, desired(client, replicas), timeout=STEP_TIMEOUT)
        found.seconds = time.monotonic() - started
    except TimeoutError:
        pass
    result.steps.append(found)
    said = "not reached" if found.seconds is None else f"{found.seconds:.1f} s"
    console.print(f"  {name}: {said}")


async def run(state: Path, result: Result, console: Console) -> None:
    host = StateDir(state).host_kubeconfig
    started = time.monotonic()
    kubectl(host, "apply", "-f", "-", stdin=manifests(result.scrape_interval))
    console.print("waiting for Prometheus and the adapter ...")
    async def serving() -> bool:
        return await asyncio.to_thread(lambda: addon_ready(host, "PrometheusReady")
                                       and addon_ready(host, "CustomMetricsReady"))
    await until("PrometheusReady and CustomMetricsReady", serving)
    member = state / f"{CLUSTER}.kubeconfig"
    member.write_text(await asyncio.to_thread(member_kubeconfig, state))
    async with Client.connect(load_kubeconfig_file(member), connections=2, timeout=30) as client:
        async def service_account() -> bool:
            try:
                await client.get("/api/v1/namespaces/default/serviceaccounts/default")
            except NotFound:
                return False
            return True
        await until("ServiceAccount default", service_account)
        kubectl(member, "apply", "-f", "-", stdin=workload())

        async def measuring() -> bool:
            current = ((await client.get(HPA)).get("status") or {}).get("currentMetrics")
            return bool(current) and await ready(client, 2)()
        await until("the HPA measuring the metric", measuring)
        result.setup_seconds = time.monotonic() - started
        for number in range(1, result.rounds + 1):
            console.print(f"round {number} ...")
            await step(client, result, console, f"up {number}: 2 x 20 -> 4 replicas", "20", 4)
            await until("4 replicas Ready", ready(client, 4), timeout=STEP_TIMEOUT)
            await step(client, result, console, f"down {number}: 4 x 5 -> 2 replicas", "5", 2)
            await until("2 replicas Ready", ready(client, 2), timeout=STEP_TIMEOUT)
            await annotate_all(client, "10")
            await until("the HPA at 2 replicas", desired(client, 2), timeout=STEP_TIMEOUT)
            if number < result.rounds:  # the next round starts from a settled metric
                await asyncio.sleep(parse_duration(result.scrape_interval) + 5)
    announced = read_operator(StateDir(state))
    for component in announced.components if announced is not None else ():
        if component.cluster == f"default.{CLUSTER}" and component.name in COMPONENTS \
                and component.pid:
            result.processes[component.name] = Usage(*process_usage(component.pid))
    tsdb = StateDir(state).cluster(f"default.{CLUSTER}") / "prometheus" / "data"
    result.tsdb_bytes = sum(path.stat().st_size for path in tsdb.rglob("*") if path.is_file())


def report(result: Result, console: Console) -> None:
    table = Table(title=f"an HPA on an application metric through Prometheus and the "
                        f"custom-metrics adapter (scrape every {result.scrape_interval}, HPA "
                        f"sync 5s; {os.cpu_count()} CPUs; status read every {POLL:g} s)")
    table.add_column("metric step -> HPA's new desiredReplicas")
    table.add_column("seconds", justify="right")
    for found in result.steps:
        table.add_row(found.name, "not reached" if found.seconds is None
                      else f"{found.seconds:.1f}")
    reached = [found.seconds for found in result.steps if found.seconds is not None]
    if reached:
        table.add_row("median / max", f"{statistics.median(reached):.1f} / {max(reached):.1f}")
    console.print(table)
    processes = Table(title="the member's processes at the end")
    for column in ("process", "RSS MiB", "peak RSS MiB", "CPU s"):
        processes.add_column(column, justify="right")
    for name, usage in result.processes.items():
        processes.add_row(name, f"{usage.rss_mib:.0f}", f"{usage.peak_rss_mib:.0f}",
                          f"{usage.cpu_seconds:.1f}")
    processes.add_row("Prometheus' TSDB on disk (MiB)", f"{result.tsdb_bytes / 2 ** 20:.1f}",
                      "", "")
    console.print(processes)
    if result.setup_seconds is not None:
        console.print(f"FakeCluster applied -> the HPA measuring: {result.setup_seconds:.1f} s")


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrape-interval", default="5s")
    parser.add_argument("--unsafe-no-fsync", action="store_true",
                        help="etcd without fsync (a user's fakefleet up fsyncs)")
    parser.add_argument("--output", type=Path, default=None,
                        help="where the JSON goes (default: bench/results/hpa-<time>.json)")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 100:
        parser.error("--rounds 1..100")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    result = Result(args.rounds, args.scrape_interval)
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-hpa-") as workdir:
        state = Path(workdir) / "state"
        console.print("fakefleet up ...")
        subprocess.run([str(FAKEFLEET), "up", "--state-dir", str(state), "--no-hub",
                        "--no-collector",
                        *(["--unsafe-no-fsync"] if args.unsafe_no_fsync else [])],
                       check=True, capture_output=True, text=True, timeout=900,
                       env=untraced_environment())
        try:
            asyncio.run(run(state, result, console))
        except (SystemExit, Exception) as error:
            result.error = f"{type(error).__name__}: {error}"
            raise
        finally:
            subprocess.run([str(FAKEFLEET), "down", "--state-dir", str(state)],
                           capture_output=True, timeout=300, check=False)
            report(result, console)
            RESULTS.mkdir(exist_ok=True)
            out = args.output or RESULTS / f"hpa-{time.strftime('%Y%m%dT%H%M%S')}.json"
            out.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
            console.print(f"results: {out}")


if __name__ == "__main__":
    main()
