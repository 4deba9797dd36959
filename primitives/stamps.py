"""When a Job passed each step of its life, as both sides of the wire count them: the member
that watches the Job stamps the steps, the hub takes them in with the member's results and
reports latencies from them. The wire carries each as ``<step>_at`` (``JobProgress``).

Steps, in order::

    created → admitted → running → finished
                                 ↘ released (its pods ended where a scheduler in the member
                                   placed it, before the Job is marked finished)

A time is seconds since the epoch; 0 means the step was not (yet) seen.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Stamps:
    """When a Job was seen at each step (0: not yet)."""

    created: float = 0.0
    admitted: float = 0.0
    running: float = 0.0
    finished: float = 0.0
    released: float = 0.0


#: The steps' names, in order (the fields of :class:`Stamps`).
STEPS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Stamps))
