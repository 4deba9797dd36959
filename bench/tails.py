"""The tail of a Karpenter scale-up taken apart: where each pod's time went between its creation
and Running, and each node's between its creation and being usable, from the moments the
harness's watches recorded (:class:`bench.karpenter.Stamps`); and kube-scheduler's own account
of its queue, from its metrics endpoint.

A pod goes: created → bound to a node (kube-scheduler; ``spec.nodeName`` seen set) → Running
(the node player). A node goes: created (by Karpenter) → ``karpenter.sh/unregistered`` removed
(Karpenter's registration) → Ready (the node player) → usable (Ready with no taint the bench's
pods do not tolerate: the node-lifecycle controller lifts ``node.kubernetes.io/not-ready``) →
``karpenter.sh/initialized``. The wait between a node becoming usable and a pod being bound to it
is kube-scheduler's part of the tail: a pod rejected while no node was usable waits there for an
event that requeues it, or for the flush of its unschedulable queue after 5 minutes
(``scheduler_queue_incoming_pods_total{event="UnschedulableTimeout"}``).

Pure: moments in (seconds on the harness's clock), figures out; no I/O, no clock.
"""

from __future__ import annotations

import datetime
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: What the bench's pods tolerate (``pod_body``): the GPU taint, NoSchedule.
TOLERATED = frozenset({("nvidia.com/gpu", "NoSchedule")})
#: Taint effects that keep a pod off a node (PreferNoSchedule only scores).
BLOCKING = frozenset({"NoSchedule", "NoExecute"})
UNREGISTERED = "karpenter.sh/unregistered"
INITIALIZED = "karpenter.sh/initialized"
#: A pod bound this long after its node became usable waited on kube-scheduler's queue, not on
#: a node (its backoff is at most 10 s).
LATE = 30.0
#: How many of the last pods to Running the per-pod table lists.
LAST_PODS = 10

#: A node's history of one property: (moment, holds) at each change, oldest first.
History = Sequence[tuple[float, bool]]


# -- predicates on watched objects -------------------------------------------------------------

def untolerated(node: Any) -> list[str]:
    """The keys of the node's taints that keep the bench's pods off it."""
    return [taint.get("key", "") for taint in (node.get("spec") or {}).get("taints") or ()
            if taint.get("effect") in BLOCKING
            and (taint.get("key"), taint.get("effect")) not in TOLERATED]


def registered(node: Any) -> bool:
    """Karpenter has registered the node: its ``karpenter.sh/unregistered`` taint is gone."""
    return not any(taint.get("key") == UNREGISTERED
                   for taint in (node.get("spec") or {}).get("taints") or ())


def initialized(node: Any) -> bool:
    return (node["metadata"].get("labels") or {}).get(INITIALIZED) == "true"


