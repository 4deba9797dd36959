"""``fakefleet trace ls`` and ``fakefleet trace show ID``: the traces the embedded collector
stored, read straight from its SQLite file (read-only; the collector need not run).

``ls`` lists recent traces, newest first; ``show`` prints one trace as a tree of spans with
each span's offset from the trace's start, its duration, its service and its cluster, the
links it carries, and a marker on spans whose parent is not in the store, laid out to the
terminal's width by :mod:`operators.cli.spantrees`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from federation.telemetry import reading
from federation.telemetry.files import CollectorFiles
from federation.telemetry.reading import Node, TraceStoreError, TraceSummary
from operators.cli.spantrees import duration, flatten, render
from operators.cli.terminal import console, state_dir_option, stdout


class TraceGroup(click.Group):
    """Prints the store's errors as one readable line, exit code 1 (as ``fakefleet`` does)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TraceStoreError as error:
            console.print(f"[bold red]error:[/] {error}", highlight=False)
            sys.exit(1)


@click.group(cls=TraceGroup)
def trace() -> None:
    """Traces stored by the embedded collector of `fakefleet up`."""


output_option = click.option("-o", "--output", type=click.Choice(["table", "json"]),
                             default="table", show_default=True)


@trace.command("ls")
@state_dir_option
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many traces, newest first.")
@output_option
def trace_ls(state_dir: Path, limit: int, output: str) -> None:
    """Recent traces: root span, services, clusters, span count, duration, start."""
    with reading.open_store(CollectorFiles.of(state_dir.resolve()).database) as db:
        found = reading.recent(db, limit)
    if output == "json":
        click.echo(json.dumps([_summary_json(s) for s in found], indent=2))
        return
    if not found:
        console.print("no traces stored yet: processes started by 'fakefleet up' export "
                      "theirs to the collector")
        return
    table = Table()
    table.add_column("trace id", no_wrap=True, min_width=32)  # whole: it is what users copy
    for column in ("root", "services", "clusters", "spans", "duration", "started"):
        table.add_column(column, justify="right" if column in ("spans", "duration") else "left",
                         overflow="fold")
    for s in found:
        table.add_row(s.trace_id, _root_name(s), ", ".join(s.services),
                      ", ".join(s.clusters) or "-", str(s.span_count),
                      duration(s.duration_ns), _timestamp(s.start_ns))
    stdout.print(table)


@trace.command("show")
@click.argument("trace_id")
@state_dir_option
@output_option
def trace_show(trace_id: str, state_dir: Path, output: str) -> None:
    """One trace as a tree of spans (TRACE_ID: its id, or a unique start of it)."""
    with reading.open_store(CollectorFiles.of(state_dir.resolve()).database) as db:
        full = reading.resolve(db, trace_id)
        summary = reading.summary(db, full)
        nodes = reading.tree(reading.spans(db, full))
    rows = flatten(nodes)
    if output == "json":
        click.echo(json.dumps({
            "trace": _summary_json(summary),
            "spans": [_span_json(node, depth, summary.start_ns) for node, depth, _ in rows],
        }, indent=2))
        return
    stdout.print(Text.assemble(
        ("trace ", "bold"), (summary.trace_id, "bold cyan"), "  ", _root_name(summary), "  ",
        f"{summary.span_count} spans, {duration(summary.duration_ns)}, started "
        f"{_timestamp(summary.start_ns)}"))
    # Printed as laid out, never cropped: on a terminal too narrow even for the columns that
    # are never cut, the terminal wraps the lines rather than rich cutting their ends off.
    stdout.print(render(rows, start_ns=summary.start_ns, total_ns=summary.duration_ns,
                        width=stdout.width), soft_wrap=True)


def _root_name(summary: TraceSummary) -> str:
    """The root span's name; while it has not arrived, the earliest span's, marked."""
    return summary.root_name if summary.root_name is not None else \
        f"{summary.first_name} (root not stored)"


def _timestamp(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def _summary_json(s: TraceSummary) -> dict[str, Any]:
    return {"traceId": s.trace_id, "root": s.root_name, "firstSpan": s.first_name,
            "services": s.services, "clusters": s.clusters, "spans": s.span_count,
            "startNs": s.start_ns, "durationNs": s.duration_ns}


def _span_json(node: Node, depth: int, start_ns: int) -> dict[str, Any]:
    span = node.span
    return {"spanId": span.span_id, "parentSpanId": span.parent_span_id, "depth": depth,
            "orphan": node.orphan, "name": span.name, "service": span.service,
            "cluster": span.cluster, "offsetNs": span.start_ns - start_ns,
            "durationNs": span.duration_ns, "statusCode": span.status_code,
            "statusMessage": span.status_message, "attributes": span.attributes,
            "events": span.events, "links": span.links}
