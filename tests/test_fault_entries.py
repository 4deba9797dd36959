"""A FakeCluster entry's life as :mod:`operators.api.injections` spells it: injected once by id,
removed by the plan; and the nodes a pool holds deleted. (A fault set's life:
tests/test_fault_sets.py.)"""

from __future__ import annotations

from operators.api.injections import (
    FaultEntry,
    hold_node,
    inject_entry,
    read_entries,
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


def test_the_plan_removes_an_entry_and_the_annotation_goes_with_the_last() -> None:
    text = render_entries([FaultEntry(id="a"), FaultEntry(id="b")])
    entries, problem = read_entries({keys.FAULTS: text or ""})
    assert problem == ""
    assert [e.id for e in remove_entry(entries, "a")] == ["b"]
    assert render_entries(remove_entry([FaultEntry(id="a")], "a")) is None, \
        "the last entry gone: the annotation goes"


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
