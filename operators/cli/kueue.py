"""``fakefleet kueue install CLUSTER``: turn on the Kueue add-on of a FakeCluster and wait for it.

The command only patches ``spec.addons.kueue`` (the declarative truth, which the operator
supervises and a GitOps repo may hold as well) and follows the cluster's ``KueueReady``
condition: a line whenever it changes (building the binary, starting, running), and at least
every 15 s. Exit 0 once it is True for the current spec, 1 on a timeout or an error.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import click

from operators.api.base import API_VERSION
from operators.cli.terminal import WAIT, console, state_dir_option
from operators.controlplane.state import StateDir
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import Invalid, K8sError, NotFound

POLL_INTERVAL = 1.0
#: A line at least this often while nothing changes, so a long build never looks hung.
QUIET_INTERVAL = 15.0


def install_patch(workers: list[str], worker_lost_timeout: str | None) -> dict[str, Any]:
    """The merge patch that asks for Kueue (and MultiKueue over ``workers``)."""
    kueue: dict[str, Any] = {"enabled": True}
    if workers:
        multikueue: dict[str, Any] = {"workers": workers}
        if worker_lost_timeout:
            multikueue["workerLostTimeout"] = worker_lost_timeout
        kueue["multiKueue"] = multikueue
    else:
        kueue["multiKueue"] = None  # a merge patch removes what null names
    return {"spec": {"addons": {"kueue": kueue}}}


def kueue_condition(cluster: dict[str, Any]) -> tuple[bool, str, str]:
    """(holds for the current generation, reason, message) of KueueReady."""
    status = cluster.get("status") or {}
    generation = cluster["metadata"].get("generation")
    for found in status.get("conditions") or []:
        if found["type"] == "KueueReady":
            current = found.get("observedGeneration") == generation
            return (current and found["status"] == "True", found.get("reason", ""),
                    found.get("message", ""))
    return False, "Pending", "waiting for the operator to pick up spec.addons.kueue"


@click.group()
def kueue() -> None:
    """Kueue (with MultiKueue) on FakeClusters: spec.addons.kueue."""


@kueue.command("install")
@state_dir_option
@click.argument("cluster")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("--workers", default="",
              help="Comma-separated FakeClusters (same namespace) this cluster dispatches Jobs "
                   "to as a MultiKueue manager.")
@click.option("--worker-lost-timeout", default=None,
              help="How long Kueue waits for a worker that stopped answering (e.g. 30s).")
@click.option("--timeout", type=WAIT, default=900.0, show_default=True,
              help="Seconds to wait for KueueReady (a first, cold build of Kueue takes "
                   "minutes).")
def install(state_dir: Path, cluster: str, namespace: str, workers: str,
            worker_lost_timeout: str | None, timeout: float) -> None:
    """Run Kueue against CLUSTER and wait until its KueueReady condition is True."""
    names = [name.strip() for name in workers.split(",") if name.strip()]
    kubeconfig = StateDir(state_dir.resolve()).host_kubeconfig
    if not kubeconfig.exists():
        raise click.ClickException(f"no host cluster in {state_dir}: start it with "
                                   f"'fakefleet up'")
    try:
        asyncio.run(_install(kubeconfig, namespace, cluster, install_patch(
            names, worker_lost_timeout), timeout))
    except K8sError as error:
        raise click.ClickException(f"the host cluster did not answer as expected: "
                                   f"{error}") from error


async def _install(kubeconfig: Path, namespace: str, name: str, patch: dict[str, Any],
                   timeout: float) -> None:
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/fakeclusters/{name}"
    async with Client.connect(load_kubeconfig_file(kubeconfig)) as client:
        try:
            await client.patch(path, patch)
        except NotFound:
            raise click.ClickException(f"FakeCluster {namespace}/{name} does not exist: see "
                                       f"'fakefleet get'") from None
        except Invalid as error:
            raise click.ClickException(str(error)) from None
        started = time.monotonic()
        said, said_at = ("", ""), 0.0
        while True:
            holds, reason, message = kueue_condition(await client.get(path))
            elapsed = time.monotonic() - started
            if (reason, message) != said or elapsed - said_at >= QUIET_INTERVAL:
                console.print(f"[dim][{elapsed:4.0f}s][/] {reason}: {message}",
                              highlight=False, soft_wrap=True)
                said, said_at = (reason, message), elapsed
            if holds:
                console.print(f"[green]Kueue is running on {namespace}/{name}[/]")
                return
            if elapsed > timeout:
                raise click.ClickException(
                    f"KueueReady of {namespace}/{name} was not True after {timeout:.0f}s "
                    f"({reason}: {message}); see 'kubectl get fc {name} -o yaml'")
            await asyncio.sleep(POLL_INTERVAL)
