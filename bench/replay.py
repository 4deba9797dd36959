"""Replay's timing error and its determinism (issue 27's numbers):

    python -m bench.replay [--configmaps 2500] [--seconds 150] [--speeds 1,10,max]
                           [--inflight 16] [--parts timing,determinism] [--nodes 4]
                           [--record-for 40] [--replay-speed 1] [--seed 7] [--smoke]

**Timing.** A synthetic trace (:mod:`bench.replaytrace`: ConfigMaps created, patched twice and
deleted, a few Deployments scaled and deleted, suspended Jobs created and deleted; 10 035
changes over 150 s by default) written as a trace file and read back, then replayed by the
product's :class:`~operators.recording.replaying.Replayer` into a fresh control plane (etcd,
kube-apiserver, scheduler, controller-manager: what a FakeCluster runs; the replay needs no
more than its API) at each speed, each run into a namespace of its own. Per speed: the timing
error of each write (when the API answered it less when it was due: ``Progress.lags``) p50,
p99 and max, writes refused, wall time; and the fastest speed whose p99 stayed within 1 s.
Beside it, the API server's raw write ceiling on the same control plane: the same planned
writes sent as fast as they are answered by ``--inflight`` senders on the same kind of client,
each object's writes in order (a patch never before its create), in writes/s.

**Determinism.** ``fakefleet up`` and three FakeClusters with a pool of ``--nodes`` nodes each:
``src``, and ``again`` in host namespaces ``replay-a`` and ``replay-b`` (the same cluster and
pool names, so that node names compare). ``fakefleet record`` records ``src`` for
``--record-for`` seconds while a Deployment of 3 is scaled to 2 and three Jobs run (4 pods that
succeed, pods that exit 2 until the Job fails, and a pod that a seeded FaultPlan makes exit 3).
The recording is replayed with ``fakefleet replay --seed --speed`` into each ``again`` in
turn, each replay recorded with ``fakefleet record``; the two recordings are compared with
:mod:`operators.recording.comparing` (``fakefleet diff``): the share of identical per-object
event sequences (the issue asks for at least 95 %), placements, pod outcomes and FaultPlan
verdicts (none here: the replays carry the plan's effect as a recorded pod life, not the plan),
and the first divergence.

Results also go to ``bench/results/replay-<time>.json`` (git-ignored), or ``--output``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS, untraced_environment
from bench.replaytrace import (
    Size,
    SpeedRun,
    chains,
    fastest_within,
    measured,
    parse_speeds,
    synthetic,
)
from bench.snapshots import FAKEFLEET, kubectl, kubectl_json
from bench.terminating import sigterm_interrupts
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import Profile
from operators.controlplane.state import StateDir
from operators.controlplane.substrate import ClusterOptions, Substrate
from operators.k8s import discovery
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError, brief
from operators.recording import comparing, files, loading, planning, replaying
from operators.recording.planning import Plan, Write
from primitives import keys
from primitives.clocks import SYSTEM_CLOCK

#: The issue's goal for the timing error (p99, s).
BUDGET = 1.0
#: Progress lines at most this often while a replay runs (s).
PROGRESS_EVERY = 10.0
READY_TIMEOUT = 600.0
#: How long a replay's recording runs beyond the replayed timeline (s): the last pods end.
SETTLE = 20.0
#: The determinism scenario's cluster names; the replays' host namespaces.
SOURCE, AGAIN, SIDES = "src", "again", ("replay-a", "replay-b")
POOL = "workers"
SHOP = "shop"
RECORDED = "deployments.apps,replicasets.apps,jobs.batch,pods"


@dataclasses.dataclass
class Ceiling:
    writes: int
    inflight: int
    seconds: float = 0.0
    failed: int = 0
    first_failure: str = ""

    @property
    def rate(self) -> float | None:
        return self.writes / self.seconds if self.seconds else None


@dataclasses.dataclass
class Timing:
    size: Size
    inflight: int
    profile: str
    trace_bytes: int = 0
    runs: list[SpeedRun] = dataclasses.field(default_factory=list)
    ceiling: Ceiling | None = None


@dataclasses.dataclass
class Determinism:
    nodes: int
    speed: float
    seed: str
    record_for: float
    recorded_changes: int = 0
    recorded_pods: int = 0
    replay_exits: list[int] = dataclasses.field(default_factory=list)
    replay_summaries: list[str] = dataclasses.field(default_factory=list)
    #: comparing.Comparison.fields(): shares, the first divergence, every differing object.
    comparison: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""


# -- timing ------------------------------------------------------------------------------------

def _path(write: Write) -> str:
    """The collection a planned write goes to (the synthetic trace names every plural)."""
    where = f"/namespaces/{write.namespace}" if write.namespace else ""
    return f"{discovery.group_path(write.api_version)}{where}/{write.resource}"


async def _send(client: Client, write: Write) -> None:
    if write.method == "create":
        await client.create(_path(write), write.body, decode=False)
    elif write.method == "patch":
        await client.patch(f"{_path(write)}/{write.name}", write.body or {})
    else:
        await client.delete(f"{_path(write)}/{write.name}")


async def write_ceiling(client: Client, plan: Plan, inflight: int) -> Ceiling:
    """The plan's writes as fast as the API answers them: its namespaces, then ``inflight``
    senders, each taking the next object and sending its writes in order."""
    namespaces, objects = chains(plan)
    ceiling = Ceiling(writes=len(plan.writes), inflight=inflight)

    async def send(write: Write) -> None:
        try:
            await _send(client, write)
        except K8sError as error:
            ceiling.failed += 1
            ceiling.first_failure = ceiling.first_failure or \
                f"{write.describe()}: {brief(error)}"

    pending = iter(objects)

    async def sender() -> None:
        for chain in pending:  # one iterator shared by the senders: each object goes once
            for write in chain:
                await send(write)

    started = time.monotonic()
    for write in namespaces:
        await send(write)
    await asyncio.gather(*(sender() for _ in range(inflight)))
    ceiling.seconds = time.monotonic() - started
    return ceiling


async def replay_once(client: Client, trace_path: Path, speed: float, inflight: int,
                      size: Size, console: Console) -> SpeedRun:
    trace = loading.load(trace_path)
    plan = planning.plan(trace, planning.Options(speed=speed, run=f"bench{int(speed * 1000)}"))
    label = "max" if speed == 0 else f"{speed:g}"
    console.print(f"replaying {len(plan.writes)} writes at speed {label} ...")
    printed = [time.monotonic()]

    def progress(now: replaying.Progress) -> None:
        if time.monotonic() - printed[0] >= PROGRESS_EVERY:
            printed[0] = time.monotonic()
            p50, p99, worst = now.lag()
            console.print(f"  {now.done}/{now.total}, lag p50 {p50:.3f}s p99 {p99:.3f}s max "
                          f"{worst:.3f}s", highlight=False)

    started = time.monotonic()
    done = await replaying.Replayer(client, clock=SYSTEM_CLOCK, concurrency=inflight,
                                    on_progress=progress).run(plan)
    return measured(speed, done, wall=time.monotonic() - started,
                    timeline=size.seconds / speed if speed else 0.0)


async def timing(binaries: binaries_.Binaries, workdir: Path, *, size: Size,
                 speeds: list[float], inflight: int, seed: int, profile: Profile,
                 console: Console) -> Timing:
    result = Timing(size, inflight, profile.value)
    async with Substrate(workdir, binaries, fsync=False,
                         environ=untraced_environment()) as substrate:
        cluster = await substrate.add_cluster("replay", ClusterOptions(profile=profile))
        access = load_kubeconfig_file(cluster.kubeconfig_path)
        async with Client.connect(access, connections=inflight, timeout=60) as client:
            for index, speed in enumerate(speeds):
                namespace = f"replay-{index}"
                path = workdir / f"{namespace}.trace"
                result.trace_bytes = files.write(path, synthetic(size, namespace=namespace,
                                                                 seed=seed))
                result.runs.append(await replay_once(client, path, speed, inflight, size,
                                                     console))
            console.print(f"write ceiling: the same writes, {inflight} in flight ...")
            plan = planning.plan(synthetic(size, namespace="ceiling", seed=seed),
                                 planning.Options(speed=0, run="ceiling"))
            result.ceiling = await write_ceiling(client, plan, inflight)
    return result


def report_timing(result: Timing, console: Console) -> None:
    size = result.size
    table = Table(title=f"replay timing: {size.changes} changes over {size.seconds:g}s "
                        f"({size.configmaps} ConfigMaps, {size.deployments} Deployments, "
                        f"{size.jobs} Jobs; trace file {result.trace_bytes / 1024:.0f} KiB), "
                        f"{result.inflight} in flight, profile {result.profile}")
    for column in ("speed", "writes", "applied", "refused", "lag p50 s", "lag p99 s",
                   "lag max s", "timeline s", "wall s", "writes/s"):
        table.add_column(column, justify="left" if column == "speed" else "right")
    for run in result.runs:
        table.add_row(run.label, str(run.writes), str(run.applied),
                      str(run.refused + run.dropped), f"{run.lag_p50:.3f}",
                      f"{run.lag_p99:.3f}", f"{run.lag_max:.3f}",
                      f"{run.timeline_seconds:.1f}" if run.speed else "-",
                      f"{run.wall_seconds:.1f}", f"{run.rate:.0f}" if run.rate else "-")
    ceiling = result.ceiling
    if ceiling is not None:
        table.add_row(f"ceiling ({ceiling.inflight} in flight)", str(ceiling.writes),
                      str(ceiling.writes - ceiling.failed), str(ceiling.failed), "-", "-", "-",
                      "-", f"{ceiling.seconds:.1f}", f"{ceiling.rate:.0f}" if ceiling.rate
                      else "-")
    console.print(table)
    fastest = fastest_within(result.runs, BUDGET)
    console.print(f"fastest speed with p99 timing error within {BUDGET:g}s and every write "
                  f"taken: {fastest.label if fastest else 'none'} (at max no write has a due "
                  f"time, so its lag is time until answered)", highlight=False)
    for run in result.runs:
        if run.first_refusal:
            console.print(f"[red]speed {run.label}: first refusal: {run.first_refusal}")
    if ceiling is not None and ceiling.first_failure:
        console.print(f"[red]ceiling: first failure: {ceiling.first_failure}")


# -- determinism -------------------------------------------------------------------------------

def scenario(seed: str) -> tuple[str, str]:
    """The source run's workloads (into the member) and its FaultPlan (into the host)."""
    job = """
apiVersion: batch/v1
kind: Job
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  completions: {completions}
  parallelism: {parallelism}
  backoffLimit: {backoff}
  template:
    metadata: {{labels: {{app: {name}}}, annotations: {annotations}}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 0
      containers: [{{name: work, image: busybox}}]
"""
    jobs = "---".join(job.format(name=name, namespace=SHOP, completions=completions,
                                 parallelism=parallelism, backoff=backoff,
                                 annotations=json.dumps(annotations))
                      for name, completions, parallelism, backoff, annotations in (
                          ("batch", 4, 2, 0, {keys.RUN_TIME: "3s"}),
                          ("flaky", 1, 1, 1, {keys.RUN_TIME: "2s", keys.EXIT_CODE: "2"}),
                          ("victim", 1, 1, 0, {keys.RUN_TIME: "10m"})))
    plan = json.dumps({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
        "metadata": {"name": f"{SOURCE}-exit", "namespace": "default"},
        "spec": {"seed": number(seed), "steps": [{
            "name": "exit", "at": "1s", "fault": {"type": "ContainerExit", "exitCode": 3},
            "target": {"clusters": {"names": [SOURCE]},
                       "pods": {"namespace": SHOP, "ownerKind": "Job",
                                "ownerName": "victim"}}}]}})
    return jobs, plan


