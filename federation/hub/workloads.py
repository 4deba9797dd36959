"""A fleet workload's Jobs: when each arrives, where it went, how far it got. Pure state, no I/O,
time passed in; :mod:`federation.hub.dispatching` drives it and :mod:`federation.hub.convert`
puts it on the wire.

Each Job moves

    Waiting → Placed → Sent → Pending → Admitted → Running → Succeeded
       ↑                                                   ↘ Failed | Refused
       └──── (a failed attempt, while attempts remain: dispatched again) ┘

    Waiting | Placed | Sent | Pending | Admitted | Running → Cancelled (the hub stopped the
                                                             workload: see below)

Waiting until it arrives (its arrival time is drawn at submission) and until a member has room
for the whole gang (hub placement) or at once (a manager target). Placed: it has a cluster and
waits for that member's session. Sent: the ``CreateJob`` command is on the wire (its id is
``<workload>/<cluster>/job-<index>-<attempt>``). Pending: the member created the Job; from there
the member's reports move it on, with the member's own times. A command sent but never
acknowledged is sent again when the member reconnects; one the member acknowledged and no
longer reports was lost there (its Job deleted), which fails that attempt.

The hub stops a workload that is cancelled (reason :data:`CANCELLED`: its phase is Cancelled)
or whose dispatching fails (:data:`DISPATCH_FAILED`: Failed, with the error in its message; one
bad workload fails alone). Its Jobs not yet sent are never created, and those sent and not
finished are Cancelled at once; every member it sent Jobs to is asked to delete them
(:attr:`Workload.deleting`, a ``DeleteJobs`` command ``<workload>/<cluster>/delete``) until it
acknowledges, or its Hello shows none of them is left there. Jobs that finished keep their
state, so the report keeps what ran.

Trace context is kept with the workload (its ``fleet.workload`` span) and with each Job (the
first sending of its current attempt), so that a command sent again stays in the trace.

The report is computed from the Jobs (no counters to drift): counts by state, latencies from
each Job's arrival, per cluster where the Jobs ran, throughput, GPU utilisation from samples
the hub takes, re-dispatches and recovery times.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from federation.hub.outcomes import Outcome
from primitives.stamps import Stamps

Placement = Literal["spread", "binpack", "weighted", "clusters", "manager"]
PLACEMENTS: tuple[str, ...] = ("spread", "binpack", "weighted", "clusters", "manager")
GPU = "nvidia.com/gpu"
#: Why the hub stopped a workload (Workload.reason): CancelWorkload, or dispatching it failed.
CANCELLED = "Cancelled"
DISPATCH_FAILED = "DispatchFailed"
#: Longest message of a stopped workload (what members say of deleting its Jobs is added).
MAX_MESSAGE = 4096
#: Utilisation samples kept per workload: beyond it, every other is dropped and the interval
#: doubles, so a long workload keeps its whole span at a coarser grain.
MAX_SAMPLES = 1200


class JobState(enum.Enum):
    WAITING = "Waiting"
    PLACED = "Placed"
    SENT = "Sent"
    PENDING = "Pending"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REFUSED = "Refused"
    CANCELLED = "Cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.REFUSED,
                        JobState.CANCELLED)

    @property
    def holds_capacity(self) -> bool:
        """Whether the Job counts against its member's room (it is or will be there)."""
        return self in (JobState.PLACED, JobState.SENT, JobState.PENDING, JobState.ADMITTED,
                        JobState.RUNNING)


