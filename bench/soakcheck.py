"""What a soak run saw, and the verdict on it: pure functions over plain records.

``bench.soak`` watches every member's nodes, pods and Jobs while it kills processes; this module
holds those sightings and judges them against what was asked for (the FaultPlans' recorded
injections, the pool sizes the run set, the workloads it submitted). It does no I/O, so the
checks themselves are unit-tested (``tests/test_soakcheck.py``).

The rules it checks, each a list of problems (empty: it held):

- every node UID was made once: a node name gets a second UID only after its first was deleted
  by a scale-down the run asked for, and no node is deleted otherwise;
- no node leaves Ready, and no pod of the steady Deployment turns not-Ready, fails, restarts or
  goes away, unless a fault window of the node (or of the pod, or of its node) covers it;
- every fault occurrence was injected and recovered exactly once: each NotReady victim left
  Ready once inside its window and came back; each ContainerExit victim restarted once,
  its window allowing the back-off a real kubelet would apply to it;
- every workload Job was created once: one UID per Job name in the whole fleet;
- nothing lost: each planned occurrence due within the run was injected and finished (its
  count against occurrences x steps), each workload reached Succeeded with all its Jobs seen in
  a member, and no pod of a workload failed;
- a verdict differs from the one expected (the same run without kills, or what the plan was
  made to get) only where a kill's downtime overlapped the expectation's window; those are
  reported apart from the rest.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from operators.engine import pods as podlife

#: Seconds after a node fault's recovery for the node-lifecycle controller and the watch to show
#: the node (and its pods) Ready again.
NODE_GRACE = 45.0
#: Seconds after a pod fault, beyond the kubelet's back-off (:func:`allow_backoff`), for the
#: container to run again and the pod to turn Ready.
POD_GRACE = 45.0
#: Seconds before the planned moment that a window opens (clocks of two processes).
LEAD = 2.0


@dataclass(frozen=True)
class Sighting:
    """One state of one object, as a watch (or a relist) showed it."""

    at: float
    cluster: str
    kind: str  # Node, Pod, Job
    name: str
    uid: str
    deleted: bool = False
    ready: str = ""  # the Ready condition's status ("True", "False", "Unknown", "")
    phase: str = ""
    restarts: int = 0
    node: str = ""
    deleting: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)


def node_sighting(at: float, cluster: str, obj: Mapping[str, Any], *,
                  deleted: bool = False) -> Sighting:
    meta = obj.get("metadata") or {}
    return Sighting(at=at, cluster=cluster, kind="Node", name=meta.get("name", ""),
                    uid=meta.get("uid", ""), deleted=deleted, ready=_ready(obj),
                    deleting=bool(meta.get("deletionTimestamp")),
                    labels=dict(meta.get("labels") or {}))


def pod_sighting(at: float, cluster: str, obj: Mapping[str, Any], *,
                 deleted: bool = False) -> Sighting:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    restarts = sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ())
    return Sighting(at=at, cluster=cluster, kind="Pod", name=meta.get("name", ""),
                    uid=meta.get("uid", ""), deleted=deleted, ready=_ready(obj),
                    phase=status.get("phase", ""), restarts=restarts,
                    node=spec.get("nodeName", ""), deleting=bool(meta.get("deletionTimestamp")),
                    labels=dict(meta.get("labels") or {}))


def job_sighting(at: float, cluster: str, obj: Mapping[str, Any], *,
                 deleted: bool = False) -> Sighting:
    meta = obj.get("metadata") or {}
    return Sighting(at=at, cluster=cluster, kind="Job", name=meta.get("name", ""),
                    uid=meta.get("uid", ""), deleted=deleted,
                    labels=dict(meta.get("labels") or {}))


def _ready(obj: Mapping[str, Any]) -> str:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return str(condition.get("status") or "")
    return ""


@dataclass(frozen=True)
class Window:
    """When a fault of one occurrence may show on one victim."""

    cluster: str
    kind: str  # Node or Pod
    name: str
    fault: str
    start: float
    end: float
    plan: str
    step: str
    occurrence: int

    def covers(self, at: float) -> bool:
        return self.start <= at <= self.end

    @property
    def label(self) -> str:
        return f"{self.plan}/{self.step}#{self.occurrence} {self.cluster}/{self.kind}/{self.name}"


def windows(plan: str, started: float, injections: Iterable[Mapping[str, Any]],
            faults: Mapping[str, str], parse: Any) -> list[Window]:
    """Every victim's window from a plan's status: from the planned injection to the recovery
    (or the instant fault) plus the grace. ``faults`` maps a step to its fault type; ``parse``
    turns an RFC 3339 time into seconds."""
    found: list[Window] = []
    for injection in injections:
        if injection.get("injectAt") is None:
            continue
        step, fault = injection.get("step", ""), faults.get(injection.get("step", ""), "")
        start = started + float(injection["injectAt"]) - LEAD
        if injection.get("recoveredAt"):
            end = parse(injection["recoveredAt"]) + NODE_GRACE
        elif injection.get("recoverAt") is not None:
            end = started + float(injection["recoverAt"]) + NODE_GRACE
        elif injection.get("injectedAt"):
            end = parse(injection["injectedAt"]) + POD_GRACE
        else:
            end = start + LEAD + POD_GRACE
        for target in injection.get("targets") or ():
            cluster, kind, _namespace, name = str(target).split(":", 1)[0].split("/", 3)
            found.append(Window(cluster, kind, name, fault, start, end, plan, step,
                                int(injection.get("occurrence") or 0)))
    return found


def kubelet_wait(history: Sequence[Sighting], crashed: float) -> float:
    """The back-off a real kubelet applies to a container that exits at ``crashed``, by its rule
    (:func:`operators.engine.pods.crash_wait`) over the restarts the pod's ``history`` shows
    before then: an exit where its restartCount grows, the restart where it is Ready again."""
    backoff, restarted, wait, crashing = 0.0, None, 0.0, False
    previous = history[0].restarts if history else 0
    for sighting in history:
        if sighting.at >= crashed or sighting.deleted:
            break
        if sighting.restarts > previous:
            wait, crashing = podlife.crash_wait(backoff, restarted, sighting.at), True
        if crashing and sighting.ready == "True":
            backoff, restarted, crashing = podlife.next_backoff(wait), sighting.at, False
        previous = sighting.restarts
    return podlife.crash_wait(backoff, restarted, crashed)


def allow_backoff(found: Iterable[Window], sightings: Iterable[Sighting]) -> list[Window]:
    """The windows, each ContainerExit victim's made longer by the back-off a real kubelet
    would apply to that exit, so the check judges the engine against a kubelet, not a flat
    grace (a pod hit often in ten minutes waits up to 300 s)."""
    pods = _histories(sightings, "Pod")
    return [dataclasses.replace(w, end=w.end + kubelet_wait(
        pods.get((w.cluster, w.name), []), w.end - POD_GRACE))
        if w.fault == "ContainerExit" else w for w in found]


@dataclass(frozen=True)
class Scale:
    """The run set pool ``pool`` of ``cluster`` to ``replicas`` at ``at``, the exact moment it
    asked (seconds from the run's start, on the clock the sightings are timed by)."""

    at: float
    cluster: str
    pool: str
    replicas: int


def _index(pool: str, name: str) -> int | None:
    suffix = name[len(pool) + 1:] if name.startswith(f"{pool}-") else ""
    return int(suffix) if suffix.isdigit() else None


def _scaled_away(sighting: Sighting, scales: list[Scale]) -> bool:
    """Whether a scale-down the run asked for explains the node's deletion."""
    for scale in scales:
        index = _index(scale.pool, sighting.name)
        if scale.cluster != sighting.cluster or index is None:
            continue
        in_effect = [s for s in scales if s.cluster == scale.cluster and s.pool == scale.pool
                     and s.at <= sighting.at]
        if in_effect and index >= max(in_effect, key=lambda s: s.at).replicas:
            return True
    return False


def _histories(sightings: Iterable[Sighting], kind: str) -> dict[tuple[str, str], list[Sighting]]:
    found: dict[tuple[str, str], list[Sighting]] = defaultdict(list)
    for sighting in sightings:
        if sighting.kind == kind:
            found[(sighting.cluster, sighting.name)].append(sighting)
    for history in found.values():
        history.sort(key=lambda s: s.at)
    return found


def nodes_made_once(sightings: Iterable[Sighting], scales: list[Scale]) -> list[str]:
    problems: list[str] = []
    for (cluster, name), history in sorted(_histories(sightings, "Node").items()):
        uids = list(dict.fromkeys(s.uid for s in history))
        for uid in uids:
            gone = [s for s in history if s.uid == uid and s.deleted]
            if gone and not _scaled_away(gone[0], scales):
                problems.append(f"{cluster}/{name}: node {uid[:8]} deleted unasked")
        for earlier, later in itertools.pairwise(uids):
            if not any(s.uid == earlier and s.deleted for s in history):
                problems.append(f"{cluster}/{name}: made again ({later[:8]}) while "
                                f"{earlier[:8]} still existed")
    return problems


def _covered(windows_by_object: Mapping[tuple[str, str, str], list[Window]], cluster: str,
             kind: str, name: str, at: float) -> bool:
    return any(w.covers(at) for w in windows_by_object.get((cluster, kind, name), ()))


def _by_object(found: Iterable[Window]) -> dict[tuple[str, str, str], list[Window]]:
    index: dict[tuple[str, str, str], list[Window]] = defaultdict(list)
    for window in found:
        index[(window.cluster, window.kind, window.name)].append(window)
    return index


def invented_node_faults(sightings: Iterable[Sighting], found: Iterable[Window],
                         scales: list[Scale]) -> list[str]:
    """Nodes that left Ready, after being Ready, with no fault window over them."""
    index = _by_object(found)
    problems: list[str] = []
    for (cluster, name), history in sorted(_histories(sightings, "Node").items()):
        ready_uids: set[str] = set()
        for sighting in history:
            if sighting.ready == "True":
                ready_uids.add(sighting.uid)
                continue
            if (sighting.uid not in ready_uids or sighting.deleted or sighting.deleting
                    or _covered(index, cluster, "Node", name, sighting.at)
                    or _scaled_away(sighting, scales)):
                continue
            problems.append(f"{cluster}/{name}: Ready={sighting.ready or 'none'} at "
                            f"{sighting.at:.0f} with no fault over it")
            break
    return problems


def invented_pod_faults(sightings: Iterable[Sighting], found: Iterable[Window],
                        app: str) -> list[str]:
    """Pods labelled ``app=<app>`` that turned not-Ready, failed, restarted or went away after
    being Ready, with no fault window over them or their node."""
    index = _by_object(found)
    problems: list[str] = []
    for (cluster, name), history in sorted(_histories(sightings, "Pod").items()):
        if not history or history[0].labels.get("app") != app:
            continue
        ready, restarts = False, history[0].restarts
        for sighting in history:
            covered = (_covered(index, cluster, "Pod", name, sighting.at)
                       or _covered(index, cluster, "Node", sighting.node, sighting.at))
            if sighting.deleted and ready and not covered:
                problems.append(f"{cluster}/{name}: deleted with no fault over it")
                break
            if sighting.deleted or sighting.deleting:
                continue
            restarted = sighting.restarts > restarts
            restarts = max(restarts, sighting.restarts)
            if sighting.ready == "True" and sighting.phase == "Running":
                ready = True
                if not restarted or covered:
                    continue
            if not ready or covered:
                continue
            what = ("restarted" if restarted else
                    f"phase {sighting.phase}" if sighting.phase != "Running" else
                    f"Ready={sighting.ready or 'none'}")
            problems.append(f"{cluster}/{name}: {what} at {sighting.at:.0f} with no fault over it")
            break
    return problems


def occurrences(sightings: Iterable[Sighting], found: Iterable[Window]) -> dict[str, list[str]]:
    """Each victim's fault, counted inside its window: ``once``, ``missed`` or ``repeated``
    (the labels of the windows in each), and ``unrecovered`` (not healthy at the window's end)."""
    nodes, pods = _histories(sightings, "Node"), _histories(sightings, "Pod")
    verdict: dict[str, list[str]] = {"once": [], "missed": [], "repeated": [], "unrecovered": []}
    for window in found:
        history = (nodes if window.kind == "Node" else pods).get((window.cluster, window.name), [])
        inside = [s for s in history if window.covers(s.at) and not s.deleted]
        before = [s for s in history if s.at < window.start and not s.deleted]
        if window.fault == "ContainerExit":
            floor = before[-1].restarts if before else (inside[0].restarts if inside else 0)
            hits = max((s.restarts for s in inside), default=floor) - floor
            healthy = bool(inside) and inside[-1].ready == "True"
        else:
            hits, previous = 0, before[-1].ready if before else "True"
            for sighting in inside:
                if previous == "True" and sighting.ready != "True":
                    hits += 1
                previous = sighting.ready
            healthy = bool(inside) and inside[-1].ready == "True"
        verdict["once" if hits == 1 else "missed" if hits == 0 else "repeated"].append(
            window.label)
        if not healthy:
            verdict["unrecovered"].append(window.label)
    return verdict


def jobs_made_once(sightings: Iterable[Sighting], label: str) -> tuple[int, list[str]]:
    """How many workload Jobs (labelled ``label``) were seen, and those made more than once."""
    uids: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for sighting in sightings:
        if sighting.kind == "Job" and label in sighting.labels:
            uids[(sighting.labels[label], sighting.name)].setdefault(sighting.uid,
                                                                    sighting.cluster)
    repeated = [f"{workload}/{name}: {len(made)} times ({', '.join(sorted(set(made.values())))})"
                for (workload, name), made in sorted(uids.items()) if len(made) > 1]
    return len(uids), repeated



#: The states an occurrence ends in once done: its fault recovered, or an instant fault done.
FINISHED = ("Recovered", "Done")


def occurrences_done(injections: Iterable[Mapping[str, Any]],
                     planned: Mapping[tuple[str, int], float], until: float) -> dict[str, Any]:
    """A plan's occurrences against its schedule. ``planned`` maps (step, occurrence) to its
    moment (seconds from the plan's start); each one due by ``until`` must have been recorded
    once and have finished. ``due`` is how many were (occurrences x steps when the whole plan
    fell within the run), ``finished`` how many did; ``missed`` (never injected: still
    Scheduled, Skipped or not recorded), ``unfinished`` (injected, never recovered),
    ``repeated`` and ``unplanned`` name them."""
    recorded: dict[tuple[str, int], list[str]] = defaultdict(list)
    for injection in injections:
        key = (str(injection.get("step", "")), int(injection.get("occurrence") or 0))
        recorded[key].append(str(injection.get("state") or "Scheduled"))
    due = sorted(key for key, moment in planned.items() if moment <= until)
    verdict: dict[str, Any] = {"due": len(due), "recorded": sum(map(len, recorded.values())),
                               "finished": 0, "missed": [], "unfinished": [], "repeated": [],
                               "unplanned": []}
    for step, occurrence in due:
        states = recorded.get((step, occurrence), [])
        label = f"{step}#{occurrence}"
        if not states or all(s in ("Scheduled", "Skipped") for s in states):
            verdict["missed"].append(f"{label}: {'/'.join(states) or 'not recorded'}")
        elif all(s in FINISHED for s in states):
            verdict["finished"] += 1
        else:
            verdict["unfinished"].append(f"{label}: {'/'.join(states)}")
    for (step, occurrence), states in sorted(recorded.items()):
        if len(states) > 1:
            verdict["repeated"].append(f"{step}#{occurrence}: recorded {len(states)} times")
        if (step, occurrence) not in planned:
            verdict["unplanned"].append(f"{step}#{occurrence}: {'/'.join(states)}")
    return verdict


def workloads_done(workloads: Iterable[Mapping[str, Any]], sightings: Iterable[Sighting],
                   label: str, jobs: int) -> dict[str, list[str]]:
    """Each submitted workload as the hub reports it (``id``, ``name``, ``phase`` and ``jobs``:
    each with ``index``, ``name``, ``state``, ``attempt``) against what the members showed.
    ``lost``: a workload not Succeeded, with fewer than ``jobs`` Jobs, a Job not Succeeded,
    or a Job the hub reports that no member ever showed (labelled ``label``); ``retried``: a
    Job the hub had to send again (its attempt > 1)."""
    shown = {(s.labels[label], s.name) for s in sightings
             if s.kind == "Job" and label in s.labels}
    verdict: dict[str, list[str]] = {"lost": [], "retried": []}
    for workload in workloads:
        name, made = workload["name"], list(workload.get("jobs") or ())
        if workload["phase"] != "Succeeded":
            verdict["lost"].append(f"{name}: {workload['phase']}")
        if len(made) != jobs:
            verdict["lost"].append(f"{name}: {len(made)} of {jobs} Jobs")
        for job in made:
            where = f"{name}/{job['index']}"
            if job["state"] != "Succeeded":
                verdict["lost"].append(f"{where}: {job['state']}")
            if (workload["id"], job["name"]) not in shown:
                verdict["lost"].append(f"{where}: Job {job['name']} never seen in a member")
            if int(job.get("attempt") or 1) > 1:
                verdict["retried"].append(f"{where}: attempt {job['attempt']}")
    return verdict


def failed_jobs(cluster: str, jobs: Iterable[Mapping[str, Any]],
                label: str) -> list[dict[str, Any]]:
    """The workload Jobs (labelled ``label``) of one member that failed, with their counts and
    conditions (type, reason, message, when), so a run says why each failed."""
    found = []
    for job in jobs:
        meta, status = job.get("metadata") or {}, job.get("status") or {}
        conditions = status.get("conditions") or ()
        if label not in (meta.get("labels") or {}) or not (status.get("failed") or any(
                c.get("type") == "Failed" and c.get("status") == "True" for c in conditions)):
            continue
        found.append({"cluster": cluster, "name": meta.get("name", ""),
                      "failed": status.get("failed", 0), "succeeded": status.get("succeeded", 0),
                      "conditions": [{key: c.get(key, "") for key in (
                          "type", "status", "reason", "message", "lastTransitionTime")}
                          for c in conditions]})
    return found


def unfinished_workload_pods(sightings: Iterable[Sighting], label: str) -> list[str]:
    """Pods of workloads (labelled ``label``) deleted, or marked for deletion, before they
    finished, earliest first: the Job controller counts such a pod as failed (isPodFailed), so
    under backoffLimit 0 the first of them fails its Job without any pod turning Failed."""
    found: dict[str, tuple[float, str]] = {}
    for s in sorted(sightings, key=lambda s: s.at):
        if s.kind == "Pod" and label in s.labels and (s.deleted or s.deleting) and \
                s.phase not in ("Succeeded", "Failed") and s.uid not in found:
            found[s.uid] = (s.at, f"{s.cluster}/{s.name} (workload {s.labels[label]}): "
                                  f"{'deleted' if s.deleted else 'deleting'} while "
                                  f"{s.phase or 'unknown'} at {s.at:.0f}")
    return [line for _, line in sorted(found.values())]


def failed_workload_pods(sightings: Iterable[Sighting], label: str) -> list[str]:
    """Pods of workloads (labelled ``label``) seen Failed: no plan of the soak targets them."""
    failed: dict[tuple[str, str], Sighting] = {}
    for sighting in sightings:
        if sighting.kind == "Pod" and label in sighting.labels and sighting.phase == "Failed":
            failed.setdefault((sighting.cluster, sighting.name), sighting)
    return [f"{cluster}/{name} (workload {s.labels[label]}): Failed at {s.at:.0f}"
            for (cluster, name), s in sorted(failed.items())]


@dataclass(frozen=True)
class Kill:
    """One kill of the seeded schedule, as it went (times in seconds from the run's start)."""

    at: float  # the seeded moment
    target: str  # operator, engine, hub, kube-apiserver, etcd, collector
    cluster: str
    pid: int  # 0: the target never ran while the kill looked for it
    killed_at: float | None  # when SIGKILL went; None: never
    tries: int  # looks for a running target (more than 1: it was down, an earlier kill's doing)
    back_after: float | None  # seconds until a new process was published; None: never

    @property
    def drift(self) -> float | None:
        """How much later than its seeded moment the kill went."""
        return None if self.killed_at is None else self.killed_at - self.at

    def downtime(self, aftermath: float) -> tuple[float, float] | None:
        """From the kill until ``aftermath`` seconds after its successor was published (for
        ever if none was); None for a kill that never went."""
        if self.killed_at is None:
            return None
        if self.back_after is None:
            return self.killed_at, math.inf
        return self.killed_at, self.killed_at + self.back_after + aftermath

    @property
    def name(self) -> str:
        return f"{self.target}/{self.cluster}" if self.cluster else self.target


@dataclass(frozen=True)
class Verdict:
    """One expectation of one occurrence: its outcome, and the window it was judged in."""

    label: str  # plan/step#occurrence/expectation
    outcome: str  # Pending (never judged), Passed, Failed
    start: float
    end: float


#: The outcome every expectation of the soak's plan is made to get: its own fault makes it true.
DESIGNED = "Passed"


def compare_verdicts(verdicts: Iterable[Verdict], kills: Iterable[Kill], *,
                     expected: Mapping[str, str] | None, aftermath: float) -> dict[str, list[str]]:
    """Each verdict against the one expected: the run without kills' (``expected``, by label),
    else :data:`DESIGNED` (no baseline, or one too short to hold the occurrence).

    - ``same``: as expected, and Passed;
    - ``notPassedWithoutKills``: not Passed, and not Passed without kills either: the kills do
      not explain it, the plan or the product does;
    - ``changedDuringKills``: not as expected, and a kill's downtime (from the kill until
      ``aftermath`` seconds after its successor was published) overlapped the window;
    - ``changedOtherwise``: not as expected, and no kill was near it.

    Pending (never judged) is an outcome of its own: it differs from Passed and from Failed.
    """
    downtimes = [(kill, span) for kill in kills if (span := kill.downtime(aftermath))]
    verdict: dict[str, list[str]] = {"same": [], "notPassedWithoutKills": [],
                                     "changedDuringKills": [], "changedOtherwise": []}
    for found in verdicts:
        without = (expected or {}).get(found.label)
        wanted = without or DESIGNED
        if found.outcome == wanted:
            key = "same" if wanted == DESIGNED else "notPassedWithoutKills"
            verdict[key].append(f"{found.label}: {found.outcome}")
            continue
        text = (f"{found.label}: {found.outcome}, "
                f"{wanted} {'without kills' if without else 'as designed'}")
        during = [kill.name for kill, (down, up) in downtimes
                  if down <= found.end and found.start <= up]
        if during:
            verdict["changedDuringKills"].append(f"{text} (down meanwhile: {', '.join(during)})")
        else:
            verdict["changedOtherwise"].append(text)
    return verdict
