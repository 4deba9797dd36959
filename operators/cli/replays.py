"""``fakefleet replay FILE --into CLUSTER``: a recorded cluster replayed into a FakeCluster.

The trace's objects are created at once, then its changes on the recorded timeline scaled by
``--speed`` (``max``: as fast as the member's API server takes them), through the member's
API with its admin kubeconfig. Workloads are replayed as objects and the member's controllers
make their pods, which take the recorded pods' lives (:mod:`operators.recording.planning`).
A line a second says how far it got and how far it lags behind the timeline; at the end, a
summary and every refused object with the reason. Exit 0 when every write was taken, 1 when
the API refused one (the replay went on with the others), 2 when it could not start.
docs/replay.md holds the design.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import click

from operators.cli.terminal import (
    console,
    host_client,
    named_member_kubeconfig,
    split_cluster,
    state_dir_option,
)
from operators.controlplane.errors import StateError
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig
from operators.k8s.errors import K8sError
from operators.recording import loading, planning, replaying
from operators.recording.files import TraceError
from operators.recording.trace import Trace
from primitives.clocks import SYSTEM_CLOCK

#: Lines of progress at most this often.
PROGRESS_INTERVAL = 1.0
#: Refused writes listed one by one up to this many; the rest are counted.
LISTED = 50


class ReplayError(click.ClickException):
    """The replay could not start: one line, exit code 2 (1 is a replay the API refused
    some of)."""

    exit_code = 2


class Speed(click.ParamType[float]):
    """A replay's speed: a factor from 0.001 to 1e6, or ``max`` (0: no waiting)."""

    name = "speed"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        text = str(value).strip().lower()
        if text in ("max", "0"):
            return 0.0
        try:
            speed = float(text)
        except ValueError:
            speed = float("nan")
        if not 0.001 <= speed <= 1e6:
            self.fail(f"{value!r} is not a speed: give a factor from 0.001 to 1000000 (10: ten "
                      f"times as fast as recorded), or max (0) for as fast as the API server "
                      f"takes the changes", param, ctx)
        return speed


def load(path: Path) -> Trace:
    """The trace in ``path``: a fakefleet trace or KWOK's recording
    (:func:`operators.recording.loading.load`); what is wrong with it exits 2."""
    try:
        return loading.load(path)
    except TraceError as error:
        raise ReplayError(str(error)) from None


@click.command()
@state_dir_option
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--into", "into", required=True, metavar="CLUSTER",
              help="The FakeCluster to replay into, [NAMESPACE/]NAME.")
@click.option("--speed", type=Speed(), default="1", show_default=True,
              help="Recorded seconds per second (10: ten times as fast); max: as fast as "
                   "the API server takes the changes, pods' lives as recorded.")
@click.option("--seed", default=None,
              help="Seed of the replayed pods' random draws (start-delay jitter, log lines), "
                   "so that two replays draw alike.")
@click.option("--raw-pods", is_flag=True,
              help="Replay the recorded pods as bare pods with their lives, and leave out "
                   "their controllers (default: the controllers make the pods).")
@click.option("--from", "source", default="", metavar="NAME",
              help="The trace's cluster to replay, when it holds several.")
def replay(state_dir: Path, file: Path, into: str, speed: float, seed: str | None,
           raw_pods: bool, source: str) -> None:
    """Replay the recording in FILE into the FakeCluster CLUSTER."""
    trace = load(file)
    options = planning.Options(speed=speed, cluster=source, raw_pods=raw_pods,
                               run=secrets.token_hex(4), seed=seed)
    try:
        plan = planning.plan(trace, options)
    except planning.PlanError as error:
        raise ReplayError(f"{file}: {error}") from None
    namespace, name = split_cluster(into)
    _announce(plan, trace, f"{namespace}/{name}", speed)
    started = time.monotonic()
    printed = [started]

    def report(progress: replaying.Progress) -> None:
        now = time.monotonic()
        if now - printed[0] >= PROGRESS_INTERVAL or progress.done == progress.total:
            printed[0] = now
            console.print(_line(progress, now - started), highlight=False)

    async def work() -> replaying.Progress:
        async with host_client(state_dir) as host:
            kubeconfig = await named_member_kubeconfig(host, namespace, name)
        async with Client.connect(load_kubeconfig(kubeconfig)) as member:
            return await replaying.Replayer(member, clock=SYSTEM_CLOCK,
                                            on_progress=report).run(plan)

    try:
        progress = asyncio.run(work())
    except StateError as error:
        raise ReplayError(str(error)) from None
    except K8sError as error:
        raise ReplayError(f"the cluster did not answer as expected: {error}") from error
    _summary(progress, time.monotonic() - started)
    if progress.refused:
        sys.exit(1)


def _announce(plan: planning.Plan, trace: Trace, into: str, speed: float) -> None:
    pace = "as fast as the API server takes them" if speed == 0 else \
        f"over {trace.duration / 1e9 / speed:.1f}s (speed {speed:g})"
    console.print(f"replaying {len(plan.writes)} writes into {into}, {pace}", highlight=False)
    reasons = collections.Counter(s.reason for s in plan.skipped)
    for reason, count in sorted(reasons.items()):
        console.print(f"  left out {count}: {reason}", highlight=False)
    for owner, count in plan.lives:
        console.print(f"  {owner}: its pods take {count} recorded lives", highlight=False)
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _line(progress: replaying.Progress, elapsed: float) -> str:
    p50, p99, worst = progress.lag()
    return (f"{elapsed:6.1f}s  applied {progress.applied}/{progress.total}  refused "
            f"{len(progress.refused)}  lag p50 {p50:.3f}s p99 {p99:.3f}s max {worst:.3f}s")


def _summary(progress: replaying.Progress, elapsed: float) -> None:
    p50, p99, worst = progress.lag()
    dropped = f", {progress.dropped} left out with a refused create" if progress.dropped \
        else ""
    console.print(f"replayed {progress.applied} of {progress.total} writes in {elapsed:.1f}s"
                  f"{dropped}; lag behind the timeline p50 {p50:.3f}s p99 {p99:.3f}s max "
                  f"{worst:.3f}s", highlight=False)
    if progress.present:
        console.print("already in the cluster, left as they stood: " + ", ".join(
            f"{w.kind or w.resource} {w.name}" for w in progress.present), highlight=False)
    if not progress.refused:
        return
    console.print(f"[red]refused {len(progress.refused)}:[/]", highlight=False)
    for refusal in progress.refused[:LISTED]:
        console.print(f"  {refusal.describe()}", highlight=False, soft_wrap=True)
    if len(progress.refused) > LISTED:
        console.print(f"  ... and {len(progress.refused) - LISTED} more", highlight=False)
