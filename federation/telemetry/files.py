"""Where the embedded collector keeps its files, and the ``collector.json`` it publishes.

    <state>/collector/spans.db (+ -wal, -shm)   the span store (federation.telemetry.store)
    <state>/collector/collector.json            pid and address of the running collector
    <state>/collector/port                      the port it had, kept across restarts
    <state>/collector/collector.log             its log, when the daemon supervises it

The collector writes ``collector.json`` once it serves; the daemon, ``fakefleet status`` and
``fakefleet trace`` read it. This module is the contract between them: the names are spelled
here only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from primitives.files import Named, ProcessDirectory, Published


@dataclasses.dataclass(frozen=True)
class CollectorFiles(ProcessDirectory):
    """The paths of a collector's directory: ``collector.json``, ``collector.log`` and
    these."""

    process = "collector"
    database = Named("spans.db")
    port = Named("port")

    @classmethod
    def of(cls, state_dir: Path) -> CollectorFiles:
        """The collector's directory inside a fakefleet state directory."""
        return cls(state_dir / "collector")


@dataclasses.dataclass(frozen=True)
class CollectorInfo(Published):
    """What a running collector publishes (``collector.json``)."""

    pid: int
    address: str
    """``host:port`` of its OTLP/gRPC receiver (plaintext, loopback)."""

    @property
    def endpoint(self) -> str:
        """The address as ``OTEL_EXPORTER_OTLP_ENDPOINT`` spells it (``http``: no TLS)."""
        return f"http://{self.address}"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])
