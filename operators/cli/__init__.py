"""``fakefleet``: the command line.

The ``main`` group, the error handling every command shares, and the one list of what
``fakefleet`` offers: each module of this package defines the commands of one group, and only
this list adds them to ``main`` (importing a module registers nothing). Errors of fakefleet
itself are one clear message and exit 1 (the plan and fleet commands' own exit 2; ``replay``
and ``diff`` exit 2 on input they cannot use, ``diff`` 1 on runs that differ).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from operators.cli import (
    conformance,
    diffs,
    etcd,
    fleets,
    hosting,
    kueue,
    plans,
    recording,
    replays,
    snapshots,
    traces,
    views,
    workloads,
)
from operators.cli.terminal import console
from operators.controlplane.errors import ControlPlaneError


class FleetGroup(click.Group):
    """Turns fakefleet's own errors into one readable line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ControlPlaneError as error:
            console.print(f"[bold red]error:[/] {error}", highlight=False)
            sys.exit(1)


@click.group(cls=FleetGroup)
def main() -> None:
    """Fleets of simulated Kubernetes clusters on real control planes."""


for command in (
    hosting.binaries, hosting.up, hosting.down, hosting.status, hosting.kubeconfig,
    views.get, views.wait,
    plans.plan,
    fleets.fleet,
    kueue.kueue,
    conformance.conformance,
    traces.trace,
    etcd.etcd,
    snapshots.snapshot,
    recording.record, recording.convert,
    replays.replay,
    diffs.diff,
):
    main.add_command(command)

for command in (workloads.submit, workloads.workload, workloads.workloads,
                workloads.cancel_workload):
    fleets.fleet.add_command(command)
