"""Golden tests of the pod lifecycle, run by the real engine: a pod in, its status writes out.

Each ``tests/golden/pods/<case>.json`` holds an input pod, the pool's pod behaviour, and the
writes the engine made for the pod (status patches and the final delete), each with its time
since the pod was created. The engine runs on an in-memory API server and a fake clock, through
the same code as in production: stages from ``stages.yaml``, the delay queue, the dispatcher,
the status PATCH. Regenerate after an intended change with
``UPDATE_GOLDEN=1 pytest tests/test_stages.py`` and review the diff.

Also here: the stage schema, validated on load with errors that say what to fix.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest

from operators.api.stages import StageError, load_lifecycle
from operators.engine import pods as podlife
from operators.engine import stages
from operators.engine.pods import PodFacts
from tests.engine.harness import PODS, POOLS, Fleet, pool

GOLDEN = Path(__file__).parent / "golden" / "pods"
HORIZON = 900.0  # seconds of engine life per case
MAX_WRITES = 8


def manifest(name: str, *, annotations: dict[str, str] | None = None, restart: str = "Always",
             init: list[dict[str, str]] | None = None, job: bool = False,
             gates: list[str] | None = None, deleting: int | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default",
                                "annotations": annotations or {}}
    if job:
        metadata["ownerReferences"] = [{"kind": "Job", "name": "j", "apiVersion": "batch/v1",
                                        "uid": "job-uid", "controller": True}]
    if deleting is not None:
        metadata["deletionTimestamp"] = f"2026-01-01T00:00:{deleting:02d}Z"
        metadata["deletionGracePeriodSeconds"] = deleting
    spec: dict[str, Any] = {"nodeName": "cpu-0", "restartPolicy": restart,
                            "containers": [{"name": "main", "image": "app:1"}]}
    if init:
        spec["initContainers"] = init
    if gates:
        spec["readinessGates"] = [{"conditionType": g} for g in gates]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
            "status": {}}


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "deployment-pod-runs-until-deleted": (manifest("web"), {"startDelay": "1s"}),
    "job-pod-succeeds-after-pool-run-time": (manifest("job", restart="Never", job=True),
                                             {"jobRunTime": "30s"}),
    "annotated-run-time-and-exit-code-fails": (
        manifest("bad", restart="Never",
                 annotations={"fakefleet.dev/run-time": "90s", "fakefleet.dev/exit-code": "3"}),
        {}),
    "failing-container-crash-loops": (
        manifest("crash", restart="OnFailure",
                 annotations={"fakefleet.dev/run-time": "5s", "fakefleet.dev/exit-code": "1"}),
        {}),
    "init-containers-in-order-sidecar-keeps-running": (
        manifest("inits", init=[{"name": "setup", "image": "busybox"},
                                {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]),
        {"initDelay": "2s"}),
    "start-delay-with-jitter-is-seeded": (
        manifest("jittery", annotations={"fakefleet.dev/seed": "42"}),
        {"startDelay": "1s", "startJitter": "4s"}),
    "readiness-gate-holds-ready-back": (manifest("gated", gates=["example.com/lb"]), {}),
    "deleted-pod-finalised-after-capped-grace": (manifest("doomed", deleting=30),
                                                 {"terminationGracePeriodCap": "2s"}),
}


async def run(pod: dict[str, Any], behaviour: dict[str, Any]) -> list[dict[str, Any]]:
    """The writes the engine makes for ``pod``, with their times since it was created."""
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1, pods=behaviour))
    async with fleet.running(fleet.engine()):
        await fleet.clock.advance(1)
        fleet.member.requests.clear()
        created = fleet.clock.now()
        fleet.member.put(PODS, pod)
        path = f"{PODS}/{pod['metadata']['name']}"
        writes: list[dict[str, Any]] = []
        while fleet.clock.now() - created < HORIZON and len(writes) < MAX_WRITES:
            await fleet.clock.advance(0.5)
            for request in fleet.member.requests:
                at = round(fleet.clock.now() - created, 1)
                if request.method == "PATCH" and request.path == f"{path}/status":
                    writes.append({"at": at, "status": request.json()["status"]})
                elif request.method == "DELETE" and request.path == path:
                    writes.append({"at": at, "deleted": request.json()})
            fleet.member.requests.clear()
    return writes


@pytest.mark.parametrize("case", sorted(CASES))
async def test_golden(case: str) -> None:
    pod, behaviour = CASES[case]
    got = await run(pod, behaviour)
    path = GOLDEN / f"{case}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps({"pod": pod, "pods": behaviour, "writes": got},
                                   indent=2) + "\n")
    expected = json.loads(path.read_text())
    assert expected["pod"] == pod, "the golden input changed: regenerate and review"
    assert got == expected["writes"]


def _stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _crash_loop(runs: list[float]) -> list[float]:
    """The waits of a container that runs each of ``runs`` seconds, then exits, restarted by
    the kubelet's rule (crash_wait at each exit, next_backoff at each restart)."""
    backoff, restarted, now, waits = 0.0, None, 1_000_000.0, []
    for run in runs:
        now += run
        wait = podlife.crash_wait(backoff, restarted, now)
        waits.append(wait)
        now += wait
        backoff, restarted = podlife.next_backoff(wait), now
    return waits