def fleet_manifest(nodes: int) -> str:
    items: list[dict[str, Any]] = []
    for namespace, cluster, pool in (("default", SOURCE, f"{SOURCE}-{POOL}"),
                                     *((side, AGAIN, POOL) for side in SIDES)):
        items.append({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                      "metadata": {"name": cluster, "namespace": namespace},
                      "spec": {"labels": {"bench": "replay"}}})
        items.append({"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                      "metadata": {"name": pool, "namespace": namespace},
                      "spec": {"clusterRef": cluster, "replicas": nodes}})
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def wait(what: str, check: Any, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (subprocess.SubprocessError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{what}: not reached within {timeout:.0f}s")


def member_kubeconfig(state: Path, cluster: str) -> Path:
    path = state / f"{cluster.replace('/', '-')}.kubeconfig"
    path.write_text(subprocess.run(
        [str(FAKEFLEET), "kubeconfig", "--state-dir", str(state), cluster],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    return path


class Recorder:
    """``fakefleet record`` of one member for ``seconds``, started and waited for."""

    def __init__(self, kubeconfig: Path, name: str, seconds: float, output: Path) -> None:
        self.output = output
        self.seconds = seconds
        self.process = subprocess.Popen(
            [str(FAKEFLEET), "record", "--kubeconfig", f"{name}={kubeconfig}", "--for",
             f"{seconds:.0f}s", "--resources", RECORDED, "-o", str(output)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=untraced_environment())

    def listed(self) -> None:
        """Until the recorder listed what is there: from now on, what happens is a change."""
        assert self.process.stderr is not None
        said = ""
        while "recording changes" not in said:
            line = self.process.stderr.readline()
            if not line:
                raise RuntimeError(f"fakefleet record ended early: {said}")
            said += line

    def finish(self) -> None:
        try:
            _, err = self.process.communicate(timeout=self.seconds + 120)
        finally:
            self.process.kill()
        if self.process.returncode != 0:
            raise RuntimeError(f"fakefleet record exited {self.process.returncode}: {err}")


def record_source(state: Path, host: Path, member: Path, result: Determinism,
                  workdir: Path, console: Console) -> Path:
    kubectl(member, "create", "namespace", SHOP)
    wait("the default ServiceAccount of shop", lambda: kubectl(
        member, "get", "serviceaccount", "default", "-n", SHOP))
    kubectl(member, "create", "deployment", "web", "-n", SHOP, "--image=nginx",
            "--replicas=3")
    output = workdir / f"{SOURCE}.trace"
    recorder = Recorder(member, SOURCE, result.record_for, output)
    try:
        recorder.listed()
        console.print(f"recording {SOURCE} for {result.record_for:.0f}s ...")
        started = time.monotonic()
        jobs, plan = scenario(result.seed)
        kubectl(member, "apply", "-f", "-", stdin=jobs)
        wait("the victim pod", lambda: kubectl(member, "get", "pods", "-n", SHOP, "-l",
                                               "app=victim", "-o", "name").strip(), 60)
        kubectl(host, "apply", "-f", "-", stdin=plan)
        time.sleep(max(0.0, 10.0 - (time.monotonic() - started)))
        kubectl(member, "scale", "deployment", "web", "-n", SHOP, "--replicas=2")
        recorder.finish()
    finally:
        recorder.process.kill()
    trace = files.read(output)
    result.recorded_changes, result.recorded_pods = len(trace.changes), len(trace.pods)
    return output


def replay_recorded(state: Path, source: Path, side: str, member: Path,
                    result: Determinism, workdir: Path, console: Console) -> Path:
    output = workdir / f"{side}.trace"
    seconds = result.record_for / result.speed + SETTLE
    recorder = Recorder(member, "west", seconds, output)
    try:
        recorder.listed()
        console.print(f"replaying into {side}/{AGAIN}, recorded for {seconds:.0f}s ...")
        done = subprocess.run(
            [str(FAKEFLEET), "replay", str(source), "--into", f"{side}/{AGAIN}", "--speed",
             f"{result.speed:g}", "--seed", result.seed, "--state-dir", str(state)],
            capture_output=True, text=True, timeout=seconds + 120, check=False,
            env=untraced_environment())
        result.replay_exits.append(done.returncode)
        said = (done.stdout + done.stderr).strip().splitlines()
        result.replay_summaries.append(next(
            (line for line in said if line.startswith("replayed ")), "\n".join(said[-5:])))
        recorder.finish()
    finally:
        recorder.process.kill()
    return output


def determinism(workdir: Path, result: Determinism, console: Console) -> None:
    state = workdir / "state"
    console.print("fakefleet up ...")
    subprocess.run([str(FAKEFLEET), "up", "--state-dir", str(state), "--unsafe-no-fsync"],
                   check=True, capture_output=True, text=True, timeout=900,
                   env=untraced_environment())
    try:
        host = StateDir(state).host_kubeconfig
        for side in SIDES:
            kubectl(host, "create", "namespace", side)
        kubectl(host, "apply", "-f", "-", stdin=fleet_manifest(result.nodes))
        console.print(f"3 FakeClusters of {result.nodes} nodes each ...")

        def ready() -> bool:
            clusters = kubectl_json(host, "get", "fc", "-A")["items"]
            pools = kubectl_json(host, "get", "fnp", "-A")["items"]
            return len(clusters) == 3 and all(
                c.get("status", {}).get("phase") == "Ready" for c in clusters) and all(
                p.get("status", {}).get("readyReplicas") == result.nodes for p in pools)
        wait("FakeClusters and pools Ready", ready)
        members = {name: member_kubeconfig(state, name)
                   for name in (SOURCE, *(f"{side}/{AGAIN}" for side in SIDES))}
        for path in members.values():
            wait("the default ServiceAccount", lambda p=path: kubectl(
                p, "get", "serviceaccount", "default"))
        source = record_source(state, host, members[SOURCE], result, workdir, console)
        runs = [replay_recorded(state, source, side, members[f"{side}/{AGAIN}"], result,
                                workdir, console) for side in SIDES]
        comparison = comparing.compare(loading.load(runs[0]), loading.load(runs[1]))
        result.comparison = comparison.fields()
    finally:
        subprocess.run([str(FAKEFLEET), "down", "--state-dir", str(state)],
                       capture_output=True, timeout=300, check=False)


def _share(found: dict[str, Any]) -> tuple[str, str, str]:
    return str(found["same"]), str(found["total"]), \
        f"{100 * found['share']:.1f}%" if found["total"] else "-"


def report_determinism(result: Determinism, console: Console) -> None:
    found = result.comparison
    table = Table(title=f"replay determinism: the recording of {SOURCE} ({result.record_for:g}s, "
                        f"{result.recorded_changes} changes, {result.recorded_pods} pod lives) "
                        f"replayed twice, seed {result.seed}, speed {result.speed:g}, "
                        f"{result.nodes} nodes")
    for column in ("measure", "same", "of", "share"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    if found:
        table.add_row("event sequences (goal: 95 %)", *_share(found["sequences"]))
        table.add_row("placements (pod on the same node)", *_share(found["placements"]))
        table.add_row("pod outcomes (phase, exit code, restarts)", *_share(found["outcomes"]))
        table.add_row("FaultPlan verdicts", *_share(found["verdicts"]))
    console.print(table)
    for exit_code, summary in zip(result.replay_exits, result.replay_summaries, strict=False):
        console.print(f"replay exit {exit_code}: {summary}", highlight=False)
    first = found.get("firstDivergence")
    if first:
        console.print(f"first divergence: {first['object']} event {first['index']} at "
                      f"+{first['seconds']:.3f}s: A {first['a'] or '(no more events)'}, B "
                      f"{first['b'] or '(no more events)'}", highlight=False)
    elif found:
        console.print("no divergence: every object's events are the same in both replays")
    if result.error:
        console.print(f"[red]{result.error}")


# -- the command ------------------------------------------------------------------------------

def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="timing,determinism",
                        help="timing, determinism or both (default both)")
    parser.add_argument("--configmaps", type=int, default=None,
                        help="ConfigMaps in the synthetic trace, 4 changes each (default 2500)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="the synthetic trace's length (default 150)")
    parser.add_argument("--speeds", default="1,10,max",
                        help="the timing part's speeds, comma-separated; max: as fast as the "
                             "API takes the writes (default 1,10,max)")
    parser.add_argument("--inflight", type=int, default=16,
                        help="writes in flight, the replay's and the ceiling's (default 16, "
                             "the replay's own)")
    parser.add_argument("--profile", choices=[p.value for p in Profile],
                        default=Profile.DEFAULT.value,
                        help="the control plane's profile (default: a FakeCluster's default)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="nodes per FakeCluster for determinism (default 4)")
    parser.add_argument("--record-for", type=float, default=None,
                        help="seconds the source run is recorded (default 40)")
    parser.add_argument("--replay-speed", type=float, default=1.0,
                        help="the determinism replays' speed (default 1)")
    parser.add_argument("--seed", default="7",
                        help="the replays' --seed, the FaultPlan's and the synthetic trace's "
                             "(its digits; default 7)")
    parser.add_argument("--smoke", action="store_true",
                        help="small sizes: 50 ConfigMaps over 10s, 2 nodes, 25s recorded")
    parser.add_argument("--output", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if not parts or parts - {"timing", "determinism"}:
        parser.error("--parts takes timing, determinism or both")
    try:
        speeds = parse_speeds(args.speeds)
    except ValueError as error:
        parser.error(str(error))
    smoke = args.smoke
    size = Size(configmaps=args.configmaps or (50 if smoke else 2500),
                deployments=1 if smoke else 5, jobs=1 if smoke else 5,
                seconds=args.seconds or (10.0 if smoke else 150.0))
    nodes = args.nodes or (2 if smoke else 4)
    record_for = args.record_for or (25.0 if smoke else 40.0)
    if not 1 <= size.configmaps <= 100_000 or not 1 <= size.seconds <= 3600 or \
            not 1 <= args.inflight <= 256 or not 1 <= nodes <= 100 or \
            not 15 <= record_for <= 600 or not 0.1 <= args.replay_speed <= 100:
        parser.error("--configmaps 1..100000, --seconds 1..3600, --inflight 1..256, --nodes "
                     "1..100, --record-for 15..600, --replay-speed 0.1..100")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    payload: dict[str, Any] = {}
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="fakefleet-bench-replay-") as workdir:
            if "timing" in parts:
                failed |= run_timing(Path(workdir) / "timing", payload, size=size,
                                     speeds=speeds, inflight=args.inflight,
                                     seed=number(args.seed), profile=Profile(args.profile),
                                     console=console)
            if "determinism" in parts:
                found = Determinism(nodes, args.replay_speed, args.seed, record_for)
                payload["determinism"] = found
                (Path(workdir) / "determinism").mkdir()
                try:
                    determinism(Path(workdir) / "determinism", found, console)
                except (SystemExit, Exception) as error:
                    found.error = f"{type(error).__name__}: {error}"
                    raise
                finally:
                    report_determinism(found, console)
                failed |= bool(found.error) or any(found.replay_exits)
    finally:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"replay-{time.strftime('%Y%m%dT%H%M%S')}.json"
        text = json.dumps({name: dataclasses.asdict(value) if dataclasses.is_dataclass(value)
                           and not isinstance(value, type) else value
                           for name, value in payload.items()}, indent=2) + "\n"
        for path in (out, args.output):
            if path is not None:
                path.write_text(text)
        console.print(f"results: {out}")
    if failed:
        sys.exit(1)


def number(seed: str) -> int:
    """A seed as the generator and the FaultPlan take it: its digits, or 1."""
    return int(seed) if seed.isdigit() else 1


def run_timing(workdir: Path, payload: dict[str, Any], *, size: Size, speeds: list[float],
               inflight: int, seed: int, profile: Profile, console: Console) -> bool:
    """The timing part, its figures put in ``payload``; whether the API refused a write."""
    workdir.mkdir()
    binaries = binaries_.resolve()
    payload["kubernetesVersion"] = binaries.version
    console.print(f"[bold]replay timing[/]: {size.changes} changes ...")
    result = asyncio.run(timing(binaries, workdir, size=size, speeds=speeds,
                                inflight=inflight, seed=seed, profile=profile,
                                console=console))
    report_timing(result, console)
    fastest = fastest_within(result.runs, BUDGET)
    payload["timing"] = {**dataclasses.asdict(result), "changes": size.changes,
                         "fastestWithinBudget": fastest.speed if fastest else None,
                         "ceilingWritesPerSecond": result.ceiling.rate if result.ceiling
                         else None}
    return any(run.refused or run.dropped for run in result.runs) or bool(
        result.ceiling and result.ceiling.failed)


if __name__ == "__main__":
    main()
