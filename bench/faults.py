"""How fast a FaultPlan's faults reach a member API, and how fast they are undone:

    python -m bench.faults [--nodes 1000] [--pods 1000] [--victims N] [--tracing off,on]
                           [--no-ceiling]

The whole product runs as a user runs it: ``fakefleet up`` (host control plane and operator),
a FakeCluster with one pool of ``--nodes`` nodes and ``--pods`` pods bound to them, then two
plans applied with the host API:

- nodes: NotReady on every node (mode all; ``--victims N``: N of them, mode fixed) at t=5s
  for 20s;
- pods: CrashLoop on every pod (or N of them) at t=5s for 20s.

A watch on the member API (started before the plan) timestamps when each victim first shows the
fault (node Ready=False; pod container terminated with the fault's exit code) and when it shows
the recovery (node Ready=True again; pod Running again). Latency is measured from the
*scheduled* moment (``status.startedAt`` + the step's ``at``), so it includes the operator's
timer, its writes of the fault entries, the engine's reaction and the API server's watch.
Pod recovery includes the kubelet's crash-loop back-off (none after a first crash, 10 s after a
second), as a real kubelet's would.

Tracing off against on (``--tracing off,on``, the default, runs the whole measurement once
each, on fresh state): ``off`` is ``fakefleet up`` with no collector and no OTLP endpoint, so
no process exports anything; ``on`` is ``fakefleet up`` as a user runs it, the embedded
collector receiving every process's spans. Faults are the work that is traced (the operator's
step spans, one engine span per batch of writes, and the member kube-apiserver's and etcd's
spans of every write the engine makes for the plan), so this is where tracing costs the most.
Besides the latencies, each row gives the engine's CPU seconds from the plan's creation to the
last victim's recovery, and with tracing on the spans the collector stored for the plan's trace.

The write ceiling (unless ``--no-ceiling``): after each plan, the harness itself sends the
status writes the engine makes for that fault, to the same victims (a node's Ready=False; a
pod's crash, rendered by the engine's own ``render_status``), as many in flight as the engine
sends them (CEILING_CONCURRENCY) on connections opened beforehand, as the engine's are, and the
same watch timestamps when each is visible, from the moment the first write goes out. That is
the floor the engine's own writes set: a fault can be no faster than its victims' status
writes. The harness writes as the member's admin
(``system:masters``), which API priority and fairness exempts; the engine writes as
``fakefleet-engine`` in ``system:nodes`` (priority levels ``node-high`` and ``system``), so
under load the ceiling is a little optimistic.

Results also go to ``bench/results/faults-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS, bounded, untraced_environment
from bench.fleet import usage
from bench.terminating import sigterm_interrupts
from federation.telemetry.files import CollectorFiles
from operators.controlplane.state import StateDir, read_operator
from operators.engine import pods as podlife
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess, load_kubeconfig, load_kubeconfig_file
from operators.k8s.errors import NotFound
from operators.k8s.requests import STRATEGIC_PATCH
from operators.k8s.times import micro_time, parse, rfc3339
from operators.k8s.watching import list_and_watch

NAMESPACE = "default"
BASE = "/apis/fakefleet.dev/v1alpha1/namespaces/default"
AT, DURATION = 5.0, 20.0
#: Seconds for the last spans to reach the collector (the SDK exports every 5 s by default).
SPAN_SETTLE = 8.0
TIMEOUT = 300.0
FAKEFLEET = Path(sys.executable).parent / "fakefleet"
#: Status writes the ceiling has in flight, as the engine does: node stages go out on its
#: heartbeat connections (EngineSettings.heartbeat_connections), pod steps on its pod slots
#: (EngineSettings.pod_concurrency).
CEILING_CONCURRENCY = {"Node": 384, "Pod": 64}
#: The exit code of the ceiling's crash (the plan's is 7: its last crash stays in lastState).
CEILING_EXIT = 9


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


def crashed_with(code: int) -> Callable[[Any], bool]:
    def crashed(pod: Any) -> bool:
        for status in (pod.get("status") or {}).get("containerStatuses") or ():
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                if (state.get("terminated") or {}).get("exitCode") == code:
                    return True
        return False
    return crashed


pod_crashed = crashed_with(7)


def pod_running(pod: Any) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and all(
        "running" in (c.get("state") or {}) for c in status.get("containerStatuses") or ())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fakefleet(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run([str(FAKEFLEET), *args], check=True, capture_output=True,
                          text=True, timeout=600, env=env).stdout


def plan_body(name: str, target: dict[str, Any], fault: dict[str, Any],
              victims: int = 0) -> dict[str, Any]:
    """The plan: its fault on every object of the target, or on ``victims`` of them."""
    mode = {"mode": "fixed", "count": victims} if victims else {"mode": "all"}
    return {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": name},
            "spec": {"seed": 1, "steps": [{"name": "all", "target": {
                "clusters": {"names": ["bench"]}, **mode, **target}, "fault": fault,
                "at": f"{AT:g}s", "duration": f"{DURATION:g}s"}]}}


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


def engine_cpu(state: Path) -> float:
    """CPU seconds the bench cluster's engine process has used so far."""
    operator = read_operator(StateDir(state))
    assert operator is not None, "the operator has not published its components"
    [engine] = [c for c in operator.components
                if c.name == "engine" and (c.cluster or "").endswith("bench") and c.pid]
    assert engine.pid is not None
    return usage("engine", engine.pid).cpu_seconds


