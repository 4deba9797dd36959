"""Reporting the results of hub commands: each change once, in the trace context of the object
made for the command.

One :class:`Reporting` serves a member's plans and jobs alike. It remembers what was last
reported of each command (so that what observation finds again unchanged is not sent again)
while the command's object exists (:meth:`Reporting.retain`), and the newest
:data:`KEEP_REFUSED` commands the API server refused (nothing exists for them to observe, so
their result is kept here and listed in every Hello; the hub has long had the older ones).
Where the results go is the link's (:meth:`federation.client.member.MemberLink.report`), set
once the link exists.

A result goes out under the id the hub knows its command by: the objects of a hub from before
members' names had their namespace carry ids that name the FakeCluster alone
(``<run>/west/start``), which the hub now knows as ``<run>/team-a/west/start``.

It observes nothing and talks to no API: the parts that read the API call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from federation.api import member_pb2
from federation.client.tracing import within
from operators.hublink import convert
from primitives import propagation

logger = logging.getLogger(__name__)


#: Refused commands whose result every Hello repeats.
KEEP_REFUSED = 1000


class Reporting:
    def __init__(self, member: str = "", name: str = "") -> None:
        """``member``: the member's name in the fleet (``namespace/name``); ``name``: its
        FakeCluster's name, which ids of commands from before namespaces counted name."""
        self._legacy = (name, member) if name and member and name != member else None
        #: Where results go (the link's report, once it exists).
        self.report: Callable[[member_pb2.CommandResult], None] = lambda result: None
        #: What was last reported of each command, encoded.
        self.reported: dict[str, bytes] = {}
        #: Commands refused by the API server (nothing exists for them to observe), oldest
        #: first.
        self.refused: dict[str, member_pb2.CommandResult] = {}

    def send(self, result: member_pb2.CommandResult, traceparent: str) -> None:
        """Report ``result`` in the context of its command's execution ("": untraced)."""
        result = self._as_known(result)
        self.reported[result.command_id] = result.SerializeToString()
        with within(traceparent):
            self.report(result)

    def update(self, result: member_pb2.CommandResult, source: Mapping[str, Any]) -> None:
        """Report ``result`` if it is not what was last reported, in the context its
        ``source`` (the object made for the command) carries."""
        result = self._as_known(result)
        if self.reported.get(result.command_id) != result.SerializeToString():
            self.send(result, traceparent_of(source))

    def refuse(self, command: member_pb2.Command, why: str) -> None:
        logger.warning("hub command %s refused: %s", command.id, why)
        result = convert.refused(command, why)
        self.refused[command.id] = result
        while len(self.refused) > KEEP_REFUSED:
            del self.refused[next(iter(self.refused))]
        self.send(result, propagation.traceparent())

    def resynced(self, results: list[member_pb2.CommandResult]
                 ) -> list[member_pb2.CommandResult]:
        """For a Hello: ``results`` (what the API shows), now the last reported, and the
        refusals."""
        results = [self._as_known(r) for r in results]
        self.reported = {r.command_id: r.SerializeToString() for r in results}
        return results + list(self.refused.values())

    def retain(self, commands: Iterable[str]) -> None:
        """Forget what was reported of commands other than ``commands`` (those whose objects
        exist): a command whose object is gone is not observed again."""
        kept = {self.known_id(command) for command in commands}
        self.reported = {command: sent for command, sent in self.reported.items()
                         if command in kept}

    def known_id(self, command_id: str) -> str:
        """``command_id`` as the hub knows it."""
        if self._legacy is None:
            return command_id
        name, member = self._legacy
        head, _, rest = command_id.partition("/")
        cluster, _, tail = rest.rpartition("/")
        return f"{head}/{member}/{tail}" if cluster == name else command_id

    def _as_known(self, result: member_pb2.CommandResult) -> member_pb2.CommandResult:
        known = self.known_id(result.command_id)
        if known == result.command_id:
            return result
        renamed = member_pb2.CommandResult()
        renamed.CopyFrom(result)
        renamed.command_id = known
        return renamed


def traceparent_of(obj: Mapping[str, Any]) -> str:
    """The trace context an object made for a hub command carries ("" if none)."""
    return propagation.from_annotations((obj.get("metadata") or {}).get("annotations"))