class Phase(enum.Enum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the workload asks for, as the hub acts on it (from the validated spec)."""

    jobs: int
    pods: int
    resources: Mapping[str, str]
    namespace: str
    labels: Mapping[str, str]
    priority_class: str
    queue: str
    placement: Placement
    selector: Mapping[str, object]
    weights: Mapping[str, float]
    manager: str
    seed: int
    max_attempts: int

    @property
    def gpus_per_pod(self) -> int:
        return gpu_count(self.resources.get(GPU, "0"))

    @property
    def gpus_per_job(self) -> int:
        return self.pods * self.gpus_per_pod


def gpu_count(quantity: str) -> int:
    """GPUs are whole: "8" → 8 (validation refuses anything else)."""
    try:
        return int(quantity)
    except ValueError:
        return 0


@dataclasses.dataclass
class Progress:
    """A member's report of one Job attempt."""

    outcome: Outcome
    #: When the member saw each step (the member's times).
    stamps: Stamps = dataclasses.field(default_factory=Stamps)
    placed_on: str = ""
    redispatched: int = 0
    message: str = ""


@dataclasses.dataclass
class JobRecord:
    index: int
    arrive_at: float
    run_seconds: float
    attempt: int = 1
    state: JobState = JobState.WAITING
    cluster: str = ""
    placed_on: str = ""
    message: str = ""
    sent_at: float = 0.0
    created_at: float = 0.0
    admitted_at: float = 0.0
    running_at: float = 0.0
    finished_at: float = 0.0
    #: When its pods ended where a scheduler in the member placed it (a MultiKueue worker),
    #: which the Job the hub sent shows later: its GPUs are free from then on.
    released_at: float = 0.0
    #: Dispatched again: by the hub after failed attempts, plus what the member's scheduler
    #: reported (a MultiKueue re-dispatch).
    redispatches: int = 0
    member_redispatches: int = 0
    #: When the last failed attempt failed (0: none is being recovered), and how long the
    #: last recovery took (failure to the new attempt running).
    failed_at: float = 0.0
    recovered_in: float = 0.0
    #: The cluster its last attempt failed on (placement tries others first).
    avoid: str = ""
    #: The W3C traceparent of the first sending of the current attempt ("": none yet).
    traceparent: str = ""

    @property
    def where(self) -> str:
        """Where it ran, for the per-cluster report."""
        return self.placed_on or self.cluster

    @property
    def ever_admitted(self) -> bool:
        return bool(self.admitted_at)


@dataclasses.dataclass(frozen=True)
class JobCommand:
    id: str
    workload_id: str
    cluster: str
    index: int
    attempt: int
    name: str
    run_seconds: float


def job_name(workload_id: str, index: int, attempt: int) -> str:
    """The Job's name in the member: a DNS label (the id is ``w`` and 8 hex digits)."""
    return f"{workload_id}-{index}" if attempt == 1 else f"{workload_id}-{index}-{attempt}"


def command_id(workload_id: str, cluster: str, index: int, attempt: int) -> str:
    return f"{workload_id}/{cluster}/job-{index}-{attempt}"


def delete_id(workload_id: str, cluster: str) -> str:
    return f"{workload_id}/{cluster}/delete"


def owner(value: str) -> tuple[str, str] | None:
    """(workload id, cluster) of a command a workload made (a Job's or a deletion's), or
    None."""
    parsed = parse_command_id(value)
    if parsed is not None:
        return parsed[0], parsed[1]
    workload, _, rest = value.partition("/")
    cluster, _, kind = rest.rpartition("/")  # namespace/name: a slash of its own
    if kind == "delete" and workload and cluster and cluster.count("/") <= 1:
        return workload, cluster
    return None


def parse_command_id(value: str) -> tuple[str, str, int, int] | None:
    """(workload id, cluster, index, attempt), or None for an id no workload made."""
    workload, _, rest = value.partition("/")
    cluster, _, job = rest.rpartition("/")  # namespace/name: a slash of its own
    if not workload or not cluster or cluster.count("/") > 1 or not job.startswith("job-"):
        return None
    numbers = job.removeprefix("job-").split("-")
    if len(numbers) != 2 or not all(n.isdigit() for n in numbers):
        return None
    return workload, cluster, int(numbers[0]), int(numbers[1])


@dataclasses.dataclass
class Latency:
    count: int = 0
    p50: float = 0.0
    p99: float = 0.0
    max: float = 0.0


def latency(values: Iterable[float]) -> Latency:
    """Nearest-rank percentiles."""
    ordered = sorted(values)
    if not ordered:
        return Latency()

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    return Latency(count=len(ordered), p50=rank(0.50), p99=rank(0.99), max=ordered[-1])


@dataclasses.dataclass
class Counts:
    jobs: int = 0
    waiting: int = 0
    pending: int = 0
    admitted: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    admitted_total: int = 0
    cancelled: int = 0

    def add(self, job: JobRecord) -> None:
        self.jobs += 1
        state = job.state
        if state is JobState.WAITING:
            self.waiting += 1
        elif state in (JobState.PLACED, JobState.SENT, JobState.PENDING):
            self.pending += 1
        elif state is JobState.ADMITTED:
            self.admitted += 1
        elif state is JobState.RUNNING:
            self.running += 1
        elif state is JobState.SUCCEEDED:
            self.succeeded += 1
        elif state is JobState.CANCELLED:
            self.cancelled += 1
        else:
            self.failed += 1
        self.admitted_total += job.ever_admitted


@dataclasses.dataclass
class Timings:
    to_admission: Latency
    to_running: Latency
    to_completion: Latency


def timings(jobs: Sequence[JobRecord]) -> Timings:
    return Timings(
        to_admission=latency(j.admitted_at - j.arrive_at for j in jobs if j.admitted_at),
        to_running=latency(j.running_at - j.arrive_at for j in jobs if j.running_at),
        to_completion=latency(j.finished_at - j.arrive_at for j in jobs
                              if j.state is JobState.SUCCEEDED))


@dataclasses.dataclass
class ClusterReport:
    cluster: str
    counts: Counts
    timings: Timings


@dataclasses.dataclass
class Report:
    counts: Counts
    timings: Timings
    clusters: list[ClusterReport]
    admitted_per_second: float
    makespan: float
    utilisation_mean: float
    utilisation_peak: float
    redispatched: int
    recovery: Latency


@dataclasses.dataclass
class Workload:
    id: str
    name: str
    spec: dict[str, object]
    """The spec as submitted (proto JSON), kept for GetWorkload and restarts."""
    settings: Settings
    created_at: float
    start_at: float
    jobs: list[JobRecord]
    finished_at: float = 0.0
    #: Utilisation samples: [time, GPUs allocated, GPUs in all].
    samples: list[list[float]] = dataclasses.field(default_factory=list)
    sample_every: float = 1.0
    #: The member the last spread/clusters placement chose (the next turn starts after it).
    last_turn: str = ""
    #: The W3C traceparent of the workload's span ("": untraced).
    traceparent: str = ""
    #: Why the hub stopped it ("": it was not), and what happened.
    reason: str = ""
    message: str = ""
    #: Once stopped: the members still to delete its Jobs, each with whether the deletion
    #: went out since the member last connected.
    deleting: dict[str, bool] = dataclasses.field(default_factory=dict)

    # -- what to do --------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        if self.reason:
            return Phase.CANCELLED if self.reason == CANCELLED else Phase.FAILED
        if not all(job.state.finished for job in self.jobs):
            return Phase.RUNNING
        if all(job.state is JobState.SUCCEEDED for job in self.jobs):
            return Phase.SUCCEEDED
        return Phase.FAILED

    def due(self, now: float) -> list[JobRecord]:
        """Jobs that arrived and have no cluster yet, in arrival order."""
        return [job for job in self.jobs
                if job.state is JobState.WAITING and job.arrive_at <= now]

    def next_arrival(self) -> float | None:
        waiting = [job.arrive_at for job in self.jobs if job.state is JobState.WAITING]
        return min(waiting) if waiting else None

    def outstanding(self, cluster: str) -> list[JobCommand]:
        """What ``cluster`` must be sent (placed there, never acknowledged)."""
        return [self.command(job) for job in self.jobs
                if job.cluster == cluster and job.state in (JobState.PLACED, JobState.SENT)]

    def command(self, job: JobRecord) -> JobCommand:
        return JobCommand(id=command_id(self.id, job.cluster, job.index, job.attempt),
                          workload_id=self.id, cluster=job.cluster, index=job.index,
                          attempt=job.attempt, name=job_name(self.id, job.index, job.attempt),
                          run_seconds=job.run_seconds)

    def traceparent_of(self, command: str) -> str:
        """The context of the first sending of ``command`` ("" if none, or an attempt that
        is over)."""
        job = self._current(command)
        return job.traceparent if job is not None else ""

    def gpus_held(self) -> dict[str, int]:
        """GPUs each member holds (or will) for this workload's Jobs placed on it."""
        held: dict[str, int] = {}
        for job in self.jobs:
            if job.state.holds_capacity:
                held[job.cluster] = held.get(job.cluster, 0) + self.settings.gpus_per_job
        return held

    def gpus_running(self) -> int:
        return sum(self.settings.gpus_per_job for job in self.jobs
                   if job.state is JobState.RUNNING and not job.released_at)

    # -- transitions: each returns whether anything changed ----------------------------------

    def place(self, job: JobRecord, cluster: str) -> None:
        job.state, job.cluster, job.placed_on = JobState.PLACED, cluster, ""

    def sent(self, job: JobRecord, now: float) -> bool:
        if job.state is JobState.PLACED:
            job.state, job.sent_at = JobState.SENT, now
            return True
        return False

    def traced(self, job: JobRecord, traceparent: str) -> bool:
        """Keep the context of the attempt's first sending (later ones are its children)."""
        if job.traceparent or not traceparent:
            return False
        job.traceparent = traceparent
        return True

    def _current(self, command: str) -> JobRecord | None:
        parsed = parse_command_id(command)
        if parsed is None or parsed[0] != self.id or not 0 <= parsed[2] < len(self.jobs):
            return None
        job = self.jobs[parsed[2]]
        if job.attempt != parsed[3] or job.cluster != parsed[1]:
            return None  # an earlier attempt's news: that attempt is over
        return job

    def acknowledged(self, command: str, now: float) -> bool:
        job = self._current(command)
        if job is None or job.state not in (JobState.PLACED, JobState.SENT):
            return False
        job.state = JobState.PENDING
        job.created_at = job.created_at or now
        return True

    def reported(self, command: str, progress: Progress, now: float) -> bool:
        job = self._current(command)
        if job is None or job.state.finished or job.state is JobState.WAITING:
            return False
        before = dataclasses.replace(job)
        stamps = progress.stamps
        job.created_at = stamps.created or job.created_at or now
        job.admitted_at = stamps.admitted or job.admitted_at
        job.running_at = stamps.running or job.running_at
        job.released_at = stamps.released
        job.placed_on = progress.placed_on or job.placed_on
        job.member_redispatches = max(job.member_redispatches, progress.redispatched)
        job.message = progress.message
        if progress.outcome is Outcome.SUCCEEDED:
            job.state, job.finished_at = JobState.SUCCEEDED, stamps.finished or now
            job.admitted_at = job.admitted_at or job.finished_at
        elif progress.outcome in (Outcome.FAILED, Outcome.REFUSED):
            self._attempt_failed(job, stamps.finished or now,
                                 JobState.FAILED if progress.outcome is Outcome.FAILED
                                 else JobState.REFUSED, progress.message)
        elif job.running_at:
            job.state = JobState.RUNNING
        elif job.admitted_at:
            job.state = JobState.ADMITTED
        else:
            job.state = JobState.PENDING
        if job.state is JobState.RUNNING and job.failed_at:
            job.recovered_in, job.failed_at = max(0.0, job.running_at - job.failed_at), 0.0
        return job != before

    def resynced(self, cluster: str, reported: Iterable[str], now: float) -> bool:
        """After a member's Hello: an attempt it acknowledged and no longer reports was lost
        there (its Job deleted); it fails, and is dispatched again if attempts remain."""
        have = set(reported)
        changed = False
        for job in self.jobs:
            if job.cluster != cluster or job.state not in (
                    JobState.PENDING, JobState.ADMITTED, JobState.RUNNING):
                continue
            if command_id(self.id, cluster, job.index, job.attempt) in have:
                continue
            self._attempt_failed(job, now, JobState.FAILED,
                                 f"the member no longer has Job "
                                 f"{job_name(self.id, job.index, job.attempt)} (deleted?)")
            changed = True
        return changed

    def _attempt_failed(self, job: JobRecord, now: float, state: JobState,
                        message: str) -> None:
        if state is JobState.FAILED and job.attempt < self.settings.max_attempts:
            job.avoid, job.failed_at = job.cluster, now
            job.attempt += 1
            job.redispatches += 1
            job.state, job.cluster, job.placed_on = JobState.WAITING, "", ""
            job.sent_at = job.created_at = job.admitted_at = job.running_at = 0.0
            job.released_at = 0.0
            job.traceparent = ""  # the next attempt is a new command
            job.message = f"attempt {job.attempt - 1} failed: {message}"
            return
        job.state, job.finished_at, job.message = state, now, message

    def stop(self, now: float, reason: str, message: str) -> None:
        """The hub stops the workload (``reason``: :data:`CANCELLED` or
        :data:`DISPATCH_FAILED`): its Jobs not sent yet are never created, those sent and not
        finished are Cancelled, and every member it sent Jobs to is to delete them."""
        self.reason, self.message = reason, message
        for job in self.jobs:
            if job.avoid:  # an earlier attempt's Job is there
                self.deleting[job.avoid] = False
            if job.state in (JobState.WAITING, JobState.PLACED):
                job.state, job.finished_at = JobState.CANCELLED, now
                job.message = f"never created: the workload stopped ({reason})"
                continue
            self.deleting[job.cluster] = False
            if not job.state.finished:
                job.state, job.finished_at = JobState.CANCELLED, now
                job.message = f"deleted: the workload stopped ({reason})"

    def deleted(self, cluster: str, note: str = "") -> bool:
        """``cluster`` deleted the workload's Jobs, or has none left (``note``: what it said
        when it could not, added to the message); whether anything changed."""
        if cluster not in self.deleting:
            return False
        del self.deleting[cluster]
        if note:
            self.message = f"{self.message}; {cluster}: {note}"[:MAX_MESSAGE]
        return True

    def resynced_deleting(self, cluster: str, reported: Iterable[str]) -> bool:
        """After ``cluster``'s Hello: if it lists none of this workload's Jobs, nothing is
        left there to delete."""
        if cluster not in self.deleting:
            return False
        self.deleting[cluster] = False  # a new session: the deletion goes out again
        for command in reported:
            parsed = parse_command_id(command)
            if parsed is not None and parsed[:2] == (self.id, cluster):
                return False
        return self.deleted(cluster)

    def sample(self, now: float, total_gpus: int) -> bool:
        """Record utilisation now, if a sample is due."""
        if self.samples and now - self.samples[-1][0] < self.sample_every:
            return False
        self.samples.append([now, float(self.gpus_running()), float(total_gpus)])
        if len(self.samples) > MAX_SAMPLES:
            self.samples = self.samples[::2]
            self.sample_every *= 2
        return True

    def settle(self, now: float) -> bool:
        if not self.finished_at and self.phase is not Phase.RUNNING:
            self.finished_at = now
            return True
        return False

    # -- what it shows -----------------------------------------------------------------------

    def report(self, now: float) -> Report:
        counts = Counts()
        by_cluster: dict[str, list[JobRecord]] = {}
        for job in self.jobs:
            counts.add(job)
            if job.where:
                by_cluster.setdefault(job.where, []).append(job)
        clusters = []
        for cluster, jobs in sorted(by_cluster.items()):
            cluster_counts = Counts()
            for job in jobs:
                cluster_counts.add(job)
            clusters.append(ClusterReport(cluster, cluster_counts, timings(jobs)))
        admissions = sorted(job.admitted_at for job in self.jobs if job.admitted_at)
        span = admissions[-1] - admissions[0] if len(admissions) > 1 else 0.0
        finished = [job.finished_at for job in self.jobs if job.state.finished]
        end = self.finished_at or now
        makespan = (max(finished) if self.finished_at and finished else end) - self.start_at
        shares = [allocated / total for _, allocated, total in self.samples if total > 0]
        return Report(
            counts=counts, timings=timings(self.jobs), clusters=clusters,
            admitted_per_second=(len(admissions) - 1) / span if span > 0 else 0.0,
            makespan=max(0.0, makespan),
            utilisation_mean=sum(shares) / len(shares) if shares else 0.0,
            utilisation_peak=max(shares, default=0.0),
            redispatched=sum(job.redispatches + job.member_redispatches for job in self.jobs),
            recovery=latency(job.recovered_in for job in self.jobs if job.recovered_in))
