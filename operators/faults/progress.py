"""What ``fakefleet plan watch`` shows of a FaultPlan: its status as lines, the lines that changed
since the last look, whether the plan is over, and the exit code its status stands for.

Pure: a status is the ``status`` of a FaultPlan as the API returns it, a dict that may be empty
or partial while the operator has not written all of it; nothing here reads a clock, the API or
a terminal. Each line has a key (the plan, an injection, one expectation of an injection), so a
watcher prints a line again only when what it says changed: the output stays a readable log in
CI, with no terminal needed.

Exit codes: 0 when the plan ended with verdict Passed, 1 when its verdict is Failed, 2 for every
other ending (still running at the timeout, ended without a verdict, errors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_ERROR = 2

#: Phases after which the operator changes nothing more.
FINAL_PHASES = frozenset({"Succeeded", "Failed", "Aborted"})
#: Victims named on an injection's line; the rest are counted.
SHOWN_TARGETS = 3

Tone = Literal["", "good", "bad"]
#: Injection states after which nothing more happens to the injection's victims.
_OVER = frozenset({"Recovered", "Done", "Skipped"})


@dataclasses.dataclass(frozen=True)
class Line:
    """One line of the display. ``key`` says what it describes, so it can be compared with the
    previous line about the same thing; ``tone`` lets a terminal colour it."""

    key: str
    text: str
    tone: Tone = ""


@dataclasses.dataclass(frozen=True)
class ExpectationResult:
    """One expectation of one injection, for the table at the end."""

    step: str
    occurrence: int
    name: str
    outcome: str
    latency: float | None
    message: str


def render(status: Mapping[str, Any] | None) -> list[Line]:
    """The lines that describe ``status``: the plan, then each injection followed by its
    expectations, in the order the operator lists them."""
    if not status:
        return [Line("plan", "Pending: no status yet (the operator has not picked the plan up; "
                             "'fakefleet status' shows whether it runs)")]
    lines = [_plan_line(status)]
    stalled = _condition(status, "Stalled")
    if stalled is not None and stalled.get("status") == "True":
        lines.append(Line("stalled", f"stalled: {_reason_message(stalled)}", "bad"))
    for injection in status.get("injections") or []:
        key = _injection_key(injection)
        lines.append(_injection_line(key, injection))
        for expectation in injection.get("expectations") or []:
            lines.append(_expectation_line(key, expectation))
    return lines


def changes(previous: Sequence[Line], current: Sequence[Line]) -> list[Line]:
    """The lines of ``current`` that say something new: about something ``previous`` did not
    describe, or describing it differently."""
    before = {line.key: line.text for line in previous}
    return [line for line in current if before.get(line.key) != line.text]


def finished(status: Mapping[str, Any] | None) -> bool:
    """Whether watching can stop: the plan is over, or an expectation already failed (the
    verdict cannot turn Passed again)."""
    status = status or {}
    return status.get("phase") in FINAL_PHASES or status.get("verdict") == "Failed"


def exit_code(status: Mapping[str, Any] | None) -> int:
    """0 for a finished plan with verdict Passed, 1 for verdict Failed, 2 otherwise (a plan
    not finished, e.g. at a timeout, or one that ended without a verdict)."""
    status = status or {}
    if status.get("verdict") == "Failed":
        return EXIT_FAILED
    if finished(status) and status.get("verdict") == "Passed":
        return EXIT_PASSED
    return EXIT_ERROR


def results(status: Mapping[str, Any] | None) -> list[ExpectationResult]:
    """Every expectation of every injection, in the operator's order."""
    found = []
    for injection in (status or {}).get("injections") or []:
        for expectation in injection.get("expectations") or []:
            found.append(ExpectationResult(
                step=str(injection.get("step", "")),
                occurrence=int(injection.get("occurrence") or 0),
                name=str(expectation.get("name", "")),
                outcome=str(expectation.get("outcome") or "Pending"),
                latency=expectation.get("latencySeconds"),
                message=str(expectation.get("message") or ""),
            ))
    return found


