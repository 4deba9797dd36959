"""``fakefleet diff RUN-A RUN-B``: two recorded runs of one scenario compared.

Each run is a recording (``fakefleet record``, or KWOK's format) of the same scenario, such as
one trace replayed twice with the same seed and speed. The comparison
(:mod:`operators.recording.comparing`) matches objects across the runs, compares their event
sequences (:mod:`operators.recording.sequencing`) and prints the first divergence and a
summary: identical sequences, placements, pod outcomes, FaultPlan verdicts, times to the
final state; ``--json`` prints the same for machines. Exit 0 when the runs are identical by
those measures, 1 when they differ (as ``diff``), 2 when a file cannot be compared.
docs/replay.md, "Comparing two runs", holds the design.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.table import Table

from operators.cli.terminal import Seconds, stdout
from operators.recording import comparing, loading
from operators.recording.comparing import CompareError, Comparison, Difference, Share
from operators.recording.files import TraceError
from operators.recording.trace import Trace

#: Differing objects listed one by one up to this many by default; the rest are counted.
LISTED = 20


class DiffError(click.ClickException):
    """The runs cannot be compared: one line, exit code 2 (1 is runs that differ)."""

    exit_code = 2


def load(path: Path, which: str) -> Trace:
    """The recording in ``path``; what is wrong with it exits 2, naming the run and file."""
    try:
        trace = loading.load(path)
    except TraceError as error:
        raise DiffError(f"{which}: {error}") from None
    if not (trace.initial or trace.changes or trace.pods):
        raise DiffError(f"{which}: {path} holds no recorded object: give the file that "
                        f"'fakefleet record -o' wrote while the run ran")
    return trace


@click.command()
@click.argument("run_a", metavar="RUN-A", type=click.Path(path_type=Path))
@click.argument("run_b", metavar="RUN-B", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True,
              help="Print the comparison as JSON (every differing object, no limit).")
@click.option("--tolerance", type=Seconds(0, 7 * 86400), default=None, metavar="SECONDS",
              help="Also count the runs as different when an object reached its final state "
                   "more than this many seconds apart (default: times are reported only).")
@click.option("--limit", type=click.IntRange(min=0), default=LISTED, show_default=True,
              help="Differing objects listed in the table.")
def diff(run_a: Path, run_b: Path, as_json: bool, tolerance: float | None,
         limit: int) -> None:
    """Compare two recorded runs of one scenario: the first divergence, and how many event
    sequences, placements, pod outcomes and verdicts are the same."""
    a, b = load(run_a, "RUN-A"), load(run_b, "RUN-B")
    try:
        comparison = comparing.compare(a, b)
    except CompareError as error:
        raise DiffError(f"{run_a} and {run_b}: {error}") from None
    identical = comparison.identical(tolerance=tolerance)
    if as_json:
        click.echo(json.dumps({"runA": str(run_a), "runB": str(run_b),
                               **comparison.fields(tolerance=tolerance)}, indent=2))
    else:
        _print(comparison, run_a, run_b, tolerance=tolerance, limit=limit)
    if not identical:
        sys.exit(1)


def _seconds(nanos: int | None) -> str:
    return "-" if nanos is None else f"{nanos / 1e9:+.3f}s"


def _share(share: Share) -> tuple[str, str, str]:
    return str(share.same), str(share.total), \
        f"{100 * share.ratio:.1f}%" if share.total else "-"


def _print(comparison: Comparison, run_a: Path, run_b: Path, *, tolerance: float | None,
           limit: int) -> None:
    stdout.print(f"A: {run_a}  B: {run_b}  clusters: {', '.join(comparison.clusters)}; "
                 f"{comparison.events_a} events in A, {comparison.events_b} in B",
                 highlight=False)
    summary = Table(title="summary", title_justify="left")
    for column in ("measure", "same", "of", "share"):
        summary.add_column(column, justify="left" if column == "measure" else "right")
    summary.add_row("event sequences", *_share(comparison.sequences))
    summary.add_row("placements (pod on the same node)", *_share(comparison.placements))
    summary.add_row("pod outcomes (phase, exit code, restarts)", *_share(comparison.outcomes))
    summary.add_row("FaultPlan verdicts", *_share(comparison.verdicts))
    stdout.print(summary)
    times = comparison.times
    worst = f" ({times.worst.text()})" if times.worst is not None else ""
    stdout.print(f"time to final state, difference over {times.count} objects: p50 "
                 f"{times.p50 / 1e9:.3f}s, max {times.max / 1e9:.3f}s{worst}; last event at "
                 f"{_seconds(times.last_a)} in A, {_seconds(times.last_b)} in B",
                 highlight=False, soft_wrap=True)
    first = comparison.first
    if first is not None:
        names = f" ({', '.join(first.names_a) or 'not in A'} in A, " \
                f"{', '.join(first.names_b) or 'not in B'} in B)"
        stdout.print(f"[bold]first divergence:[/] {first.key.text()}{names}, event "
                     f"{first.index} at {_seconds(first.at)}", highlight=False, soft_wrap=True)
        stdout.print(f"  A: {first.a or '(no more events)'} at {_seconds(first.at_a)}",
                     highlight=False, soft_wrap=True)
        stdout.print(f"  B: {first.b or '(no more events)'} at {_seconds(first.at_b)}",
                     highlight=False, soft_wrap=True)
        table = Table(title=f"objects whose events differ ({len(comparison.divergences)})",
                      title_justify="left")
        for column in ("object", "event", "time", "A", "B"):
            table.add_column(column, overflow="fold")
        for found in comparison.divergences[:limit]:
            table.add_row(found.key.text(), str(found.index), _seconds(found.at),
                          found.a or "-", found.b or "-")
        stdout.print(table)
        if len(comparison.divergences) > limit:
            stdout.print(f"  ... and {len(comparison.divergences) - limit} more (--json lists "
                         f"all)", highlight=False)
    _differences("placements that differ", comparison.placement_differences, limit)
    _differences("pod outcomes that differ", comparison.outcome_differences, limit)
    if comparison.verdict_pairs:
        _differences("FaultPlan verdicts", comparison.verdict_pairs, limit)
    if comparison.identical(tolerance=tolerance):
        stdout.print("[green]the runs are identical[/]")
    elif not comparison.divergences and tolerance is not None:
        stdout.print(f"[red]the runs differ:[/] an object reached its final state more than "
                     f"{tolerance:g}s apart", highlight=False)
    else:
        stdout.print("[red]the runs differ[/]")


def _differences(title: str, found: tuple[Difference, ...], limit: int) -> None:
    if not found:
        return
    table = Table(title=f"{title} ({len(found)})", title_justify="left")
    for column in ("object", "A", "B"):
        table.add_column(column, overflow="fold")
    for difference in found[:limit]:
        table.add_row(difference.key.text(), difference.a, difference.b)
    stdout.print(table)
    if len(found) > limit:
        stdout.print(f"  ... and {len(found) - limit} more (--json lists all)", highlight=False)
