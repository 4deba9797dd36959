"""A fleet under fire: FaultPlans, hub workloads and pool scaling while processes are killed:

    python -m bench.soak [--duration 1800] [--kills 50] [--seed 1] [--baseline]
                         [--baseline-duration SECONDS]
                         [--targets operator,engine,hub,kube-apiserver,etcd,collector]
    python -m bench.soak --duration 240 --kills 6      # a smoke run, about 9 minutes in all

The product runs as a user runs it: ``fakefleet up`` (host control plane, operator, hub,
collector), two FakeClusters ``a`` and ``b`` (a CPU pool of 10 nodes and an H100 pool of 3
each; ``b`` also a pool ``b-elastic`` that the run scales between 3 and 6 nodes every 100 s),
and in each member a Deployment ``soak`` of 20 pods on the CPU nodes. Then, for
``--duration`` seconds:

- one FaultPlan ``soak`` (seed ``--seed``): from 30 s on, every 120 s, 2 CPU nodes per cluster
  NotReady for 30 s (expected: the victims show Ready=False within 30 s), and from 90 s on 2
  Deployment pods per cluster whose container exits with code 3; as many occurrences as start
  before the last minute;
- every 120 s until the last minute, a hub workload of 4 Jobs (one pod of 8 GPUs each, 20 s),
  spread over the fleet;
- ``--kills`` SIGKILLs at moments and of processes drawn from ``--seed`` (none in the first
  and the last minute): the operator, a member's engine, the hub, a member's kube-apiserver,
  the members' etcd, the collector. Each kill runs on its own (``bench.soakdriving``): one
  whose target is down looks again for up to 60 s, and each waits up to 120 s for its
  successor to be published, without holding back the next.

Watches on every member (started before the plan, relisting through kills) record each node's,
pod's and Job's states; ``bench.soakcheck`` judges them once the plan and the workloads ended:
node UIDs made once, faults injected and recovered once, the plan's occurrences all done,
workloads all Succeeded with every Job created once, nothing NotReady or failed outside a
fault window, and each expectation's verdict against the one expected. ``--baseline`` first
runs the same seeded scenario without kills (for ``--baseline-duration`` seconds, default
``--duration``) on a fresh state directory, and expects its verdicts; without it, every
expectation is expected to pass (its own fault makes it true). A verdict that differs is
reported apart when a kill's downtime overlapped its window. Everything it starts is stopped
(``fakefleet down``) however it ends. Results also go to ``bench/results/soak-<time>.json``
(with each failed workload Job's conditions), and with ``--keep DIR`` each run's state
directory (every process's log) to ``DIR/<run>``; it exits 1 when a check failed that no kill
explains.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from bench import soakcheck
from bench.engines import RESULTS
from bench.soakcheck import Kill, Scale, Sighting, Verdict
from bench.soakdriving import (
    COMEBACK,
    QUIET,
    RETRY_FOR,
    TARGETS,
    Killer,
    Published,
    scaling,
    schedule,
    submitting,
)
from bench.terminating import sigterm_interrupts
from bench.workloads import BIN, Host, sh
from federation.api import fleet_pb2
from operators.api.faultplans import MAX_OCCURRENCES
from operators.controlplane.state import StateDir
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError
from operators.k8s.times import parse
from operators.k8s.watching import list_and_watch
from primitives import keys
from primitives.clocks import SYSTEM_CLOCK

NAMESPACE = "bench"  # bench.workloads.Host's: the FakeClusters' namespace in the host
BASE = f"/apis/fakefleet.dev/v1alpha1/namespaces/{NAMESPACE}"
CLUSTERS = ("a", "b")
APP = "soak"
FIRST_FAULT, PODS_EXIT, PLAN_EVERY, NODE_FAULT_FOR, EXPECT_WITHIN = 30, 90, 120, 30, 30
STEPS = {"nodes-down": FIRST_FAULT, "pods-exit": PODS_EXIT}
SCALE_EVERY, ELASTIC = 100.0, (3, 6)
SUBMIT_EVERY, JOBS, RUN_TIME = 120.0, 4, 20.0
#: Seconds after a killed process is published again that its clients may still be catching
#: up (reconnecting with back-off, relisting): a verdict judged then may still be the kill's.
AFTERMATH = 15.0
#: Seconds for a scale or a submission under way at the end to be confirmed.
CONFIRM = 120.0
#: Seconds after the last activity for plans and workloads to finish and states to settle.
FINISH, SETTLE = 600.0, 60.0
#: The run's bounds: kills need time between the quiet minutes, and a FaultPlan holds at most
#: MAX_OCCURRENCES occurrences over its steps.
SHORTEST = 3 * QUIET
LONGEST = QUIET + FIRST_FAULT + (MAX_OCCURRENCES // len(STEPS) - 1) * PLAN_EVERY


def fleet_manifest() -> str:
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NAMESPACE}}}"]
    for cluster in CLUSTERS:
        docs.append(f"""apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {cluster}, namespace: {NAMESPACE}}}
