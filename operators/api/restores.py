"""The hold a snapshot restore puts on a FakeCluster, as both sides read it.

``fakefleet snapshot restore`` replaces a member's etcd prefix only while nothing of the member
runs: it writes :data:`~primitives.keys.RESTORE` on the FakeCluster with what may run (first
nothing, then the API server alone, then the engine too) and waits until the operator answers
in :data:`~primitives.keys.RESTORE_HELD` with the hold's :attr:`RestoreHold.token`. Removing
the hold gives the member back to the operator's usual reconcile, which starts the rest.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Literal

from primitives import keys

#: What a restore may let run, in the order it lets them: the API server alone (the restore
#: shifts times through it), then the engine (it renews every Lease before the
#: controller-manager, which would judge their age, starts again).
Runnable = Literal["kube-apiserver", "engine"]
RUNNABLE: tuple[Runnable, ...] = ("kube-apiserver", "engine")


@dataclasses.dataclass(frozen=True)
class RestoreHold:
    """A restore's hold on a member: its id and what of the member may run now."""

    id: str
    run: tuple[Runnable, ...] = ()

    @property
    def token(self) -> str:
        """What the operator writes back once the member runs exactly ``run``."""
        return f"{self.id}:{','.join(self.run)}"

    def render(self) -> str:
        return json.dumps({"id": self.id, "run": list(self.run)}, separators=(",", ":"))


def read_hold(annotations: Mapping[str, str] | None) -> RestoreHold | None:
    """The hold a FakeCluster carries, or None. An unreadable value holds everything stopped:
    a restore half done must never start on its own."""
    text = (annotations or {}).get(keys.RESTORE)
    if text is None:
        return None
    try:
        raw = json.loads(text)
        run = tuple(item for item in RUNNABLE if item in raw.get("run", ()))
        return RestoreHold(str(raw["id"]), run)
    except (ValueError, KeyError, TypeError, AttributeError):
        return RestoreHold("unreadable")


def held(annotations: Mapping[str, str] | None) -> str | None:
    """The token of the hold the operator last carried out (None: none)."""
    return (annotations or {}).get(keys.RESTORE_HELD)
