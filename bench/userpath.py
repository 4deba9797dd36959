"""The plain user path at KWOK's benchmark size, timed from outside with kubectl:

    python -m bench.userpath [--nodes 5000] [--replicas 10000] [--kill-operator]

What a new user does, and nothing else: ``fakefleet up``; ``kubectl apply`` of a FakeCluster
with ``profile: load`` and a FakeNodePool of ``--nodes`` nodes; ``kubectl create deployment``
of ``--replicas`` replicas in the member, placed by its real kube-scheduler; ``kubectl delete``
of the Deployment. Each phase is timed by polling kubectl once a second (the figure is ±1 s):

1. pool Ready: the FakeNodePool's ``readyReplicas`` equals ``--nodes``;
2. Deployment complete: its ``readyReplicas`` equals ``--replicas`` (Ready, not only Running:
   the node-lifecycle controller's NotReady marks count against it);
3. pods deleted: no pod of the Deployment is left.

No FaultPlan is applied, so nothing may fail: the run counts the nodes that turned NotReady (a
watch on the member's nodes), the ``NodeNotReady`` Events the node-lifecycle controller wrote,
and the pods that were left not Ready.

``--kill-operator`` sends SIGKILL to the operator once the Deployment has half its replicas
Ready, while a client polls the member kube-apiserver's ``/readyz`` every 100 ms (from then
until the Deployment is complete); it reports the failed polls, and what the new operator
changed (the nodes' UIDs, before and after).

Results also go to ``bench/results/userpath-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS, Tally, node_ready, untraced_environment
from bench.terminating import sigterm_interrupts
from operators.controlplane.state import StateDir, read_operator
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError

BIN = Path(sys.executable).parent
KUBECTL, FAKEFLEET = BIN / "kubectl", BIN / "fakefleet"
CLUSTER, POOL, DEPLOYMENT = "user", "user-cpu", "work"
PHASE_TIMEOUT = 1800.0
POLL = 1.0
READYZ_EVERY = 0.1


@dataclasses.dataclass
class Phase:
    name: str
    seconds: float | None = None  # None: not reached within PHASE_TIMEOUT
    nodes_lost: int = 0


@dataclasses.dataclass
class Kill:
    operator_pid: int = 0
    readyz_polls: int = 0
    readyz_failed: int = 0
    #: The first failures, as they were seen (status or error).
    failures: list[str] = dataclasses.field(default_factory=list)
    nodes_recreated: int = 0
    back_after: float | None = None


@dataclasses.dataclass
class Result:
    nodes: int
    replicas: int
    phases: list[Phase] = dataclasses.field(default_factory=list)
    node_not_ready_events: int = 0
    pods_not_ready: int = 0
    kill: Kill | None = None
    error: str = ""


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, check=True, timeout=300).stdout


def kubectl_json(kubeconfig: Path, *args: str) -> Any:
    return json.loads(kubectl(kubeconfig, *args, "-o", "json"))


async def poll(what: str, check: Any) -> float | None:
    """Seconds until ``check()`` (run in a thread: it calls kubectl) is true, polled every
    second; None after PHASE_TIMEOUT."""
    started = time.monotonic()
    while time.monotonic() - started < PHASE_TIMEOUT:
        with contextlib.suppress(subprocess.SubprocessError, json.JSONDecodeError, KeyError):
            if await asyncio.to_thread(check):
                return time.monotonic() - started
        await asyncio.sleep(POLL)
    print(f"{what}: not reached within {PHASE_TIMEOUT:.0f}s", file=sys.stderr)
    return None


class ReadyzPoller:
    """GET /readyz on the member every 100 ms, counting what did not answer 200 ok."""

    def __init__(self, client: Client, kill: Kill) -> None:
        self.client, self.kill = client, kill
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            self.kill.readyz_polls += 1
            try:
                answer = await asyncio.wait_for(self.client.get_text("/readyz"), 5.0)
                failed = None if answer.strip() == "ok" else answer.strip()[:200]
            except (K8sError, OSError, TimeoutError) as error:
                failed = f"{type(error).__name__}: {error}"[:200]
            if failed is not None:
                self.kill.readyz_failed += 1
                if len(self.kill.failures) < 10:
                    self.kill.failures.append(failed)
            await asyncio.sleep(max(0.0, READYZ_EVERY - (time.monotonic() - started)))


async def kill_operator(state: Path, kill: Kill) -> None:
    announced = read_operator(StateDir(state))
    assert announced is not None, "no operator announced itself"
    kill.operator_pid = announced.pid
    os.kill(announced.pid, signal.SIGKILL)
    started = time.monotonic()
    while time.monotonic() - started < 300:
        now = read_operator(StateDir(state))
        if now is not None and now.ready and now.pid != announced.pid:
            kill.back_after = time.monotonic() - started
            return
        await asyncio.sleep(0.2)


async def run(state: Path, result: Result, console: Console, *, kill: bool) -> None:
    host = StateDir(state).host_kubeconfig
    kubectl(host, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
         "metadata": {"name": CLUSTER, "namespace": "default"},
         "spec": {"controlPlane": {"profile": "load"}}},
        {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
         "metadata": {"name": POOL, "namespace": "default"},
         "spec": {"clusterRef": CLUSTER, "replicas": result.nodes}}]}))
    member = state / f"{CLUSTER}.kubeconfig"

    def cluster_ready() -> bool:
        found = kubectl_json(host, "get", "fc", CLUSTER)
        if found.get("status", {}).get("phase") != "Ready":
            return False
        member.write_text(subprocess.run(
            [str(FAKEFLEET), "kubeconfig", "--state-dir", str(state), CLUSTER],
            capture_output=True, text=True, check=True, timeout=60).stdout)
        return True

    console.print("waiting for the FakeCluster ...")
    if await poll("FakeCluster Ready", cluster_ready) is None:
        raise SystemExit("the FakeCluster never became Ready")
    client = Client.connect(load_kubeconfig_file(member), connections=4, timeout=60)
    nodes = Tally(client, "/api/v1/nodes", {}, node_ready)
    nodes.start()
    readyz: ReadyzPoller | None = None
    try:
        async def phase(name: str, check: Any) -> Phase:
            lost = nodes.lost
            console.print(f"{name} ...")
            seconds = await poll(name, check)
            found = Phase(name, seconds, nodes.lost - lost)
            result.phases.append(found)
            console.print(f"  {name}: {seconds if seconds is None else round(seconds, 1)} s, "
                          f"{found.nodes_lost} nodes turned NotReady")
            return found

        await phase("pool Ready", lambda: kubectl_json(host, "get", "fnp", POOL)
                    .get("status", {}).get("readyReplicas") == result.nodes)
        uids_before = {n["metadata"]["name"]: n["metadata"]["uid"]
                       for n in kubectl_json(member, "get", "nodes")["items"]}
        kubectl(member, "create", "deployment", DEPLOYMENT, "--image=fake",
                f"--replicas={result.replicas}")
        def ready_replicas() -> int:
            status = kubectl_json(member, "get", "deployment", DEPLOYMENT).get("status", {})
            return int(status.get("readyReplicas", 0))

        async def kill_half_way() -> None:
            nonlocal readyz
            while await asyncio.to_thread(ready_replicas) < result.replicas // 2:
                await asyncio.sleep(POLL)
            result.kill = Kill()
            readyz = ReadyzPoller(client, result.kill)
            readyz.start()
            console.print("  SIGKILL of the operator, polling the member's /readyz ...")
            await kill_operator(state, result.kill)

        killing = asyncio.create_task(kill_half_way()) if kill else None
        try:
            await phase("Deployment complete",
                        lambda: ready_replicas() == result.replicas)
            if killing is not None:
                await killing
                await asyncio.sleep(10)  # what the new operator does once it is back
                uids_after = {n["metadata"]["name"]: n["metadata"]["uid"]
                              for n in kubectl_json(member, "get", "nodes")["items"]}
                assert result.kill is not None
                result.kill.nodes_recreated = sum(1 for name, uid in uids_before.items()
                                                  if uids_after.get(name) != uid)
        finally:
            if killing is not None and not killing.done():
                killing.cancel()
            if readyz is not None:
                await readyz.stop()
        pods = kubectl_json(member, "get", "pods", "-l", f"app={DEPLOYMENT}")["items"]
        result.pods_not_ready = sum(1 for pod in pods if not any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in pod.get("status", {}).get("conditions", [])))
        kubectl(member, "delete", "deployment", DEPLOYMENT, "--wait=false")
        await phase("pods deleted", lambda: not kubectl_json(
            member, "get", "pods", "-l", f"app={DEPLOYMENT}")["items"])
        events = kubectl_json(member, "get", "events", "-A", "--field-selector",
                              "reason=NodeNotReady")["items"]
        result.node_not_ready_events = len(events)
    finally:
        if readyz is not None:
            await readyz.stop()
        await nodes.stop()
        await client.close()


def report(result: Result, console: Console) -> None:
    table = Table(title=f"the user path: a FakeCluster (profile load), a pool of {result.nodes} "
                        f"nodes, a Deployment of {result.replicas} replicas through the real "
                        f"scheduler, deleted ({os.cpu_count()} CPUs; kubectl polled every "
                        f"{POLL:g} s)")
    for column in ("phase", "seconds", "nodes turned NotReady"):
        table.add_column(column, justify="right")
    for phase in result.phases:
        table.add_row(phase.name, f"{phase.seconds:.1f}" if phase.seconds else "not reached",
                      str(phase.nodes_lost))
    table.add_row("NodeNotReady Events", str(result.node_not_ready_events), "")
    table.add_row("pods not Ready once complete", str(result.pods_not_ready), "")
    if result.kill is not None:
        kill = result.kill
        table.add_row("operator SIGKILL: /readyz polls failed",
                      f"{kill.readyz_failed} of {kill.readyz_polls}", "")
        table.add_row("operator SIGKILL: back Ready after (s)",
                      f"{kill.back_after:.1f}" if kill.back_after else "never", "")
        table.add_row("operator SIGKILL: nodes re-created", str(kill.nodes_recreated), "")
        for failure in kill.failures:
            console.print(f"failed /readyz poll: {failure}")
    console.print(table)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--replicas", type=int, default=10000)
    parser.add_argument("--kill-operator", action="store_true",
                        help="SIGKILL the operator half-way through the Deployment, polling "
                             "the member's /readyz every 100 ms")
    parser.add_argument("--unsafe-no-fsync", action="store_true",
                        help="etcd without fsync (a user's fakefleet up fsyncs)")
    args = parser.parse_args()
    if not 1 <= args.nodes <= 20000 or not 1 <= args.replicas <= 100000:
        parser.error("--nodes 1..20000 and --replicas 1..100000")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    result = Result(args.nodes, args.replicas)
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-userpath-") as workdir:
        state = Path(workdir) / "state"
        console.print("fakefleet up ...")
        subprocess.run([str(FAKEFLEET), "up", "--state-dir", str(state),
                        *(["--unsafe-no-fsync"] if args.unsafe_no_fsync else [])],
                       check=True, capture_output=True, text=True, timeout=900,
                       env=untraced_environment())
        try:
            asyncio.run(run(state, result, console, kill=args.kill_operator))
        except (SystemExit, Exception) as error:
            result.error = f"{type(error).__name__}: {error}"
            raise
        finally:
            subprocess.run([str(FAKEFLEET), "down", "--state-dir", str(state)],
                           capture_output=True, timeout=300, check=False)
            report(result, console)
            RESULTS.mkdir(exist_ok=True)
            out = RESULTS / f"userpath-{time.strftime('%Y%m%dT%H%M%S')}.json"
            out.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
            console.print(f"results: {out}")


if __name__ == "__main__":
    main()
