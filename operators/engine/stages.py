"""The pod lifecycle as data: stages that say, for a pod in a given phase and condition, after
which delay which step happens next. Pure: no I/O, no clock.

A stage, as in KWOK, is selector + delay + next step::

    Stage("pod-complete", phases={RUNNING}, conditions={"alive", "finite"},
          timer=Timer.RUN, step=Step.EXIT)

reads "a running pod that is not being deleted and has a finite run time exits after its run
time". :data:`POD_STAGES` is the whole default lifecycle; the first stage that matches a pod
wins. Fault injection adds stages of its own to the same mechanism.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Callable, Iterable, Mapping

from operators.engine.pods import PodFacts


class Phase(enum.StrEnum):
    """Where a pod is in its life, as the engine sees it."""

    PENDING = "Pending"  # bound to a node, nothing started
    INITIALIZING = "Initializing"  # init containers running one after another
    RUNNING = "Running"
    BACKOFF = "BackOff"  # a container failed and waits to restart (CrashLoopBackOff)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Step(enum.StrEnum):
    """What a stage does to the pod."""

    INIT_NEXT = "init-next"  # the next init container completes (a sidecar: starts)
    START = "start"  # the containers run; the pod gets its IP and becomes Ready
    EXIT = "exit"  # the containers terminate with the pod's exit code
    RESTART = "restart"  # the back-off is over: the containers run again
    DELETE = "delete"  # a deleted pod is finalised (deleted with grace period 0)


class Timer(enum.StrEnum):
    """Where a stage's delay comes from."""

    NONE = "none"
    START = "start"  # start delay + jitter (annotation fakefleet.dev/start-delay, or the pool)
    INIT = "init"  # per init container (the pool)
    RUN = "run"  # run time (annotation fakefleet.dev/run-time, or the pool's Job run time)
    BACKOFF = "backoff"  # 10 s doubling per restart, at most 300 s, as the kubelet does
    GRACE = "grace"  # the pod's deletion grace period, capped by the pool


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    phases: frozenset[Phase]
    conditions: frozenset[str]
    timer: Timer
    step: Step


@dataclasses.dataclass(frozen=True)
class Timing:
    """A pool's defaults for the timers, in seconds."""

    start_delay: float = 0.0
    start_jitter: float = 0.0
    init_delay: float = 0.0
    job_run_time: float = 10.0
    job_run_jitter: float = 0.0
    grace_cap: float = 1.0


LIVE = frozenset(Phase)
BACKOFF_BASE = 10.0
BACKOFF_MAX = 300.0

#: Predicates the stage conditions may name; each reads only the pod's facts.
CONDITIONS: Mapping[str, Callable[[PodFacts], bool]] = {
    "deleting": lambda pod: pod.deleting,
    "alive": lambda pod: not pod.deleting,
    "init-pending": lambda pod: pod.init_done < len(pod.init_containers),
    "init-done": lambda pod: pod.init_done >= len(pod.init_containers),
    "finite": lambda pod: pod.run_time is not None or pod.job,
}

POD_STAGES: tuple[Stage, ...] = (
    Stage("pod-delete", LIVE, frozenset({"deleting"}), Timer.GRACE, Step.DELETE),
    Stage("pod-init", frozenset({Phase.PENDING, Phase.INITIALIZING}),
          frozenset({"alive", "init-pending"}), Timer.INIT, Step.INIT_NEXT),
    Stage("pod-ready", frozenset({Phase.PENDING, Phase.INITIALIZING}),
          frozenset({"alive", "init-done"}), Timer.START, Step.START),
    Stage("pod-complete", frozenset({Phase.RUNNING}), frozenset({"alive", "finite"}),
          Timer.RUN, Step.EXIT),
    Stage("pod-restart", frozenset({Phase.BACKOFF}), frozenset({"alive"}), Timer.BACKOFF,
          Step.RESTART),
)


def validate(stages: Iterable[Stage]) -> None:
    """Refuse stages that name unknown conditions (a typo would silently never match)."""
    for stage in stages:
        unknown = stage.conditions - CONDITIONS.keys()
        if unknown:
            raise ValueError(f"stage {stage.name!r} names unknown conditions {sorted(unknown)}; "
                             f"known: {sorted(CONDITIONS)}")


validate(POD_STAGES)


def match(pod: PodFacts, phase: Phase, stages: Iterable[Stage] = POD_STAGES) -> Stage | None:
    """The first stage that applies to ``pod`` in ``phase`` (None: nothing more happens)."""
    for stage in stages:
        if phase in stage.phases and all(CONDITIONS[c](pod) for c in stage.conditions):
            return stage
    return None


def delay(stage: Stage, pod: PodFacts, timing: Timing, rng: random.Random) -> float:
    """Seconds until ``stage`` fires for ``pod``; draws from ``rng`` only where jitter is."""
    if stage.timer is Timer.START:
        base = pod.start_delay if pod.start_delay is not None else timing.start_delay
        return base + (rng.uniform(0, timing.start_jitter) if timing.start_jitter else 0.0)
    if stage.timer is Timer.INIT:
        return timing.init_delay
    if stage.timer is Timer.RUN:
        if pod.run_time is not None:
            return pod.run_time
        jitter = rng.uniform(0, timing.job_run_jitter) if timing.job_run_jitter else 0.0
        return timing.job_run_time + jitter
    if stage.timer is Timer.BACKOFF:
        return min(BACKOFF_BASE * 2.0 ** max(pod.restarts - 1, 0), BACKOFF_MAX)
    if stage.timer is Timer.GRACE:
        return min(pod.grace if pod.grace is not None else 0.0, timing.grace_cap)
    return 0.0


def after(step: Step, pod: PodFacts) -> Phase | None:
    """The phase a step leaves the pod in (None: the pod is gone)."""
    if step is Step.INIT_NEXT:
        return Phase.INITIALIZING
    if step in (Step.START, Step.RESTART):
        return Phase.RUNNING
    if step is Step.EXIT:
        if pod.exit_code == 0:
            return Phase.SUCCEEDED
        return Phase.FAILED if pod.restart_policy == "Never" else Phase.BACKOFF
    return None


def advance(pod: PodFacts, step: Step, now: str, *, allocate: Callable[[PodFacts], str]) -> None:
    """Apply ``step`` to the pod's facts at time ``now``; its status is rendered from them."""
    if step is Step.INIT_NEXT:
        pod.start_time = pod.start_time or now
        pod.init_finished.append(now)
    elif step in (Step.START, Step.RESTART):
        if pod.ip is None:
            pod.ip = allocate(pod)
        pod.start_time = pod.start_time or now
        pod.started_at = now
        pod.ready_since = now
    elif step is Step.EXIT:
        pod.last_exit = (pod.exit_code, pod.started_at, now)
    following = after(step, pod)
    if following is Phase.BACKOFF:
        pod.restarts += 1
    if following is not None:
        pod.phase = str(following)
    pod.changed_at = now
