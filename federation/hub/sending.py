"""Sending to members: a session's outbox, and every sending of a command as a span.

A :class:`Session` is one member's open stream as the hub holds it: a bounded queue of the
messages waiting to be written, which :mod:`federation.hub.services` puts on the wire. A member
that falls :data:`SESSION_QUEUE` messages behind loses its session rather than the hub its
memory; nothing is lost with it (commands are kept in the runs and workloads, and what the
member never acknowledged is sent again when it reconnects).

:func:`send_command` is the one way a command goes out: in a ``hub.send_command`` span whose
context the message carries, so that a resend (after a reconnect or a restart) stays in the
trace of the first sending.

This module decides nothing about what to send or when (that is :mod:`federation.hub.running`
for runs and :mod:`federation.hub.dispatching` for workloads), keeps no state beyond the queue,
and knows nothing of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opentelemetry import trace

from federation.api import member_pb2
from federation.client.tracing import RESEND, command_attributes
from federation.hub import tracing

logger = logging.getLogger(__name__)

#: Messages waiting for a member's stream; a member that falls this far behind is dropped and
#: resyncs when it reconnects (commands are in the runs, not only in the queue).
SESSION_QUEUE = 1000


class Session:
    """One member's open stream: what waits to be written to it."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.outbox: asyncio.Queue[member_pb2.HubMessage | None] = \
            asyncio.Queue(maxsize=SESSION_QUEUE)
        self.closed = False

    def send(self, message: member_pb2.HubMessage) -> bool:
        if self.closed:
            return False
        try:
            self.outbox.put_nowait(message)
        except asyncio.QueueFull:
            logger.warning("member %s fell %d messages behind: its session is dropped",
                           self.cluster, SESSION_QUEUE)
            self.close()
            return False
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(asyncio.QueueFull):
                self.outbox.put_nowait(None)


def send_command(tracer: trace.Tracer, session: Session, message: member_pb2.HubMessage,
                 first: str, parent: str) -> str | None:
    """Send a command in a ``hub.send_command`` span, whose context the message carries:
    a child of the command's first sending (``first``) when this one repeats it, else of
    ``parent``. Returns that context ("" untraced), or None when the session took
    nothing."""
    if session.closed:
        return None
    attributes = command_attributes(session.cluster, message.command) | {RESEND: bool(first)}
    with tracing.continuing(tracer, "hub.send_command", first or parent, attributes,
                            kind=trace.SpanKind.PRODUCER) as span:
        message.traceparent = tracing.of(span)
        if not session.send(message):
            if span is not None:
                span.set_status(trace.StatusCode.ERROR,
                                "the member's session fell behind and was dropped")
            return None
    return message.traceparent
