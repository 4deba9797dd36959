"""Before a replayed controller's pod starts: the recorded life it takes from its lives set
(:mod:`operators.api.lives`), so that the n-th pod the controller made runs as the n-th pod it
made when recorded, through the same stages as any pod.

The set keeps which pod took which ordinal, written conditionally on its resourceVersion, so
two pods never take one ordinal, and an engine restarted reads each adopted pod's choice back
instead of choosing again. A set is read once and kept as last written, so each pod costs one
write; a conflict reads it again. The engine takes the pods of one set one at a time, in the order
it sees them bound: the scheduler binds one owner's pods in the order they were made (its
queue is first in, first out among pods of one priority). A set that cannot be read for good
(gone, or not what a replay writes) leaves the pod its defaults and says so in an Event; an
API error is only retried. This module reads and writes the sets; the pod lifecycle
(:mod:`~operators.engine.lifecycle`) holds a pod back until it took its life.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from operators.api import lives
from operators.engine.pods import PodFacts
from operators.engine.recording import EventRecorder
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound
from primitives import keys
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

#: A set the API did not answer for is read again after 1 s doubling, at most 10 s.
RETRY_BASE, RETRY_MAX = 1.0, 10.0
EVENT_REASON = "InvalidAnnotation"


class Lives:
    """The pods of one cluster waiting for their recorded life, by uid."""

    def __init__(self, cluster: str, client: Client, recorder: EventRecorder, *,
                 clock: Clock) -> None:
        self.cluster = cluster
        self.client = client
        self._recorder = recorder
        self._clock = clock
        self._attempts: dict[str, tuple[int, float]] = {}  # uid → (failures, next look)
        self._locks: dict[str, asyncio.Lock] = {}  # one per set: its pods in order
        # Each set as last read or written: a pod takes its ordinal from it with one write,
        # and a conflict (another writer since) reads it again.
        self._sets: dict[str, dict[str, Any]] = {}

    @staticmethod
    def waiting(facts: PodFacts) -> bool:
        """Whether the pod waits for its life (one being deleted does not: it never runs)."""
        return not facts.life_taken and not facts.deleting

    def due(self, uid: str) -> float:
        """When to read the pod's set: at once the first time, after a back-off once it
        failed."""
        return self._attempts.get(uid, (0, 0.0))[1]

    def forget(self, uid: str) -> None:
        self._attempts.pop(uid, None)

    async def take(self, facts: PodFacts) -> None:
        """Take the pod's life from its set (or say why it has none) into ``facts``."""
        name = facts.lives
        lock = self._locks.setdefault(name, asyncio.Lock())
        try:
            async with lock:
                ordinal, life = await self._claim(name, facts.uid)
        except NotFound:
            self._refused(facts, f"annotation {keys.LIVES} ignored: lives set "
                                 f"{lives.NAMESPACE}/{name} does not exist; the pod runs "
                                 f"with its pool's defaults")
            return
        except lives.LivesError as error:
            self._refused(facts, f"annotation {keys.LIVES} ignored: {error}")
            return
        except K8sError as error:
            failures = self._attempts.get(facts.uid, (0, 0.0))[0] + 1
            delay = min(RETRY_BASE * 2 ** (failures - 1), RETRY_MAX)
            self._attempts[facts.uid] = (failures, self._clock.now() + delay)
            logger.debug("engine %s: pod %s/%s: lives set %s not read (again in %.0fs): %s",
                         self.cluster, facts.namespace, facts.name, name, delay, error)
            return
        self._attempts.pop(facts.uid, None)
        logger.debug("engine %s: pod %s/%s takes life %d of %s%s", self.cluster,
                     facts.namespace, facts.name, ordinal, name,
                     "" if life is not None else " (past the last: its defaults)")
        facts.take(life)

    async def _claim(self, name: str, uid: str) -> tuple[int, lives.Life | None]:
        path = f"{lives.CONFIGMAPS}/{name}"
        while True:
            found = self._sets.get(name)
            if found is None:
                found = self._sets[name] = await self.client.get(path)
            ordinal, life, patch = lives.claim(found, uid)
            if patch is None:
                return ordinal, life
            try:
                self._sets[name] = await self.client.patch(path, patch)
            except Conflict:
                del self._sets[name]  # another writer came first: choose again from its
                continue
            except K8sError:
                del self._sets[name]
                raise
            return ordinal, life

    def _refused(self, facts: PodFacts, problem: str) -> None:
        self._attempts.pop(facts.uid, None)
        facts.take(None)
        logger.warning("engine %s: pod %s/%s: %s", self.cluster, facts.namespace, facts.name,
                       problem)
        self._recorder.emit(kind="Pod", namespace=facts.namespace, name=facts.name,
                            uid=facts.uid, event_type="Warning", reason=EVENT_REASON,
                            message=problem, host=facts.node)
