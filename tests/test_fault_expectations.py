"""Expectations on how the system under test reacted: paths, matchers, picking, deadlines."""

from __future__ import annotations

from typing import Any

import pytest

from operators.faults.expectations import (
    Condition,
    Count,
    Deadline,
    Expectation,
    ExpectationError,
    Field,
    Objects,
    Result,
    Taint,
    resolve,
    verdict,
)
from operators.faults.targets import Victim
from primitives.selectors import LabelSelector

NODE: dict[str, Any] = {
    "metadata": {"name": "gpu-3", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    "spec": {"unschedulable": True, "taints": [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
    "status": {"allocatable": {"nvidia.com/gpu": "7"},
               "conditions": [{"type": "Ready", "status": "Unknown",
                               "reason": "NodeStatusUnknown"}]},
}


def pod(name: str, node: str, phase: str = "Running", app: str = "train") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "labels": {"app": app}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


@pytest.mark.parametrize(("path", "value"), [
    ("metadata.name", "gpu-3"),
    ("metadata.labels['nvidia.com/gpu.product']", "NVIDIA-H100-80GB-HBM3"),
    ('status.allocatable["nvidia.com/gpu"]', "7"),
    ("spec.taints[1].effect", "NoExecute"),
    ("spec.taints[key=node.kubernetes.io/unreachable].effect", "NoExecute"),
    ("spec.unschedulable", True),
    ("status.conditions[type=Ready].reason", "NodeStatusUnknown"),
    ("spec.taints[7].effect", None),
    ("spec.taints[key=absent].effect", None),
    ("metadata.name.deeper", None),
    ("status.missing", None),
])
def test_paths_read_maps_lists_and_list_items(path: str, value: object) -> None:
    assert resolve(NODE, path) == value


@pytest.mark.parametrize("path", ["", ".status", "status..phase", "status[", "status.phase["])
def test_a_path_that_cannot_be_read_is_refused_with_the_syntax(path: str) -> None:
    with pytest.raises(ExpectationError, match="path"):
        Field(path, "x")


def test_field_equals_compares_as_yaml_spells_values() -> None:
    assert Field("spec.unschedulable", True).matches(NODE)
    assert Field("spec.unschedulable", "true").matches(NODE)
    assert Field("status.allocatable['nvidia.com/gpu']", 7).matches(NODE)
    assert not Field("status.allocatable['nvidia.com/gpu']", 8).matches(NODE)


def test_condition_and_taint_matchers() -> None:
    assert Condition("Ready", "Unknown").matches(NODE)
    assert Condition("Ready", "Unknown", reason="NodeStatusUnknown").matches(NODE)
    assert not Condition("Ready", "Unknown", reason="KubeletNotReady").matches(NODE)
    assert not Condition("MemoryPressure", "False").matches(NODE)
    assert Taint("node.kubernetes.io/unreachable").matches(NODE)
    assert Taint("node.kubernetes.io/unreachable", "NoExecute").matches(NODE)
    assert not Taint("node.kubernetes.io/unreachable", "NoSchedule").matches(NODE)
    assert not Taint("node.kubernetes.io/unreachable").matches({"spec": {}})


def test_objects_are_picked_by_namespace_name_selector_and_victims() -> None:
    pods = [pod("a", "gpu-3"), pod("b", "gpu-4"), pod("c", "gpu-3", app="other"),
            pod("d", "gpu-5")]
    victims = [Victim("west", "Node", "gpu-3"), Victim("east", "Node", "gpu-4"),
               Victim("west", "Pod", "d", "ml")]
    on_nodes = Objects("v1", "Pod", namespace="ml", selector=LabelSelector({"app": "train"}),
                       on_victim_nodes=True)
    assert [p["metadata"]["name"] for p in on_nodes.pick("west", pods, victims)] == ["a"]
    hit = Objects("v1", "Pod", victims=True)
    assert [p["metadata"]["name"] for p in hit.pick("west", pods, victims)] == ["d"]
    named = Objects("v1", "Pod", namespace="ml", name="b")
    assert [p["metadata"]["name"] for p in named.pick("east", pods, [])] == ["b"]


def test_no_running_pod_on_a_node_hit_is_a_count_of_zero() -> None:
    expectation = Expectation(
        "moved away", 30.0,
        Objects("v1", "Pod", selector=LabelSelector({"app": "train"}), on_victim_nodes=True),
        Count(where=Field("status.phase", "Running"), equals=0))
    victims = [Victim("west", "Node", "gpu-3")]
    before = [pod("a", "gpu-3"), pod("b", "gpu-4")]
    after = [pod("a", "gpu-3", phase="Failed"), pod("b", "gpu-4"), pod("c", "gpu-5")]
    assert not expectation.holds(expectation.objects.pick("west", before, victims))
    assert expectation.holds(expectation.objects.pick("west", after, victims))


def test_per_object_matchers_need_an_object_and_every_object() -> None:
    tainted = Expectation("tainted", 60.0, Objects("v1", "Node", victims=True),
                          Taint("node.kubernetes.io/unreachable"))
    assert not tainted.holds([])
    assert tainted.holds([NODE])
    assert not tainted.holds([NODE, {"metadata": {"name": "gpu-4"}, "spec": {}}])


def test_count_bounds() -> None:
    three = [pod(str(i), "n") for i in range(3)]
    assert Count(equals=3).holds(three)
    assert Count(at_least=2, at_most=3).holds(three)
    assert not Count(at_least=4).holds(three)
    assert not Count(at_most=2).holds(three)
    assert Count(where=Field("status.phase", "Pending"), equals=0).holds(three)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Count(), "count: give equals, atLeast or atMost"),
    (lambda: Count(at_least=-1), "must not be negative"),
    (lambda: Objects("v1", "Node", on_victim_nodes=True),
     "onVictimNodes and offVictimNodes: only for kind Pod"),
    (lambda: Objects("v1", "Node", victims=True, cluster="host"), "use cluster: member"),
    (lambda: Expectation("e", 0.0, Objects("v1", "Node"), Count(equals=1)),
     "within must be a positive duration"),
])
def test_bad_expectations_are_refused_naming_the_field(make: object, message: str) -> None:
    with pytest.raises(ExpectationError, match=message):
        make()  # type: ignore[operator]


