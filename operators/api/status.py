"""kstatus conditions: a condition keeps its lastTransitionTime while its status holds."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from operators.api.base import Condition


def condition(kind: str, holds: bool, *, reason: str, message: str, generation: int, now: str,
              previous: Iterable[Condition]) -> Condition:
    status: Literal["True", "False"] = "True" if holds else "False"
    transition = now
    for old in previous:
        if old.type == kind and old.status == status and old.lastTransitionTime:
            transition = old.lastTransitionTime
    return Condition(type=kind, status=status, reason=reason, message=message,
                     lastTransitionTime=transition, observedGeneration=generation)