spec: {{}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {cluster}-cpu, namespace: {NAMESPACE}}}
spec: {{clusterRef: {cluster}, replicas: 10}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {cluster}-gpu, namespace: {NAMESPACE}}}
spec: {{clusterRef: {cluster}, replicas: 3, gpu: {{preset: H100-SXM5-80GB}}}}""")
    docs.append(f"""apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: b-elastic, namespace: {NAMESPACE}}}
spec: {{clusterRef: b, replicas: {ELASTIC[0]}}}""")
    return "\n---\n".join(docs) + "\n"


def deployment_manifest(cluster: str) -> str:
    return f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: {APP}, namespace: default}}
spec:
  replicas: 20
  selector: {{matchLabels: {{app: {APP}}}}}
  template:
    metadata: {{labels: {{app: {APP}}}}}
    spec:
      nodeSelector: {{{keys.POOL}: {cluster}-cpu}}
      containers: [{{name: c, image: fake}}]
"""


def occurrences_in(duration: float) -> int:
    """How many occurrences of each step start before the run's quiet last minute."""
    return int((duration - QUIET - FIRST_FAULT) // PLAN_EVERY) + 1


def planned(occurrences: int) -> dict[tuple[str, int], float]:
    """Each occurrence's moment, seconds from the plan's start."""
    return {(step, k): at + k * PLAN_EVERY for step, at in STEPS.items()
            for k in range(occurrences)}


def plan_body(seed: int, occurrences: int) -> dict[str, Any]:
    repeat = {"every": f"{PLAN_EVERY}s", "times": occurrences}
    return {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": "soak", "namespace": NAMESPACE},
            "spec": {"seed": seed, "steps": [
                {"name": "nodes-down", "at": f"{STEPS['nodes-down']}s",
                 "duration": f"{NODE_FAULT_FOR}s", "repeat": repeat,
                 "target": {"nodes": {"pools": [f"{c}-cpu" for c in CLUSTERS]},
                            "mode": "fixed", "count": 2},
                 "fault": {"type": "NotReady"},
                 "expectations": [{"name": "victims-not-ready", "within": f"{EXPECT_WITHIN}s",
                                   "objects": {"kind": "Node", "victims": True},
                                   "condition": {"type": "Ready", "status": "False"}}]},
                {"name": "pods-exit", "at": f"{STEPS['pods-exit']}s", "repeat": repeat,
                 "target": {"pods": {"namespace": "default",
                                     "selector": {"matchLabels": {"app": APP}}},
                            "mode": "fixed", "count": 2},
                 "fault": {"type": "ContainerExit", "exitCode": 3}}]}}


def workload_spec(index: int) -> fleet_pb2.WorkloadSpec:
    return json_format.ParseDict({
        "jobs": JOBS, "podsPerJob": 1, "resources": {"nvidia.com/gpu": "8"},
        "runTime": {"distribution": "fixed", "seconds": RUN_TIME},
        "arrivals": {"process": "poisson", "rate": 0.5}, "seed": index,
        "namespace": "default", "target": {"placement": "spread"}}, fleet_pb2.WorkloadSpec())


def phase_name(phase: fleet_pb2.WorkloadPhase.ValueType) -> str:
    return fleet_pb2.WorkloadPhase.Name(phase).removeprefix("WORKLOAD_PHASE_").capitalize()


# -- watching ----------------------------------------------------------------------------------

Make = Callable[..., Sighting]


class Sightings:
    """Every state the watches showed, and what a relist found gone."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.seen: list[Sighting] = []
        self.live: dict[tuple[str, str, str], dict[str, Any]] = {}

    def handler(self, cluster: str, kind: str, make: Make) -> tuple[
            Callable[[list[Any]], None], Callable[[str, Any], None]]:
        def on_event(event: str, obj: Any) -> None:
            at = time.time() - self.started
            name = (obj.get("metadata") or {}).get("name", "")
            self.seen.append(make(at, cluster, obj, deleted=event == "DELETED"))
            if event == "DELETED":
                self.live.pop((cluster, kind, name), None)
            else:
                self.live[(cluster, kind, name)] = obj

        def on_list(items: list[Any]) -> None:
            names = {(i.get("metadata") or {}).get("name", "") for i in items}
            for key, obj in list(self.live.items()):
                if key[0] == cluster and key[1] == kind and key[2] not in names:
                    on_event("DELETED", obj)
            for item in items:
                on_event("ADDED", item)
        return on_list, on_event


WATCHED: tuple[tuple[str, str, Make], ...] = (
    ("Node", "/api/v1/nodes", soakcheck.node_sighting),
    ("Pod", "/api/v1/namespaces/default/pods", soakcheck.pod_sighting),
    ("Job", "/apis/batch/v1/namespaces/default/jobs", soakcheck.job_sighting))


# -- one run -----------------------------------------------------------------------------------

class Soak:
    """One run of the scenario on ``host`` (``fakefleet up`` done): the fleet, then
    ``duration`` seconds of plan, workloads, scaling and ``kills`` kills; what it saw, judged."""

    def __init__(self, host: Host, *, duration: float, kills: int, seed: int,
                 targets: list[str], console: Console, title: str) -> None:
        self.host, self.duration, self.kills, self.seed = host, duration, kills, seed
        self.targets, self.console, self.title = targets, console, title
        self.started = time.time()

    def say(self, text: str) -> None:
        self.console.print(f"[{self.title} {time.time() - self.started:6.0f}s] {text}",
                           markup=False, highlight=False)

    async def run(self) -> dict[str, Any]:
        host = self.host
        host.apply(fleet_manifest())
        self.say("waiting for the fleet ...")
        host.fakefleet("wait", "--timeout", "900", timeout=960)
        clients: list[Client] = []
        try:
            members: dict[str, Client] = {}
            for cluster in CLUSTERS:
                kubeconfig = host.member(cluster)
                host.apply(deployment_manifest(cluster), kubeconfig)
                sh(str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "rollout", "status",
                   f"deployment/{APP}", "--timeout=300s", timeout=320)
                members[cluster] = Client.connect(load_kubeconfig_file(kubeconfig), timeout=30)
                clients.append(members[cluster])
            api = Client.connect(load_kubeconfig_file(host.kubeconfig), timeout=30)
            clients.append(api)
            return await self.soak(api, members)
        finally:
            for client in clients:
                await client.close()

    async def soak(self, api: Client, members: dict[str, Client]) -> dict[str, Any]:
        self.started = started = time.time()
        sightings = Sightings(started)
        occurrences = occurrences_in(self.duration)
        kills = schedule(self.seed, self.kills, self.duration, self.targets, CLUSTERS)
        stop = asyncio.Event()
        killer = Killer(Published(StateDir(self.host.state)), clock=SYSTEM_CLOCK,
                        started=started, say=self.say)
        scales: list[Scale] = []
        submitted: list[str] = []
        tasks = [asyncio.create_task(list_and_watch(
            members[cluster], path, {}, on_list=on_list, on_event=on_event))
            for cluster in CLUSTERS for kind, path, make in WATCHED
            for on_list, on_event in [sightings.handler(cluster, kind, make)]]
        try:
            await api.create(f"{BASE}/faultplans", plan_body(self.seed, occurrences))
            self.say(f"plan soak: {occurrences} occurrences of each step; {len(kills)} kills "
                     f"over {self.duration:.0f}s")
            writes = [
                asyncio.create_task(scaling(
                    api, f"{BASE}/fakenodepools/b-elastic", "b", "b-elastic", ELASTIC,
                    every=SCALE_EVERY, clock=SYSTEM_CLOCK, started=started, stop=stop,
                    scales=scales, say=self.say)),
                asyncio.create_task(submitting(
                    self.host.fleet, workload_spec, every=SUBMIT_EVERY,
                    last=self.duration - QUIET, clock=SYSTEM_CLOCK, started=started, stop=stop,
                    submitted=submitted, say=self.say))]
            killing = asyncio.create_task(killer.run(kills))
            tasks += [*writes, killing,
                      asyncio.create_task(self.progress(api, sightings, killer, submitted))]
            await asyncio.sleep(self.duration)
            stop.set()
            self.say("the run's time is up: waiting for the last kills' successors ...")
            await killing
            done, unconfirmed = await asyncio.wait(writes, timeout=CONFIRM)
            for task in done:
                task.result()  # an error the activity did not expect is the harness's bug
            if unconfirmed:
                self.say(f"{len(unconfirmed)} writes still unconfirmed after {CONFIRM:.0f}s")
            self.say("waiting for the plan and the workloads to finish ...")
            status = await self.finished(api, submitted)
            await asyncio.sleep(SETTLE)
            workloads = await self.workloads(submitted)
            jobs = await failed_jobs(members)
            until = time.time() - started
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return judge(status, sightings.seen, scales, killer.kills, workloads, started,
                     planned(occurrences), until, unconfirmed=len(unconfirmed)) | {
                         "failedWorkloadJobs": jobs}

    async def progress(self, api: Client, sightings: Sightings, killer: Killer,
                       submitted: list[str]) -> None:
        while True:
            await asyncio.sleep(60)
            try:
                status = (await api.get(f"{BASE}/faultplans/soak")).get("status") or {}
            except K8sError as error:  # the host API may be down (etcd killed): look again
                status = {"phase": f"unknown ({type(error).__name__})"}
            self.say(f"plan {status.get('phase')} steps {status.get('stepsDone')}; "
                     f"{len(killer.kills)} kills done, {len(submitted)} workloads, "
                     f"{len(sightings.seen)} sightings")

    async def finished(self, api: Client, submitted: list[str]) -> dict[str, Any]:
        """The plan's last status, once it and every workload finished (or FINISH passed)."""
        deadline = time.monotonic() + FINISH
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(K8sError):  # a slow host API: look again
                status = (await api.get(f"{BASE}/faultplans/soak")).get("status") or {}
                if status.get("phase") in ("Succeeded", "Failed"):
                    break
            await asyncio.sleep(2.0)
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                async with self.host.fleet() as fleet:
                    phases = {phase_name((await fleet.get_workload(w)).phase)
                              for w in submitted}
                if not phases & {"Unspecified", "Running"}:
                    break
            await asyncio.sleep(2.0)
        return status

    async def workloads(self, submitted: list[str]) -> list[dict[str, Any]]:
        found = []
        async with self.host.fleet() as fleet:
            for workload in submitted:
                got = await fleet.get_workload(workload, jobs=True)
                found.append({"id": workload, "name": got.name, "phase": phase_name(got.phase),
                              "counts": json_format.MessageToDict(got.report.counts),
                              "jobs": [{"index": j.index, "name": j.name, "state": j.state,
                                        "attempt": j.attempt, "cluster": j.cluster,
                                        "message": j.message}
                                       for j in got.jobs]})
        return found


async def failed_jobs(members: dict[str, Client]) -> list[dict[str, Any]]:
    """Every member's failed workload Jobs with their conditions; a member whose API does not
    answer says so instead."""
    found: list[dict[str, Any]] = []
    for cluster, member in members.items():
        try:
            listed = await member.get("/apis/batch/v1/namespaces/default/jobs")
        except K8sError as error:
            found.append({"cluster": cluster, "error": str(error)})
            continue
        found += soakcheck.failed_jobs(cluster, listed.get("items") or (), keys.WORKLOAD)
    return found


def judge(status: dict[str, Any], seen: list[Sighting], scales: list[Scale],
          kills: list[Kill], workloads: list[dict[str, Any]], run_started: float,
          schedule_: dict[tuple[str, int], float], until: float, *,
          unconfirmed: int) -> dict[str, Any]:
    """The checks over what one run saw. Every time is in seconds from the run's start
    (``run_started``, wall clock): the plan's RFC 3339 times are turned into that too."""
    zero = parse(status["startedAt"]) - run_started if status.get("startedAt") else 0.0
    injections = status.get("injections") or []
    faults = {"nodes-down": "NotReady", "pods-exit": "ContainerExit"}
    found = soakcheck.allow_backoff(soakcheck.windows(
        "soak", zero, injections, faults, lambda text: parse(text) - run_started), seen)
    verdicts = [
        Verdict(f"soak/{i['step']}#{i.get('occurrence', 0)}/{e['name']}",
                e.get("outcome", "Pending"), zero + float(i.get("injectAt") or 0),
                (parse(i["injectedAt"]) - run_started if i.get("injectedAt")
                 else zero + float(i.get("injectAt") or 0)) + EXPECT_WITHIN)
        for i in injections for e in i.get("expectations") or ()]
    jobs, repeated_jobs = soakcheck.jobs_made_once(seen, keys.WORKLOAD)
    return {
        "plan": {"phase": status.get("phase"), "verdict": status.get("verdict"),
                 "stepsDone": status.get("stepsDone")},
        "kills": [asdict(k) | {"drift": k.drift} for k in kills],
        "scales": [asdict(s) for s in scales],
        "unconfirmedWrites": unconfirmed,
        "workloads": workloads,
        "sightings": len(seen),
        "nodesMadeOnce": soakcheck.nodes_made_once(seen, scales),
        "inventedNodeFaults": soakcheck.invented_node_faults(seen, found, scales),
        "inventedPodFaults": soakcheck.invented_pod_faults(seen, found, APP),
        "occurrences": soakcheck.occurrences(seen, found),
        "schedule": soakcheck.occurrences_done(injections, schedule_, until - zero),
        "jobs": jobs, "jobsRepeated": repeated_jobs,
        "workloadsDone": soakcheck.workloads_done(workloads, seen, keys.WORKLOAD, JOBS),
        "failedWorkloadPods": soakcheck.failed_workload_pods(seen, keys.WORKLOAD),
        "unfinishedWorkloadPods": soakcheck.unfinished_workload_pods(seen, keys.WORKLOAD),
        "verdicts": [asdict(v) for v in verdicts],
    }


def compare(result: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    """Each of ``result``'s verdicts against the baseline's (or as designed), into it."""
    expected = None if baseline is None else {v["label"]: v["outcome"]
                                              for v in baseline["verdicts"]}
    kills = [Kill(**{k: v for k, v in kill.items() if k != "drift"})
             for kill in result["kills"]]
    result["verdictChanges"] = soakcheck.compare_verdicts(
        [Verdict(**v) for v in result["verdicts"]], kills, expected=expected,
        aftermath=AFTERMATH)


# -- the report --------------------------------------------------------------------------------

def quantile(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[round(q * (len(ordered) - 1))]:.1f}" if ordered else "-"


def kills_table(result: dict[str, Any], targets: list[str], title: str) -> Table:
    table = Table(title=title)
    table.add_column("target")
    for column in ("planned", "killed", f"back (≤{COMEBACK:.0f}s)", "not back",
                   f"never running (looked {RETRY_FOR:.0f}s)", "waited for its target",
                   "back after p50 / max (s)", "drift p50 / max (s)"):
        table.add_column(column, justify="right")
    for target in [*targets, "all"]:
        mine = [k for k in result["kills"] if target in ("all", k["target"])]
        killed = [k for k in mine if k["killed_at"] is not None]
        back = [k["back_after"] for k in killed if k["back_after"] is not None]
        drift = [k["drift"] for k in killed]
        table.add_row(target, str(len(mine)), str(len(killed)), str(len(back)),
                      str(len(killed) - len(back)), str(len(mine) - len(killed)),
                      str(sum(1 for k in mine if k["tries"] > 1)),
                      f"{quantile(back, 0.5)} / {quantile(back, 1.0)}",
                      f"{quantile(drift, 0.5)} / {quantile(drift, 1.0)}")
    return table


#: The checks, each (label, what it counts from a run's result, whether a count above 0 fails).
CHECKS: tuple[tuple[str, Callable[[dict[str, Any]], Any], bool], ...] = (
    ("node UIDs made more than once, or deleted unasked",
     lambda r: len(r["nodesMadeOnce"]), True),
    ("nodes not Ready with no fault over them", lambda r: len(r["inventedNodeFaults"]), True),
    ("Deployment pods not Ready, failed, restarted or gone with no fault over them",
     lambda r: len(r["inventedPodFaults"]), True),
    ("fault victims hit exactly once", lambda r: len(r["occurrences"]["once"]), False),
    ("fault victims never seen hit", lambda r: len(r["occurrences"]["missed"]), True),
    ("fault victims hit more than once", lambda r: len(r["occurrences"]["repeated"]), True),
    ("fault victims not healthy at their window's end",
     lambda r: len(r["occurrences"]["unrecovered"]), True),
    ("occurrences finished / due (occurrences x steps)",
     lambda r: f"{r['schedule']['finished']} / {r['schedule']['due']}", False),
    ("occurrences never injected", lambda r: len(r["schedule"]["missed"]), True),
    ("occurrences injected, never finished", lambda r: len(r["schedule"]["unfinished"]), True),
    ("occurrences recorded twice, or unplanned",
     lambda r: len(r["schedule"]["repeated"]) + len(r["schedule"]["unplanned"]), True),
    ("workloads Succeeded / submitted",
     lambda r: f"{sum(w['phase'] == 'Succeeded' for w in r['workloads'])} / "
               f"{len(r['workloads'])}", False),
    ("workloads or their Jobs lost", lambda r: len(r["workloadsDone"]["lost"]), True),
    ("workload Jobs seen in members", lambda r: r["jobs"], False),
    ("workload Jobs created more than once", lambda r: len(r["jobsRepeated"]), True),
    ("workload Jobs the hub sent again (attempt > 1)",
     lambda r: len(r["workloadsDone"]["retried"]), True),
    ("workload pods failed", lambda r: len(r["failedWorkloadPods"]), True),
    ("scales and submissions unconfirmed at the end", lambda r: r["unconfirmedWrites"], True),
    ("expectations as expected (Passed)", lambda r: len(r["verdictChanges"]["same"]), False),
    ("expectations not passed without kills either",
     lambda r: len(r["verdictChanges"]["notPassedWithoutKills"]), True),
    ("expectations changed, a kill's downtime overlapping their window",
     lambda r: len(r["verdictChanges"]["changedDuringKills"]), False),
    ("expectations changed, no kill near them",
     lambda r: len(r["verdictChanges"]["changedOtherwise"]), True),
    ("kills whose process was not back", lambda r: sum(
        k["killed_at"] is not None and k["back_after"] is None for k in r["kills"]), True),
    ("plan", lambda r: f"{r['plan']['phase']} {r['plan']['verdict']} ({r['plan']['stepsDone']})",
     False),
)

#: The lists whose entries the report prints below the tables (at most 20 of each).
DETAILS = (("nodesMadeOnce",), ("inventedNodeFaults",), ("inventedPodFaults",),
           ("occurrences", "missed"), ("occurrences", "repeated"),
           ("occurrences", "unrecovered"), ("schedule", "missed"), ("schedule", "unfinished"),
           ("schedule", "repeated"), ("schedule", "unplanned"), ("workloadsDone", "lost"),
           ("workloadsDone", "retried"), ("jobsRepeated",), ("failedWorkloadPods",),
           ("verdictChanges", "notPassedWithoutKills"),
           ("verdictChanges", "changedDuringKills"), ("verdictChanges", "changedOtherwise"))


def failures(result: dict[str, Any]) -> list[str]:
    return [label for label, count, fails in CHECKS if fails and count(result)]


def report(runs: dict[str, dict[str, Any]], console: Console, args: argparse.Namespace) -> None:
    run = runs["with kills"]
    console.print(kills_table(run, args.targets,
                              f"soak: {args.duration:.0f}s, {args.kills} kills (seed "
                              f"{args.seed}), {os.cpu_count()} CPUs"))
    checks = Table(title="what held")
    checks.add_column("check")
    for name in runs:
        checks.add_column(name, justify="right")
    for label, count, _ in CHECKS:
        checks.add_row(label, *(str(count(r)) for r in runs.values()))
    console.print(checks)
    for name, result in runs.items():
        for path in DETAILS:
            found: Any = result
            for key in path:
                found = found[key]
            for line in found[:20]:
                console.print(f"  {name}: {'.'.join(path)}: {line}", markup=False,
                              highlight=False)


# -- the command -------------------------------------------------------------------------------

def soak_once(args: argparse.Namespace, console: Console, *, kills: int, duration: float,
              title: str) -> dict[str, Any]:
    """One run on a fresh state directory; ``fakefleet down`` however it ends."""
    with tempfile.TemporaryDirectory(prefix="fakefleet-soak-") as workdir:
        host = Host(Path(workdir) / "state")
        try:
            console.print(f"[{title}] fakefleet up ...", markup=False)
            host.fakefleet("up")
            return asyncio.run(Soak(host, duration=duration, kills=kills, seed=args.seed,
                                    targets=args.targets, console=console, title=title).run())
        finally:
            console.print(f"[{title}] fakefleet down ...", markup=False)
            down = subprocess.run([str(BIN / "fakefleet"), "down", "--state-dir",
                                   str(host.state)], capture_output=True, text=True,
                                  timeout=300, check=False)
            if down.returncode:
                console.print(f"[{title}] fakefleet down failed ({down.returncode}): "
                              f"{down.stderr[-2000:]}", markup=False, highlight=False)
            if args.keep is not None:
                kept = args.keep / title.replace(" ", "-")
                keep_state(host.state, kept)
                console.print(f"[{title}] state kept in {kept}", markup=False)


def keep_state(state: Path, dest: Path) -> None:
    """The run's state directory (every process's log: the operator's, the engines', the
    hub's, the members') copied to ``dest`` before the temporary one goes; sockets and other
    special files left out (copytree cannot copy them, and they mean nothing after the run)."""
    def special(directory: str, names: list[str]) -> set[str]:
        return {name for name in names if not (
            (path := Path(directory) / name).is_symlink() or path.is_file() or path.is_dir())}
    shutil.copytree(state, dest, symlinks=True, ignore=special, dirs_exist_ok=True)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=1800.0)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", action="store_true",
                        help="first run the same scenario without kills, and expect its verdicts")
    parser.add_argument("--baseline-duration", type=float, default=None,
                        help="seconds of the run without kills (default: --duration)")
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help="comma-separated processes to kill: " + ", ".join(TARGETS))
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="copy each run's state directory (every process's log) into "
                             "DIR/<run> when it ends, to diagnose a failure afterwards")
    args = parser.parse_args()
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not args.targets or set(args.targets) - set(TARGETS):
        parser.error(f"--targets: give some of {', '.join(TARGETS)}")
    for flag, value in (("--duration", args.duration),
                        ("--baseline-duration", args.baseline_duration)):
        if value is not None and not SHORTEST <= value <= LONGEST:
            parser.error(f"{flag} {value:g}: give {SHORTEST:.0f} to {LONGEST:.0f} seconds (a "
                         f"quiet minute at each end, and at most {MAX_OCCURRENCES} "
                         f"occurrences in a FaultPlan)")
    if args.kills < 0:
        parser.error(f"--kills {args.kills}: give 0 or more")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    runs: dict[str, dict[str, Any]] = {}
    if args.baseline:
        runs["without kills"] = soak_once(args, console, kills=0,
                                          duration=args.baseline_duration or args.duration,
                                          title="without kills")
        compare(runs["without kills"], None)
    runs["with kills"] = soak_once(args, console, kills=args.kills, duration=args.duration,
                                   title="with kills")
    compare(runs["with kills"], runs.get("without kills"))
    report(runs, console, args)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"soak-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"duration": args.duration, "kills": args.kills,
                               "seed": args.seed, "targets": args.targets,
                               "baselineDuration": args.baseline_duration,
                               "cpus": os.cpu_count(), **runs}, indent=2) + "\n")
    console.print(f"results: {out}")
    if failed := failures(runs["with kills"]):
        raise SystemExit("checks failed that no kill explains: " + "; ".join(failed))


if __name__ == "__main__":
    main()