def summary(status: Mapping[str, Any] | None) -> str:
    """One sentence on how the plan ended, e.g. ``Passed: 3 of 3 expectations passed``."""
    status = status or {}
    phase = status.get("phase") or "Pending"
    verdict = status.get("verdict") or ""
    found = results(status)
    passed = sum(1 for result in found if result.outcome == "Passed")
    failed = sum(1 for result in found if result.outcome == "Failed")
    if found:
        counts = (f"{passed} of {len(found)} expectations passed"
                  + (f", {failed} failed" if failed else ""))
    else:
        counts = "no expectations" if finished(status) else "no expectation judged yet"
    if verdict:
        return f"{verdict}: {counts} (phase {phase})"
    if finished(status):
        return f"{phase} without a verdict: {counts}"
    return f"not finished: phase {phase}, {counts}"


def outcome_tone(outcome: str) -> Tone:
    """How an expectation's outcome reads: Passed good, Failed bad, Pending neither."""
    return "good" if outcome == "Passed" else "bad" if outcome == "Failed" else ""


def seconds(value: float) -> str:
    """A duration as people write it: 0.5s, 30s, 2m, 2m30s, 1h5m."""
    if value < 60:
        return f"{value:.3g}s"
    total = round(value)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{amount}{unit}" for amount, unit in parts if amount)


# -- lines -------------------------------------------------------------------------------------

def _plan_line(status: Mapping[str, Any]) -> Line:
    phase = status.get("phase") or "Pending"
    text = f"phase {phase}"
    if status.get("stepsDone"):
        text += f", steps {status['stepsDone']}"
    verdict = status.get("verdict") or ""
    if verdict:
        text += f", verdict {verdict}"
    if status.get("startedAt"):
        text += f", started {status['startedAt']}"
    tone: Tone = ("bad" if verdict == "Failed" or phase in ("Failed", "Aborted")
                  else "good" if verdict == "Passed" else "")
    return Line("plan", text, tone)


def _injection_key(injection: Mapping[str, Any]) -> str:
    return f"{injection.get('step', '')}#{int(injection.get('occurrence') or 0)}"


def _injection_line(key: str, injection: Mapping[str, Any]) -> Line:
    state = injection.get("state") or "Scheduled"
    parts = [f"  {key} {state}"]
    if state == "Scheduled":
        inject_at = injection.get("injectAt")
        parts.append("waits for the steps in its after" if inject_at is None
                     else f"injects at +{seconds(inject_at)}")
    targets = [_target(str(target)) for target in injection.get("targets") or []]
    count = int(injection.get("targetCount") or len(targets))
    plural = "s" if count != 1 else ""
    if injection.get("targetsRef"):
        parts.append(f"{count} target{plural}, listed in ConfigMap {injection['targetsRef']}")
    elif targets:
        shown = ", ".join(targets[:SHOWN_TARGETS])
        more = f", +{count - SHOWN_TARGETS} more" if count > SHOWN_TARGETS else ""
        parts.append(f"{count} target{plural}: {shown}{more}")
    if injection.get("injectedAt"):
        parts.append(f"injected {injection['injectedAt']}")
    if injection.get("recoveredAt"):
        parts.append(f"recovered {injection['recoveredAt']}")
    elif state not in _OVER and injection.get("recoverAt") is not None:
        parts.append(f"recovers at +{seconds(injection['recoverAt'])}")
    if injection.get("message"):
        parts.append(str(injection["message"]))
    tone: Tone = "bad" if injection.get("message") else ""
    return Line(key, "; ".join(parts), tone)


def _target(text: str) -> str:
    """cluster/Kind/namespace/name as written, without the empty namespace of a node or
    cluster: west/Node/west-h100-3."""
    parts = text.split("/", 3)
    if len(parts) == 4 and not parts[2]:
        return "/".join((parts[0], parts[1], parts[3]))
    return text


def _expectation_line(key: str, expectation: Mapping[str, Any]) -> Line:
    name = expectation.get("name", "")
    outcome = expectation.get("outcome") or "Pending"
    text = f"    {key} expect {name}: {outcome}"
    latency = expectation.get("latencySeconds")
    if outcome in ("Passed", "Failed") and latency is not None:
        text += f" after {seconds(latency)}"
    if expectation.get("message"):
        text += f" ({expectation['message']})"
    return Line(f"{key}/{name}", text, outcome_tone(outcome))


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            found: Mapping[str, Any] = condition
            return found
    return None


def _reason_message(condition: Mapping[str, Any]) -> str:
    reason, message = condition.get("reason") or "", condition.get("message") or ""
    return f"{reason}: {message}" if reason and message else reason or message or "no reason"
