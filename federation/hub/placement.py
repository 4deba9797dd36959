"""Where the hub puts each Job of a workload: pure, seeded, from the members' inventory.

A Job is a gang: all its pods go to one cluster, or the Job waits. Policies:

- ``spread``: the clusters take turns (in name order), each Job going to the next one it fits;
- ``binpack``: the cluster with the fewest free GPUs that still fits the Job (fills clusters
  one by one, leaving whole clusters free for large gangs);
- ``weighted``: a seeded draw among the clusters it fits, in proportion to their weights;
- ``named``: the given clusters take turns, as spread but among them only.

Free GPUs start from each member's allocatable and go down as Jobs are placed; a Job that fits
nowhere is not placed (None), and what it would have taken stays free.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Literal

Policy = Literal["spread", "binpack", "weighted", "named"]


class PlacementError(ValueError):
    """A placement that cannot be asked for; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Job:
    pods: int
    gpus_per_pod: int

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


def place(jobs: Sequence[Job], free_gpus: Mapping[str, int], policy: Policy, *,
          seed: int = 0, weights: Mapping[str, float] | None = None,
          names: Sequence[str] = (), after: str = "") -> list[str | None]:
    """Each Job's cluster (None: it fits nowhere now), in order. With spread and named, the
    first turn goes to the cluster after ``after`` (the last one chosen by an earlier call)."""
    free = dict(free_gpus)
    if policy == "named":
        unknown = [name for name in names if name not in free]
        if not names or unknown:
            raise PlacementError(f"target.clusters: {', '.join(unknown) or 'none given'}; "
                                 f"name members of the fleet ({', '.join(sorted(free))})")
        order = list(names)
    else:
        order = sorted(free)
    if policy == "weighted":
        weights = weights or {}
        bad = {name: w for name, w in weights.items() if name not in free or not w >= 0}
        if bad:
            raise PlacementError(f"target.weights: {bad}; give members of the fleet with "
                                 f"weights of 0 or more")
    rng = random.Random(f"{seed}/placement")
    turn = 0
    if after in order:
        turn = (order.index(after) + 1) % len(order)
    elif after:
        turn = next((i for i, name in enumerate(order) if name > after), 0)
    placed: list[str | None] = []
    for job in jobs:
        fits = [name for name in order if free[name] >= job.gpus]
        chosen: str | None = None
        if fits:
            if policy in ("spread", "named"):
                for step in range(len(order)):
                    candidate = order[(turn + step) % len(order)]
                    if free[candidate] >= job.gpus:
                        chosen = candidate
                        turn = (turn + step + 1) % len(order)
                        break
            elif policy == "binpack":
                chosen = min(fits, key=lambda name: (free[name], name))
            else:
                assert weights is not None
                weighted = [(name, weights.get(name, 1.0)) for name in fits]
                total = sum(w for _, w in weighted)
                if total > 0:
                    chosen = rng.choices([n for n, _ in weighted],
                                         [w for _, w in weighted])[0]
        if chosen is not None:
            free[chosen] -= job.gpus
        placed.append(chosen)
    return placed
