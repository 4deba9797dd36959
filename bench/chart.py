"""From installing the chart to a Ready operator running out of the chart's ServiceAccount:

    python -m bench.chart [--runs 3]

Each run on a fresh host API server (on a shared etcd, no scheduler or controller-manager: no
pod is scheduled, the operator runs as a process, as it would in the chart's pod): the chart's
CRDs applied server-side until Established; the rendered chart (ServiceAccount, Role,
RoleBinding, PersistentVolumeClaim, Deployment) applied server-side, as Flux applies it; a
token of the ServiceAccount through the TokenRequest API; ``python -m operators`` with that
token, until it announced itself ready (its permission check and its own etcd included); then
a FakeCluster with a pool of 10 nodes until both are Ready.

Results also go to ``bench/results/chart-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS
from bench.terminating import sigterm_interrupts
from operators.controlplane import binaries as binaries_
from operators.controlplane import helm
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate

CHART = Path(__file__).parent.parent / "charts" / "fakefleet"
KUBECTL = Path(sys.executable).parent / "kubectl"
NAMESPACE = "fakefleet"
FLEET = """
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {name: bench, namespace: fakefleet}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {name: bench-cpu, namespace: fakefleet}
spec: {clusterRef: bench, replicas: 10}
"""


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, check=True, timeout=300).stdout


def timed(step: Any) -> float:
    started = time.monotonic()
    step()
    return time.monotonic() - started


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


async def one_run(substrate: Substrate, index: int, helm_binary: Path,
                  workdir: Path) -> dict[str, float]:
    host: LocalCluster = await substrate.add_cluster(f"chart-{index}", ClusterOptions(
        scheduler=False, controller_manager=False))
    try:
        # Blocking steps, in a thread: the substrate's supervision keeps running meanwhile.
        return await asyncio.to_thread(measure, host.kubeconfig_path, index, helm_binary,
                                       workdir)
    finally:
        await substrate.remove_cluster(f"chart-{index}", purge=True)


def measure(admin: Path, index: int, helm_binary: Path, workdir: Path) -> dict[str, float]:
    rendered = subprocess.run([str(helm_binary), "template", "fakefleet", str(CHART),
                               "--namespace", NAMESPACE], capture_output=True, text=True,
                              check=True).stdout
    figures: dict[str, float] = {}
    figures["CRDs applied and Established"] = timed(lambda: (
        kubectl(admin, "apply", "--server-side", "-f", str(CHART / "crds")),
        kubectl(admin, "wait", "--for=condition=Established", "crd", "--all")))
    kubectl(admin, "create", "namespace", NAMESPACE)
    figures["chart applied (server-side)"] = timed(lambda: kubectl(
        admin, "apply", "--server-side", "--field-manager=bench", "-f", "-", stdin=rendered))
    token: list[str] = []

    def authorized() -> bool:  # the RBAC authorizer has seen the RoleBinding
        return subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(admin), "auth", "can-i", "patch", "fakeclusters",
             "--subresource=status", "-n", NAMESPACE,
             f"--as=system:serviceaccount:{NAMESPACE}:fakefleet"],
            capture_output=True, text=True, check=False).stdout.strip() == "yes"
    figures["Role in force, token (TokenRequest)"] = timed(lambda: (
        wait_for(authorized, 30, "the Role"), token.append(kubectl(
            admin, "-n", NAMESPACE, "create", "token", "fakefleet").strip())))
    config = yaml.safe_load(admin.read_text())
    config["users"][0]["user"] = {"token": token[0]}
    kubeconfig = workdir / f"sa-{index}.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    state = workdir / f"operator-{index}"
    started = time.monotonic()
    with (workdir / f"operator-{index}.log").open("wb") as log:
        operator = subprocess.Popen(
            [sys.executable, "-m", "operators", "--state-dir", str(state), "--kubeconfig",
             str(kubeconfig), "--namespace", NAMESPACE, "--unsafe-no-fsync"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        def ready() -> bool:
            try:
                return bool(json.loads((state / "operator.json").read_text()).get("ready"))
            except (OSError, ValueError):
                return operator.poll() is not None
        wait_for(ready, 120, "the operator")
        if operator.poll() is not None:
            raise SystemExit(f"the operator exited: {(workdir / f'operator-{index}.log')}")
        figures["operator start to Ready"] = time.monotonic() - started
        figures["total: chart apply to operator Ready"] = (
            figures["chart applied (server-side)"] + figures["Role in force, token (TokenRequest)"]
            + figures["operator start to Ready"])

        def fleet_ready() -> bool:
            found = json.loads(kubectl(admin, "-n", NAMESPACE, "get", "fc,fnp", "-o", "json"))
            cluster = next(i for i in found["items"] if i["kind"] == "FakeCluster")
            pool = next(i for i in found["items"] if i["kind"] == "FakeNodePool")
            return ((cluster.get("status") or {}).get("phase") == "Ready"
                    and (pool.get("status") or {}).get("readyReplicas") == 10)
        figures["FakeCluster + 10 nodes apply to Ready"] = timed(lambda: (
            kubectl(admin, "apply", "-f", "-", stdin=FLEET), wait_for(fleet_ready, 180,
                                                                       "the fleet")))
        kubectl(admin, "-n", NAMESPACE, "delete", "fnp,fc", "--all", "--timeout=120s")
    finally:
        operator.terminate()
        operator.wait(timeout=60)
    return figures


async def run(runs: int) -> dict[str, Any]:
    helm_binary = helm.ensure(progress=print)
    binaries = binaries_.resolve()
    results = []
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as workdir:
        async with Substrate(Path(workdir) / "etcd", binaries, fsync=False) as substrate:
            for index in range(runs):
                results.append(await one_run(substrate, index, helm_binary, Path(workdir)))
    return {"runs": results, "cpus": os.cpu_count(), "load": os.getloadavg()}


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=160)
    console.print(f"load {os.getloadavg()[0]:.2f} at the start")
    result = asyncio.run(run(args.runs))
    table = Table(title=f"chart install to a Ready operator, {args.runs} runs, "
                        f"{result['cpus']} CPUs")
    for column in ("step", "median (s)", "min (s)", "max (s)"):
        table.add_column(column, justify="left" if column == "step" else "right")
    for step in result["runs"][0]:
        values = [run[step] for run in result["runs"]]
        table.add_row(step, f"{statistics.median(values):.2f}", f"{min(values):.2f}",
                      f"{max(values):.2f}")
    console.print(table)
    console.print("load average at the end " + " / ".join(f"{x:.2f}" for x in result["load"]))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"chart-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
