"""What two runs of one scenario should share, object by object: its *event sequence*, the
ordered semantic state changes of the object, as ``fakefleet diff`` compares them
(:mod:`~operators.recording.matching` finds each object's in a trace, and which object of the
other run it is).

An event is one fact of an object that changed (at most one event per fact per recorded change,
in the order :func:`facts` gives), said as ``fact: value``:

- ``created`` and ``deleted``;
- a pod's ``node`` (its placement), its ``phase``, its ``condition Ready`` and
  ``condition DisruptionTarget`` (an eviction), each container's exits
  (``container C exit N: CODE (REASON)`` for its N-th run, read from ``state`` or from
  ``lastState`` after a restart, so that a restart the recorder saw at once and one it saw in
  two steps make the same events) and its ``restarts``;
- a workload's ``replicas``, a Job's or CronJob's ``suspended``, a node's ``unschedulable`` and
  ``taints``, any object's ``phase`` and ``condition T`` (in the order the conditions were
  added, which controllers keep by appending);
- a FaultPlan's ``verdict`` and each injection's state (``step S#OCCURRENCE``).

A condition is an event when it becomes True and when it stops being True: a condition first
written False only says that nothing happened yet, and whether a run shows it at all depends
on how soon its controller synced.

Deliberately ignored, because two runs of one scenario differ there without behaving any
differently: UIDs and resourceVersions (new per object and per write); timestamps and
managedFields (a recording strips them); the names that controllers generate (matched by
owner and creation order instead, :mod:`~operators.recording.matching`); status counters that
a controller batches as its timing allows (``readyReplicas`` going 0, 1, 3 or 0, 3); a pod's
other conditions (PodScheduled, Initialized, ContainersReady, PodReadyToStartContainers: they
repeat its node, phase and containers, in an order of writes that is the kubelet's business);
an object's spec and data beyond the facts above (the scenario's input, written alike by both
runs); and objects that only say how the run was made: Events (named by timestamps,
aggregated by count), Leases (heartbeats) and a replay's lives sets (named per replay).

Pure functions of one object's states; recorded content of any shape is taken (what is not
where the API puts it counts as absent).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from primitives import keys

#: Kinds left out: they say how a run was made, not what it did.
IGNORED_KINDS = frozenset({"Event", "Lease"})
#: A pod's conditions compared.
POD_CONDITIONS = frozenset({"Ready", "DisruptionTarget"})

CREATED = "created"
DELETED = "deleted"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a pod ended up: its phase, the exit code of its last termination (the first
    non-zero of its containers; None if none ended), and its containers' restarts."""

    phase: str
    exit_code: int | None
    restarts: int

    def text(self) -> str:
        code = "-" if self.exit_code is None else str(self.exit_code)
        return f"{self.phase or '-'}, exit {code}, {self.restarts} restarts"


def mapping_of(value: Any) -> dict[str, Any]:
    """``value`` if it is an object, else an empty one."""
    return value if isinstance(value, dict) else {}


