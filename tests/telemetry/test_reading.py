"""The span store on its own: retention, summaries, and the tree built from stored spans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from federation.telemetry import reading
from federation.telemetry.decoding import SpanRow
from federation.telemetry.reading import StoredSpan
from federation.telemetry.store import Retention, SpanStore, StoreError

T0 = 1_780_000_000 * 10**9


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
