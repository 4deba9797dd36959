"""What `fakefleet plan watch` shows of a FaultPlan's status, and the exit code it stands for."""

from __future__ import annotations

from typing import Any

import pytest

from operators.faults.progress import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_PASSED,
    ExpectationResult,
    Line,
    changes,
    exit_code,
    finished,
    render,
    results,
    seconds,
    summary,
)

STARTED = "2025-06-01T12:00:00Z"


def injection(state: str = "Scheduled", **fields: Any) -> dict[str, Any]:
    return {"step": "xid", "occurrence": 0, "state": state, "injectAt": 30.0,
            "recoverAt": 150.0, **fields}


def expectation(outcome: str = "Pending", **fields: Any) -> dict[str, Any]:
    return {"name": "tainted", "outcome": outcome, **fields}


def status(phase: str = "Running", verdict: str = "", **fields: Any) -> dict[str, Any]:
    return {"phase": phase, "startedAt": STARTED, "stepsDone": "0/1", "verdict": verdict,
            **fields}


# -- exit codes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "code"), [
    (status("Succeeded", "Passed", stepsDone="1/1"), EXIT_PASSED),
    (status("Failed", "Failed", stepsDone="1/1"), EXIT_FAILED),
    # an expectation failed while steps still run: the verdict cannot become Passed again
    (status("Running", "Failed"), EXIT_FAILED),
    # still running when the watcher gave up: a timeout
    (status("Running"), EXIT_ERROR),
    (status("Pending"), EXIT_ERROR),
    ({}, EXIT_ERROR),
    (None, EXIT_ERROR),
    # ended without a verdict (deleted while running, or the operator wrote none)
    (status("Aborted"), EXIT_ERROR),
    (status("Succeeded"), EXIT_ERROR),
])
def test_exit_code_follows_the_verdict_of_a_finished_plan(
        given: dict[str, Any] | None, code: int) -> None:
    assert exit_code(given) == code


@pytest.mark.parametrize(("given", "over"), [
    (status("Succeeded", "Passed"), True),
    (status("Failed", "Failed"), True),
    (status("Aborted"), True),
    (status("Running", "Failed"), True),
    (status("Running"), False),
    (status("Running", "Passed"), False),
    (status("Pending"), False),
    ({}, False),
])
def test_watching_stops_when_the_plan_ends_or_fails(given: dict[str, Any], over: bool) -> None:
    assert finished(given) is over


# -- lines -------------------------------------------------------------------------------------

def texts(lines: list[Line]) -> list[str]:
    return [line.text for line in lines]


def test_no_status_yet_says_the_operator_has_not_picked_the_plan_up() -> None:
    empties: list[dict[str, Any] | None] = [None, {}]
    for empty in empties:
        [line] = render(empty)
        assert line.key == "plan"
        assert line.text.startswith("Pending: no status yet")
        assert "fakefleet status" in line.text


def test_a_scheduled_injection_shows_when_it_injects_and_recovers() -> None:
    assert texts(render(status(injections=[injection()]))) == [
        f"phase Running, steps 0/1, started {STARTED}",
        "  xid#0 Scheduled; injects at +30s; recovers at +2m30s",
    ]


def test_an_injection_that_waits_for_other_steps_says_so() -> None:
    lines = render(status(injections=[injection(injectAt=None, recoverAt=None)]))
    assert lines[1].text == "  xid#0 Scheduled; waits for the steps in its after"


def test_an_injected_fault_shows_its_targets_and_time() -> None:
    lines = render(status(injections=[injection(
        "Injected", targets=["west/Node//west-h100-3"], injectedAt="2025-06-01T12:00:31Z",
        expectations=[expectation()])]))
    assert texts(lines)[1:] == [
        "  xid#0 Injected; 1 target: west/Node/west-h100-3; injected 2025-06-01T12:00:31Z; "
        "recovers at +2m30s",
        "    xid#0 expect tainted: Pending",
    ]
    assert [line.key for line in lines] == ["plan", "xid#0", "xid#0/tainted"]


def test_many_targets_are_counted_and_the_first_few_named() -> None:
    victims = [f"west/Pod/ml/nccl-{i}:worker" for i in range(5)]
    [_, line] = render(status(injections=[injection("Done", targets=victims, recoverAt=None,
                                                    injectedAt="2025-06-01T12:00:31Z")]))
    assert line.text == ("  xid#0 Done; 5 targets: west/Pod/ml/nccl-0:worker, "
                         "west/Pod/ml/nccl-1:worker, west/Pod/ml/nccl-2:worker, +2 more; "
                         "injected 2025-06-01T12:00:31Z")


def test_a_recovered_injection_shows_both_times() -> None:
    [_, line] = render(status(injections=[injection(
        "Recovered", targets=["west/Cluster//west"], injectedAt="2025-06-01T12:00:30Z",
        recoveredAt="2025-06-01T12:01:00Z")]))
    assert line.text == ("  xid#0 Recovered; 1 target: west/Cluster/west; injected "
                         "2025-06-01T12:00:30Z; recovered 2025-06-01T12:01:00Z")