def test_backoff_restarts_at_once_then_doubles_and_caps_like_the_kubelet() -> None:
    """Defect: the wait came from the cumulative restartCount. kuberuntime's doBackOff
    restarts a container with no back-off entry at once, then waits 10 s doubling to 300 s."""
    assert _crash_loop([1.0] * 9) == [0, 10, 20, 40, 80, 160, 300, 300, 300]


def test_backoff_starts_over_after_600_s_of_running_like_the_kubelet() -> None:
    """Defect: a pod hit by an exit every ~8 minutes waited longer each time (restartCount
    never falls); the kubelet forgets the entry of a container that ran over 600 s."""
    assert _crash_loop([1.0, 1.0, 1.0, 601.0, 1.0, 599.0]) == [0, 10, 20, 0, 10, 20]


def test_backoff_is_read_back_from_the_status_the_engine_wrote() -> None:
    """A restarted engine goes on as its kubelets (which did not restart) would."""
    running = {"state": {"running": {"startedAt": _stamp(1040.4)}},
               "lastState": {"terminated": {"startedAt": _stamp(1000), "finishedAt":
                                            _stamp(1020)}}}
    assert podlife.backoff_from_status(running) == (40.0, _stamp(1040.4))
    waiting = {"state": {"waiting": {"reason": "CrashLoopBackOff",
                                     "message": "back-off 1m20s restarting failed"}},
               "lastState": {"terminated": {"startedAt": _stamp(1000)}}}
    assert podlife.backoff_from_status(waiting) == (80.0, _stamp(1000))
    assert podlife.backoff_from_status({"state": {"running": {"startedAt": _stamp(1)}}}) == \
        (0.0, "")
    assert [podlife.go_duration(s) for s in (0, 10, 80, 300)] == ["0s", "10s", "1m20s", "5m0s"]


def test_bad_annotations_are_ignored_with_a_problem_that_names_the_fix() -> None:
    pod = manifest("bad", annotations={"fakefleet.dev/run-time": "ninety",
                                       "fakefleet.dev/exit-code": "300"})
    pod["metadata"]["uid"] = "u"
    facts = PodFacts(pod)
    assert (facts.run_time, facts.exit_code) == (None, 0)
    assert len(facts.problems) == 2
    assert "fakefleet.dev/run-time" in facts.problems[0]
    assert "such as 90s" in facts.problems[0]
    assert "exit code from 0 to 255" in facts.problems[1]


# -- the stage schema -------------------------------------------------------------------------

def lifecycle(stage: str) -> str:
    return f"apiVersion: fakefleet.dev/v1alpha1\nkind: Lifecycle\nstages:\n{stage}"


