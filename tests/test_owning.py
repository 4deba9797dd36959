"""What of a pod's status the engine owns, and the verdict on what the watch shows (pure)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from operators.engine import owning
from operators.engine.owning import Verdict
from operators.engine.pods import PodFacts, life_from_status, render_status

GOLDEN = Path(__file__).parent / "golden" / "pods"


def _written() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every status the engine wrote in the golden cases, with the pod it wrote it for."""
    found = []
    for path in sorted(GOLDEN.glob("*.json")):
        case = json.loads(path.read_text())
        pod = copy.deepcopy(case["pod"])
        pod["metadata"]["uid"] = "uid-1"
        for index, write in enumerate(case["writes"]):
            if "status" in write:
                found.append((f"{path.stem}#{index}", pod, write["status"]))
    return found


@pytest.mark.parametrize(("case", "pod", "status"), _written(), ids=lambda v: str(v)[:60])
def test_a_status_the_engine_wrote_agrees_with_the_life_read_back_from_it(
        case: str, pod: dict[str, Any], status: dict[str, Any]) -> None:
    """A restarted engine adopts each pod from its status: what it would write again owns
    the same, so adopting writes nothing back."""
    facts = PodFacts({**pod, "status": status})
    facts.host_ip = status.get("hostIP", "")
    again = render_status(facts, life_from_status(facts, status), "")
    assert owning.judge(owning.owned(status), owning.owned(again), node_ready=True) is \
        Verdict.AGREES, case


RUNNING = {"phase": "Running",
           "conditions": [{"type": "Ready", "status": "True"},
                          {"type": "ContainersReady", "status": "True"},
                          {"type": "PodScheduled", "status": "True"}],
           "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                  "state": {"running": {"startedAt": "2026-01-01T00:00:01Z"}}}]}


def _with(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(RUNNING), **changes}


def test_marked_not_ready_is_healed_on_a_ready_node_and_waits_on_another() -> None:
    marked = copy.deepcopy(RUNNING)
    marked["conditions"][0]["status"] = "False"
    ours = owning.owned(RUNNING)
    assert owning.judge(owning.owned(marked), ours, node_ready=True) is Verdict.HEAL
    assert owning.judge(owning.owned(marked), ours, node_ready=False) is Verdict.WAIT


def test_times_messages_and_others_conditions_are_not_the_engine_s() -> None:
    other = copy.deepcopy(RUNNING)
    other["conditions"][0]["lastTransitionTime"] = "2026-01-01T00:09:00Z"
    other["conditions"][0]["message"] = "said otherwise"
    other["conditions"][2]["status"] = "False"  # PodScheduled: the scheduler's
    other["conditions"].append({"type": "DisruptionTarget", "status": "True"})
    other["containerStatuses"][0]["state"]["running"]["startedAt"] = "2026-01-01T00:05:00Z"
    assert owning.owned(other) == owning.owned(RUNNING)


@pytest.mark.parametrize("end", ["Failed", "Succeeded"])
def test_an_end_another_writer_gave_is_adopted_whatever_the_node(end: str) -> None:
    ended = owning.owned(_with(phase=end))
    assert owning.judge(ended, owning.owned(RUNNING), node_ready=False) is Verdict.ADOPT


def test_an_end_of_the_engine_s_own_shown_living_again_is_written_back() -> None:
    ours = owning.owned(_with(phase="Succeeded"))
    assert owning.judge(owning.owned(RUNNING), ours, node_ready=True) is Verdict.HEAL
    assert owning.judge(owning.owned(_with(phase="Failed")), ours, node_ready=True) is \
        Verdict.ADOPT, "one end for another: the API's stands"
