"""Each node's ``/metrics/resource`` body rendered once per time bucket, not once per request.

A node's usage is a function of time and of its pods (:mod:`operators.engine.usage`), so a body
rendered at ``t`` is the node's true reading *stamped* ``t``: metrics-server and Prometheus
compute rates from the timestamps in the text, not from when they asked. Serving it to every
scrape within the same bucket of :data:`BUCKET` seconds is therefore honest, and cheap for
repeated scrapers (metrics-server and Prometheus on the same nodes, a probe, ``kubectl get
--raw``). A change of the node's pods (one started, stopped, deleted, or its usage annotations)
makes a new body at once, so a pod never shows a second after it stopped; a change of the
pool's usage defaults or of the node itself shows from the next bucket.

Only the current bucket's bodies are kept: memory holds what was scraped in the last second,
never a body per node of the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from primitives.clocks import Clock

#: Seconds one rendering of a node serves for: well under metrics-server's shortest
#: resolution (10 s), so every round gets a fresh reading.
BUCKET = 1.0


class Bodies:
    """Rendered bodies by node, for the current time bucket and the version of its pods."""

    __slots__ = ("_bodies", "_bucket", "_clock", "_render", "_span")

    def __init__(self, render: Callable[[str, float], bytes], *, clock: Clock,
                 bucket: float = BUCKET) -> None:
        """``render(node, now)``: the node's body at ``now``."""
        self._render = render
        self._clock = clock
        self._span = bucket
        self._bucket = -math.inf
        self._bodies: dict[str, tuple[int, bytes]] = {}

    def __len__(self) -> int:
        return len(self._bodies)

    def get(self, node: str, version: int) -> bytes:
        """The node's body: rendered anew unless this bucket's is of the same ``version``."""
        now = self._clock.now()
        bucket = math.floor(now / self._span)
        if bucket != self._bucket:
            self._bucket = bucket
            self._bodies.clear()
        else:
            cached = self._bodies.get(node)
            if cached is not None and cached[0] == version:
                return cached[1]
        body = self._render(node, now)
        self._bodies[node] = (version, body)
        return body
