"""Time shifted, not lost: the times a restored object carries, moved by the time between the
save and the restore. Pure functions, no I/O.

The engine resumes each pod's timer from its status (a pod with 20 s of run time left at the
save has 20 s left after the restore only if its ``startedAt`` moves by as much as the clock
did), each Lease renewal from its ``renewTime``, and a FaultPlan counts its steps from
``status.startedAt``. Every time under these keys moves; a time's precision (seconds, or
microseconds for Leases) is kept.
"""

from __future__ import annotations

import datetime
from typing import Any

from operators.k8s.times import parse

#: The keys whose values are times that something waits on, in the objects a restore shifts:
#: pod and node status, Lease spec, FaultPlan status.
TIME_KEYS = frozenset({
    "startTime", "lastTransitionTime", "lastProbeTime", "startedAt", "finishedAt",
    "lastHeartbeatTime", "renewTime", "acquireTime", "injectedAt", "recoveredAt",
})


def shift(value: Any, seconds: int) -> Any:
    """``value`` (a status, a spec) with every time under :data:`TIME_KEYS` moved by
    ``seconds``; what is not a time is left as it is."""
    if isinstance(value, dict):
        return {key: _moved(item, seconds) if key in TIME_KEYS and isinstance(item, str)
                else shift(item, seconds) for key, item in value.items()}
    if isinstance(value, list):
        return [shift(item, seconds) for item in value]
    return value


def _moved(stamp: str, seconds: int) -> str:
    try:
        moment = parse(stamp) + seconds
    except ValueError:
        return stamp  # not a time (an empty string): nothing waits on it
    spelled = datetime.datetime.fromtimestamp(moment, datetime.UTC)
    if "." in stamp:
        return spelled.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return spelled.strftime("%Y-%m-%dT%H:%M:%SZ")
