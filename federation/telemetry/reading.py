"""The reading side of the span store: recent traces, one trace's spans, and its tree.

Readers open the file read-only, so ``fakefleet trace`` can never change or lock what the
collector writes (WAL: the collector goes on writing while a reader reads). Building the tree
is pure: :func:`tree` takes spans, returns nodes.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class TraceStoreError(Exception):
    """The store cannot answer: it is missing, or the trace asked for is unknown or ambiguous.
    The message says what to do."""


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    root_name: str | None
    """The name of the earliest span without a parent; None while no root span has arrived."""
    first_name: str
    services: list[str]
    clusters: list[str]
    span_count: int
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclasses.dataclass(frozen=True)
class StoredSpan:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    service: str
    cluster: str | None
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    status_message: str
    attributes: dict[str, Any]
    events: list[dict[str, Any]]
    links: list[dict[str, Any]]

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclasses.dataclass
class Node:
    """A span in the tree: ``orphan`` when it names a parent that is not in the store (not
    arrived yet, or from a process that did not sample or export it)."""

    span: StoredSpan
    children: list[Node] = dataclasses.field(default_factory=list)
    orphan: bool = False


@contextmanager
def open_store(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the store at ``path``."""
    if not path.exists():
        raise TraceStoreError(
            f"no span store at {path}: start fakefleet with its collector ('fakefleet up', "
            f"without FAKEFLEET_COLLECTOR=off), or give the --state-dir it runs in")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        db.execute("SELECT 1 FROM traces LIMIT 1")
    except sqlite3.Error as error:
        raise TraceStoreError(f"the span store {path} cannot be read ({error}): is it a "
                              f"fakefleet collector's spans.db?") from error
    try:
        yield db
    finally:
        db.close()


_SUMMARY = ("SELECT trace_id, root_name, first_name, services, clusters, span_count, start_ns, "
            "end_ns FROM traces")


def _summary(row: tuple[Any, ...]) -> TraceSummary:
    return TraceSummary(trace_id=row[0], root_name=row[1], first_name=row[2],
                        services=json.loads(row[3]), clusters=json.loads(row[4]),
                        span_count=row[5], start_ns=row[6], end_ns=row[7])


def recent(db: sqlite3.Connection, limit: int) -> list[TraceSummary]:
    """The traces that started last, newest first."""
    return [_summary(row) for row in db.execute(
        f"{_SUMMARY} ORDER BY start_ns DESC LIMIT ?", (limit,))]


def summary(db: sqlite3.Connection, trace_id: str) -> TraceSummary:
    """One trace's summary row (``trace_id`` in full, as :func:`resolve` returns it)."""
    row = db.execute(f"{_SUMMARY} WHERE trace_id = ?", (trace_id,)).fetchone()
    if row is None:
        raise TraceStoreError(f"no trace {trace_id} in the store (retention may have dropped "
                              f"it): 'fakefleet trace ls' lists the stored ones")
    return _summary(row)


def resolve(db: sqlite3.Connection, prefix: str) -> str:
    """The full id of the one trace whose id starts with ``prefix``."""
    wanted = prefix.strip().lower()
    if not wanted or any(c not in "0123456789abcdef" for c in wanted) or len(wanted) > 32:
        raise TraceStoreError(
            f"{prefix!r} is not a trace id: give the 32 hex digits 'fakefleet trace ls' shows, "
            f"or enough of their start to be unique")
    matches = [row[0] for row in db.execute(
        "SELECT trace_id FROM traces WHERE trace_id >= ? AND trace_id < ? LIMIT 6",
        (wanted, wanted + "g"))]
    if not matches:
        raise TraceStoreError(f"no trace starts with {wanted!r}: 'fakefleet trace ls' lists "
                              f"the stored ones (old ones are dropped by retention)")
    if len(matches) > 1:
        shown = ", ".join(matches[:5])
        many = "more than 5" if len(matches) > 5 else str(len(matches))
        raise TraceStoreError(f"{wanted!r} starts {many} traces ({shown}): give more digits")
    return str(matches[0])


def spans(db: sqlite3.Connection, trace_id: str) -> list[StoredSpan]:
    """Every stored span of a trace, earliest first."""
    rows = db.execute(
        "SELECT trace_id, span_id, parent_span_id, name, service, cluster, kind, start_ns, "
        "end_ns, status_code, status_message, attributes, events, links FROM spans "
        "WHERE trace_id = ? ORDER BY start_ns, span_id", (trace_id,))
    return [StoredSpan(trace_id=r[0], span_id=r[1], parent_span_id=r[2], name=r[3],
                       service=r[4], cluster=r[5], kind=r[6], start_ns=r[7], end_ns=r[8],
                       status_code=r[9], status_message=r[10], attributes=json.loads(r[11]),
                       events=json.loads(r[12]), links=json.loads(r[13])) for r in rows]


def tree(found: list[StoredSpan]) -> list[Node]:
    """The spans as a forest, each level earliest first: true roots, and the spans whose
    parent is missing (marked ``orphan``) at the top level beside them."""
    nodes = {span.span_id: Node(span) for span in found}
    top: list[Node] = []
    for span in sorted(found, key=lambda s: (s.start_ns, s.span_id)):
        node = nodes[span.span_id]
        parent = nodes.get(span.parent_span_id) if span.parent_span_id else None
        if parent is not None and parent is not node:
            parent.children.append(node)
        else:
            node.orphan = span.parent_span_id is not None
            top.append(node)
    # Spans that name each other as parents (a broken exporter) reach no root: the earliest
    # of each such loop is cut from its parent and shown at the top, so every span is shown.
    seen: set[str] = set()
    _walk(top, seen)
    for span in sorted(found, key=lambda s: (s.start_ns, s.span_id)):
        if span.span_id not in seen:
            node = nodes[span.span_id]
            assert span.parent_span_id is not None
            nodes[span.parent_span_id].children.remove(node)
            node.orphan = True
            top.append(node)
            _walk([node], seen)
    return top


def _walk(nodes: list[Node], seen: set[str]) -> None:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        seen.add(node.span.span_id)
        stack.extend(node.children)