def spans_of(state: Path, trace_id: str) -> int:
    """Spans of ``trace_id`` the embedded collector stored (0 without a collector)."""
    database = CollectorFiles.of(state).database
    if not trace_id or not database.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        count: int = db.execute("SELECT count(*) FROM spans WHERE trace_id = ?",
                                (trace_id,)).fetchone()[0]
        return count


async def measure(state: Path, host: Client, member: Client, name: str, path: str,
                  body: dict[str, Any], stamps: Stamps, count: int) -> dict[str, Any]:
    cpu_before = engine_cpu(state)
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
        cpu = engine_cpu(state) - cpu_before
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
        "plan": name, "victims": injection["targetCount"], "visible": len(latencies),
        "victimNames": [text.rsplit("/", 1)[-1] for text in injection["targets"]],
        "p50": round(percentile(latencies, 0.5), 2), "p99": round(percentile(latencies, 0.99), 2),
        "max": round(max(latencies), 2), "mean": round(statistics.fmean(latencies), 2),
        "entriesWritten": round(parse(injection["injectedAt"]) - scheduled, 2),
        "recoverAll": round(max(recovered), 2),
        "recoverP50": round(percentile(recovered, 0.5), 2),
        "injectedAt": injection["injectedAt"], "recoveredAt": injection["recoveredAt"],
        "engineCpuSeconds": round(cpu, 1), "traceId": status.get("traceId") or "",
    }


def node_not_ready_patch(now: str) -> dict[str, Any]:
    """A NotReady fault's status write, as the engine's heartbeats make it (a strategic merge
    of the Ready condition)."""
    return {"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KubeletNotReady",
        "message": "the bench's ceiling", "lastHeartbeatTime": now,
        "lastTransitionTime": now}]}}


def pod_crash_patch(pod: Any, now: str) -> dict[str, Any]:
    """A crash's status write, as the engine renders it: the pod's life as its status shows
    it, then its containers exited with CEILING_EXIT and backing off."""
    facts = podlife.PodFacts(pod)
    status = pod.get("status") or {}
    facts.host_ip = status.get("hostIP", "")
    life = podlife.life_from_status(facts, status)
    crashed = dataclasses.replace(
        life, phase=podlife.BACKOFF, changed_at=now, restarts=life.restarts + 1,
        last_exit=podlife.Exit(CEILING_EXIT, "Error", "", life.started_at or now, now))
    return {"metadata": {"uid": facts.uid},
            "status": podlife.render_status(facts, crashed, now)}