def test_a_skipped_injection_shows_why() -> None:
    [_, line] = render(status(injections=[injection(
        "Skipped", message="step xid: no FakeCluster named north in namespace default")]))
    assert line.text == ("  xid#0 Skipped; step xid: no FakeCluster named north in "
                         "namespace default")
    assert line.tone == "bad"


def test_expectations_show_outcome_latency_and_message() -> None:
    lines = render(status("Failed", "Failed", injections=[injection("Recovered", expectations=[
        expectation("Passed", latencySeconds=2.14),
        expectation("Failed", name="rescheduled", latencySeconds=120.0,
                    message="2 pods Running on victim nodes, expected 0"),
    ])]))
    assert [(line.text, line.tone) for line in lines[2:]] == [
        ("    xid#0 expect tainted: Passed after 2.14s", "good"),
        ("    xid#0 expect rescheduled: Failed after 2m (2 pods Running on victim nodes, "
         "expected 0)", "bad"),
    ]
    assert lines[0].text == f"phase Failed, steps 0/1, verdict Failed, started {STARTED}"
    assert lines[0].tone == "bad"


def test_a_stalled_plan_shows_the_reason() -> None:
    lines = render(status("Failed", "Failed", conditions=[
        {"type": "Ready", "status": "False", "reason": "Failed"},
        {"type": "Stalled", "status": "True", "reason": "PlanInvalid",
         "message": "the plan cannot run: step xid: no pool h100"}]))
    assert lines[1] == Line("stalled", "stalled: PlanInvalid: the plan cannot run: step xid: "
                                       "no pool h100", "bad")


def test_a_passed_plan_is_good() -> None:
    [line] = render(status("Succeeded", "Passed", stepsDone="1/1"))
    assert line.tone == "good"
    assert line.text == f"phase Succeeded, steps 1/1, verdict Passed, started {STARTED}"


# -- only changes --------------------------------------------------------------------------------

def test_only_lines_that_changed_are_printed_again() -> None:
    first = render(status(injections=[injection(), injection(occurrence=1, injectAt=90.0)]))
    assert changes([], first) == first
    assert changes(first, first) == []

    injected = render(status(injections=[
        injection("Injected", targets=["west/Node//a"], injectedAt="2025-06-01T12:00:30Z",
                  expectations=[expectation()]),
        injection(occurrence=1, injectAt=90.0)]))
    assert texts(changes(first, injected)) == [
        "  xid#0 Injected; 1 target: west/Node/a; injected 2025-06-01T12:00:30Z; "
        "recovers at +2m30s",
        "    xid#0 expect tainted: Pending",
    ]

    passed = render(status(injections=[
        injection("Injected", targets=["west/Node//a"], injectedAt="2025-06-01T12:00:30Z",
                  expectations=[expectation("Passed", latencySeconds=1.5)]),
        injection(occurrence=1, injectAt=90.0)]))
    assert texts(changes(injected, passed)) == ["    xid#0 expect tainted: Passed after 1.5s"]


def test_a_change_of_phase_prints_the_plan_line_alone() -> None:
    running = render(status(injections=[injection("Recovered")]))
    done = render(status("Succeeded", "Passed", stepsDone="1/1",
                         injections=[injection("Recovered")]))
    assert changes(running, done) == [done[0]]


# -- the end -----------------------------------------------------------------------------------

def test_results_list_every_expectation_of_every_injection() -> None:
    given = status("Failed", "Failed", injections=[
        injection("Recovered", expectations=[expectation("Passed", latencySeconds=3.0)]),
        injection("Recovered", occurrence=1, expectations=[
            expectation("Failed", latencySeconds=60.0, message="no taint")]),
    ])
    assert results(given) == [
        ExpectationResult("xid", 0, "tainted", "Passed", 3.0, ""),
        ExpectationResult("xid", 1, "tainted", "Failed", 60.0, "no taint"),
    ]
    assert summary(given) == "Failed: 1 of 2 expectations passed, 1 failed (phase Failed)"


@pytest.mark.parametrize(("given", "said"), [
    (status("Succeeded", "Passed"), "Passed: no expectations (phase Succeeded)"),
    (status("Running", injections=[injection("Injected", expectations=[expectation()])]),
     "not finished: phase Running, 0 of 1 expectations passed"),
    (status("Aborted"), "Aborted without a verdict: no expectations"),
    # the operator lists an injection's expectations once it is injected
    (status("Running", injections=[injection()]),
     "not finished: phase Running, no expectation judged yet"),
])
def test_summary_says_how_the_plan_ended(given: dict[str, Any], said: str) -> None:
    assert summary(given) == said


@pytest.mark.parametrize(("value", "text"), [
    (0, "0s"), (0.5, "0.5s"), (2.14159, "2.14s"), (30, "30s"), (60, "1m"), (150, "2m30s"),
    (3900, "1h5m"),
])
def test_seconds_read_as_durations(value: float, text: str) -> None:
    assert seconds(value) == text
