"""The embedded trace collector: an OTLP/gRPC ``TraceService`` that stores spans in SQLite.

``python -m federation.telemetry.collector --state-dir DIR`` is what ``fakefleet up`` runs;
:func:`serve` is the embeddable core (tests run it in-process on port 0). It listens on
loopback in plaintext (the SDK's exporters reach it as ``http://127.0.0.1:PORT``; nothing but
this host can connect), serves the gRPC health service, and publishes ``collector.json``
(:mod:`federation.telemetry.files`) once it serves.

Each Export is decoded here, stored in one transaction on the store's own thread (the event
loop never waits on SQLite), and answered only once committed: an acknowledged batch is never
lost. A malformed request is refused with INVALID_ARGUMENT naming the field; a batch with some
bad spans (among them spans dated more than a few minutes past the collector's clock) stores
the good ones and answers OTLP's ``partial_success``. Retention, in spans and in bytes, runs
every ``retention_interval`` seconds, not on each insert.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from federation.telemetry.decoding import decode
from federation.telemetry.files import CollectorFiles, CollectorInfo
from federation.telemetry.store import Retention, SpanStore, StoreError
from primitives.clocks import SYSTEM_CLOCK, Clock
from primitives.flags import integer, number
from primitives.tasks import spawn

logger = logging.getLogger(__name__)

SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
#: The SDK's exporter sends batches of 512 spans by default; a bigger limit leaves room for
#: other exporters' larger batches without letting one request fill the memory.
MAX_REQUEST_BYTES = 32 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class CollectorSettings:
    state_dir: Path
    listen: str = "127.0.0.1:0"
    retention: Retention = dataclasses.field(default_factory=Retention)
    retention_interval: float = 30.0
    fsync: bool = True


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The OTLP ``TraceService``: decode, store on the writer thread, answer once committed."""

    def __init__(self, store: SpanStore, writer: concurrent.futures.ThreadPoolExecutor, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._writer = writer
        self._clock = clock

    async def Export(
        self, request: ExportTraceServiceRequest, context: grpc.aio.ServicerContext[
            ExportTraceServiceRequest, ExportTraceServiceResponse],
    ) -> ExportTraceServiceResponse:
        decoded = decode(request, now_ns=int(self._clock.now() * 1e9))
        if decoded.rejections:
            logger.warning("refused %d span(s) of a batch: %s", len(decoded.rejections),
                           decoded.summary())
        if decoded.rejections and not decoded.rows:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(decoded.rejections)} span(s) refused, none stored: {decoded.summary()}")
        if decoded.rows:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._writer, self._store.write, decoded.rows)
            except sqlite3.Error as error:  # a full disk, say: OTLP exporters retry this code
                logger.error("could not store %d span(s): %s", len(decoded.rows), error)
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the span store {self._store.path} cannot take the batch now ({error}): "
                    f"retry later")
        if not decoded.rejections:
            return ExportTraceServiceResponse()
        return ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(
            rejected_spans=len(decoded.rejections),
            error_message=f"{len(decoded.rows)} span(s) stored, "
                          f"{len(decoded.rejections)} refused: {decoded.summary()}"))

    async def export_bytes(self, data: bytes, context: grpc.aio.ServicerContext[
            bytes, ExportTraceServiceResponse]) -> ExportTraceServiceResponse:
        """Export from the raw request: where gRPC decodes it, bytes that are not an
        ExportTraceServiceRequest are answered UNKNOWN, not the INVALID_ARGUMENT that OTLP
        prescribes for a request that must not be retried."""
        try:
            request = ExportTraceServiceRequest.FromString(data)
        except DecodeError as error:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request body ({len(data)} bytes) is not an OTLP "
                f"ExportTraceServiceRequest ({error}): send protobuf-encoded OTLP traces")
        return await self.Export(request, context)  # type: ignore[arg-type]


def _register(receiver: TraceReceiver, server: grpc.aio.Server) -> None:
    """``add_TraceServiceServicer_to_server``, except that the request reaches the receiver
    undecoded (see :meth:`TraceReceiver.export_bytes`)."""
    handler: grpc.RpcMethodHandler[bytes, ExportTraceServiceResponse]
    handler = grpc.unary_unary_rpc_method_handler(
        receiver.export_bytes, request_deserializer=None,
        response_serializer=ExportTraceServiceResponse.SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))


