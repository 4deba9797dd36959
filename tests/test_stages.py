"""Golden tests of the pod lifecycle: a pod in, the stages it goes through out.

Each ``tests/golden/pods/<case>.json`` holds an input pod and pool timing, and the expected
sequence of (stage, delay, resulting status). The lifecycle is run purely, on a fake clock.
Regenerate after an intended change with ``UPDATE_GOLDEN=1 pytest tests/test_stages.py`` and
review the diff.
"""

from __future__ import annotations

import datetime
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from operators.engine import stages
from operators.engine.pods import PodFacts, render_status, render_warning
from operators.engine.stages import Phase, Timing

GOLDEN = Path(__file__).parent / "golden" / "pods"
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
MAX_STEPS = 8


def pod(name: str, *, annotations: dict[str, str] | None = None, restart: str = "Always",
        init: list[dict[str, str]] | None = None, job: bool = False,
        gates: list[str] | None = None, deleting: float | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}",
                                "creationTimestamp": "2026-01-01T00:00:00Z",
                                "annotations": annotations or {}}
    if job:
        metadata["ownerReferences"] = [{"kind": "Job", "name": "j", "apiVersion": "batch/v1"}]
    if deleting is not None:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = deleting
    spec: dict[str, Any] = {"nodeName": "n-0", "restartPolicy": restart,
                            "containers": [{"name": "main", "image": "app:1"}]}
    if init:
        spec["initContainers"] = init
    if gates:
        spec["readinessGates"] = [{"conditionType": g} for g in gates]
    return {"metadata": metadata, "spec": spec, "status": {}}


CASES: dict[str, tuple[dict[str, Any], Timing]] = {
    "deployment-pod-runs-until-deleted": (pod("web"), Timing(start_delay=1.0)),
    "job-pod-succeeds-after-pool-run-time": (pod("job", restart="Never", job=True),
                                             Timing(job_run_time=30.0)),
    "annotated-run-time-and-exit-code-fails": (
        pod("bad", restart="Never",
            annotations={"fakefleet.dev/run-time": "90s", "fakefleet.dev/exit-code": "3"}),
        Timing()),
    "failing-container-crash-loops": (
        pod("crash", restart="OnFailure",
            annotations={"fakefleet.dev/run-time": "5s", "fakefleet.dev/exit-code": "1"}),
        Timing()),
    "init-containers-in-order-sidecar-keeps-running": (
        pod("inits", init=[{"name": "setup", "image": "busybox"},
                           {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]),
        Timing(init_delay=2.0)),
    "start-delay-with-jitter-is-seeded": (
        pod("jittery", annotations={"fakefleet.dev/seed": "42"}),
        Timing(start_delay=1.0, start_jitter=4.0)),
    "readiness-gate-holds-ready-back": (pod("gated", gates=["example.com/lb"]), Timing()),
    "deleted-pod-finalised-after-capped-grace": (pod("doomed", deleting=30.0),
                                                 Timing(grace_cap=2.0)),
}


def run(manifest: dict[str, Any], timing: Timing) -> list[dict[str, Any]]:
    facts = PodFacts(manifest)
    facts.host_ip = "172.16.0.1"
    addresses = iter(f"10.128.0.{n}" for n in range(2, 255))
    clock = START
    trail: list[dict[str, Any]] = []
    for _ in range(MAX_STEPS):
        stage = stages.match(facts, Phase(facts.phase))
        if stage is None:
            break
        rng = random.Random(f"0:{facts.seed or facts.namespace + '/' + facts.name}")
        delay = stages.delay(stage, facts, timing, rng)
        clock += datetime.timedelta(seconds=delay)
        entry: dict[str, Any] = {"stage": stage.name, "delay": round(delay, 3)}
        if stage.step is stages.Step.DELETE:
            trail.append(entry)
            break
        now = clock.strftime("%Y-%m-%dT%H:%M:%SZ")
        stages.advance(facts, stage.step, now, allocate=lambda _: next(addresses))
        entry["phase"] = facts.phase
        entry["status"] = render_status(facts, now)
        trail.append(entry)
    return trail


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    manifest, timing = CASES[case]
    got = run(manifest, timing)
    path = GOLDEN / f"{case}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps({"pod": manifest, "timing": timing.__dict__, "stages": got},
                                   indent=2) + "\n")
    expected = json.loads(path.read_text())
    assert expected["pod"] == manifest, "the golden input changed: regenerate and review"
    assert got == expected["stages"]


def test_unknown_stage_condition_is_refused() -> None:
    broken = stages.Stage("typo", frozenset({Phase.RUNNING}), frozenset({"finit"}),
                          stages.Timer.RUN, stages.Step.EXIT)
    with pytest.raises(ValueError, match="unknown conditions"):
        stages.validate([broken])


def test_backoff_doubles_and_caps_like_the_kubelet() -> None:
    facts = PodFacts(pod("b"))
    restart = next(s for s in stages.POD_STAGES if s.step is stages.Step.RESTART)
    waits = []
    for restarts in (1, 2, 3, 6, 9):
        facts.restarts = restarts
        waits.append(stages.delay(restart, facts, Timing(), random.Random(0)))
    assert waits == [10, 20, 40, 300, 300]


def test_bad_annotations_are_ignored_with_a_warning_that_names_the_fix() -> None:
    facts = PodFacts(pod("bad", annotations={"fakefleet.dev/run-time": "ninety",
                                             "fakefleet.dev/exit-code": "three"}))
    assert (facts.run_time, facts.exit_code) == (None, 0)
    assert len(facts.problems) == 2
    event = render_warning(facts, facts.problems[0], "2026-01-01T00:00:05Z")
    assert (event["type"], event["reason"]) == ("Warning", "InvalidAnnotation")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                                       "name": "bad", "uid": "uid-bad"}
    assert "fakefleet.dev/run-time" in event["message"]
    assert "such as 90s" in event["message"]
    assert "fakefleet.dev/exit-code" in facts.problems[1]
    assert PodFacts(pod("good", annotations={"fakefleet.dev/run-time": "90s"})).problems == ()
