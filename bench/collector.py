"""The embedded trace collector's ingest rate and the disk its spans take:

    python -m bench.collector [--exporters 4] [--spans 100000] [--batch 512]
                              [--fsync off|on|both] [--workdir DIR]

The collector runs as ``fakefleet up`` runs it, ``python -m federation.telemetry.collector`` in
its own process, its store in a temporary directory. The exporters are ``--exporters``
concurrent OTLP/gRPC clients (one channel each) in one other process
(``python -m bench.collector exporters ...``), each sending Export requests of ``--batch``
spans (the SDK's BatchSpanProcessor default is 512) back to back, as fast as the collector
answers. The spans are realistic: made by the real SDK (a trace of 16 spans, a root and
its descendants, each with 10 attributes: strings, ints, a bool, a double), encoded by the
SDK's OTLP encoder, then copied with fresh trace and span ids so every span is a new row.
The requests are built before the clock starts: what is timed is the collector's decoding,
storing and committing, not the SDK's encoding.

Measured, with the store synced on each commit (``fsync``, the product's default) and
without (``--unsafe-no-fsync``, what tests and ``fakefleet up --unsafe-no-fsync`` use):

- spans/s: spans sent / seconds from the first request until the last answer;
- the Export call as the exporters saw it (p50, p99);
- size on disk per 10k spans: ``spans.db`` once the collector stopped (its WAL then checkpointed
  into it), divided by the spans it holds;
- the collector's CPU seconds and peak RSS.

The harness checks that the store holds exactly the spans that were sent.
Results also go to ``bench/results/collector-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context
from rich.console import Console
from rich.table import Table

from bench.engines import RESULTS
from bench.faults import percentile
from bench.hub import Process
from bench.terminating import sigterm_interrupts
from federation.telemetry.collector import SERVICE
from federation.telemetry.files import CollectorFiles, CollectorInfo

TRACE_SPANS = 16
TIMEOUT = 60.0


# -- the exporters process -------------------------------------------------------------------

def template() -> ExportTraceServiceRequest:
    """One trace of the SDK's own making, as its OTLP exporter would send it."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(
        {"service.name": "fakefleet-engine", "k8s.cluster.name": "west"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("fakefleet.engine")
    parents = []
    for index in range(TRACE_SPANS):
        context = set_span_in_context(parents[(index - 1) // 3]) if index else None
        span = tracer.start_span(f"engine.patch_nodes.{index % 4}", context=context, attributes={
            "k8s.cluster.name": "west", "fakefleet.pool": "west-h100",
            "fakefleet.batch.size": 64, "fakefleet.batch.index": index,
            "fakefleet.fault": "GPUXid", "fakefleet.xid": 79, "fakefleet.dry_run": False,
            "fakefleet.latency_ms": 12.5, "k8s.node.name": f"west-h100-{index}",
            "http.response.status_code": 200})
        parents.append(span)
    for span in reversed(parents):
        span.end()
    provider.shutdown()
    return encode_spans(memory.get_finished_spans())


def requests(total: int, batch: int) -> list[bytes]:
    """``total`` spans in requests of ``batch``, every span with ids of its own."""
    base = template()
    [resource_spans] = base.resource_spans
    [scope_spans] = resource_spans.scope_spans
    spans = sorted(scope_spans.spans, key=lambda s: s.start_time_unix_nano)
    index_of = {span.span_id: index for index, span in enumerate(spans)}
    made: list[bytes] = []
    serial = 0
    while serial < total:
        request = ExportTraceServiceRequest()
        out = request.resource_spans.add()
        out.resource.CopyFrom(resource_spans.resource)
        scope = out.scope_spans.add()
        scope.scope.CopyFrom(scope_spans.scope)
        for _ in range(min(batch, total - serial)):
            original: Span = spans[serial % TRACE_SPANS]
            trace = serial // TRACE_SPANS + 1
            span = scope.spans.add()
            span.CopyFrom(original)
            span.trace_id = trace.to_bytes(16, "big")
            span.span_id = (serial + 1).to_bytes(8, "big")
            if original.parent_span_id:
                parent = trace * TRACE_SPANS - TRACE_SPANS + index_of[original.parent_span_id]
                span.parent_span_id = (parent + 1).to_bytes(8, "big")
            serial += 1
        made.append(request.SerializeToString())
    return made


async def export_all(address: str, exporters: int, bodies: list[bytes]) -> dict[str, Any]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    latencies: list[float] = []

    async def exporter() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            export = channel.unary_unary(
                f"/{SERVICE}/Export", request_serializer=lambda b: b,
                response_deserializer=ExportTraceServiceResponse.FromString)
            await channel.channel_ready()
            while not queue.empty():
                body = queue.get_nowait()
                sent = time.perf_counter()
                answer = await export(body, timeout=TIMEOUT)
                latencies.append(time.perf_counter() - sent)
                assert not answer.partial_success.rejected_spans, answer

    started = time.perf_counter()
    await asyncio.gather(*(exporter() for _ in range(exporters)))
    return {"seconds": time.perf_counter() - started, "latencies": latencies}


def exporters_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.collector exporters")
    parser.add_argument("--address", required=True)
    parser.add_argument("--exporters", type=int, required=True)
    parser.add_argument("--spans", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args(argv)
    bodies = requests(args.spans, args.batch)
    result = asyncio.run(export_all(args.address, args.exporters, bodies))
    result["requestBytes"] = sum(len(b) for b in bodies)
    args.report.write_text(json.dumps(result))


# -- the harness ---------------------------------------------------------------------------

async def bench(*, fsync: bool, exporters: int, spans: int, batch: int,
                workdir: Path) -> dict[str, Any]:
    files = CollectorFiles(workdir / ("fsync" if fsync else "no-fsync"))
    files.root.mkdir(parents=True)
    collector = Process(
        [sys.executable, "-m", "federation.telemetry.collector", "--state-dir", str(files.root),
         "--retention-spans", str(spans * 2), *([] if fsync else ["--unsafe-no-fsync"])],
        files.log)
    await collector.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while (info := CollectorInfo.read(files.info)) is None or info.pid != collector.pid:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the collector did not serve; see {files.log}")
            await asyncio.sleep(0.05)
        report = files.root / "exporters.json"
        cpu_before = collector.cpu_seconds()
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.collector", "exporters", "--address", info.address,
            "--exporters", str(exporters), "--spans", str(spans), "--batch", str(batch),
            "--report", str(report))
        if await sender.wait() != 0:
            raise RuntimeError("the exporters process failed")
        cpu = collector.cpu_seconds() - cpu_before
        peak_rss = collector.memory_mib("VmHWM")
    finally:
        await collector.stop()
    sent = json.loads(report.read_text())
    with sqlite3.connect(files.database) as db:
        (stored,) = db.execute("SELECT COUNT(*) FROM spans").fetchone()
    if stored != spans:
        raise RuntimeError(f"the store holds {stored} spans, {spans} were sent")
    size = files.database.stat().st_size
    latencies = sent["latencies"]
    return {
        "fsync": fsync, "exporters": exporters, "spans": spans, "batch": batch,
        "seconds": round(sent["seconds"], 2),
        "spansPerSecond": round(spans / sent["seconds"]),
        "exportP50Ms": round(percentile(latencies, 0.5) * 1000, 1),
        "exportP99Ms": round(percentile(latencies, 0.99) * 1000, 1),
        "requestBytesPerSpan": round(sent["requestBytes"] / spans),
        "diskMiBPer10kSpans": round(size / spans * 10_000 / 2**20, 2),
        "collectorCpuSeconds": round(cpu, 1),
        "collectorPeakRssMib": round(peak_rss, 1),
    }


def report(results: list[dict[str, Any]], console: Console) -> None:
    first = results[0]
    table = Table(title=f"collector: {first['spans']} spans from {first['exporters']} "
                        f"exporters in batches of {first['batch']} (10 attributes each)")
    table.add_column("")
    for result in results:
        table.add_column("fsync" if result["fsync"] else "no fsync", justify="right")
    rows = [("spans/s", "spansPerSecond"), ("seconds", "seconds"),
            ("Export p50 (ms)", "exportP50Ms"), ("Export p99 (ms)", "exportP99Ms"),
            ("OTLP bytes per span", "requestBytesPerSpan"),
            ("disk per 10k spans (MiB)", "diskMiBPer10kSpans"),
            ("collector CPU (s)", "collectorCpuSeconds"),
            ("collector peak RSS (MiB)", "collectorPeakRssMib")]
    for label, key in rows:
        table.add_row(label, *(str(result[key]) for result in results))
    console.print(table)


def main() -> None:
    if sys.argv[1:2] == ["exporters"]:
        exporters_main(sys.argv[2:])
        return
    sigterm_interrupts()
    parser = argparse.ArgumentParser(prog="python -m bench.collector")
    parser.add_argument("--exporters", type=int, default=4)
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--fsync", choices=["off", "on", "both"], default="both")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the stores and logs here (default: a removed temporary "
                             "directory)")
    args = parser.parse_args()
    console = Console()
    modes = {"off": [False], "on": [True], "both": [True, False]}[args.fsync]
    with tempfile.TemporaryDirectory(prefix="bench-collector-") as temporary:
        workdir = args.workdir or Path(temporary)
        results = [asyncio.run(bench(fsync=fsync, exporters=args.exporters, spans=args.spans,
                                     batch=args.batch, workdir=workdir)) for fsync in modes]
    report(results, console)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"collector-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
