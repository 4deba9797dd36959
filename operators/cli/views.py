"""``fakefleet get`` and ``fakefleet wait``: the fleet as the host cluster's FakeClusters and
FakeNodePools describe it, as a table or as progress until all is Ready.

These commands only read the host cluster; they never change it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from operators.api.base import API_VERSION
from operators.cli.terminal import WAIT, console, host_client, run_k8s, state_dir_option, stdout
from operators.controlplane.errors import StateError


def _current(obj: dict[str, Any]) -> bool:
    """Whether the object's status was written for its current generation."""
    status = obj.get("status") or {}
    return bool(status.get("observedGeneration") == obj["metadata"].get("generation"))


@click.command()
@state_dir_option
def get(state_dir: Path) -> None:
    """List the FakeClusters of the fleet: phase, nodes, version, endpoint."""
    async def fetch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with host_client(state_dir) as client:
            clusters = await client.get(f"/apis/{API_VERSION}/fakeclusters")
            pools = await client.get(f"/apis/{API_VERSION}/fakenodepools")
        return clusters["items"], pools["items"]

    clusters, pools = run_k8s(fetch())
    table = Table(title="fakefleet clusters")
    for column in ("namespace", "name", "phase", "pools", "nodes", "ready", "version",
                   "endpoint"):
        table.add_column(column, justify="right" if column in ("nodes", "ready") else "left")
    for item in clusters:
        meta, status = item["metadata"], item.get("status") or {}
        own = [p["metadata"]["name"] for p in pools
               if p["metadata"]["namespace"] == meta["namespace"]
               and p["spec"]["clusterRef"] == meta["name"]]
        phase = status.get("phase", "Pending")
        table.add_row(meta["namespace"], meta["name"],
                      f"[green]{phase}[/]" if phase == "Ready" else phase, ", ".join(own),
                      str(status.get("nodes", 0)), str(status.get("readyNodes", 0)),
                      status.get("kubernetesVersion", ""), status.get("endpoint", ""))
    stdout.print(table, soft_wrap=True)


def readiness(clusters: list[dict[str, Any]],
              pools: list[dict[str, Any]]) -> tuple[int, int, int, int]:
    """(clusters Ready with all their nodes, clusters, nodes Ready, nodes wanted)."""
    desired_per_cluster: dict[tuple[str, str], int] = {}
    for pool in pools:
        key = (pool["metadata"]["namespace"], pool["spec"]["clusterRef"])
        desired_per_cluster[key] = desired_per_cluster.get(key, 0) + _wanted(pool)
    ready_clusters = sum(
        1 for c in clusters
        if _current(c) and c["status"].get("phase") == "Ready"
        and c["status"].get("readyNodes") == desired_per_cluster.get(
            (c["metadata"]["namespace"], c["metadata"]["name"]), 0))
    desired = sum(_wanted(p) for p in pools)
    # A pool counts only once its status describes its current spec (kubectl scale).
    ready = sum(min((p.get("status") or {}).get("readyReplicas", 0), _wanted(p))
                if _current(p) else 0 for p in pools)
    return ready_clusters, len(clusters), ready, desired


def _wanted(pool: dict[str, Any]) -> int:
    """The nodes a pool is to have: spec.replicas, or those its provisioner (Karpenter) made,
    as many as pods need."""
    if pool["spec"].get("provisioner"):
        return int((pool.get("status") or {}).get("replicas", 0))
    return int(pool["spec"].get("replicas", 1))


@click.command()
@state_dir_option
@click.option("--timeout", type=WAIT, default=300.0, show_default=True)
def wait(state_dir: Path, timeout: float) -> None:
    """Wait, with progress, until every FakeCluster and FakeNodePool is Ready."""
    async def poll() -> tuple[int, int, int, int]:
        async with host_client(state_dir) as client:
            clusters = (await client.get(f"/apis/{API_VERSION}/fakeclusters"))["items"]
            pools = (await client.get(f"/apis/{API_VERSION}/fakenodepools"))["items"]
        return readiness(clusters, pools)

    deadline = time.monotonic() + timeout
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        clusters_bar = progress.add_task("clusters Ready", total=None)
        nodes_bar = progress.add_task("nodes Ready", total=None)
        while True:
            ready_clusters, total_clusters, ready, desired = run_k8s(poll())
            progress.update(clusters_bar, completed=ready_clusters, total=total_clusters)
            progress.update(nodes_bar, completed=ready, total=desired)
            if ready_clusters == total_clusters and ready == desired:
                return
            if time.monotonic() > deadline:
                raise StateError(f"the fleet was not Ready after {timeout:.0f}s: "
                                 f"{ready_clusters}/{total_clusters} clusters, "
                                 f"{ready}/{desired} nodes; see 'fakefleet get'")
            time.sleep(0.5)
