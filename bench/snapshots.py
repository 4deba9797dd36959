"""Snapshot save and restore at KWOK's benchmark size, beside building the same state afresh:

    python -m bench.snapshots [--clusters 1] [--nodes 5000] [--pods 10000] [--output FILE]

``fakefleet up``; ``--clusters`` FakeClusters (``profile: load``), each with a pool of
``--nodes`` nodes and a Deployment of ``--pods`` replicas placed by its real scheduler, built
together and timed until every pool and Deployment is Ready (the build, polled every second).
Then ``fakefleet snapshot save`` of all of them (one etcd revision), the Deployments deleted
(so the restore has something to undo), and ``fakefleet snapshot restore``; each command is
timed, and its peak RSS read from the kernel's accounting of that child (``wait4``). After the
restore: every Deployment Ready again with the same UID, every node Ready, and the
``NodeNotReady`` Events the node-lifecycle controller wrote (none are expected).

Results also go to ``bench/results/snapshots-<time>.json`` (git-ignored), or ``--output``.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from bench.engines import RESULTS, untraced_environment
from bench.terminating import sigterm_interrupts
from operators.controlplane.state import StateDir

BIN = Path(sys.executable).parent
KUBECTL, FAKEFLEET = BIN / "kubectl", BIN / "fakefleet"
DEPLOYMENT = "work"
BUILD_TIMEOUT = 1800.0


@dataclasses.dataclass
class Command:
    seconds: float = 0.0
    peak_rss_mib: float = 0.0
    output: str = ""


@dataclasses.dataclass
class Result:
    clusters: int
    nodes: int
    pods: int
    build_seconds: float | None = None
    save: Command | None = None
    size_mib: float = 0.0
    keys: int = 0
    restore: Command | None = None
    same_uids: bool = False
    nodes_ready: int = 0
    node_not_ready_events: int = 0
    error: str = ""


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, check=True, timeout=300).stdout


def kubectl_json(kubeconfig: Path, *args: str) -> Any:
    return json.loads(kubectl(kubeconfig, *args, "-o", "json"))


def fakefleet(*args: str) -> Command:
    """Run ``fakefleet ARGS``: its wall time and its own peak RSS (not its children's)."""
    started = time.monotonic()
    process = subprocess.Popen([str(FAKEFLEET), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=untraced_environment())
    assert process.stdout is not None
    output = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"fakefleet {' '.join(args)} exited {process.returncode}:\n{output}")
    return Command(time.monotonic() - started, usage.ru_maxrss / 1024, output.strip())


def wait(what: str, check: Any) -> float:
    started = time.monotonic()
    while time.monotonic() - started < BUILD_TIMEOUT:
        try:
            if check():
                return time.monotonic() - started
        except (subprocess.SubprocessError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{what}: not reached within {BUILD_TIMEOUT:.0f}s")


def run(state: Path, result: Result, console: Console) -> None:
    host = StateDir(state).host_kubeconfig
    names = [f"snap-{index}" for index in range(result.clusters)]
    for name in names:
        kubectl(host, "apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "fakefleet.dev/v1alpha1", "kind": "List", "items": [
                {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                 "metadata": {"name": name, "namespace": "default"},
                 "spec": {"controlPlane": {"profile": "load"}}},
                {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                 "metadata": {"name": f"{name}-cpu", "namespace": "default"},
                 "spec": {"clusterRef": name, "replicas": result.nodes,
                          "template": {"capacity": {"cpu": "64", "memory": "256Gi",
                                                    "pods": "110"}}}}]}))
    console.print(f"building {result.clusters} x {result.nodes} nodes ...")
    started = time.monotonic()
    wait("pools Ready", lambda: all(
        kubectl_json(host, "get", "fnp", f"{name}-cpu").get("status", {}).get(
            "readyReplicas") == result.nodes for name in names))
    members = {}
    for name in names:
        members[name] = Path(state) / f"{name}.kubeconfig"
        members[name].write_text(subprocess.run(
            [str(FAKEFLEET), "kubeconfig", "--state-dir", str(state), name],
            capture_output=True, text=True, check=True, timeout=60).stdout)
        wait("default ServiceAccount", lambda m=members[name]: kubectl(
            m, "get", "serviceaccount", "default"))
        kubectl(members[name], "create", "deployment", DEPLOYMENT, "--image=nginx",
                f"--replicas={result.pods}")
    console.print(f"... and {result.pods} pods each")

    def deployments_ready() -> bool:
        return all(kubectl_json(m, "get", "deployment", DEPLOYMENT).get("status", {}).get(
            "readyReplicas") == result.pods for m in members.values())

    wait("Deployments Ready", deployments_ready)
    result.build_seconds = time.monotonic() - started
    uids = {name: kubectl_json(m, "get", "deployment", DEPLOYMENT)["metadata"]["uid"]
            for name, m in members.items()}

    console.print("fakefleet snapshot save ...")
    result.save = fakefleet("snapshot", "save", "bench", "--state-dir", str(state))
    path = StateDir(state).snapshots / "bench.snapshot"
    result.size_mib = path.stat().st_size / 2**20
    header = json.loads(path.read_bytes().split(b"\n", 2)[1])
    result.keys = int(header["keys"])
    for m in members.values():
        kubectl(m, "delete", "deployment", DEPLOYMENT, "--wait=false")
    console.print("fakefleet snapshot restore ...")
    result.restore = fakefleet("snapshot", "restore", "bench", "--state-dir", str(state),
                               "--timeout", str(int(BUILD_TIMEOUT)))
    wait("Deployments Ready after the restore", deployments_ready)
    result.same_uids = all(
        kubectl_json(m, "get", "deployment", DEPLOYMENT)["metadata"]["uid"] == uids[name]
        for name, m in members.items())
    for m in members.values():
        for node in kubectl_json(m, "get", "nodes")["items"]:
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            result.nodes_ready += ready["status"] == "True"
        result.node_not_ready_events += len(kubectl(
            m, "get", "events", "-A", "--field-selector", "reason=NodeNotReady",
            "-o", "name").split())


