"""An in-process collector on a free loopback port, and real SDK exporters pointed at it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from federation.telemetry.collector import CollectorSettings, serve
from federation.telemetry.files import CollectorInfo
from federation.telemetry.store import Retention


@contextlib.asynccontextmanager
async def running_collector(state_dir: Path, *, retention: Retention | None = None,
                            retention_interval: float = 30.0,
                            listen: str = "127.0.0.1:0") -> AsyncIterator[CollectorInfo]:
    stop = asyncio.Event()
    ready: asyncio.Future[CollectorInfo] = asyncio.get_running_loop().create_future()
    settings = CollectorSettings(state_dir=state_dir, listen=listen,
                                 retention=retention or Retention(),
                                 retention_interval=retention_interval, fsync=False)
    task = asyncio.create_task(serve(settings, stop_flag=stop, ready=ready.set_result))
    done, _ = await asyncio.wait([task, ready],  # type: ignore[type-var]
                                 return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    try:
        yield ready.result()
    finally:
        stop.set()
        await task


def provider(info: CollectorInfo, service: str, cluster: str | None = None) -> TracerProvider:
    """A TracerProvider exporting to the collector as a process of ``service`` would."""
    attributes = {"service.name": service}
    if cluster:
        attributes["k8s.cluster.name"] = cluster
    made = TracerProvider(resource=Resource.create(attributes))
    made.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=info.endpoint)))
    return made


async def flush(providers: Sequence[TracerProvider]) -> None:
    """Export everything buffered. The SDK's exporter blocks, and the collector serves on this
    event loop: so the export runs on a thread."""
    for one in providers:
        assert await asyncio.to_thread(one.force_flush, 10_000)
        await asyncio.to_thread(one.shutdown)
