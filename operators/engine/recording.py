"""Kubernetes Events from the engine: what a user must learn in ``kubectl events``, not only in
the engine's log (an annotation ignored, a foreign node left alone, a stage's events).

Events go out through a bounded queue from a task of their own: a flood of them (a thousand
bad pods) never holds up node or pod writes; when the queue is full they are dropped (the log
has them). An Event's name is derived from what it says, so a repeat is refused by the API as
AlreadyExists instead of piling up (:func:`operators.k8s.events.render_event`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError
from operators.k8s.events import render_event
from operators.k8s.times import rfc3339
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

QUEUE = 256


class EventRecorder:
    """Sends Events in the background; :meth:`emit` never waits."""

    def __init__(self, cluster: str, client: Client, *, clock: Clock) -> None:
        self.cluster = cluster
        self._client = client
        self._clock = clock
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=QUEUE)
        self.dropped = 0

    def emit(self, *, kind: str, name: str, uid: str, namespace: str = "",
             event_type: str = "Normal", reason: str, message: str, host: str) -> None:
        event = render_event(kind=kind, name=name, uid=uid, namespace=namespace,
                             event_type=event_type, reason=reason, message=message, host=host,
                             now=rfc3339(self._clock.now()))
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            logger.debug("engine %s: event dropped (queue full): %s", self.cluster, message)

    async def run(self) -> None:
        while True:
            event = await self._queue.get()
            namespace = event["metadata"]["namespace"]
            try:
                await self._client.create(f"/api/v1/namespaces/{namespace}/events", event,
                                          decode=False)
            except Conflict:
                pass  # the same event, sent before
            except K8sError as error:  # e.g. the namespace is going away: the log has it
                logger.debug("engine %s: event %s not sent: %s", self.cluster,
                             event["metadata"]["name"], error)
