"""`fakefleet trace show` laid out to the terminal's width: services, clusters, offsets and
durations whole at 80 and at 200 columns, long span names shortened from the middle, and the
lines under a span (errors, links, a missing parent) whole, wrapped at the table's width."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry import trace as trace_api
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from rich.console import Console

from federation.telemetry.files import CollectorFiles
from operators.cli import spantrees, traces
from tests.telemetry.collectors import flush, provider, running_collector

T0 = 1_780_000_000 * 10**9
MS = 10**6
S = 10**9
PROVISION = "fakecluster.provision default/west-h100-with-a-long-pool-name"
PATCH = "PATCH /apis/fakefleet.dev/v1alpha1/namespaces/default/fakenodepools/west-h100/status"
FAILURE = "node west-h100-7 not found: the engine could not write its condition in time"


async def long_trace(tmp_path: Path) -> str:
    """A plan's trace of a minute with long span names from four services: a provision with
    an API server's request under it, a step whose engine batch failed and links to it, and a
    batch whose parent never reaches the collector."""
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        operator = provider(info, "fakefleet-operator", cluster="west")
        apiserver = provider(info, "kube-apiserver", cluster="west")
        engine = provider(info, "fakefleet-engine", cluster="west")
        lost = provider(info, "fakefleet-engine", cluster="east")
        tracer = operator.get_tracer("test")
        root = tracer.start_span("plan.run", start_time=T0)
        under_root = trace_api.set_span_in_context(root)
        provision = tracer.start_span(PROVISION, context=under_root, start_time=T0 + 400 * MS)
        patch = apiserver.get_tracer("test").start_span(
            PATCH, context=trace_api.set_span_in_context(provision), start_time=T0 + 1200 * MS)
        patch.end(end_time=T0 + 1200 * MS + 3_400_000)
        provision.end(end_time=T0 + 9900 * MS)
        step = tracer.start_span("step.inject xid-79", context=under_root,
                                 start_time=T0 + 12_034 * MS)
        batch = engine.get_tracer("test").start_span(
            "engine.fault_batch", context=trace_api.set_span_in_context(step),
            start_time=T0 + 12_500 * MS, links=[Link(step.get_span_context())])
        batch.set_status(Status(StatusCode.ERROR, FAILURE))
        batch.end(end_time=T0 + 12_600 * MS)
        step.end(end_time=T0 + 13_500 * MS)
        unexported = NonRecordingSpan(SpanContext(
            root.get_span_context().trace_id, 0xDEAD0000BEEF0000, is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        orphan = lost.get_tracer("test").start_span(
            "engine.fault_batch", context=trace_api.set_span_in_context(unexported),
            start_time=T0 + 50 * S)
        orphan.end(end_time=T0 + 50 * S + 200 * MS)
        root.end(end_time=T0 + 65 * S)
        await flush([operator, apiserver, engine, lost])
    return f"{root.get_span_context().trace_id:032x}"


def show(tmp_path: Path, trace_id: str, *args: str) -> str:
    result = CliRunner().invoke(traces.trace,
                                ["show", trace_id, "--state-dir", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    return result.output


def shown_at(width: int, tmp_path: Path, trace_id: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The table as a terminal of ``width`` columns shows it."""
    monkeypatch.setattr(traces, "stdout", Console(width=width))
    return show(tmp_path, trace_id)


