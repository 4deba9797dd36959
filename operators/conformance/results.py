"""What a check found about one requirement: pure data.

A status is one of the four the program's validator accepts. ``deadline`` says which deadline
passed when a check ran out of time (the step it was waiting for), so a report never says only
"failed"; ``extra`` marks a check that the checklist does not ask for (DRA in v1.36), reported
in junit.xml and the evidence only.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Status = Literal["Implemented", "Not Implemented", "Partially Implemented", "N/A"]
STATUSES: tuple[Status, ...] = ("Implemented", "Not Implemented", "Partially Implemented",
                                "N/A")
#: Said in the report and in every requirement's notes.
BANNER = ("fakefleet AI-conformance rehearsal on simulated hardware, not a certification: "
          "real Kubernetes components ran against fake nodes and GPUs")


@dataclasses.dataclass(frozen=True)
class Result:
    """One check's outcome."""

    id: str
    status: Status
    notes: str
    evidence: tuple[str, ...] = ()
    """Files under the output directory, relative to it (evidence/<id>/...)."""
    seconds: float = 0.0
    deadline: str = ""
    """Which deadline passed (empty: none did)."""
    automated: bool = True
    """Whether a check ran, as opposed to a status fakefleet states for what it cannot judge."""
    extra: bool = False
    """Not a requirement of the checklist: junit.xml and evidence only."""

    @property
    def passed(self) -> bool:
        return self.status == "Implemented"
