"""Operator and node-engine figures on real control planes, printed as a table.

    python -m bench.nodes [--nodes 1000] [--clusters 3] [--window 60]

Measures, through ``fakefleet up`` in a temporary state directory:
- ``kubectl apply`` of a FakeCluster until its status says Ready (once per cluster);
- a FakeNodePool of ``--nodes`` nodes: apply until the pool reports all Ready, and until the
  member's API server lists them all Ready;
- the RSS of the operator process and of the engine processes (one per cluster) before and
  after the pool;
- steady-state writes per second to the member API server once the pool is settled, from the
  apiserver's own ``apiserver_request_total`` counters over ``--window`` seconds.

Results also go to ``bench/results/nodes-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.controlplane import RESULTS, rss_mib
from bench.metrics import mutating_requests
from bench.terminating import sigterm_interrupts
from operators.controlplane.state import StateDir, read_operator

BIN = Path(sys.executable).parent


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
                          input=stdin, capture_output=True, text=True, check=True,
                          timeout=120).stdout


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - started


def writes(kubeconfig: Path) -> dict[str, int]:
    """Mutating requests the member API server served so far."""
    return mutating_requests(kubectl(kubeconfig, "get", "--raw", "/metrics"))


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=90.0,
                        help="seconds after the pool is Ready before measuring (KCM catches up)")
    args = parser.parse_args()
    console = Console()
    result: dict[str, Any] = {"nodes": args.nodes}
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as state_name:
        state = Path(state_name)
        fakefleet = [str(BIN / "fakefleet")]
        subprocess.run([*fakefleet, "up", "--state-dir", state_name, "--unsafe-no-fsync"],
                       check=True, capture_output=True)
        host = StateDir(state).host_kubeconfig
        try:
            def phase(name: str) -> str:
                return kubectl(host, "get", "fc", name, "-o", "jsonpath={.status.phase}")

            ready_times = []
            for index in range(args.clusters):
                name = f"bench-{index}"
                started = time.monotonic()
                kubectl(host, "apply", "-f", "-", stdin=json.dumps({
                    "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                    "metadata": {"name": name, "namespace": "default"}, "spec": {}}))
                wait_for(lambda n=name: phase(n) == "Ready", 120, f"{name} Ready")
                ready_times.append(time.monotonic() - started)
            result["clusterReadySeconds"] = [round(s, 2) for s in ready_times]

            operator = read_operator(StateDir(state))
            assert operator is not None, "the operator announced itself"
            operator_pid = operator.pid
            engines = {c.cluster: c.pid for c in operator.components
                       if c.name == "engine" and c.pid}
            result["operatorRssBeforeMiB"] = round(rss_mib(operator_pid), 1)
            result["engineRssBeforeMiB"] = round(rss_mib(engines["default.bench-0"]), 1)
            member = state / "member.kubeconfig"
            member.write_text(subprocess.run(
                [*fakefleet, "kubeconfig", "--state-dir", state_name, "bench-0"],
                check=True, capture_output=True, text=True).stdout)

            def pool_ready() -> bool:
                out = kubectl(host, "get", "fnp", "big", "-o",
                              "jsonpath={.status.readyReplicas}")
                return out.strip() == str(args.nodes)

            def member_ready() -> bool:
                out = kubectl(member, "get", "nodes", "--no-headers")
                return sum(1 for line in out.splitlines() if " Ready " in line) == args.nodes

            started = time.monotonic()
            kubectl(host, "apply", "-f", "-", stdin=json.dumps({
                "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
                "metadata": {"name": "big", "namespace": "default"},
                "spec": {"clusterRef": "bench-0", "replicas": args.nodes,
                         "gpu": {"preset": "H100-SXM5-80GB"},
                         "topology": {"zones": ["a", "b", "c"], "racks": 8}}}))
            wait_for(member_ready, 600, "the member to list every node Ready", interval=0.5)
            result["memberNodesReadySeconds"] = round(time.monotonic() - started, 2)
            wait_for(pool_ready, 120, "the pool to report every node Ready")
            result["poolReadySeconds"] = round(time.monotonic() - started, 2)

            time.sleep(args.settle)  # the creation burst drains (KCM lifts not-ready taints)
            first = writes(member)
            window_start = time.monotonic()
            time.sleep(args.window)
            last = writes(member)
            elapsed = time.monotonic() - window_start
            delta = {key: last[key] - first.get(key, 0) for key in last
                     if last[key] - first.get(key, 0) > 0}
            result["steadyWritesPerSecond"] = round(sum(delta.values()) / elapsed, 1)
            result["steadyWritesBreakdown"] = {k: round(v / elapsed, 2) for k, v in
                                               sorted(delta.items())}
            result["operatorRssAfterMiB"] = round(rss_mib(operator_pid), 1)
            result["engineRssAfterMiB"] = round(rss_mib(engines["default.bench-0"]), 1)
        finally:
            subprocess.run([*fakefleet, "down", "--state-dir", state_name], check=False,
                           capture_output=True)

    table = Table(title=f"fakefleet operator and node engine ({args.nodes} nodes)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("kubectl apply FakeCluster → Ready (s, each)",
                  ", ".join(f"{s:.1f}" for s in result["clusterReadySeconds"]))
    table.add_row(f"{args.nodes}-node pool: member lists all Ready (s)",
                  f"{result['memberNodesReadySeconds']:.1f}")
    table.add_row(f"{args.nodes}-node pool: pool status all Ready (s)",
                  f"{result['poolReadySeconds']:.1f}")
    table.add_row(f"operator RSS with {args.clusters} idle clusters (MiB)",
                  f"{result['operatorRssBeforeMiB']:.0f}")
    table.add_row(f"operator RSS with {args.nodes} nodes (MiB)",
                  f"{result['operatorRssAfterMiB']:.0f}")
    table.add_row("engine RSS of an idle cluster (MiB)",
                  f"{result['engineRssBeforeMiB']:.0f}")
    table.add_row(f"engine RSS with {args.nodes} nodes (MiB)",
                  f"{result['engineRssAfterMiB']:.0f}")
    table.add_row("steady-state writes to the member apiserver (/s)",
                  f"{result['steadyWritesPerSecond']:.1f}")
    for key, rate in result["steadyWritesBreakdown"].items():
        table.add_row(f"  {key} (/s)", f"{rate:.2f}")
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"nodes-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