def usable(ready: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Ready (by ``ready``) and no taint the bench's pods do not tolerate."""
    def holds(node: Any) -> bool:
        return ready(node) and not untolerated(node)
    return holds


def bound(pod: Any) -> bool:
    """kube-scheduler placed the pod: its node is set (the binding sets PodScheduled True in
    the same write)."""
    return bool((pod.get("spec") or {}).get("nodeName"))


def node_of(pod: Any) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


# -- arithmetic --------------------------------------------------------------------------------

def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None of none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def spread(label: str, values: Sequence[float]) -> dict[str, float | None]:
    """``label`` p50, p99 and max, rounded to 10 ms, and how many values there were."""
    figures: dict[str, float | None] = {
        f"{label} p{round(q * 100)}": None if (found := quantile(values, q)) is None
        else round(found, 2) for q in (0.5, 0.99)}
    figures[f"{label} max"] = round(max(values), 2) if values else None
    figures[f"{label} (count)"] = len(values)
    return figures


def onset(history: History, at: float) -> float | None:
    """When the property a ``history`` follows last began to hold, as of ``at``; None when it
    did not hold at ``at``."""
    since: float | None = None
    for moment, holds in history:
        if moment > at:
            break
        if holds and since is None:
            since = moment
        elif not holds:
            since = None
    return since


def losses(history: History) -> int:
    """How many times the property stopped holding after it held."""
    return sum(1 for (_, before), (_, after) in itertools.pairwise(history)
               if before and not after)


def spans(marks: Iterable[Mapping[str, float]], start: str, end: str) -> list[float]:
    """``end - start`` of every object that met both marks."""
    return [found[end] - found[start] for found in marks if start in found and end in found]


# -- the tail ----------------------------------------------------------------------------------

def tail_figures(pods: Mapping[str, Mapping[str, float]], placed: Mapping[str, str],
                 nodes: Mapping[str, Mapping[str, float]],
                 usable_histories: Mapping[str, History],
                 ready_histories: Mapping[str, History], *,
                 started: float) -> dict[str, float | None]:
    """The scale-up's tail taken apart.

    ``pods`` and ``nodes``: each object's marks (moments by mark: ``seen``, and for pods
    ``unschedulable``, ``bound``, ``running``; for nodes ``registered``, ``ready``, ``usable``,
    ``initialized``); ``placed``: each bound pod's node; the histories: when each node became
    and stopped being usable, and Ready. Spans in seconds; "last" moments in seconds from
    ``started`` (the first pod's creation).
    """
    figures: dict[str, float | None] = {}
    pod_marks, node_marks = list(pods.values()), list(nodes.values())
    figures |= spread("pod created → bound", spans(pod_marks, "seen", "bound"))
    figures |= spread("pod bound → Running (node player)", spans(pod_marks, "bound", "running"))
    waits, unseen = node_waits(pods, placed, usable_histories)
    figures |= spread("node usable → a pod bound to it (kube-scheduler)", waits)
    figures[f"pods bound > {LATE:g} s after their node was usable"] = \
        sum(1 for wait in waits if wait > LATE)
    figures["pods bound to a node not (yet) seen usable"] = unseen
    figures |= spread("node created → unregistered taint gone (Karpenter)",
                      spans(node_marks, "seen", "registered"))
    figures |= spread("node created → Ready (node player)", spans(node_marks, "seen", "ready"))
    figures |= spread("node Ready → usable (taints lifted)", spans(node_marks, "ready", "usable"))
    figures |= spread("node Ready → initialized label (Karpenter)",
                      spans(node_marks, "ready", "initialized"))
    figures["nodes that stopped being usable after they were"] = \
        sum(1 for history in usable_histories.values() if losses(history))
    figures["nodes that lost Ready after they had it"] = \
        sum(1 for history in ready_histories.values() if losses(history))

    def last(marks: list[Mapping[str, float]], mark: str) -> float | None:
        found = [moment[mark] for moment in marks if mark in moment]
        return round(max(found) - started, 2) if found else None

    figures["last node unregistered taint gone"] = last(node_marks, "registered")
    figures["last node Ready"] = last(node_marks, "ready")
    figures["last node usable"] = last(node_marks, "usable")
    figures["last node initialized"] = last(node_marks, "initialized")
    figures["last pod bound"] = last(pod_marks, "bound")
    figures["last pod Running"] = last(pod_marks, "running")
    ends = [(found["bound"], name) for name, found in pods.items() if "bound" in found]
    if ends:
        _, name = max(ends)
        wait = pod_wait(name, pods, placed, usable_histories)
        figures["last pod bound: its node usable → bound"] = \
            None if wait is None else round(wait, 2)
        figures["last pod bound: first Unschedulable → bound"] = round(
            pods[name]["bound"] - pods[name]["unschedulable"], 2) \
            if "unschedulable" in pods[name] else None
    return figures


def pod_wait(pod: str, pods: Mapping[str, Mapping[str, float]], placed: Mapping[str, str],
             usable_histories: Mapping[str, History]) -> float | None:
    """How long ``pod`` was bound after its node last became usable; None when the harness
    never saw its node usable before the binding."""
    when = pods[pod].get("bound")
    node = placed.get(pod)
    if when is None or node is None:
        return None
    since = onset(usable_histories.get(node, ()), when)
    return None if since is None else when - since


def node_waits(pods: Mapping[str, Mapping[str, float]], placed: Mapping[str, str],
               usable_histories: Mapping[str, History]) -> tuple[list[float], int]:
    """Each bound pod's wait from its node being usable to its binding, and how many bound
    pods' nodes the harness had not seen usable by then (its two watches are not ordered)."""
    waits: list[float] = []
    unseen = 0
    for pod, marks in pods.items():
        if "bound" not in marks or pod not in placed:
            continue
        wait = pod_wait(pod, pods, placed, usable_histories)
        if wait is None:
            unseen += 1
        else:
            waits.append(wait)
    return waits, unseen


POD_COLUMNS = ("pod", "node", "created", "Unschedulable", "node created", "node registered",
               "node Ready", "node usable", "bound", "Running")


def last_pods(pods: Mapping[str, Mapping[str, float]], placed: Mapping[str, str],
              nodes: Mapping[str, Mapping[str, float]], usable_histories: Mapping[str, History],
              *, started: float, count: int = LAST_PODS) -> list[dict[str, Any]]:
    """The ``count`` pods Running last (or never), each with its moments and its node's, in
    seconds from ``started``: the per-pod view of the tail (:data:`POD_COLUMNS`)."""
    def at(moment: float | None) -> float | None:
        return None if moment is None else round(moment - started, 2)

    order = sorted(pods, key=lambda name: pods[name].get("running", math.inf), reverse=True)
    rows = []
    for name in order[:count]:
        marks, node = pods[name], placed.get(name)
        found = nodes.get(node, {}) if node is not None else {}
        when = marks.get("bound")
        since = onset(usable_histories.get(node, ()), when) \
            if node is not None and when is not None else None
        rows.append({
            "pod": name, "node": node or "", "created": at(marks.get("seen")),
            "Unschedulable": at(marks.get("unschedulable")),
            "node created": at(found.get("seen")), "node registered": at(found.get("registered")),
            "node Ready": at(found.get("ready")),
            "node usable": at(since if since is not None else found.get("usable")),
            "bound": at(when), "Running": at(marks.get("running"))})
    return rows


# -- the engine's pod watch -------------------------------------------------------------------

#: The engine's log line (:mod:`operators.k8s.watching`) when a watch must list again.
_RELISTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: "
                       r"watch (\S+): resourceVersion \S+ is gone; relisting")