def spans_of(tmp_path: Path, trace_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(show(tmp_path, trace_id, "-o", "json"))["spans"]
    return found


@pytest.mark.parametrize("width", [80, 200])
async def test_services_clusters_offsets_and_durations_are_whole(
        width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace_id = await long_trace(tmp_path)
    table = shown_at(width, tmp_path, trace_id, monkeypatch)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= width, table
    at = next(i for i, line in enumerate(lines) if line.startswith("span "))
    header = lines[at].split()
    assert header[:5] == ["span", "service", "cluster", "offset", "duration"]
    assert ("timeline" in header) == (width == 200)
    rows = [line.split() for line in lines[at + 1:]]
    for span in spans_of(tmp_path, trace_id):
        cells = [span["service"], span["cluster"] or "-",
                 f"+{spantrees.duration(span['offsetNs'])}",
                 spantrees.duration(span["durationNs"])]
        assert any(row[-len(cells) - (width == 200):][:len(cells)] == cells for row in rows), (
            f"{span['name']}: {cells} not whole in\n{table}")
    for expected in ("fakefleet-operator", "kube-apiserver", "fakefleet-engine",
                     "+12.03s", "+400.0ms", "+50.00s", "1m05s", "3.4ms"):
        assert expected in table


async def test_at_200_columns_every_name_is_whole_beside_its_service(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace_id = await long_trace(tmp_path)
    table = shown_at(200, tmp_path, trace_id, monkeypatch)
    assert f"├─ {PROVISION}" in table
    assert f"│  └─ {PATCH}  kube-apiserver" in table
    assert "engine.fault_batch  ⚠ parent dead0000beef0000 missing" in table
    assert f"      ✗ error: {FAILURE}" in table
    assert "└─ step.inject xid-79" in table
    assert "█" in table


async def test_at_80_columns_long_names_keep_their_start_and_end_and_notes_wrap_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace_id = await long_trace(tmp_path)
    table = shown_at(80, tmp_path, trace_id, monkeypatch)
    lines = table.splitlines()
    for guide, name in (("├─ ", PROVISION), ("│  └─ ", PATCH)):
        [row] = [line for line in lines if line.startswith(guide + name[:8])]
        head, tail = row.removeprefix(guide).split("  ")[0].split("…")
        assert name.startswith(head), row
        assert name.endswith(tail), row
        assert min(len(head), len(tail)) >= 8, row
    assert "└─ step.inject xid-79" in table, "a short name stays whole"
    assert "█" not in table, "no room for the timeline: the names have it"

    def note(start: str) -> str:
        """A line under a span, and its wrapped continuation, as one text."""
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(start))
        parts = [lines[at].strip()]
        indent = len(lines[at]) - len(lines[at].lstrip()) + 2
        for line in lines[at + 1:]:
            if not line.startswith(" " * indent) or line[indent] == " ":
                break
            parts.append(line.strip())
        return " ".join(parts)

    assert note("✗ error:") == f"✗ error: {FAILURE}"
    [step] = [s for s in spans_of(tmp_path, trace_id) if s["name"] == "step.inject xid-79"]
    assert note("↪ link to span") == \
        f"↪ link to span {step['spanId']} of this trace (step.inject xid-79)"
    assert note("⚠ parent") == "⚠ parent dead0000beef0000 missing", \
        "the marker goes under the span when it does not fit beside the name"


def test_names_are_shortened_from_the_middle() -> None:
    assert spantrees.shorten("fakecluster.provision default/west-h100", 26) == \
        "fakecluster.p…lt/west-h100"
    assert spantrees.shorten("plan.run", 26) == "plan.run"
    assert spantrees.shorten("abcdef", 5) == "ab…ef"
    assert spantrees.shorten("abcdef", 2) == "a…"
    assert spantrees.shorten("abcdef", 1) == "…"


def test_the_span_column_gets_its_room_before_the_timeline() -> None:
    """(span, timeline) for the columns never cut taking 49 of the width."""
    assert spantrees.fit(80, fixed=49, wanted=90) == (31, 0)
    assert spantrees.fit(100, fixed=49, wanted=90) == (spantrees.SPAN_MIN, 13)
    assert spantrees.fit(120, fixed=49, wanted=90) == (45, 24)
    assert spantrees.fit(200, fixed=49, wanted=90) == (90, 24)
    assert spantrees.fit(80, fixed=49, wanted=20) == (20, 9)
    assert spantrees.fit(60, fixed=49, wanted=90) == (spantrees.SPAN_FLOOR, 0), \
        "too narrow even so: the table is wider than the terminal, never cut"
