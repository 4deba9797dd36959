"""Watching the fleet: who watches which members, and what each is told when a member changes.

A :class:`Watcher` is one WatchClusters call as the hub holds it: a selector and a bounded queue
of events, which :mod:`federation.hub.services` writes to the wire. A new watcher is told every
member its selector picks (ADDED), then SYNCED; after that each change of such a member
(ADDED, MODIFIED, DELETED). One that falls :data:`WATCH_QUEUE` events behind is ended
(``overflowed``) and may watch again, rather than the hub buffering without bound.

Publishing a change also marks the hub's state changed (what a watcher is told is what the
store will hold). This module decides nothing about members (that is
:mod:`federation.hub.membership`), and knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from federation.api import fleet_pb2
from federation.hub import convert
from federation.hub.membership import Member
from federation.hub.shared import Shared

#: Events waiting for one watcher; one that falls behind is ended and may watch again.
WATCH_QUEUE = 20_000


class Watcher:
    def __init__(self, selector: dict[str, Any]) -> None:
        self.selector = selector
        self.events: asyncio.Queue[fleet_pb2.ClusterEvent | None] = \
            asyncio.Queue(maxsize=WATCH_QUEUE)
        self.overflowed = False


class Watching:
    """The fleet's watchers, told of every change of the members they select."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.watchers: set[Watcher] = set()

    def watch(self, selector: dict[str, Any]) -> Watcher:
        watcher = Watcher(selector)
        for member in sorted(self.shared.membership.members.values(), key=lambda m: m.name):
            if convert.selects(selector, member.identity):
                watcher.events.put_nowait(fleet_pb2.ClusterEvent(
                    type=fleet_pb2.EVENT_TYPE_ADDED, member=convert.member_message(member)))
                if watcher.events.full():
                    break
        watcher.events.put_nowait(fleet_pb2.ClusterEvent(type=fleet_pb2.EVENT_TYPE_SYNCED))
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def end(self) -> None:
        """The hub stops: every watch ends after what it was told."""
        for watcher in list(self.watchers):
            with contextlib.suppress(asyncio.QueueFull):
                watcher.events.put_nowait(None)

    def publish(self, members: Iterable[Member | None], *, added: bool = False,
                deleted: bool = False) -> None:
        kind = fleet_pb2.EVENT_TYPE_DELETED if deleted else \
            fleet_pb2.EVENT_TYPE_ADDED if added else fleet_pb2.EVENT_TYPE_MODIFIED
        for member in members:
            if member is None:
                continue
            if not deleted:
                self.shared.store.changed()
            event: fleet_pb2.ClusterEvent | None = None
            for watcher in list(self.watchers):
                if not convert.selects(watcher.selector, member.identity):
                    continue
                event = event or fleet_pb2.ClusterEvent(type=kind,
                                                        member=convert.member_message(member))
                try:
                    watcher.events.put_nowait(event)
                except asyncio.QueueFull:
                    watcher.overflowed = True
                    self.watchers.discard(watcher)
