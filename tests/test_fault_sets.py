"""A fault set as :mod:`operators.api.faultsets` spells it, once for the plan and the engine:
named from its occurrence, chunked by count and bytes, its targets grouped by their stages, read
back as written (or refused, saying why); turned to its recovery only from inject, marked done
only from the state its targets finished; and what the plan owes an occurrence's sets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from operators.api import faultsets
from operators.api.faultplans import Fault
from operators.api.faultsets import SetError
from operators.faults import catalogue
from primitives import keys

ID = "default/p-01234567/step/0"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LATER = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
XID = Fault(type="GPUXid", xid=79, gpus=2)


def written(*members: tuple[str, int], chunk: int = 0) -> dict[str, Any]:
    """The set of nodes with their GPU counts, as the API answers it."""
    body = faultsets.render(ID, "Node", chunk, [
        (name, catalogue.node_entry(ID, XID, gpus=gpus)) for name, gpus in members],
        traceparent=TRACE)
    body["metadata"].update(uid="u-1", resourceVersion="7",
                            creationTimestamp="2026-01-01T00:00:00Z")
    return body


def test_a_set_is_named_from_its_occurrence_and_labelled_for_all_its_chunks() -> None:
    body = written(("a", 8), chunk=2)
    digest = faultsets.digest(ID)
    assert body["metadata"]["name"] == f"fault-{digest}-2"
    assert body["metadata"]["namespace"] == "fakefleet-system"
    assert body["metadata"]["labels"] == {keys.FAULT_SET: digest}
    assert faultsets.selector(ID) == f"fakefleet.dev/fault-set={digest}"
    assert faultsets.set_name(ID, 0) != faultsets.set_name(f"{ID}x", 0)
    assert len(body["metadata"]["name"]) <= 63


def test_targets_with_the_same_stages_share_one_entry_and_read_back_as_written() -> None:
    found = faultsets.read(written(("a", 8), ("b", 4), ("c", 8)))
    assert (found.id, found.kind, found.state, found.traceparent) == (ID, "Node", "inject",
                                                                       TRACE)
    assert [group.targets for group in found.groups] == [("a", "c"), ("b",)]
    assert found.targets == 3
    first = found.groups[0].entry
    assert (first.id, first.state, first.traceparent) == (ID, "inject", TRACE)
    assert first.stages == catalogue.node_entry(ID, XID, gpus=8).stages
    assert found.groups[1].entry.stages == catalogue.node_entry(ID, XID, gpus=4).stages


def test_chunks_keep_the_order_and_bound_count_and_bytes() -> None:
    names = [f"n-{index}" for index in range(10)]
    assert faultsets.chunks(names, most=4) == [range(0, 4), range(4, 8), range(8, 10)]
    long = ["x" * 100] * 5
    assert faultsets.chunks(long, size=250) == [range(0, 2), range(2, 4), range(4, 5)]
    assert faultsets.chunks(["x" * 300], size=250) == [range(0, 1)], "one alone always fits"
    assert faultsets.chunks([]) == []
    # The most pods of one injection, with the longest names, fit under etcd's limit.
    pods = [faultsets.pod_target("n" * 63, "p" * 253, "u" * 36)] * 5000
    parts = faultsets.chunks(pods)
    assert len(parts) == 4
    for part in parts:
        body = faultsets.render(ID, "Pod", 0, [
            (pods[i], catalogue.pod_entry(ID, Fault(type="CrashLoop"))) for i in part])
        assert len(json.dumps(body)) < 1 << 20


@pytest.mark.parametrize(("change", "says"), [
    ({"id": ""}, "data.id is missing"),
    ({"kind": "Cluster"}, "data.kind is 'Cluster'"),
    ({"state": "later"}, "data.state is 'later'"),
    ({"entries": "{"}, "data.entries is not a list of fault entries"),
    ({"entries": '[{"stages": [], "targets": "a"}]'}, "targets are not a list"),
    ({"entries": '[{"stages": [{"name": "x"}], "targets": []}]'}, "data.entries"),
])
def test_a_configmap_that_is_no_set_is_refused_saying_why(change: dict[str, str],
                                                          says: str) -> None:
    body = written(("a", 8))
    body["data"].update(change)
    with pytest.raises(SetError, match=says):
        faultsets.read(body)


def test_a_pod_target_names_its_uid() -> None:
    target = faultsets.pod_target("ml", "train-0", "0f3c")
    assert target == "ml/train-0/0f3c"
    assert faultsets.pod_uid(target) == "0f3c"
    body = faultsets.render(ID, "Pod", 0, [("ml/train-0", catalogue.pod_entry(
        ID, Fault(type="CrashLoop")))])
    with pytest.raises(SetError, match="namespace/name/uid"):
        faultsets.read(body)


def test_only_an_injected_set_turns_to_its_recovery() -> None:
    found = faultsets.read(written(("a", 8)))
    assert faultsets.recover_patch(found, LATER) == {
        "metadata": {"resourceVersion": "7"},
        "data": {"state": "recover", "traceparent": LATER}}
    assert faultsets.recover_patch(found) == {"metadata": {"resourceVersion": "7"},
                                              "data": {"state": "recover"}}, \
        "an untraced flip keeps the trace it has"
    turned = faultsets.read({**written(("a", 8)), "data": {
        **written(("a", 8))["data"], "state": "recover"}})
    assert faultsets.recover_patch(turned, LATER) is None, "recovering already"
    done = faultsets.read({**written(("a", 8)), "data": {
        **written(("a", 8))["data"], "state": "done"}})
    assert faultsets.recover_patch(done, LATER) is None, "done stays done"


def test_a_set_is_marked_done_only_from_the_state_its_targets_finished() -> None:
    found = faultsets.read(written(("a", 8)))
    assert faultsets.done_patch(found, "inject") == {"metadata": {"resourceVersion": "7"},
                                                     "data": {"state": "done"}}
    assert faultsets.done_patch(found, "recover") is None, "turned meanwhile: not ours to end"
    assert faultsets.done_patch(found, "done") is None


def test_a_recovery_says_what_the_plan_owes_an_occurrence() -> None:
    def state(value: str) -> faultsets.FaultSet:
        body = written(("a", 8))
        body["data"]["state"] = value
        return faultsets.read(body)
    assert faultsets.recovery([]) == "gone"
    assert faultsets.recovery([state("done"), state("inject")]) == "again"
    assert faultsets.recovery([state("done"), state("recover")]) == "waiting"
    assert faultsets.recovery([state("done"), state("done")]) == "over"
