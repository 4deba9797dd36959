"""The span store on its own: retention, summaries, and the tree built from stored spans."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest

from federation.telemetry import reading
from federation.telemetry.decoding import SpanRow
from federation.telemetry.reading import StoredSpan
from federation.telemetry.store import SCHEMA, Retention, SpanStore, StoreError

T0 = 1_780_000_000 * 10**9
#: 2100-01-01T00:00:00Z.
Y2100 = 4_102_444_800 * 10**9
KEEP = 10**18


def row(trace: int, span: int, *, parent: int | None = None, start: int = 0, end: int = 1,
        name: str = "s", service: str = "svc", cluster: str | None = None) -> SpanRow:
    return SpanRow(trace_id=f"{trace:032x}", span_id=f"{span:016x}",
                   parent_span_id=None if parent is None else f"{parent:016x}", name=name,
                   service=service, cluster=cluster, kind=1, scope="", start_ns=T0 + start,
                   end_ns=T0 + end, status_code=0, status_message="", attributes="{}",
                   resource=json.dumps({"service.name": service}), events="[]", links="[]")


def stored(span: int, parent: int | None, start: int) -> StoredSpan:
    return StoredSpan(trace_id="1" * 32, span_id=f"{span:016x}",
                      parent_span_id=None if parent is None else f"{parent:016x}",
                      name=f"s{span}", service="svc", cluster=None, kind=1, start_ns=start,
                      end_ns=start + 1, status_code=0, status_message="", attributes={},
                      events=[], links=[])


def test_summaries_follow_spans_that_arrive_out_of_order(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "spans.db", fsync=False)
    store.write([row(1, 2, parent=1, start=5, end=9, name="child", service="engine",
                     cluster="west")])
    with reading.open_store(tmp_path / "spans.db") as db:
        (early,) = reading.recent(db, 5)
    assert (early.root_name, early.first_name, early.span_count) == (None, "child", 1)
    store.write([row(1, 1, start=0, end=20, name="root", service="hub"),
                 row(1, 3, parent=1, start=2, end=3, name="other", service="engine",
                     cluster="east")])
    with reading.open_store(tmp_path / "spans.db") as db:
        (later,) = reading.recent(db, 5)
    store.close()
    assert (later.root_name, later.first_name, later.span_count) == ("root", "root", 3)
    assert (later.services, later.clusters) == (["engine", "hub"], ["east", "west"])
    assert (later.start_ns, later.duration_ns) == (T0, 20)


def test_retention_by_count_drops_whole_traces_oldest_first(tmp_path: Path) -> None:
    store = SpanStore(tmp_path / "spans.db", fsync=False)
    for trace in range(1, 6):  # traces of 1, 2, ..., 5 spans, each later than the one before
        store.write([row(trace, span, start=trace * 100 + span) for span in range(1, trace + 1)])
    dropped = store.enforce(Retention(max_spans=9, max_age_ns=10**18), now_ns=T0)
    assert (dropped.traces, dropped.spans) == (3, 6)
    assert store.span_count() == 9
    with reading.open_store(tmp_path / "spans.db") as db:
        assert [t.span_count for t in reading.recent(db, 10)] == [5, 4]
    assert store.enforce(Retention(max_spans=9, max_age_ns=10**18), now_ns=T0).traces == 0
    store.close()


def test_traces_go_in_the_order_their_spans_arrived_not_by_their_dates(tmp_path: Path) -> None:
    """A trace dated 2100 (past the decoder: a sender whose clock is off by less than its
    limit would do the same) goes before the real ones that came after it, also after a
    restart of the collector; a trace that keeps receiving spans stays."""
    store = SpanStore(tmp_path / "spans.db", fsync=False)
    store.write([row(1, 1, start=0)])
    store.write([dataclasses.replace(row(2, 1), start_ns=Y2100, end_ns=Y2100 + 1),
                 dataclasses.replace(row(2, 2), start_ns=Y2100, end_ns=Y2100 + 5)])
    store.write([row(3, 1, start=10)])
    store.close()
    store = SpanStore(tmp_path / "spans.db", fsync=False)
    store.write([row(4, 1, start=20)])
    store.write([row(1, 2, start=1)])  # trace 1 is alive: it arrived last
    dropped = store.enforce(Retention(max_spans=4, max_age_ns=KEEP), now_ns=T0)
    assert (dropped.traces, dropped.spans) == (1, 2)
    with reading.open_store(tmp_path / "spans.db") as db:
        assert {t.trace_id[-1] for t in reading.recent(db, 10)} == {"1", "3", "4"}
    assert store.enforce(Retention(max_spans=2, max_age_ns=KEEP), now_ns=T0).traces == 2
    with reading.open_store(tmp_path / "spans.db") as db:
        assert [t.trace_id[-1] for t in reading.recent(db, 10)] == ["1"]
    store.close()


def test_the_store_keeps_within_its_bytes_dropping_what_arrived_first(tmp_path: Path) -> None:
    """Spans of 2 KiB of attributes each, ten times more than a bound of 1 MiB holds: the
    pages in use and the file stay within it, and what is left is the newest, and about as
    much as fits."""
    store = SpanStore(tmp_path / "spans.db", fsync=False)
    retention = Retention(max_spans=10**9, max_age_ns=KEEP, max_bytes=1 << 20)
    fat = json.dumps({"payload": "x" * 2048})
    for trace in range(1, 501):
        store.write([dataclasses.replace(row(trace, span, start=trace), attributes=fat)
                     for span in (1, 2)])
        if trace % 50 == 0:
            over = store.size() > retention.max_bytes
            store.enforce(retention, now_ns=T0)
            assert store.size() <= retention.max_bytes
            assert not over or store.size() > 0.8 * retention.max_bytes, "dropped too many"
    store.close()
    with sqlite3.connect(tmp_path / "spans.db") as db:
        (pages,), (page,) = (db.execute(f"PRAGMA {p}").fetchone() for p in
                             ("page_count", "page_size"))
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert pages * page <= retention.max_bytes
    assert (tmp_path / "spans.db").stat().st_size <= retention.max_bytes
    with reading.open_store(tmp_path / "spans.db") as db:
        kept = sorted(int(t.trace_id, 16) for t in reading.recent(db, 1000))
    assert kept == list(range(kept[0], 501))


def test_a_store_of_an_earlier_version_drops_its_old_traces_first(tmp_path: Path) -> None:
    """Its traces have no arrival: they count as older than any that arrives now."""
    path = tmp_path / "spans.db"
    with sqlite3.connect(path) as old:
        old.executescript(SCHEMA.replace(",\n    arrival INTEGER NOT NULL", ""))
        old.execute("INSERT INTO traces VALUES ('a', ?, ?, 1, 'old', ?, 'old', '[]', '[]')",
                    (Y2100, Y2100, Y2100))
        old.execute("INSERT INTO spans VALUES ('a', 's', NULL, 'old', 'svc', NULL, 1, '', ?, ?, "
                    "0, '', '{}', 1, '[]', '[]')", (Y2100, Y2100))
    old.close()
    store = SpanStore(path, fsync=False)
    store.write([row(2, 1)])
    assert store.enforce(Retention(max_spans=1, max_age_ns=KEEP), now_ns=T0).traces == 1
    with reading.open_store(path) as db:
        assert [t.root_name for t in reading.recent(db, 10)] == ["s"]
    store.close()


def test_the_tree_puts_spans_without_their_parent_at_the_top_and_breaks_loops() -> None:
    spans = [stored(1, None, 0), stored(2, 1, 1), stored(3, 99, 2),  # 99 never arrived
             stored(4, 5, 3), stored(5, 4, 4),  # a loop: each names the other as parent
             stored(6, 6, 5)]  # its own parent
    top = reading.tree(spans)
    assert [(n.span.name, n.orphan, [c.span.name for c in n.children]) for n in top] == [
        ("s1", False, ["s2"]), ("s3", True, []), ("s6", True, []), ("s4", True, ["s5"])]


def test_a_file_that_is_not_a_store_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "spans.db"
    path.write_bytes(b"not a database, just some bytes " * 200)
    with pytest.raises(StoreError, match=r"is not a usable span store .* move it aside"):
        SpanStore(path, fsync=False)
    with pytest.raises(reading.TraceStoreError, match="cannot be read"), \
            reading.open_store(path):
        pass
