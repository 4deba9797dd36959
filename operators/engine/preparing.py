"""Before a pod on a fake node starts: its ResourceClaims read, as the kubelet's DRA manager
reads them, and whether they let it start (:mod:`~operators.engine.claims` decides).

A pod whose claims are not reserved for it waits; a refusal is said once in an Event
(FailedPrepareDynamicResources) and looked at again after a back-off, an API error only
retried; the claims made for the pod changing make it look again at once. This module keeps
those looks and reads the claims; the pod lifecycle (:mod:`~operators.engine.lifecycle`)
decides when a pod waits and schedules the looks.
"""

from __future__ import annotations

import logging

from operators.engine import claims
from operators.engine.pods import PodFacts
from operators.engine.recording import EventRecorder
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound, transient
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

#: A refused (or unreadable) pod's claims are looked at again after 1 s doubling, at most 10 s.
RETRY_BASE, RETRY_MAX = 1.0, 10.0


class _Preparing:
    """A pod whose ResourceClaims are not prepared yet: when to look again, and what the last
    look found (the Event says it once)."""

    __slots__ = ("attempts", "due", "refused")

    def __init__(self) -> None:
        self.attempts = 0
        self.due = 0.0
        self.refused = ""


class Preparations:
    """The pods of one cluster whose claims the engine looks at, by uid."""

    def __init__(self, cluster: str, client: Client, recorder: EventRecorder, *,
                 clock: Clock) -> None:
        self.cluster = cluster
        self.client = client
        self._recorder = recorder
        self._clock = clock
        self._pods: dict[str, _Preparing] = {}

    def due(self, uid: str) -> float:
        """When to look at the pod's claims: at once the first time, after a back-off once
        refused (or the API failed)."""
        return self._pods.setdefault(uid, _Preparing()).due

    def claims_changed(self, uid: str) -> None:
        """The claims made for the pod changed: look at once."""
        preparing = self._pods.get(uid)
        if preparing is not None:
            preparing.due = 0.0

    def forget(self, uid: str) -> None:
        self._pods.pop(uid, None)

    async def prepare(self, facts: PodFacts) -> None:
        """Read the pod's claims and say in ``facts.claims_prepared`` whether it may start."""
        wanted, problem = claims.needed(facts.namespace, facts.name, facts.claims,
                                        facts.claim_status)
        for name, owned in wanted:
            try:
                claim = await self.client.get(claims.claim_path(facts.namespace, name))
            except NotFound:
                problem = claims.not_found(name)
            except K8sError as error:
                if transient(error):  # nothing learnt: look again later
                    self._refused(facts, "", facts.claims_prepared)
                    return
                problem = f"fetch ResourceClaim {name}: {error}"
            else:
                problem = claims.refusal(facts.namespace, facts.name, facts.uid, name, claim,
                                         owned=owned)
            if problem:
                break
        if not problem:
            self._pods.pop(facts.uid, None)
            facts.claims_prepared = True
        else:
            self._refused(facts, problem, False)

    def _refused(self, facts: PodFacts, problem: str, prepared: bool | None) -> None:
        preparing = self._pods.setdefault(facts.uid, _Preparing())
        preparing.attempts += 1
        preparing.due = self._clock.now() + min(RETRY_BASE * 2 ** (preparing.attempts - 1),
                                                RETRY_MAX)
        facts.claims_prepared = prepared
        if problem and problem != preparing.refused:
            preparing.refused = problem
            logger.debug("engine %s: pod %s/%s waits for its claims: %s", self.cluster,
                         facts.namespace, facts.name, problem)
            self._recorder.emit(kind="Pod", namespace=facts.namespace, name=facts.name,
                                uid=facts.uid, event_type="Warning",
                                reason=claims.EVENT_REASON,
                                message=claims.event_message(problem), host=facts.node)