@pytest.mark.parametrize(("stage", "fragments"), [
    ("- {name: a, resource: Pod, selector: {matchExpressions: [{key: finit, operator: In, "
     "values: [x]}]}, effect: {delete: true}}",
     ["stages.0.selector", "'finit' is not a pod field", "finite", "labels[KEY]"]),
    ("- {name: a, resource: Pod, selector: {matchExpressions: [{key: finite, operator: In}]}, "
     "effect: {delete: true}}", ["operator In needs values"]),
    ("- {name: a, resource: Pod, effect: {exit: {}, phase: Running}}",
     ["one outcome, not phase and exit"]),
    ("- {name: a, resource: Pod, effect: {}}", ["the effect does nothing"]),
    ("- {name: a, resource: Pod, delay: {source: forever}, effect: {delete: true}}",
     ["stages.0.delay.source", "'startDelay'", "'runTime'"]),
    ("- {name: a, resource: Pod, delay: {duration: 5 minutes}, effect: {delete: true}}",
     ["stages.0.delay.duration", "should match pattern", "5 minutes"]),
    ("- {name: a, resource: Node, selector: {phases: [Running]}, effect: {heartbeat: false}}",
     ["phases are for pods"]),
    ("- {name: a, resource: Node, delay: {source: runTime}, effect: {heartbeat: false}}",
     ["node stages take a fixed duration"]),
    ("- {name: a, resource: Cat, effect: {}}", ["stages.0", "'Pod'", "'Node'"]),
    ("- {name: a, resource: Pod, effect: {exit: {exitCode: 300}}}",
     ["exitCode", "less than or equal to 255"]),
    ("- {name: a, resource: Pod, effect: {delete: true}}\n"
     "- {name: a, resource: Pod, effect: {delete: true}}", ["two stages are named 'a'"]),
])
def test_invalid_stages_are_refused_naming_the_place_and_the_fix(
        stage: str, fragments: list[str]) -> None:
    with pytest.raises(StageError) as raised:
        load_lifecycle(lifecycle(stage), source="my-stages.yaml")
    message = str(raised.value)
    assert message.startswith("my-stages.yaml is invalid")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_every_field_a_selector_may_name_can_be_read() -> None:
    from operators.api import stages as api
    assert set(stages.POD_VIEWS) == set(api.POD_FIELDS)
    assert set(stages.NODE_VIEWS) == set(api.NODE_FIELDS)


def test_the_default_lifecycle_loads_and_covers_pods_and_nodes() -> None:
    rules = stages.default_rules()
    assert [rule.name for rule in rules.pods] == [
        "pod-delete", "pod-claims-pending", "pod-init", "pod-ready", "pod-complete",
        "pod-restart"]
    assert "node-status" in [rule.name for rule in rules.nodes]


async def test_a_custom_stage_makes_pods_stuck_pending_with_the_kubelet_s_reason() -> None:
    """A new behaviour is a new stage, not new engine code: pods labelled so never start."""
    custom = load_lifecycle(lifecycle("""
- name: image-pull-fails
  resource: Pod
  selector:
    phases: [Pending]
    matchExpressions:
    - {key: "labels[chaos]", operator: In, values: [bad-image]}
  effect:
    wait: {reason: ImagePullBackOff, message: 'Back-off pulling image "app:1"'}
    events: [{type: Warning, reason: Failed, message: 'Failed to pull image "app:1"'}]
- name: pod-ready
  resource: Pod
  selector:
    phases: [Pending]
    matchExpressions: [{key: "labels[chaos]", operator: DoesNotExist}]
  effect: {phase: Running}
"""))
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(rules=stages.compile_lifecycle(custom))):
        await fleet.clock.advance(1)
        stuck = manifest("stuck")
        stuck["metadata"]["labels"] = {"chaos": "bad-image"}
        fleet.member.put(PODS, stuck)
        fleet.member.put(PODS, manifest("fine"))
        await fleet.clock.advance(5)
    waiting = fleet.pod("stuck")["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "app:1"'}
    assert fleet.pod("stuck")["status"]["phase"] == "Pending"
    assert fleet.pod("fine")["status"]["phase"] == "Running"
    events = fleet.member.objects("/api/v1/namespaces/default/events")
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [("Failed", "stuck")]
