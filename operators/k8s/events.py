"""Kubernetes Events as data: the core/v1 Event a writer sends about a Node or a Pod it acted on.

Rendering only: whoever sends an Event decides when, through which client, and what a refusal
means (the engine queues them so a flood never holds up its writes; the FaultPlan runner sends
one per fault set it wrote or recovered, and one per node it deleted). An Event's name is
derived from what it says, so a repeat is refused by the API as AlreadyExists instead of piling
up.
"""

from __future__ import annotations

import hashlib
from typing import Any


def render_event(*, kind: str, name: str, uid: str, namespace: str = "", event_type: str,
                 reason: str, message: str, host: str, now: str) -> dict[str, Any]:
    """A core/v1 Event about a Pod (in its namespace) or a Node (in ``default``), as the engine
    on ``host`` reports it (another reporter replaces source and reportingComponent)."""
    digest = hashlib.sha256(f"{uid}/{reason}/{message}".encode()).hexdigest()[:16]
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid}
    if namespace:
        involved["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{digest}", "namespace": namespace or "default"},
        "involvedObject": involved,
        "type": event_type,
        "reason": reason,
        "message": message,
        "source": {"component": "fakefleet-engine", "host": host},
        "reportingComponent": "fakefleet-engine",
        "reportingInstance": host,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
