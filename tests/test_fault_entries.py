"""An entry's life as :mod:`operators.api.injections` spells it, once for the plan and the
engine: injected once by id, turned to its recovery only from inject, done by the engine,
removed by the plan; and the nodes a pool holds deleted."""

from __future__ import annotations

from operators.api.injections import (
    FaultEntry,
    done_annotations,
    hold_node,
    inject_entry,
    read_entries,
    recover_entry,
    recovery,
    release_node,
    remove_entry,
    render_entries,
    render_held,
)
from primitives import keys

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LATER = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"


def test_an_entry_written_before_is_kept_as_it_was() -> None:
    first = FaultEntry(id="a", traceparent=TRACE)
    entries = inject_entry([], first)
    assert entries == [first]
    again = inject_entry(entries, FaultEntry(id="a", traceparent=LATER))
    assert again == [first], "a restart injects nothing twice, and keeps the first trace"
    assert [e.id for e in inject_entry(again, FaultEntry(id="b"))] == ["a", "b"]


def test_only_an_injected_entry_turns_to_its_recovery() -> None:
    entries = [FaultEntry(id="a", traceparent=TRACE), FaultEntry(id="b", state="done")]
    flipped = recover_entry(entries, "a", LATER)
    assert [(e.id, e.state, e.traceparent) for e in flipped] == [
        ("a", "recover", LATER), ("b", "done", None)]
    untraced = recover_entry(entries, "a")
    assert untraced[0].traceparent == TRACE, "an untraced flip keeps the trace it has"
    assert recover_entry(flipped, "a", TRACE) == flipped, "recovering already"
    assert recover_entry(entries, "b", TRACE) == entries, "done stays done"


def test_the_engine_marks_done_and_the_plan_removes() -> None:
    text = render_entries([FaultEntry(id="a", state="recover"), FaultEntry(id="b")])
    ended = done_annotations({keys.FAULTS: text or ""}, "a")
    assert ended is not None
    entries, problem = read_entries(ended)
    assert problem == ""
    assert [(e.id, e.state) for e in entries] == [("a", "done"), ("b", "inject")]
    assert done_annotations(ended, "a") is None, "done already: nothing to write"
    assert [e.id for e in remove_entry(entries, "a")] == ["b"]
    assert render_entries(remove_entry([FaultEntry(id="a")], "a")) is None, \
        "the last entry gone: the annotation goes"


def test_a_recovery_says_what_the_plan_owes_the_entry() -> None:
    assert recovery([], "a") == "gone"
    assert recovery([FaultEntry(id="a")], "a") == "again"
    assert recovery([FaultEntry(id="a", state="recover")], "a") == "waiting"
    assert recovery([FaultEntry(id="a", state="done")], "a") == "over"
    assert recovery([FaultEntry(id="b", state="done")], "a") == "gone"


def test_a_pool_holds_and_releases_nodes_by_entry() -> None:
    held = hold_node({}, "a", "n-2")
    held = hold_node(held, "a", "n-1")
    assert held == {"a": ["n-1", "n-2"]}
    assert hold_node(held, "a", "n-1") == held
    held = hold_node(held, "b", "n-1")
    assert release_node(held, "a", "n-1") == {"a": ["n-2"], "b": ["n-1"]}
    released = release_node(release_node(held, "a", "n-1"), "a", "n-2")
    assert render_held(released) == '{"b":["n-1"]}', "an entry that holds nothing is dropped"
    assert release_node({}, "a", "n-1") == {"a": []}