def list_of(value: Any) -> list[Any]:
    """``value`` if it is a list, else an empty one."""
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def ignored(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` only says how a run was made (no sequence of its own)."""
    return str(obj.get("kind", "")) in IGNORED_KINDS or \
        keys.LIVES in mapping_of(mapping_of(obj.get("metadata")).get("labels"))


def facts(obj: Mapping[str, Any]) -> dict[str, str]:
    """What is compared of ``obj``'s state, as ``{fact: value}`` in the order events say it."""
    kind = str(obj.get("kind", ""))
    spec = mapping_of(obj.get("spec"))
    status = mapping_of(obj.get("status"))
    found: dict[str, str] = {}
    if kind == "Pod" and spec.get("nodeName"):
        found["node"] = str(spec["nodeName"])
    replicas = spec.get("replicas")
    if isinstance(replicas, int) and not isinstance(replicas, bool):
        found["replicas"] = str(replicas)
    if kind in ("Job", "CronJob") and "suspend" in spec:
        found["suspended"] = str(bool(spec["suspend"])).lower()
    if kind == "Node":
        found["unschedulable"] = str(bool(spec.get("unschedulable"))).lower()
        found["taints"] = ",".join(sorted(
            f"{t.get('key', '')}={t.get('value', '')}:{t.get('effect', '')}"
            for t in list_of(spec.get("taints")) if isinstance(t, dict))) or "none"
    if isinstance(status.get("phase"), str) and status["phase"]:
        found["phase"] = status["phase"]
    # In the list's order, which is the order they were added in (controllers append): a
    # Job's SuccessCriteriaMet and Complete say the same whether one write or two brought them.
    for condition in list_of(status.get("conditions")):
        kept = mapping_of(condition)
        if kept and (kind != "Pod" or str(kept.get("type")) in POD_CONDITIONS):
            found[f"condition {kept.get('type', '')}"] = str(kept.get("status", ""))
    if kind == "Pod":
        found.update(_containers(status))
    if kind == "FaultPlan":
        for injection in list_of(status.get("injections")):
            if isinstance(injection, dict):
                found[f"step {injection.get('step', '')}#{injection.get('occurrence', 0)}"] = \
                    str(injection.get("state", ""))
        if status.get("verdict"):
            found["verdict"] = str(status["verdict"])
    return found


def _containers(status: Mapping[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    containers = [*list_of(status.get("initContainerStatuses")),
                  *list_of(status.get("containerStatuses"))]
    for container in sorted((c for c in containers if isinstance(c, dict)),
                            key=lambda c: str(c.get("name", ""))):
        name = str(container.get("name", ""))
        runs = _count(container.get("restartCount"))
        before = mapping_of(container.get("lastState")).get("terminated")
        if runs and isinstance(before, dict):
            found[f"container {name} exit {runs - 1}"] = _ended(before)
        if runs:
            found[f"container {name} restarts"] = str(runs)
        now = mapping_of(container.get("state")).get("terminated")
        if isinstance(now, dict):
            found[f"container {name} exit {runs}"] = _ended(now)
    return found


def _ended(terminated: Mapping[str, Any]) -> str:
    return f"{_count(terminated.get('exitCode'))} ({terminated.get('reason') or '-'})"


def lasting(fact: str) -> bool:
    """Whether ``fact`` stays true once seen: a container's N-th exit happened, whatever the
    status says later (``lastState`` keeps only the last)."""
    return fact.startswith("container ") and " exit " in fact


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The events between two states' facts."""
    said = []
    for fact, value in after.items():
        old = before.get(fact)
        if value == old:
            continue
        if fact.startswith("condition ") and value != "True" and old != "True":
            continue
        said.append(f"{fact}: {value}")
    for fact, old in before.items():
        if fact in after or lasting(fact):
            continue
        if fact.startswith("condition ") and old != "True":
            continue
        said.append(f"{fact}: unset")
    return said


def step(before: Mapping[str, str], obj: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """``obj``'s facts (with the lasting ones of ``before`` kept) and the events from
    ``before`` to them."""
    after = {**{f: v for f, v in before.items() if lasting(f)}, **facts(obj)}
    return after, changes(before, after)


def placement(obj: Mapping[str, Any]) -> str:
    """The node a pod is on ("" before it is scheduled)."""
    return str(mapping_of(obj.get("spec")).get("nodeName") or "")


def verdict(obj: Mapping[str, Any]) -> str:
    """A FaultPlan's verdict ("" while there is none)."""
    return str(mapping_of(obj.get("status")).get("verdict") or "")


def outcome(obj: Mapping[str, Any]) -> Outcome:
    """How the pod ``obj`` ended up (its last recorded state)."""
    status = mapping_of(obj.get("status"))
    code: int | None = None
    restarts = 0
    for container in list_of(status.get("containerStatuses")):
        if not isinstance(container, dict):
            continue
        restarts += _count(container.get("restartCount"))
        ended = mapping_of(container.get("state")).get("terminated") or \
            mapping_of(container.get("lastState")).get("terminated")
        if isinstance(ended, dict):
            found = _count(ended.get("exitCode"))
            code = found if code in (None, 0) else code
    return Outcome(str(status.get("phase") or ""), code, restarts)
