"""List, then watch from the list's resourceVersion, for as long as the caller runs: the
informer pattern, without the cache.

It bends and never breaks: every failure of a list or a watch (no answer, a reset, a 5xx, a
429 beyond the client's patience, a 403 while RBAC catches up, a line that is not JSON) is
retried after a capped, jittered back-off; a watch resumes from the last resourceVersion it saw;
a 410 (the version is compacted away, on a watch or on a paginated list whose continue token
expired) starts a clean relist at once. Only cancellation ends it.

One watch per resource however many objects: the callbacks see every object once on each
(re)list and then every change, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from operators.k8s.client import Client
from operators.k8s.errors import Gone, K8sError
from operators.k8s.retrying import Backoff
from primitives.clocks import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

PAGE = 500
#: The longest wait before a failed list or watch is tried again (s): an API server back from an
#: outage is seen again within seconds (client-go's reflectors wait up to 30 s, but they are
#: one per kind; a fault plan's outage of 15 s must not leave an engine deaf for 30 more).
RETRY_CAP = 5.0


async def list_all(client: Client, path: str, params: Mapping[str, str]) -> tuple[str, list[
        Any]]:
    """Every object at ``path`` (paginated) and the list's resourceVersion."""
    items: list[Any] = []
    token = ""
    while True:
        query = {**params, "limit": str(PAGE)}
        if token:
            query["continue"] = token
        page = await client.get(path, query)
        items.extend(page.get("items") or [])
        token = page["metadata"].get("continue", "")
        if not token:
            return str(page["metadata"]["resourceVersion"]), items


async def list_and_watch(
    client: Client,
    path: str,
    params: Mapping[str, str],
    *,
    on_list: Callable[[list[Any]], None],
    on_event: Callable[[str, Any], None],
    clock: Clock = SYSTEM_CLOCK,
    backoff: Backoff | None = None,
) -> None:
    """Run until cancelled: ``on_list`` after each (re)list, ``on_event`` for each change."""
    backoff = backoff or Backoff(cap=RETRY_CAP)
    while True:
        try:
            version, items = await list_all(client, path, params)
        except Gone:
            logger.info("list %s: the continue token expired; listing again", path)
            continue
        except K8sError as error:
            delay = backoff.next()
            logger.warning("list %s failed, retrying in %.1fs: %s", path, delay, error)
            await clock.sleep(delay)
            continue
        backoff.reset()
        on_list(items)
        await _watch(client, path, params, version, on_event, clock, backoff)


async def _watch(client: Client, path: str, params: Mapping[str, str], version: str,
                 on_event: Callable[[str, Any], None], clock: Clock, backoff: Backoff) -> None:
    """Watch from ``version`` across reconnections; returns when a relist is needed."""
    while True:
        started, seen = clock.now(), 0
        try:
            async for event in client.watch(path, {**params, "resourceVersion": version}):
                seen += 1
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone(410, "Expired", str(obj.get("message", "")))
                    raise K8sError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = obj["metadata"]["resourceVersion"]
                backoff.reset()
                if kind != "BOOKMARK":
                    on_event(str(kind), obj)
        except Gone:
            logger.info("watch %s: resourceVersion %s is gone; relisting", path, version)
            return
        except K8sError as error:
            delay = backoff.next()
            logger.debug("watch %s dropped, resuming from %s in %.1fs: %s", path, version,
                         delay, error)
            await clock.sleep(delay)
            continue
        if not seen and clock.now() - started < 1.0:  # ended at once: do not spin
            await clock.sleep(backoff.next())
