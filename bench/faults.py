"""How fast a FaultPlan's faults reach a member API, and how fast they are undone:

    python -m bench.faults [--nodes 1000] [--pods 1000]

The whole product runs as a user runs it: ``fakefleet up`` (host control plane and operator),
a FakeCluster with one pool of ``--nodes`` nodes and ``--pods`` pods bound to them, then two
plans applied with the host API:

- nodes: NotReady on every node (mode all) at t=5s for 20s;
- pods: CrashLoop on every pod (mode all) at t=5s for 20s.

A watch on the member API (started before the plan) timestamps when each victim first shows the
fault (node Ready=False; pod container terminated with the fault's exit code) and when it shows
the recovery (node Ready=True again; pod Running again). Latency is measured from the
*scheduled* moment (``status.startedAt`` + the step's ``at``), so it includes the operator's
timer, its writes of the fault entries, the engine's reaction and the API server's watch.
Pod recovery includes the kubelet's crash-loop back-off (10 s after the last crash), as a real
kubelet's would.

Results also go to ``bench/results/faults-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS, bounded
from operators.controlplane.state import StateDir
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig, load_kubeconfig_file
from operators.k8s.errors import NotFound
from operators.k8s.times import parse
from operators.k8s.watching import list_and_watch

NAMESPACE = "default"
BASE = "/apis/fakefleet.dev/v1alpha1/namespaces/default"
AT, DURATION = 5.0, 20.0
TIMEOUT = 300.0
FAKEFLEET = Path(sys.executable).parent / "fakefleet"


class Stamps:
    """When each object first showed the fault, and when it first showed recovery after it."""

    def __init__(self, faulted: Callable[[Any], bool], healthy: Callable[[Any], bool]) -> None:
        self.faulted, self.healthy = faulted, healthy
        self.hit: dict[str, float] = {}
        self.back: dict[str, float] = {}

    def see(self, kind: str, obj: Any) -> None:
        if kind == "DELETED":
            return
        name = obj["metadata"]["name"]
        now = time.time()
        if name not in self.hit and self.faulted(obj):
            self.hit[name] = now
        elif name in self.hit and name not in self.back and self.healthy(obj):
            self.back[name] = now


def node_not_ready(node: Any) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "False"
               for c in (node.get("status") or {}).get("conditions") or ())


def node_ready(node: Any) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or ())


def pod_crashed(pod: Any) -> bool:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            if (state.get("terminated") or {}).get("exitCode") == 7:
                return True
    return False


def pod_running(pod: Any) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and all(
        "running" in (c.get("state") or {}) for c in status.get("containerStatuses") or ())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fakefleet(*args: str) -> str:
    return subprocess.run([str(FAKEFLEET), *args], check=True, capture_output=True,
                          text=True, timeout=600).stdout


def plan_body(name: str, target: dict[str, Any], fault: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": name},
            "spec": {"seed": 1, "steps": [{"name": "all", "target": {
                "clusters": {"names": ["bench"]}, "mode": "all", **target}, "fault": fault,
                "at": f"{AT:g}s", "duration": f"{DURATION:g}s"}]}}


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def measure(host: Client, member: Client, name: str, path: str, body: dict[str, Any],
                  stamps: Stamps, count: int) -> dict[str, Any]:
    watch = asyncio.create_task(list_and_watch(
        member, path, {}, on_list=lambda items: [stamps.see("ADDED", i) for i in items],
        on_event=stamps.see))
    try:
        await host.create(f"{BASE}/faultplans", body)
        status: dict[str, Any] = {}

        async def finished() -> None:
            nonlocal status
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                status = (await host.get(f"{BASE}/faultplans/{name}")).get("status") or {}
                if status.get("phase") in ("Succeeded", "Failed"):
                    return
                await asyncio.sleep(1.0)
            raise SystemExit(f"plan {name} did not finish: {status}")
        await finished()
        await until(lambda: len(stamps.back) >= count, 120, f"{name}: every victim back")
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    start = parse(status["startedAt"])
    injection = status["injections"][0]
    scheduled = start + injection["injectAt"]
    recover_at = start + injection["recoverAt"]
    latencies = [stamp - scheduled for stamp in stamps.hit.values()]
    recovered = [stamp - recover_at for stamp in stamps.back.values()]
    return {
        "plan": name, "victims": len(injection["targets"]), "visible": len(latencies),
        "p50": round(percentile(latencies, 0.5), 2), "p99": round(percentile(latencies, 0.99), 2),
        "max": round(max(latencies), 2), "mean": round(statistics.fmean(latencies), 2),
        "entriesWritten": round(parse(injection["injectedAt"]) - scheduled, 2),
        "recoverAll": round(max(recovered), 2),
        "recoverP50": round(percentile(recovered, 0.5), 2),
        "injectedAt": injection["injectedAt"], "recoveredAt": injection["recoveredAt"],
    }


async def run(state: Path, nodes: int, pods: int, console: Console) -> list[dict[str, Any]]:
    host = Client.connect(load_kubeconfig_file(StateDir(state).host_kubeconfig), timeout=60)
    try:
        await host.create(f"{BASE}/fakeclusters", {
            "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
            "metadata": {"name": "bench"},
            "spec": {"controlPlane": {"profile": "load", "scheduler": False}}})
        await host.create(f"{BASE}/fakenodepools", {
            "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
            "metadata": {"name": "pool"},
            "spec": {"clusterRef": "bench", "replicas": nodes}})

        async def pool_ready() -> None:
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                with contextlib.suppress(NotFound):
                    status = (await host.get(f"{BASE}/fakenodepools/pool")).get("status") or {}
                    if status.get("readyReplicas") == nodes:
                        return
                await asyncio.sleep(1.0)
            raise SystemExit("the pool never became Ready")
        console.print(f"waiting for {nodes} nodes Ready ...")
        await pool_ready()
        member = Client.connect(load_kubeconfig(fakefleet("kubeconfig", "--state-dir",
                                                          str(state), "bench")),
                                connections=32, timeout=60)
        try:
            console.print(f"creating {pods} pods ...")
            names = sorted(n["metadata"]["name"]
                           for n in (await member.get("/api/v1/nodes"))["items"])
            deadline = time.monotonic() + 60
            while True:
                try:
                    await member.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
                    break
                except NotFound:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
            await bounded([lambda i=index: member.create(
                f"/api/v1/namespaces/{NAMESPACE}/pods", {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"bench-{i}", "labels": {"app": "bench"}},
                    "spec": {"nodeName": names[i % len(names)], "restartPolicy": "Always",
                             "containers": [{"name": "c", "image": "fake"}]}})
                for index in range(pods)], 32)
            running = Stamps(pod_running, pod_running)
            watch = asyncio.create_task(list_and_watch(
                member, "/api/v1/pods", {}, on_list=lambda items: [
                    running.see("ADDED", i) for i in items], on_event=running.see))
            await until(lambda: len(running.hit) >= pods, 120, "pods Running")
            watch.cancel()
            console.print("node fault ...")
            results = [await measure(host, member, "nodes", "/api/v1/nodes", plan_body(
                "nodes", {"nodes": {}}, {"type": "NotReady"}),
                Stamps(node_not_ready, node_ready), nodes)]
            console.print("pod fault ...")
            results.append(await measure(host, member, "pods", "/api/v1/pods", plan_body(
                "pods", {"pods": {"namespace": NAMESPACE}}, {"type": "CrashLoop",
                                                               "exitCode": 7}),
                Stamps(pod_crashed, pod_running), pods))
        finally:
            await member.close()
    finally:
        await host.close()
    return results


def report(results: list[dict[str, Any]], console: Console, nodes: int, pods: int) -> None:
    table = Table(title=f"FaultPlan: {nodes} nodes NotReady, {pods} pods CrashLoop "
                        f"({os.cpu_count()} CPUs); seconds from the scheduled moment")
    for column in ("fault", "victims", "entries written", "visible", "p50", "p99", "max",
                   "all recovered after recoverAt", "recovery p50"):
        table.add_column(column, justify="right")
    for result in results:
        table.add_row(result["plan"], str(result["victims"]), f"{result['entriesWritten']:.2f}",
                      str(result["visible"]),
                      f"{result['p50']:.2f}", f"{result['p99']:.2f}", f"{result['max']:.2f}",
                      f"{result['recoverAll']:.2f}", f"{result['recoverP50']:.2f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=200)
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-faults-") as workdir:
        state = Path(workdir) / "state"
        console.print("fakefleet up ...")
        fakefleet("up", "--state-dir", str(state), "--unsafe-no-fsync")
        try:
            results = asyncio.run(run(state, args.nodes, args.pods, console))
        finally:
            subprocess.run([str(FAKEFLEET), "down", "--state-dir", str(state)],
                           capture_output=True, timeout=300, check=False)
    report(results, console, args.nodes, args.pods)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"faults-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"nodes": args.nodes, "pods": args.pods,
                               "cpus": os.cpu_count(), "results": results}, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
