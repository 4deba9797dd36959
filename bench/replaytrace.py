"""bench.replay's pure parts: the synthetic trace it replays, the order the write ceiling sends
the same writes in, and the figures it reports. No I/O, no clock.

The trace is what a busy namespace records: ConfigMaps created, patched twice and deleted, and
a few Deployments (scaled, then deleted) and Jobs (created suspended, then deleted: a bare
control plane has no nodes to run pods on, and the bench measures the replay's writes, not
what controllers make of them). Its times are drawn from a seeded generator, so a size and a
seed give the same trace in every run.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from typing import Any

from operators.recording.planning import Plan, Write
from operators.recording.replaying import Progress
from operators.recording.trace import Change, Method, Resource, Target, Trace

NANOS = 1_000_000_000
#: The cluster's name in the synthetic trace (a trace of one cluster: replay needs no --from).
CLUSTER = "bench"
CONFIGMAPS = Resource("", "v1", "configmaps")
DEPLOYMENTS = Resource("apps", "v1", "deployments")
JOBS = Resource("batch", "v1", "jobs")
#: Changes per ConfigMap (create, two patches, delete) and per Deployment (create, three
#: scales, delete) and Job (create, delete).
PER_CONFIGMAP, PER_DEPLOYMENT, PER_JOB = 4, 5, 2
#: Within a ConfigMap's life, the share of the trace its patches come after its create, and
#: the span its delete comes in: every change falls inside the trace.
CREATES_UNTIL = 0.6
LIFE = (0.1, 0.4)


@dataclasses.dataclass(frozen=True)
class Size:
    """What the synthetic trace holds, and over how long."""

    configmaps: int = 2500
    deployments: int = 5
    jobs: int = 5
    seconds: float = 150.0

    @property
    def changes(self) -> int:
        return (PER_CONFIGMAP * self.configmaps + PER_DEPLOYMENT * self.deployments +
                PER_JOB * self.jobs)


def _configmap(namespace: str, name: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "bench"}},
            "data": {"value": value, "owner": "team-a", "note": "x" * 64}}


def _deployment(namespace: str, name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "nginx"}]}}}}


def _job(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"suspend": True, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}]}}}}


def synthetic(size: Size, *, namespace: str, seed: int = 1) -> Trace:
    """A trace of ``size.changes`` changes in ``namespace`` over ``size.seconds``, the same
    for the same arguments. The namespace itself is not in it: replay makes it."""
    draw = random.Random(seed)
    span = int(size.seconds * NANOS)
    changes: list[Change] = []

    def at(share: float) -> int:
        return min(int(share * span), span)

    def change(when: int, method: Method, resource: Resource, name: str,
               template: dict[str, Any] | None = None) -> None:
        changes.append(Change(when, method, Target(CLUSTER, resource, namespace, name),
                              template))

    for index in range(size.configmaps):
        name = f"cm-{index}"
        born = draw.uniform(0.0, CREATES_UNTIL)
        dies = born + draw.uniform(*LIFE)
        first, second = sorted(draw.uniform(born, dies) for _ in range(2))
        change(at(born), "create", CONFIGMAPS, name, _configmap(namespace, name, "v0"))
        change(at(first), "patch", CONFIGMAPS, name, {"data": {"value": "v1"}})
        change(at(second), "patch", CONFIGMAPS, name, {"data": {"value": "v2"}})
        change(at(dies), "delete", CONFIGMAPS, name)
    for index in range(size.deployments):
        name = f"web-{index}"
        born = draw.uniform(0.0, CREATES_UNTIL)
        dies = born + draw.uniform(*LIFE)
        change(at(born), "create", DEPLOYMENTS, name, _deployment(namespace, name))
        for step, when in enumerate(sorted(draw.uniform(born, dies) for _ in range(3))):
            change(at(when), "patch", DEPLOYMENTS, name, {"spec": {"replicas": 1 + step % 2}})
        change(at(dies), "delete", DEPLOYMENTS, name)
    for index in range(size.jobs):
        name = f"batch-{index}"
        born = draw.uniform(0.0, CREATES_UNTIL)
        change(at(born), "create", JOBS, name, _job(namespace, name))
        change(at(born + draw.uniform(*LIFE)), "delete", JOBS, name)
    # A stable sort: an object's changes keep their order where two fall on one nanosecond.
    changes.sort(key=lambda c: c.at)
    return Trace(clusters=(CLUSTER,), started_at="2026-01-01T00:00:00Z", duration=span,
                 changes=tuple(changes),
                 notes=(f"synthetic (bench.replay): {size.configmaps} ConfigMaps, "
                        f"{size.deployments} Deployments, {size.jobs} Jobs, seed {seed}",))


def chains(plan: Plan) -> tuple[list[Write], list[list[Write]]]:
    """The plan's writes as the write ceiling sends them: the namespaces first, then each
    object's writes in their order (a patch never before its create), the objects in the
    order of their first write."""
    namespaces = [w for w in plan.writes if w.kind == "Namespace" and not w.namespace]
    by_object: dict[str, list[Write]] = {}
    for write in plan.writes:
        if not (write.kind == "Namespace" and not write.namespace):
            by_object.setdefault(write.chain or write.identity, []).append(write)
    return namespaces, list(by_object.values())


# -- figures -----------------------------------------------------------------------------------

@dataclasses.dataclass
class SpeedRun:
    """One replay of the synthetic trace at one speed (0: max)."""

    speed: float
    writes: int
    applied: int = 0
    refused: int = 0
    dropped: int = 0
    #: The timing error of each write (s): when the API answered it less when it was due.
    lag_p50: float = 0.0
    lag_p99: float = 0.0
    lag_max: float = 0.0
    wall_seconds: float = 0.0
    #: The timeline's length at this speed (s; 0 at max).
    timeline_seconds: float = 0.0
    first_refusal: str = ""

    @property
    def label(self) -> str:
        return "max" if self.speed == 0 else f"{self.speed:g}"

    @property
    def rate(self) -> float | None:
        return self.applied / self.wall_seconds if self.wall_seconds else None


def measured(speed: float, progress: Progress, *, wall: float, timeline: float) -> SpeedRun:
    """A replay's figures from its :class:`~operators.recording.replaying.Progress` (the lag
    percentiles as ``fakefleet replay`` reports them)."""
    p50, p99, worst = progress.lag()
    return SpeedRun(speed=speed, writes=progress.total, applied=progress.applied,
                    refused=len(progress.refused), dropped=progress.dropped, lag_p50=p50,
                    lag_p99=p99, lag_max=worst, wall_seconds=wall, timeline_seconds=timeline,
                    first_refusal=progress.refused[0].describe() if progress.refused else "")


def fastest_within(runs: Iterable[SpeedRun], budget: float = 1.0) -> SpeedRun | None:
    """The fastest replay on a timeline (not max: there every write is due at once, and its
    lag is the time until it was answered) whose p99 timing error stayed within ``budget``
    seconds and whose writes the API all took; None if none did."""
    kept = [run for run in runs if run.speed > 0 and run.lag_p99 <= budget and
            run.refused == 0 and run.dropped == 0 and run.applied == run.writes]
    return max(kept, key=lambda run: run.speed, default=None)


def parse_speeds(text: str) -> list[float]:
    """``1,10,max`` as factors (0: max); a ValueError names what is wrong."""
    speeds = []
    for given in (part.strip().lower() for part in text.split(",")):
        if given in ("max", "0"):
            speeds.append(0.0)
            continue
        try:
            speed = float(given)
        except ValueError:
            speed = float("nan")
        if not 0.001 <= speed <= 1e6:
            raise ValueError(f"{given!r} is not a speed: give factors from 0.001 to 1000000, or "
                             f"max, comma-separated (1,10,max)")
        speeds.append(speed)
    if not speeds or len(set(speeds)) != len(speeds):
        raise ValueError(f"{text!r}: give each speed once (1,10,max)")
    return speeds
