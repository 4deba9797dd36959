"""List, then watch from the list's resourceVersion; resume after a dropped connection, relist
cleanly when the API server says the version is gone (410).

One watch per resource, however many objects: the callbacks see every object once on each
(re)list and then every change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from operators.k8s.client import Client
from operators.k8s.errors import Gone, TransportError

logger = logging.getLogger(__name__)

WATCH_TIMEOUT = 300  # seconds; the server ends the watch, we resume from the last version
PAGE = 500


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
        items.extend(page["items"])
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
    retry_delay: float = 1.0,
) -> None:
    """Run until cancelled: ``on_list`` after each (re)list, ``on_event`` for each change."""
    while True:
        try:
            version, items = await list_all(client, path, params)
        except TransportError as error:
            logger.warning("listing %s failed, retrying: %s", path, error)
            await asyncio.sleep(retry_delay)
            continue
        on_list(items)
        while True:
            query = {**params, "resourceVersion": version, "timeoutSeconds": str(WATCH_TIMEOUT)}
            try:
                async for event in client.watch(path, query):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(410, "Expired", str(obj.get("message", "")))
                        logger.warning("watch %s: %s", path, obj.get("message"))
                        continue
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        on_event(kind, obj)
            except Gone:
                logger.info("watch %s: resourceVersion %s is gone; relisting", path, version)
                break
            except TransportError as error:
                logger.debug("watch %s dropped, resuming from %s: %s", path, version, error)
                await asyncio.sleep(retry_delay)