def report(result: Result, console: Console) -> None:
    table = Table(title=f"snapshots: {result.clusters} cluster(s) x {result.nodes} nodes, "
                        f"{result.pods} pods")
    table.add_column("what")
    table.add_column("value", justify="right")
    build = result.build_seconds
    table.add_row("build afresh (s)", f"{build:.1f}" if build is not None else "-")
    for name, command in (("save", result.save), ("restore", result.restore)):
        if command is not None:
            table.add_row(f"{name} (s)", f"{command.seconds:.1f}")
            table.add_row(f"{name} peak RSS (MiB)", f"{command.peak_rss_mib:.0f}")
    table.add_row("size on disk (MiB)", f"{result.size_mib:.1f}")
    table.add_row("etcd keys", str(result.keys))
    table.add_row("same UIDs after restore", str(result.same_uids))
    table.add_row("nodes Ready after restore",
                  f"{result.nodes_ready} / {result.clusters * result.nodes}")
    table.add_row("NodeNotReady Events", str(result.node_not_ready_events))
    if result.error:
        table.add_row("error", result.error)
    console.print(table)


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.clusters <= 16 or not 1 <= args.nodes <= 20000 or \
            not 1 <= args.pods <= 100000:
        parser.error("--clusters 1..16, --nodes 1..20000 and --pods 1..100000")
    console = Console() if sys.stdout.isatty() else Console(width=200)
    result = Result(args.clusters, args.nodes, args.pods)
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-snapshots-") as workdir:
        state = Path(workdir) / "state"
        console.print("fakefleet up ...")
        subprocess.run([str(FAKEFLEET), "up", "--state-dir", str(state), "--unsafe-no-fsync",
                        "--profile", "load"], check=True, capture_output=True, text=True,
                       timeout=900, env=untraced_environment())
        try:
            run(state, result, console)
        except (SystemExit, Exception) as error:
            result.error = f"{type(error).__name__}: {error}"
            raise
        finally:
            subprocess.run([str(FAKEFLEET), "down", "--state-dir", str(state)],
                           capture_output=True, timeout=300, check=False)
            report(result, console)
            RESULTS.mkdir(exist_ok=True)
            out = args.output or RESULTS / f"snapshots-{time.strftime('%Y%m%dT%H%M%S')}.json"
            out.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")
            console.print(f"results: {out}")


if __name__ == "__main__":
    main()
