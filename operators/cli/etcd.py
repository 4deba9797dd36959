"""``fakefleet etcd``: the shared etcd's own troubles, and the way out of them.

``disarm`` is what etcd's documentation prescribes after its NOSPACE alarm (a full database
refuses every write, so every member's API server fails its writes): compact to the current
revision, defragment, clear the alarms. It frees what old revisions held; space the live keys
take is only freed by deleting them (FakeClusters you no longer need).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from operators.cli.terminal import console, state_dir_option
from operators.controlplane.etcd import disarm_etcd, etcd_alarms, shared_etcd


@click.group()
def etcd() -> None:
    """The shared etcd: its alarms (fakefleet status shows them), and clearing them."""


@etcd.command()
@state_dir_option
def disarm(state_dir: Path) -> None:
    """Compact and defragment the shared etcd, then clear its alarms (NOSPACE)."""
    endpoint = shared_etcd(state_dir.resolve())

    async def work() -> tuple[list[str], list[str], int, int]:
        done = await disarm_etcd(endpoint)
        return done.alarms, await etcd_alarms(endpoint), done.size_before, done.size_after

    cleared, left, before, after = asyncio.run(work())
    console.print(f"etcd: database {before / 2**20:.1f} MiB → {after / 2**20:.1f} MiB after "
                  f"compaction and defragmentation; alarms cleared: "
                  f"{', '.join(cleared) or 'none were raised'}", highlight=False)
    if left:
        console.print(f"[bold red]etcd:[/] still raised: {', '.join(left)}: the live keys "
                      f"fill the quota; delete FakeClusters you no longer need and run this "
                      f"again", highlight=False)
        raise SystemExit(1)
