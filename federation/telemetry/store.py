"""The span store: one SQLite file, written by the collector only, read by ``fakefleet trace``.

Tables (the schema is created here; readers import :mod:`federation.telemetry.reading`):

- ``spans``: one row per span, keyed by (trace_id, span_id) so that an exporter retrying a batch
  whose answer it lost stores nothing twice; indexed by start time as well.
- ``resources``: the resource attributes of each process once, not once per span.
- ``traces``: one summary row per trace (first start, last end, span count, root name,
  services, clusters, and the batch that last brought a span of it), kept up to date in the same
  transaction as the spans, so that listing recent traces and enforcing retention never scan
  every span.

The file is in WAL mode: readers never block the writer. Each :meth:`SpanStore.write` is one
transaction, committed (and, unless ``fsync=False``, synced) before it returns, so a batch the
collector acknowledged survives a crash of the collector or of the machine.

A :class:`SpanStore` is not thread-safe: the collector gives it a thread of its own.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from collections import defaultdict
from pathlib import Path

from federation.telemetry.decoding import SpanRow

SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY,
    attributes TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    name TEXT NOT NULL,
    service TEXT NOT NULL,
    cluster TEXT,
    kind INTEGER NOT NULL,
    scope TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL,
    status_message TEXT NOT NULL,
    attributes TEXT NOT NULL,
    resource_id INTEGER NOT NULL REFERENCES resources (id),
    events TEXT NOT NULL,
    links TEXT NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_by_start ON spans (start_ns);
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    span_count INTEGER NOT NULL,
    root_name TEXT,
    root_start_ns INTEGER,
    first_name TEXT NOT NULL,
    services TEXT NOT NULL,
    clusters TEXT NOT NULL,
    arrival INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns);
CREATE INDEX IF NOT EXISTS traces_by_end ON traces (end_ns);
"""
#: After the ``arrival`` column exists (a store of an earlier version gets it when opened).
ARRIVAL_INDEX = "CREATE INDEX IF NOT EXISTS traces_by_arrival ON traces (arrival, start_ns)"
#: The WAL is cut back to this size after a checkpoint: without a limit it keeps the size of
#: the largest batch it ever held, outside the bound on the database.
WAL_LIMIT = 16 << 20


@dataclasses.dataclass(frozen=True)
class Retention:
    """How much the store keeps: whole traces, those whose spans arrived first dropped first."""

    max_spans: int = 500_000
    """About 265 MB of realistic spans (10 attributes each; see docs/tracing.md)."""
    max_age_ns: int = 24 * 3600 * 10**9
    """A trace whose last span ended longer ago than this is dropped."""
    max_bytes: int = 512 << 20
    """Pages of the database in use: twice what ``max_spans`` realistic spans take, so that
    this bound holds where spans are much larger than usual."""


@dataclasses.dataclass(frozen=True)
class Dropped:
    traces: int = 0
    spans: int = 0


class StoreError(Exception):
    """The span store cannot be opened; the message says what to do."""


