"""The embedded trace collector of ``fakefleet up``: listed by ``fakefleet status``, handed to
the children as their OTLP endpoint, restarted when it dies, and read by ``fakefleet trace``.

Spans come from this test process through the real SDK and OTLP exporter: what the fleet's own
processes will export is the business of the instrumentation, not of the collector.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import set_span_in_context

from e2e.conftest import FAKEFLEET, Fleet, eventually, fakefleet
from federation.telemetry.files import CollectorFiles, CollectorInfo
from operators.controlplane.state import ComponentState, StateDir, read_host


def trace_cli(state: Path, *args: str) -> str:
    """``fakefleet trace ARGS`` on the collector of ``state``; its standard output."""
    done = subprocess.run([str(FAKEFLEET), "trace", *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def component(state: Path, name: str) -> ComponentState:
    host = read_host(StateDir(state))
    assert host is not None
    [found] = [c for c in host.components if c.name == name]
    return found


def export_plan_trace(endpoint: str) -> str:
    """A small trace as a plan's would look: one root, a span per member cluster."""
    provider = TracerProvider(resource=Resource.create(
        {"service.name": "e2e-tracing", "k8s.cluster.name": "west"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("e2e")
    with tracer.start_as_current_span("plan.run") as root:
        for cluster in ("west", "east"):
            with tracer.start_as_current_span("step.inject",
                                              context=set_span_in_context(root),
                                              attributes={"k8s.cluster.name": cluster}):
                pass
    assert provider.force_flush(10_000)
    provider.shutdown()
    return f"{root.get_span_context().trace_id:032x}"


def test_the_collector_runs_and_fakefleet_trace_shows_what_it_stored(fleet: Fleet) -> None:
    state = fleet.state
    status = fakefleet("status", "--state-dir", str(state)).stdout
    [row] = [line for line in status.splitlines() if " collector " in line]
    assert " ok " in row, status
    collector = component(state, "collector")
    info = CollectorInfo.read(CollectorFiles.of(state).info)
    assert info is not None
    assert (collector.pid, collector.port) == (info.pid, info.port)

    operator = component(state, "operator")
    environ = Path(f"/proc/{operator.pid}/environ").read_bytes().split(b"\0")
    if "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ:  # else the user's endpoint wins
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT={info.endpoint}".encode() in environ
        assert b"OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in environ

    trace_id = export_plan_trace(info.endpoint)
    listed = json.loads(trace_cli(state, "ls", "-o", "json", "--limit", "50"))
    [found] = [t for t in listed if t["traceId"] == trace_id]
    assert (found["root"], found["spans"], found["clusters"]) == ("plan.run", 3, ["east", "west"])
    shown = trace_cli(state, "show", trace_id[:12])
    assert "plan.run" in shown
    assert shown.count("└─ step.inject") + shown.count("├─ step.inject") == 2


def test_a_killed_collector_comes_back_on_its_port_with_its_spans(fleet: Fleet) -> None:
    state = fleet.state
    before = CollectorInfo.read(CollectorFiles.of(state).info)
    assert before is not None
    trace_id = export_plan_trace(before.endpoint)
    os.kill(before.pid, signal.SIGKILL)

    def back() -> CollectorInfo | None:
        info = CollectorInfo.read(CollectorFiles.of(state).info)
        return info if info is not None and info.pid != before.pid else None

    after: CollectorInfo = eventually(back, timeout=20, what="the collector to be restarted")
    assert after.address == before.address  # exporters that were told the address keep it
    eventually(lambda: component(state, "collector").restarts >= 1, timeout=10,
               what="host.json to count the restart")
    listed = json.loads(trace_cli(state, "ls", "-o", "json", "--limit", "50"))
    assert trace_id in [t["traceId"] for t in listed]
    assert export_plan_trace(after.endpoint) in trace_cli(state, "ls", "--limit", "50")
