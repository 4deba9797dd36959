"""Lease renewal gaps measured against the node-lifecycle controller's grace, and said loudly
when they come near it: the engine never lets nodes go NotReady quietly.

The node-lifecycle controller marks a node Unknown when its Lease was not renewed for its
grace period (``--node-monitor-grace-period``, 50 s by default). The heartbeats
(:mod:`~operators.engine.heartbeating`) tell of every gap: one closed by a renewal, and, every
few seconds, those still open (renewals late in a queue, or failing). A gap past three quarters
of the grace (37.5 s of 50 s) puts its pool at risk: a warning in the log, and the condition
``HeartbeatsAtRisk`` True on the FakeNodePool, with the largest gap measured and its node. It
clears once no gap past that has been measured for as long (every node of the pool then renewed
within it): an info line, and the condition False with what the largest gap was. Nodes that do
not heartbeat on purpose (an Unreachable fault) are not measured: their silence is asked for.

Pure book-keeping: no I/O, the time comes in.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: The node-lifecycle controller's grace period (kube-controller-manager's default).
NODE_GRACE = 50.0
#: The share of the grace a renewal gap may take before its pool is at risk.
AT_RISK = 0.75
#: A larger gap than the one reported by this much is reported again.
REPORT_STEP = 1.0


@dataclasses.dataclass
class _Gaps:
    """One pool's gaps past the threshold, since it was at risk."""

    gap: float  # the largest measured
    node: str  # whose it was
    last: float  # when one past the threshold was last measured
    reported: float  # the largest gap the condition says, and whose
    reported_node: str
    at_risk: bool = True


class GapAlarm:
    """Every pool's renewal gaps, and whether its heartbeats are at risk."""

    def __init__(self, cluster: str, *, grace: float = NODE_GRACE,
                 on_change: Callable[[], None] = lambda: None) -> None:
        """``on_change``: a pool's condition changed (its status is to be written)."""
        self.cluster = cluster
        self.grace = grace
        self.threshold = grace * AT_RISK
        self._on_change = on_change
        self._pools: dict[str, _Gaps] = {}

    def measured(self, pool: str, node: str, gap: float, now: float) -> None:
        """A renewal gap of ``gap`` seconds of ``node`` (closed, or still open at ``now``)."""
        if gap <= self.threshold:
            return
        gaps = self._pools.get(pool)
        if gaps is None or not gaps.at_risk:
            self._pools[pool] = _Gaps(gap, node, now, gap, node)
            logger.warning(
                "engine %s: heartbeats at risk in pool %s: a Lease renewal gap of %.1fs (node "
                "%s) passed 3/4 of the node-lifecycle controller's grace (%.1fs of %.0fs); the "
                "API server does not take the renewals in time, and nodes may go NotReady",
                self.cluster, pool, gap, node, self.threshold, self.grace)
            self._on_change()
            return
        gaps.last = now
        if gap > gaps.gap:
            gaps.gap, gaps.node = gap, node
        if gaps.gap >= gaps.reported + REPORT_STEP:
            gaps.reported, gaps.reported_node = gaps.gap, gaps.node
            self._on_change()

    def review(self, now: float) -> None:
        """Clear the pools with no gap past the threshold for as long as the threshold."""
        for pool, gaps in self._pools.items():
            if gaps.at_risk and now - gaps.last >= self.threshold:
                gaps.at_risk = False
                logger.info("engine %s: heartbeats on time again in pool %s (the largest "
                            "Lease renewal gap was %.1fs, node %s)", self.cluster, pool,
                            gaps.gap, gaps.node)
                self._on_change()

    def condition(self, pool: str) -> tuple[bool, str] | None:
        """The pool's HeartbeatsAtRisk (status, message); None: never at risk here."""
        gaps = self._pools.get(pool)
        if gaps is None:
            return None
        if gaps.at_risk:
            return True, (f"a Lease renewal gap of {gaps.reported:.1f}s (node "
                          f"{gaps.reported_node}) "
                          f"passed 3/4 of the node-lifecycle controller's grace "
                          f"({self.threshold:.1f}s of {self.grace:.0f}s): the API server does "
                          f"not take the renewals in time, and nodes may go NotReady")
        return False, (f"every Lease renewal within {self.threshold:.1f}s again; the largest "
                       f"gap was {gaps.gap:.1f}s (node {gaps.node})")
