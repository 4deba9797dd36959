"""``fakefleet snapshot save|ls|rm|restore``: FakeClusters saved and brought back.

``save`` reads the members and their host objects from the shared etcd at one revision into
one private file (:mod:`operators.snapshots`); ``restore`` takes a saved NAME or a path and
replaces each cluster in the running ``fakefleet up`` through etcd, times shifted. Both need
the state directory of ``fakefleet up``: the snapshot is taken from, and restored into, its
etcd. docs/snapshots.md holds the design.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import click
from rich.table import Table

from operators.cli.terminal import WAIT, console, host_client, run_k8s, state_dir_option
from operators.controlplane.etcd import shared_etcd
from operators.controlplane.state import StateDir
from operators.snapshots import encoding, restoring, saving, storing
from operators.snapshots.encoding import SnapshotError
from primitives.clocks import SYSTEM_CLOCK
from primitives.names import split_member_name

CLUSTERS = "/apis/fakefleet.dev/v1alpha1/fakeclusters"

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
@click.option("--force", is_flag=True, help="Replace a snapshot of the same name.")
def save(state_dir: Path, name: str, clusters: tuple[str, ...], without_secrets: bool,
         force: bool) -> None:
    """Save FakeClusters, read from etcd at one revision, as snapshot NAME."""
    state_dir = state_dir.resolve()
    path = storing.path_of(state_dir, name)
    if path.exists() and not force:
        raise SnapshotError(f"snapshot {name!r} exists ({path}): choose another name, or "
                            f"replace it with --force")
    etcd = shared_etcd(state_dir)
    started = time.monotonic()

    async def work() -> encoding.Snapshot:
        members = [split_member_name(c) for c in clusters] or await _local_members(state_dir)
        if not members:
            raise SnapshotError("there is no local FakeCluster to save: create one first")
        return await saving.save(etcd=etcd, state=StateDir(state_dir), members=members,
                                 secrets=not without_secrets, clock=SYSTEM_CLOCK)

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
        + ("it holds Secrets and keys: mode 0600" if not without_secrets else
           "without Secrets"), highlight=False)


@snapshot.command(name="ls")
@state_dir_option
def list_(state_dir: Path) -> None:
    """List the saved snapshots."""
    table = Table("NAME", "CREATED", "CLUSTERS", "KEYS", "SIZE", "SECRETS", "MODE")
    for found in storing.listing(state_dir.resolve()):
        header = found.header
        if header is None:
            table.add_row(found.name, "-", f"[red]{found.problem}[/]", "-",
                          _size(found.size), "?", f"{found.mode:04o}")
            continue
        secrets = "yes" if header.secrets else "no"
        mode = f"{found.mode:04o}"
        if header.secrets and found.mode & 0o077:
            mode = f"[red]{mode} (readable by others: chmod 600)[/]"
        table.add_row(found.name, header.createdAt, ", ".join(header.clusters),
                      str(header.keys), _size(found.size), secrets, mode)
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
@click.option("--timeout", type=WAIT, default=300.0, show_default=True,
              help="Seconds each cluster has to be Ready again.")
def restore_(state_dir: Path, name_or_path: str, clusters: tuple[str, ...],
             timeout: float) -> None:
    """Restore the clusters of a snapshot (a saved NAME, or a path) into the running
    'fakefleet up', replacing them."""
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
        raise SnapshotError("\n".join(str(error) for error in failed))


async def _local_members(state_dir: Path) -> list[tuple[str, str]]:
    async with host_client(state_dir) as host:
        items = (await host.get(CLUSTERS)).get("items") or []
    return [(item["metadata"]["namespace"], item["metadata"]["name"]) for item in items
            if item["spec"].get("controlPlane", {}).get("backend", "local") == "local"]


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
