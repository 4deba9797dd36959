"""What the hub's parts share: the fleet's membership, the store, the members' open sessions,
the clock and the tracer. The hub (:class:`federation.hub.core.Hub`) makes one and hands it to
each part; no part replaces what it holds.

Only data: it must not grow behaviour (that belongs to the parts).
"""

from __future__ import annotations

import dataclasses

from opentelemetry import trace

from federation.hub.membership import Membership
from federation.hub.sending import Session
from federation.hub.store import Store
from primitives.clocks import Clock


@dataclasses.dataclass(frozen=True)
class Shared:
    membership: Membership
    store: Store
    #: The members' open sessions, by cluster, one each: :mod:`federation.hub.sessions` opens
    #: and closes them, runs and workloads send through them.
    connected: dict[str, Session]
    clock: Clock
    tracer: trace.Tracer