async def ceiling(access: ClusterAccess, member: Client, kind: str, path: str,
                  names: list[str], stamps: Stamps) -> dict[str, Any]:
    """The victims' status writes sent by the harness itself, CEILING_CONCURRENCY in flight:
    when each is visible in the watch, from the moment the first goes out."""
    concurrency = CEILING_CONCURRENCY[kind]
    writer = Client.connect(access, connections=concurrency, timeout=60)
    listed = asyncio.Event()

    def on_list(items: list[Any]) -> None:
        for item in items:
            stamps.see("ADDED", item)
        listed.set()
    watch = asyncio.create_task(list_and_watch(member, path, {}, on_list=on_list,
                                               on_event=stamps.see))
    try:
        await listed.wait()
        assert not set(names) & set(stamps.hit), "the victims show the fault already"
        objects = {item["metadata"]["name"]: item
                   for item in (await member.get(path)).get("items") or ()}
        # The engine's connections are open long before a fault: so are the ceiling's (a TLS
        # handshake per connection, on two busy cores, would be most of what it measures).
        await bounded([lambda: writer.get("/version")] * min(concurrency, len(names)),
                      concurrency)
        started = time.time()
        now = micro_time(started) if kind == "Node" else rfc3339(started)
        calls: list[Callable[[], Awaitable[Any]]]
        if kind == "Node":
            calls = [lambda n=name: writer.patch(f"/api/v1/nodes/{n}/status",
                                                 node_not_ready_patch(now),
                                                 content_type=STRATEGIC_PATCH, decode=False)
                     for name in names]
        else:
            calls = [lambda n=name: writer.patch(
                f"/api/v1/namespaces/{NAMESPACE}/pods/{n}/status",
                pod_crash_patch(objects[n], now), decode=False) for name in names]
        await bounded(calls, concurrency)
        sent = time.time() - started
        await until(lambda: set(names) <= set(stamps.hit), 120, f"{kind}: every write visible")
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await writer.close()
    latencies = [stamps.hit[name] - started for name in names]
    return {"ceilingP50": round(percentile(latencies, 0.5), 2),
            "ceilingP99": round(percentile(latencies, 0.99), 2),
            "ceilingMax": round(max(latencies), 2), "ceilingSent": round(sent, 2)}


async def run(state: Path, nodes: int, pods: int, victims: int, with_ceiling: bool,
              console: Console) -> list[dict[str, Any]]:
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
        access = load_kubeconfig(fakefleet("kubeconfig", "--state-dir", str(state), "bench"))
        member = Client.connect(access, connections=32, timeout=60)
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
            results = [await measure(state, host, member, "nodes", "/api/v1/nodes", plan_body(
                "nodes", {"nodes": {}}, {"type": "NotReady"}, victims),
                Stamps(node_not_ready, node_ready), min(victims or nodes, nodes))]
            if with_ceiling:
                console.print("node ceiling ...")
                await until_healthy(member, "/api/v1/nodes", node_ready)
                results[-1].update(await ceiling(
                    access, member, "Node", "/api/v1/nodes", results[-1]["victimNames"],
                    Stamps(node_not_ready, node_ready)))
            console.print("pod fault ...")
            results.append(await measure(state, host, member, "pods", "/api/v1/pods", plan_body(
                "pods", {"pods": {"namespace": NAMESPACE}}, {"type": "CrashLoop",
                                                               "exitCode": 7}, victims),
                Stamps(pod_crashed, pod_running), min(victims or pods, pods)))
            if with_ceiling:
                console.print("pod ceiling ...")
                await until_healthy(member, f"/api/v1/namespaces/{NAMESPACE}/pods", pod_running)
                crashed = crashed_with(CEILING_EXIT)
                results[-1].update(await ceiling(
                    access, member, "Pod", f"/api/v1/namespaces/{NAMESPACE}/pods",
                    results[-1]["victimNames"], Stamps(crashed, pod_running)))
        finally:
            await member.close()
    finally:
        await host.close()
    if CollectorFiles.of(state).database.exists():
        # Spans reach the collector in batches (every few seconds): count them once all came.
        await asyncio.sleep(SPAN_SETTLE)
    for result in results:
        result["spans"] = spans_of(state, result["traceId"])
    return results


