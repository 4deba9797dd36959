"""``fakefleet snapshot save|ls|rm|restore``: FakeClusters saved and brought back.

``save`` reads the members and their host objects from the shared etcd at one revision into
one private file (:mod:`operators.snapshots`), and for the fleet the hub's state just after;
``restore`` takes a saved NAME or a path and replaces each cluster in the running
``fakefleet up`` through etcd, times shifted, then has the hub take in its state. Both need
the state directory of ``fakefleet up``: the snapshot is taken from, and restored into, its
etcd and its hub. docs/snapshots.md holds the design.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import click
from rich.table import Table

from federation.client.discovery import HubFiles, HubInfo
from operators.cli.terminal import WAIT, console, host_client, run_k8s, state_dir_option
from operators.controlplane.etcd import shared_etcd
from operators.controlplane.state import StateDir
from operators.snapshots import encoding, restoring, saving, storing
from operators.snapshots.encoding import SnapshotError
from primitives.clocks import SYSTEM_CLOCK
from primitives.files import write_private
from primitives.names import split_member_name

CLUSTERS = "/apis/fakefleet.dev/v1alpha1/fakeclusters"
#: Seconds the hub has to restart and take in a snapshot's state (it starts in a few).
HUB_TIMEOUT = 60.0

cluster_option = click.option(
    "--cluster", "clusters", multiple=True,
    help="A FakeCluster (NAME or NAMESPACE/NAME); repeat for more. Default: every local one.")


@click.group()
def snapshot() -> None:
    """Save FakeClusters to a file and restore them: same names, same UIDs, times shifted."""


@snapshot.command()
@state_dir_option
@click.argument("name")
@cluster_option
@click.option("--without-secrets", is_flag=True,
              help="Leave out the members' Secrets and their certificates and keys.")
@click.option("--hub/--without-hub", "hub", default=None,
              help="Save the hub's members, runs and workloads too. Default: without --cluster "
                   "(the fleet), when a hub runs.")
@click.option("--force", is_flag=True, help="Replace a snapshot of the same name.")
def save(state_dir: Path, name: str, clusters: tuple[str, ...], without_secrets: bool,
         hub: bool | None, force: bool) -> None:
    """Save FakeClusters, read from etcd at one revision, as snapshot NAME; for the fleet,
    the hub's state too."""
    state_dir = state_dir.resolve()
    path = storing.path_of(state_dir, name)
    if path.exists() and not force:
        raise SnapshotError(f"snapshot {name!r} exists ({path}): choose another name, or "
                            f"replace it with --force")
    etcd = shared_etcd(state_dir)
    hub_state = HubFiles(StateDir(state_dir).hub).state
    if hub is None:
        hub = not clusters and hub_state.exists()
    started = time.monotonic()

    async def work() -> encoding.Snapshot:
        members = [split_member_name(c) for c in clusters] or await _local_members(state_dir)
        if not members:
            raise SnapshotError("there is no local FakeCluster to save: create one first")
        return await saving.save(etcd=etcd, state=StateDir(state_dir), members=members,
                                 secrets=not without_secrets, clock=SYSTEM_CLOCK,
                                 hub=hub_state if hub else None)

    with console.status("reading etcd at one revision"):
        taken = run_k8s(work())
        data = encoding.encode(taken, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                               time.gmtime()))
        storing.write(path, data)
    console.print(
        f"saved {', '.join(c.member for c in taken.clusters)} at etcd revision "
        f"{taken.revision} to {path} ({len(data) / 2**20:.1f} MiB, "
        f"{sum(len(c.keys) for c in taken.clusters)} keys, "
        f"{time.monotonic() - started:.1f}s); "
        + (f"the hub's {taken.hub_counts()} "
           + ("(as stored at that revision); " if taken.hub_at_revision else
              "(as stored just after that revision: the hub changed during the read); ")
           if taken.hub is not None else "")
        + ("it holds Secrets and keys: mode 0600" if not without_secrets else
           "without Secrets"), highlight=False)


@snapshot.command(name="ls")
@state_dir_option
def list_(state_dir: Path) -> None:
    """List the saved snapshots."""
    table = Table("NAME", "CREATED", "CLUSTERS", "HUB", "KEYS", "SIZE", "SECRETS", "MODE")
    for found in storing.listing(state_dir.resolve()):
        header = found.header
        if header is None:
            table.add_row(found.name, "-", f"[red]{found.problem}[/]", "-", "-",
                          _size(found.size), "?", f"{found.mode:04o}")
            continue
        secrets = "yes" if header.secrets else "no"
        mode = f"{found.mode:04o}"
        if header.secrets and found.mode & 0o077:
            mode = f"[red]{mode} (readable by others: chmod 600)[/]"
        table.add_row(found.name, header.createdAt, ", ".join(header.clusters),
                      "yes" if header.hub else "no", str(header.keys), _size(found.size),
                      secrets, mode)
    console.print(table)


@snapshot.command()
@state_dir_option
@click.argument("name")
def rm(state_dir: Path, name: str) -> None:
    """Delete snapshot NAME."""
    console.print(f"deleted {storing.remove(state_dir.resolve(), name)}", highlight=False)


