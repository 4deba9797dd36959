"""Reporting the results of hub commands: each change once, in the trace context of the object
made for the command.

One :class:`Reporting` serves a member's plans and jobs alike. It remembers what was last
reported of each command (so that what observation finds again unchanged is not sent again),
and the commands the API server refused (nothing exists for them to observe, so their result is
kept here and listed in every Hello). Where the results go is the link's
(:meth:`federation.client.member.MemberLink.report`), set once the link exists.

It observes nothing and talks to no API: the parts that read the API call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from federation.api import member_pb2
from federation.client.tracing import within
from operators.hublink import convert
from primitives import propagation

logger = logging.getLogger(__name__)


class Reporting:
    def __init__(self) -> None:
        #: Where results go (the link's report, once it exists).
        self.report: Callable[[member_pb2.CommandResult], None] = lambda result: None
        #: What was last reported of each command, encoded.
        self.reported: dict[str, bytes] = {}
        #: Commands refused by the API server (nothing exists for them to observe).
        self.refused: dict[str, member_pb2.CommandResult] = {}

    def send(self, result: member_pb2.CommandResult, traceparent: str) -> None:
        """Report ``result`` in the context of its command's execution ("": untraced)."""
        self.reported[result.command_id] = result.SerializeToString()
        with within(traceparent):
            self.report(result)

    def update(self, result: member_pb2.CommandResult, source: Mapping[str, Any]) -> None:
        """Report ``result`` if it is not what was last reported, in the context its
        ``source`` (the object made for the command) carries."""
        if self.reported.get(result.command_id) != result.SerializeToString():
            self.send(result, traceparent_of(source))

    def refuse(self, command: member_pb2.Command, why: str) -> None:
        logger.warning("hub command %s refused: %s", command.id, why)
        result = convert.refused(command, why)
        self.refused[command.id] = result
        self.send(result, propagation.traceparent())

    def resynced(self, results: list[member_pb2.CommandResult]
                 ) -> list[member_pb2.CommandResult]:
        """For a Hello: ``results`` (what the API shows), now the last reported, and the
        refusals."""
        self.reported = {r.command_id: r.SerializeToString() for r in results}
        return results + list(self.refused.values())


def traceparent_of(obj: Mapping[str, Any]) -> str:
    """The trace context an object made for a hub command carries ("" if none)."""
    return propagation.from_annotations((obj.get("metadata") or {}).get("annotations"))
