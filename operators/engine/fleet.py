"""Many engines, one per member cluster, each isolated: a failure in one never stops another.

Every engine runs in its own task under a guard that logs its failure and restarts it with
back-off; the other engines do not notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from operators.engine.running import ClusterEngine

logger = logging.getLogger(__name__)


class EngineFleet:
    """Starts, stops and guards the engines of the member clusters."""

    def __init__(self, *, min_backoff: float = 1.0, max_backoff: float = 30.0) -> None:
        self._engines: dict[str, ClusterEngine] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self.failures: dict[str, int] = {}

    def get(self, cluster: str) -> ClusterEngine | None:
        return self._engines.get(cluster)

    def __contains__(self, cluster: str) -> bool:
        return cluster in self._engines

    def start(self, cluster: str, factory: Callable[[], ClusterEngine]) -> ClusterEngine:
        """Start the engine of ``cluster`` unless it runs already."""
        if cluster in self._engines:
            return self._engines[cluster]
        engine = factory()
        self._engines[cluster] = engine
        self.failures[cluster] = 0
        self._tasks[cluster] = asyncio.create_task(self._guard(engine), name=f"engine:{cluster}")
        return engine

    async def stop(self, cluster: str) -> None:
        engine = self._engines.pop(cluster, None)
        task = self._tasks.pop(cluster, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if engine is not None:
            await engine.close()

    async def stop_all(self) -> None:
        for cluster in list(self._engines):
            await self.stop(cluster)

    async def _guard(self, engine: ClusterEngine) -> None:
        backoff = self._min_backoff
        while True:
            try:
                await engine.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.failures[engine.cluster] = self.failures.get(engine.cluster, 0) + 1
                logger.exception("engine of cluster %s failed; restarting in %.0fs",
                                 engine.cluster, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