@snapshot.command(name="restore")
@state_dir_option
@click.argument("name_or_path")
@cluster_option
@click.option("--without-hub", is_flag=True,
              help="Leave the hub's state as it is (restoring some clusters, --cluster, "
                   "always does).")
@click.option("--timeout", type=WAIT, default=300.0, show_default=True,
              help="Seconds each cluster has to be Ready again.")
def restore_(state_dir: Path, name_or_path: str, clusters: tuple[str, ...],
             without_hub: bool, timeout: float) -> None:
    """Restore the clusters of a snapshot (a saved NAME, or a path) into the running
    'fakefleet up', replacing them; then the hub's members, runs and workloads, if the
    snapshot holds them."""
    state_dir = state_dir.resolve()
    path = storing.locate(state_dir, name_or_path)
    header, taken = encoding.read(path)
    wanted = {split_member_name(c) for c in clusters}
    chosen = [c for c in taken.clusters if not wanted or (c.namespace, c.name) in wanted]
    missing = wanted - {(c.namespace, c.name) for c in taken.clusters}
    if missing:
        raise SnapshotError(f"snapshot {path} has no cluster "
                            f"{', '.join(f'{n}/{c}' for n, c in sorted(missing))}; it has "
                            f"{', '.join(header.clusters)}")
    hub = taken.hub is not None and not clusters and not without_hub
    hub_files = HubFiles(StateDir(state_dir).hub)
    if hub and HubInfo.read(hub_files.info) is None:
        raise SnapshotError(
            f"snapshot {path} holds the hub's state, but no hub runs in {state_dir} "
            f"('fakefleet up' starts one unless --no-hub): start one, or restore the clusters "
            f"alone with --without-hub")
    etcd = shared_etcd(state_dir)

    async def work() -> list[restoring.Restored | BaseException]:
        async with host_client(state_dir) as host:
            # Each cluster is held and restored on its own: they wait for their own
            # processes, so together they take about as long as one.
            return await asyncio.gather(*(restoring.restore(
                taken, cluster, source=str(path), host=host, etcd=etcd,
                state=StateDir(state_dir), clock=SYSTEM_CLOCK, timeout=timeout,
                progress=lambda step: console.print(f"[dim]{step}[/]", highlight=False))
                for cluster in chosen), return_exceptions=True)

    failed = []
    for done in run_k8s(work()):
        if isinstance(done, SnapshotError):
            failed.append(done)
            continue
        if isinstance(done, BaseException):
            raise done
        console.print(f"[green]restored[/] {done.member}: {done.keys} keys, times shifted by "
                      f"{done.shifted_by}s in {done.objects_shifted} objects, Ready in "
                      f"{done.seconds:.1f}s", highlight=False)
        for note in done.notes:
            console.print(f"[yellow]note:[/] {note}", highlight=False)
    if failed:
        if hub:
            failed.append(SnapshotError("the hub's state was not restored: the clusters "
                                        "above were not all restored"))
        raise SnapshotError("\n".join(str(error) for error in failed))
    if hub:
        with console.status("the hub takes in its state"):
            _restore_hub(StateDir(state_dir), taken, path)
        console.print(f"[green]restored[/] the hub's {taken.hub_counts()}, times shifted by "
                      f"the time since the save", highlight=False)


def _restore_hub(state: StateDir, taken: encoding.Snapshot, path: Path) -> None:
    """Leave the hub the snapshot's state to take in, and restart it: it takes the state in
    as it starts (federation.hub.importing), with the time since the save then."""
    files = HubFiles(state.hub)
    running = HubInfo.read(files.info)
    if running is None:
        raise SnapshotError(f"the hub's state was not restored: no hub runs in "
                            f"{files.directory} any more ('fakefleet status')")
    files.refused.unlink(missing_ok=True)
    write_private(files.restore, restoring.hub_import(taken, host=state.host_id()))
    # Its supervisor (the daemon of 'fakefleet up') starts it again at once.
    with contextlib.suppress(ProcessLookupError):  # it died meanwhile: it starts again too
        os.kill(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + HUB_TIMEOUT
    while (info := HubInfo.read(files.info)) is None or info.pid == running.pid or \
            files.restore.exists():
        if time.monotonic() > deadline:
            raise SnapshotError(
                f"the hub's state was not restored: waited {HUB_TIMEOUT:.0f}s for the hub to "
                f"restart and take in {files.restore} (its log: {files.log}); it takes it in "
                f"whenever it starts next")
        time.sleep(0.2)
    if files.refused.exists():
        reason = json.loads(files.refused.read_bytes()).get("refused", "see " + str(files.log))
        raise SnapshotError(f"the hub's state in {path} was not restored: {reason}; the hub "
                            f"keeps its own")


async def _local_members(state_dir: Path) -> list[tuple[str, str]]:
    async with host_client(state_dir) as host:
        items = (await host.get(CLUSTERS)).get("items") or []
    return [(item["metadata"]["namespace"], item["metadata"]["name"]) for item in items
            if item["spec"].get("controlPlane", {}).get("backend", "local") == "local"]


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
