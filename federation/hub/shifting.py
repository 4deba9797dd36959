"""Time shifted, not lost, for the hub's state: a restored fleet's members, runs and workloads
with every time they carry moved by the time between the save and the restore. Pure functions,
no I/O.

The hub acts on absolute times: a run's members start its plan at ``start_at``, a workload's
Jobs arrive at their ``arrive_at``. Moved by as much as the clock moved, a Job due 30 s after
the save is due 30 s after the restore, and what was measured before the save (a Job's time to
admission, a run's duration) keeps its length. A time of 0 means "not yet" and stays 0;
durations (a Job's run time, a recovery's length) are no times and stay as they are.
"""

from __future__ import annotations

import copy
from typing import TypeVar

from federation.hub.membership import Member
from federation.hub.runs import MemberPart, Run
from federation.hub.workloads import JobRecord, Workload

#: The times of each kind of record, by field name.
MEMBER_TIMES = ("registered_at", "state_since", "last_heartbeat")
RUN_TIMES = ("created_at", "start_at", "finished_at")
PART_TIMES = ("sent_at", "acknowledged_at", "finished_at")
WORKLOAD_TIMES = ("created_at", "start_at", "finished_at")
JOB_TIMES = ("arrive_at", "sent_at", "created_at", "admitted_at", "running_at", "finished_at",
             "released_at", "failed_at")


def member(value: Member, seconds: float) -> Member:
    return _moved(value, MEMBER_TIMES, seconds)


def run(value: Run, seconds: float) -> Run:
    moved = _moved(value, RUN_TIMES, seconds)
    moved.parts = {name: _moved(part, PART_TIMES, seconds)
                   for name, part in value.parts.items()}
    return moved


def workload(value: Workload, seconds: float) -> Workload:
    moved = _moved(value, WORKLOAD_TIMES, seconds)
    moved.jobs = [_moved(job, JOB_TIMES, seconds) for job in value.jobs]
    moved.samples = [[at + seconds, *rest] for at, *rest in value.samples]
    return moved


Record = TypeVar("Record", Member, Run, MemberPart, Workload, JobRecord)


def _moved(value: Record, fields: tuple[str, ...], seconds: float) -> Record:
    """A copy of ``value`` with its ``fields`` moved (the original is left as it is)."""
    moved = copy.copy(value)
    for name in fields:
        if moment := getattr(value, name):
            setattr(moved, name, moment + seconds)
    return moved