async def until_healthy(member: Client, path: str, healthy: Callable[[Any], bool]) -> None:
    """Wait until every object at ``path`` is back to health (the plan's recovery done)."""
    deadline = time.monotonic() + 120
    while not all(healthy(item) for item in (await member.get(path)).get("items") or ()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path}: not every object healthy again")
        await asyncio.sleep(1.0)


def report(results: list[dict[str, Any]], console: Console, nodes: int, pods: int) -> None:
    table = Table(title=f"FaultPlan: NotReady on {nodes} nodes' victims, CrashLoop on {pods} "
                        f"pods' ({os.cpu_count()} CPUs); seconds from the scheduled moment "
                        f"(ceiling: from the first direct write)")
    for column in ("tracing", "fault", "victims", "faults written", "visible", "p50", "p99",
                   "max", "ceiling p50", "ceiling p99", "p99 / ceiling p99",
                   "all recovered after recoverAt", "recovery p50", "engine CPU (s)",
                   "spans stored"):
        table.add_column(column, justify="right")
    for result in results:
        bound = result.get("ceilingP99")
        table.add_row(result["tracing"], result["plan"], str(result["victims"]),
                      f"{result['entriesWritten']:.2f}", str(result["visible"]),
                      f"{result['p50']:.2f}", f"{result['p99']:.2f}", f"{result['max']:.2f}",
                      f"{result['ceilingP50']:.2f}" if bound is not None else "-",
                      f"{bound:.2f}" if bound is not None else "-",
                      f"{result['p99'] / bound:.2f}" if bound else "-",
                      f"{result['recoverAll']:.2f}", f"{result['recoverP50']:.2f}",
                      f"{result['engineCpuSeconds']:.1f}", str(result["spans"]))
    console.print(table)


def environment(tracing: str) -> dict[str, str]:
    """``fakefleet up``'s environment: no collector and no endpoint, or the embedded one."""
    environ = untraced_environment()
    if tracing == "off":
        environ["FAKEFLEET_COLLECTOR"] = "off"
    return environ


def measure_once(tracing: str, nodes: int, pods: int, victims: int, with_ceiling: bool,
                 console: Console) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-faults-") as workdir:
        state = Path(workdir) / "state"
        console.print(f"tracing {tracing}: fakefleet up ...")
        fakefleet("up", "--state-dir", str(state), "--unsafe-no-fsync",
                  env=environment(tracing))
        try:
            results = asyncio.run(run(state, nodes, pods, victims, with_ceiling, console))
        finally:
            subprocess.run([str(FAKEFLEET), "down", "--state-dir", str(state)],
                           capture_output=True, timeout=300, check=False)
    return [{"tracing": tracing, **result} for result in results]


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--victims", type=int, default=0,
                        help="victims of each step, nodes and pods alike (default: all); "
                             "e.g. 200 for the design's 200-victim goal")
    parser.add_argument("--ceiling", action=argparse.BooleanOptionalAction, default=True,
                        help="after each plan, send its victims' status writes directly and "
                             "time them: the floor the engine's writes set (default: on)")
    parser.add_argument("--tracing", default="off,on",
                        help="comma-separated: off (no collector, no endpoint), on (embedded "
                             "collector); each a whole run on fresh state")
    args = parser.parse_args()
    settings = [setting.strip() for setting in args.tracing.split(",") if setting.strip()]
    if not settings or set(settings) - {"off", "on"}:
        parser.error(f"--tracing {args.tracing!r}: give off, on or off,on")
    if args.victims < 0 or args.victims > min(args.nodes, args.pods):
        parser.error(f"--victims {args.victims}: give 0 (all) to {min(args.nodes, args.pods)} "
                     f"(at most --nodes and --pods)")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    results = [result for setting in settings
               for result in measure_once(setting, args.nodes, args.pods, args.victims,
                                          args.ceiling, console)]
    report(results, console, args.nodes, args.pods)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"faults-{time.strftime('%Y%m%dT%H%M%S')}.json"
    for result in results:
        del result["victimNames"]
    out.write_text(json.dumps({"nodes": args.nodes, "pods": args.pods,
                               "victims": args.victims,
                               "cpus": os.cpu_count(), "results": results}, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
