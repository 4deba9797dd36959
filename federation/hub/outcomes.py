"""What a member reports of a command it was sent, as the hub's state keeps it: one word for a
run's StartPlan and StopPlan and for a workload's CreateJob alike (``CommandPhase`` on the
wire, which :mod:`federation.hub.convert` maps to it). Pure: no I/O.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """What a member reports of a command."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REFUSED = "Refused"