def relists(log: str, path: str) -> list[float]:
    """When the engine's watch of ``path`` had to list again (its log's local times, as epoch
    seconds): a relist shows the engine every object anew, so a bound pod it passed over
    (its node not played yet) is seen again only then."""
    moments = []
    for line in log.splitlines():
        match = _RELISTED.match(line)
        if match and match.group(2) == path:
            moments.append(datetime.datetime.strptime(
                match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return moments


def relist_figures(log: str, path: str, *, started: float) -> dict[str, float | None]:
    """How often the engine's watch of ``path`` listed again after ``started``, and when
    last (s from ``started``)."""
    after = [moment - started for moment in relists(log, path) if moment >= started]
    return {f"engine's watch of {path} listed again": len(after),
            f"engine's watch of {path} listed again, last":
                round(max(after), 2) if after else None}


# -- kube-scheduler's account ------------------------------------------------------------------

def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(sample.name, sample.labels, sample.value)
            for family in text_string_to_metric_families(text) for sample in family.samples
            if not math.isnan(sample.value)]


def scheduler_counters(text: str) -> dict[str, float]:
    """kube-scheduler's counters that say why pods waited, keyed for the report:

    - ``pods into <queue> on <event>``: ``scheduler_queue_incoming_pods_total``; the event
      ``UnschedulableTimeout`` is the 5-minute flush of the unschedulable queue, pods no event
      requeued;
    - ``attempts <result>``: ``scheduler_schedule_attempts_total``;
    - ``scheduled after the flush``: ``scheduler_pod_scheduled_after_flush_total``;
    - ``hint <plugin> on <event>: <hint>``: how often each plugin's queueing hint ran on each
      event and what it answered (``scheduler_queueing_hint_execution_duration_seconds``'s
      count): a plugin that answered QueueSkip on every node event leaves its pods to the flush.
    """
    counts: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        counts[key] = counts.get(key, 0.0) + value

    for name, labels, value in _samples(text):
        if name == "scheduler_queue_incoming_pods_total":
            add(f"pods into {labels.get('queue', '')} on {labels.get('event', '')}", value)
        elif name == "scheduler_schedule_attempts_total":
            add(f"attempts {labels.get('result', '')}", value)
        elif name == "scheduler_pod_scheduled_after_flush_total":
            add("scheduled after the flush", value)
        elif name == "scheduler_queueing_hint_execution_duration_seconds_count":
            add(f"hint {labels.get('plugin', '')} on {labels.get('event', '')}: "
                f"{labels.get('hint', '')}", value)
    return counts


def scheduler_gauges(text: str) -> dict[str, float]:
    """kube-scheduler's queues now: ``pending <queue>`` (``scheduler_pending_pods``) and
    ``unschedulable by <plugin>`` (``scheduler_unschedulable_pods``: pods whose last attempt
    the plugin rejected; a pod rejected by several counts under each)."""
    gauges: dict[str, float] = {}
    for name, labels, value in _samples(text):
        if name == "scheduler_pending_pods":
            key = f"pending {labels.get('queue', '')}"
        elif name == "scheduler_unschedulable_pods":
            key = f"unschedulable by {labels.get('plugin', '')}"
        else:
            continue
        gauges[key] = gauges.get(key, 0.0) + value
    return gauges


def grown(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each counter gained (those that gained nothing left out)."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()
            if value > before.get(key, 0.0)}


def gauges_after(samples: Sequence[tuple[float, Mapping[str, float]]],
                 moment: float | None) -> tuple[float, Mapping[str, float]] | None:
    """The first of the timed ``samples`` taken at or after ``moment`` (the queues once every
    node was usable), None if none was."""
    if moment is None:
        return None
    return next(((when, gauges) for when, gauges in samples if when >= moment), None)