def test_a_deadline_passes_at_the_first_observation_that_holds() -> None:
    expectation = Expectation("e", 60.0, Objects("v1", "Node"), Count(equals=1))
    deadline = Deadline(expectation, injected_at=100.0)
    assert deadline.observe(110.0, holds=False) is None
    assert deadline.observe(142.5, holds=True) == Result("e", "Passed", 42.5)
    assert deadline.observe(200.0, holds=False) == Result("e", "Passed", 42.5), "decided once"


def test_a_deadline_fails_when_it_passes_without_holding() -> None:
    deadline = Deadline(Expectation("e", 60.0, Objects("v1", "Node"), Count(equals=1)), 100.0)
    assert deadline.observe(159.0, holds=False) is None
    assert deadline.observe(160.0, holds=False) == Result("e", "Failed", 60.0)
    assert deadline.observe(161.0, holds=True) == Result("e", "Failed", 60.0)
    late = Deadline(Expectation("e", 60.0, Objects("v1", "Node"), Count(equals=1)), 100.0)
    assert late.observe(175.0, holds=True) == Result("e", "Failed", 60.0), "seen too late"


def test_the_verdict_follows_the_results() -> None:
    passed, failed = Result("a", "Passed", 1.0), Result("b", "Failed", 60.0)
    assert verdict([passed, passed]) == "Passed"
    assert verdict([passed, None]) is None
    assert verdict([None, failed]) == "Failed"
    assert verdict([]) == "Passed"


def test_rescheduled_pods_are_counted_off_the_nodes_hit() -> None:
    expectation = Expectation(
        "rescheduled", 120.0,
        Objects("v1", "Pod", selector=LabelSelector({"app": "train"}), off_victim_nodes=True),
        Count(where=Field("status.phase", "Running"), at_least=2))
    victims = [Victim("west", "Node", "gpu-3")]
    before = [pod("a", "gpu-3"), pod("b", "gpu-4")]
    after = [pod("b", "gpu-4"), pod("c", "gpu-5")]
    assert not expectation.holds(expectation.objects.pick("west", before, victims))
    assert expectation.holds(expectation.objects.pick("west", after, victims))


def test_on_and_off_the_nodes_hit_exclude_each_other() -> None:
    with pytest.raises(ExpectationError, match="not both"):
        Objects("v1", "Pod", on_victim_nodes=True, off_victim_nodes=True)
    with pytest.raises(ExpectationError, match="only for kind Pod"):
        Objects("v1", "Node", off_victim_nodes=True)