class SpanStore:
    """The writing side of the store."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only takes on a new file
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute(f"PRAGMA synchronous = {'FULL' if fsync else 'OFF'}")
            self._db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT}")
            self._db.executescript(SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(traces)")}
            if "arrival" not in columns:  # the traces stored before are the first to go
                self._db.execute(
                    "ALTER TABLE traces ADD COLUMN arrival INTEGER NOT NULL DEFAULT 0")
            self._db.execute(ARRIVAL_INDEX)
            (self._arrival,) = self._db.execute(
                "SELECT COALESCE(MAX(arrival), 0) FROM traces").fetchone()
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise StoreError(f"{path} is not a usable span store ({error}): move it aside "
                             f"(the spans in it are lost to fakefleet trace) and start the "
                             f"collector again") from error
        self._resources: dict[str, int] = {}

    def close(self) -> None:
        self._db.close()

    def write(self, rows: list[SpanRow]) -> int:
        """Store ``rows`` in one transaction; returns how many were new (not retries)."""
        by_trace: dict[str, list[SpanRow]] = defaultdict(list)
        for row in rows:
            by_trace[row.trace_id].append(row)
        added = 0
        # A counter, not the clock: it neither goes back nor trusts the senders' times.
        self._arrival += 1
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for trace_id, spans in by_trace.items():
                cursor = self._db.executemany(
                    "INSERT OR IGNORE INTO spans VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(r.trace_id, r.span_id, r.parent_span_id, r.name, r.service, r.cluster,
                      r.kind, r.scope, r.start_ns, r.end_ns, r.status_code, r.status_message,
                      r.attributes, self._resource_id(r.resource), r.events, r.links)
                     for r in spans])
                added += cursor.rowcount
                self._summarize(trace_id, spans, cursor.rowcount)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            self._resources.clear()  # ids handed out in the rolled-back transaction are gone
            raise
        return added

    def _resource_id(self, attributes: str) -> int:
        known = self._resources.get(attributes)
        if known is None:
            self._db.execute("INSERT OR IGNORE INTO resources (attributes) VALUES (?)",
                             (attributes,))
            (known,) = self._db.execute("SELECT id FROM resources WHERE attributes = ?",
                                        (attributes,)).fetchone()
            self._resources[attributes] = known
        return known

    def _summarize(self, trace_id: str, spans: list[SpanRow], added: int) -> None:
        """Fold ``spans`` into the trace's summary row. Minimum, maximum and set union give
        the same result when a retried span comes again; only the count needs ``added``."""
        old = self._db.execute(
            "SELECT start_ns, end_ns, span_count, root_name, root_start_ns, first_name, "
            "services, clusters FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
        first = min(spans, key=lambda r: r.start_ns)
        roots = [r for r in spans if r.parent_span_id is None]
        root = min(roots, key=lambda r: r.start_ns) if roots else None
        start, end = first.start_ns, max(r.end_ns for r in spans)
        first_name = first.name
        root_name, root_start = (root.name, root.start_ns) if root else (None, None)
        services = {r.service for r in spans}
        clusters = {r.cluster for r in spans if r.cluster}
        count = added
        if old is not None:
            if old[0] <= start:
                start, first_name = old[0], old[5]
            end = max(end, old[1])
            count += old[2]
            if old[3] is not None and (root_start is None or old[4] <= root_start):
                root_name, root_start = old[3], old[4]
            services.update(json.loads(old[6]))
            clusters.update(json.loads(old[7]))
        self._db.execute(
            "INSERT OR REPLACE INTO traces VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (trace_id, start, end, count, root_name, root_start, first_name,
             json.dumps(sorted(services)), json.dumps(sorted(clusters)), self._arrival))

    def enforce(self, retention: Retention, *, now_ns: int) -> Dropped:
        """Drop whole traces: those that ended before ``now - max_age``, then the ones whose
        spans arrived least recently, as many as it takes to keep at most ``max_spans`` spans
        and ``max_bytes`` of pages in use.

        By arrival, not by the spans' own times: a sender whose clock runs ahead (by less than
        the decoder refuses) cannot push out the traces that came after its own.
        """
        aged = dict(self._db.execute(
            "SELECT trace_id, span_count FROM traces WHERE end_ns < ?",
            (max(0, now_ns - retention.max_age_ns),)).fetchall())
        dropped = self._drop(aged, self._spans() - retention.max_spans)
        # The bytes of one trace are not known until it is gone: drop about as many spans as
        # the excess holds at the average size, measure again, and so on.
        while (spans := self._spans()) and (size := self.size()) > retention.max_bytes:
            more = self._drop({}, math.ceil((size - retention.max_bytes) * spans / size))
            dropped = Dropped(dropped.traces + more.traces, dropped.spans + more.spans)
        return dropped

    def _drop(self, doomed: dict[str, int], excess: int) -> Dropped:
        """Delete the traces of ``doomed``, and then the least recently arrived ones until
        ``excess`` spans more are gone (at least one trace when ``excess`` is positive)."""
        doomed = dict(doomed)
        excess -= sum(doomed.values())
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if excess > 0:
                for trace_id, count in self._db.execute(
                        "SELECT trace_id, span_count FROM traces ORDER BY arrival, start_ns"):
                    if excess <= 0:
                        break
                    if trace_id not in doomed:
                        doomed[trace_id] = count
                        excess -= count
            ids = [(trace_id,) for trace_id in doomed]
            self._db.executemany("DELETE FROM spans WHERE trace_id = ?", ids)
            self._db.executemany("DELETE FROM traces WHERE trace_id = ?", ids)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        if doomed:
            # Freed pages go back to the file system. Through execute(), the statement is
            # stepped once, and each step frees one page; a script runs it to the end.
            self._db.executescript("PRAGMA incremental_vacuum;")
        return Dropped(traces=len(doomed), spans=sum(doomed.values()))

    def size(self) -> int:
        """Bytes of the database's pages in use (the free ones are reused before it grows)."""
        (pages,) = self._db.execute("PRAGMA page_count").fetchone()
        (free,) = self._db.execute("PRAGMA freelist_count").fetchone()
        (page,) = self._db.execute("PRAGMA page_size").fetchone()
        return int((pages - free) * page)

    def _spans(self) -> int:
        (total,) = self._db.execute(
            "SELECT COALESCE(SUM(span_count), 0) FROM traces").fetchone()
        return int(total)

    def span_count(self) -> int:
        (total,) = self._db.execute("SELECT COUNT(*) FROM spans").fetchone()
        return int(total)