async def _retain(store: SpanStore, writer: concurrent.futures.ThreadPoolExecutor,
                  settings: CollectorSettings, clock: Clock) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await clock.sleep(settings.retention_interval)
        try:
            dropped = await loop.run_in_executor(writer, lambda: store.enforce(
                settings.retention, now_ns=int(clock.now() * 1e9)))
        except Exception:  # a full disk, say: keep serving, try again next time
            logger.exception("retention failed; trying again in %gs",
                             settings.retention_interval)
            continue
        if dropped.traces:
            logger.info("retention dropped %d trace(s), %d span(s)", dropped.traces,
                        dropped.spans)


async def serve(settings: CollectorSettings, *, stop_flag: asyncio.Event,
                ready: Callable[[CollectorInfo], None] | None = None,
                clock: Clock = SYSTEM_CLOCK) -> None:
    """Serve until ``stop_flag`` is set; on return the port is closed and the store too."""
    files = CollectorFiles(settings.state_dir)
    writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="span-store")
    loop = asyncio.get_running_loop()
    store = await loop.run_in_executor(
        writer, lambda: SpanStore(files.database, fsync=settings.fsync))
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
    _register(TraceReceiver(store, writer, clock=clock), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    retaining: asyncio.Task[None] | None = None
    try:
        try:
            port = server.add_insecure_port(settings.listen)
        except RuntimeError as error:  # gRPC's word for "address in use"
            raise OSError(f"the collector cannot listen on {settings.listen} ({error}): "
                          f"free the port or give another --listen") from error
        await server.start()
        for service in ("", SERVICE):
            await checks.set(service, health_pb2.HealthCheckResponse.SERVING)
        info = CollectorInfo(pid=os.getpid(),
                             address=f"{settings.listen.rsplit(':', 1)[0]}:{port}")
        info.write(files.info)
        logger.info("collector serves OTLP/gRPC on %s, spans in %s", info.address,
                    files.database)
        retaining = spawn("retention", functools.partial(_retain, store, writer, settings, clock))
        if ready is not None:
            ready(info)
        await stop_flag.wait()
    finally:
        if retaining is not None:
            retaining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await retaining
        if (published := CollectorInfo.read(files.info)) and published.pid == os.getpid():
            files.info.unlink(missing_ok=True)
        for service in ("", SERVICE):
            await checks.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.stop(grace=2.0)  # answers in flight are committed before they are sent
        await loop.run_in_executor(writer, store.close)
        writer.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m federation.telemetry.collector",
        description="fakefleet's embedded OTLP/gRPC trace collector (spans into SQLite).")
    parser.add_argument("--state-dir", type=Path, required=True,
                        help="where spans.db and collector.json live")
    parser.add_argument("--listen", default="127.0.0.1:0",
                        help="host:port to serve on (default: loopback, a free port); "
                             "plaintext, so keep it on loopback")
    parser.add_argument("--retention-spans", type=integer(1, 10**9), default=Retention.max_spans,
                        help="keep at most this many spans, dropping the traces that arrived "
                             "first, from 1 to 10^9 (default %(default)s)")
    parser.add_argument("--retention-mib", type=integer(1, 1 << 20),
                        default=Retention.max_bytes >> 20,
                        help="keep at most this many MiB of database pages in use, dropping "
                             "the traces that arrived first, from 1 to 2^20 (default "
                             "%(default)s)")
    parser.add_argument("--retention-hours", type=number(0.01, 87_600, "a number of hours"),
                        default=Retention.max_age_ns / 3600e9,
                        help="drop traces that ended longer ago, from 0.01 to 87600 (ten "
                             "years; default %(default)s)")
    parser.add_argument("--retention-interval", type=number(0.1, 3600, "a number of seconds"),
                        default=30.0,
                        help="seconds between retention passes, from 0.1 to 3600 (default "
                             "%(default)s)")
    parser.add_argument("--unsafe-no-fsync", action="store_true",
                        help="do not fsync each batch (tests and benchmarks)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = CollectorSettings(
        state_dir=args.state_dir.resolve(), listen=args.listen,
        retention=Retention(max_spans=args.retention_spans,
                            max_age_ns=int(args.retention_hours * 3600e9),
                            max_bytes=args.retention_mib << 20),
        retention_interval=args.retention_interval, fsync=not args.unsafe_no_fsync)

    async def run() -> None:
        stop_flag = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop_flag.set)
        await serve(settings, stop_flag=stop_flag)

    try:
        asyncio.run(run())
    except (OSError, StoreError) as error:
        logging.getLogger(__name__).error("%s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
