"""The member side of a hub link: register, keep a session up, heartbeat, take commands.

What the member *is* and *does* comes from a :class:`Member` (the operator's hub link, or the
benchmark's simulated members); this module only keeps the conversation going:

- register, open the session with a Hello that reports every command the member has (so the
  hub resends only what never arrived), then heartbeat at the hub's interval, echoing the
  hub's own heartbeat numbers;
- commands are carried out one at a time, in order, and acknowledged after the member has
  them (``Member.execute`` returns once they are durable); results go out as they change;
- on any failure it reconnects with jittered exponential back-off; refusals that retrying
  cannot fix (bad token, a name another host holds) wait longer and are reported as they are;
- link faults (:class:`LinkFaults`) drop what goes one way or both, or delay it; when a
  partition heals the session is opened anew, so that the Hello resynchronises both sides;
- both ways are bounded queues: commands wait to be executed (:data:`COMMANDS`; when full, the
  link stops reading and gRPC's flow control holds the hub back), and messages wait to be
  written (:data:`OUTBOX`; heartbeats and acks wait for room). A result reported while the
  outbox is full is not dropped: the session ends, and the next one's Hello carries every
  result.

Every wait (back-off, heartbeats, added latency, fault polls) is on the link's clock
(``clock``, the wall clock unless a test passes its own).

Tracing: each command is executed in a ``member.execute_command`` span, a child of the
context its HubMessage carries (``traceparent``), so that what the member does for it (the
FaultPlan or Job it creates, with that span's context in their annotation) joins the hub's
trace. Its ack carries that span's context, and a result carries the context current where
the member reports it (:meth:`MemberLink.report`). Heartbeats are background work: untraced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from typing import Protocol

import grpc
from opentelemetry import trace

from federation.api import common_pb2, member_pb2, member_pb2_grpc
from federation.client import tracing
from federation.client.channels import HubAddress, bearer, open_channel
from primitives import propagation
from primitives.clocks import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

#: Back-off between attempts: from the first to the largest, doubling, with jitter. A hub
#: restart is survived within the largest plus a round trip.
BACKOFF_FIRST = 0.2
BACKOFF_MAX = 3.0
#: After a refusal that retrying does not fix (token, name), ask again this rarely.
REFUSED_BACKOFF = 15.0
FAULT_POLL = 0.2
#: Commands received and not yet executed, and messages not yet written to the hub.
COMMANDS = 1000
OUTBOX = 10_000
_FINAL = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
          grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS}


@dataclasses.dataclass(frozen=True)
class LinkFaults:
    """What a fault plan does to the link right now."""

    to_hub_dropped: bool = False
    from_hub_dropped: bool = False
    latency: float = 0.0

    @property
    def partitioned(self) -> bool:
        return self.to_hub_dropped or self.from_hub_dropped

    def describe(self) -> str:
        dropped = [way for way, lost in (("to the hub", self.to_hub_dropped),
                                         ("from the hub", self.from_hub_dropped)) if lost]
        parts = [f"what goes {' and '.join(dropped)} is lost"] if dropped else []
        if self.latency:
            parts.append(f"{self.latency:g}s added to every message")
        return "; ".join(parts) or "none"


NO_FAULTS = LinkFaults()


class Behind(Exception):
    """More results wait for the hub than the outbox holds: a new session resynchronises."""


class Member(Protocol):
    """A member cluster, as the link needs it."""

    async def introduce(self) -> member_pb2.RegisterRequest:
        """Identity and capacity, for Register."""
        ...

    async def inventory(self) -> common_pb2.Inventory | None:
        """The inventory to send with the next heartbeat (None: unchanged or unknown)."""
        ...

    async def resync(self) -> list[member_pb2.CommandResult]:
        """Every command the member has, and where each stands (for the Hello)."""
        ...

    async def execute(self, command: member_pb2.Command) -> bool:
        """Carry ``command`` out (durably started when this returns); True when the member had
        it already. Results are reported through :meth:`MemberLink.report`. It runs in the
        command's span: what it writes should carry that context (``propagation``)."""
        ...

    def faults(self) -> LinkFaults:
        ...

    def connected(self, up: bool, message: str) -> None:
        """The link came up (True) or went down (False, with why)."""
        ...


class MemberLink:
    def __init__(self, hub: HubAddress, token: str, member: Member, cluster: str, *,
                 rng: random.Random | None = None,
                 tracer_provider: trace.TracerProvider | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.hub = hub
        self.tracer_provider = tracer_provider
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self.member = member
        self.cluster = cluster
        self._metadata = bearer(token)
        self._rng = rng or random.Random()
        self._clock = clock
        self._outbox: asyncio.Queue[member_pb2.MemberMessage] | None = None
        self._behind: asyncio.Event | None = None
        self.sessions = 0
        self.hub_seq = 0

    def report(self, result: member_pb2.CommandResult) -> None:
        """Send a command's result now if a session is up (else the next Hello carries it).

        The message carries the trace context current here: a member reports in the context
        of the command the result is about (:func:`federation.client.tracing.within`), so
        that the hub's handling of it joins the command's trace."""
        if self._outbox is None or self._behind is None:
            return
        try:
            self._outbox.put_nowait(member_pb2.MemberMessage(
                result=result, traceparent=propagation.traceparent()))
        except asyncio.QueueFull:
            self._behind.set()

    async def run(self, stop_flag: asyncio.Event) -> None:
        delay = BACKOFF_FIRST
        channel = open_channel(self.hub, tracer_provider=self.tracer_provider)
        try:
            while not stop_flag.is_set():
                await self._await_healed(stop_flag)
                started = self._clock.now()
                try:
                    await self._session(channel, stop_flag)
                    message = "the session ended"
                    final = False
                except grpc.aio.AioRpcError as error:
                    message = f"{error.code().name}: {error.details()}"
                    final = error.code() in _FINAL
                    logger.warning("hub link of %s: %s", self.cluster, message)
                except Behind as error:
                    message, final = str(error), False
                    logger.warning("hub link of %s: %s", self.cluster, message)
                except Exception as error:  # the member failed a command: start over
                    message, final = f"the member failed: {error}", False
                    logger.exception("hub link of %s", self.cluster)
                if stop_flag.is_set():
                    break
                self.member.connected(False, message)
                if self._clock.now() - started > 2 * BACKOFF_MAX:
                    delay = BACKOFF_FIRST  # it was up a while: try again soon
                wait = REFUSED_BACKOFF if final else delay * (0.5 + self._rng.random() / 2)
                delay = min(BACKOFF_MAX, delay * 2)
                await self._clock.wait(stop_flag, wait)
        finally:
            await channel.close()

    async def _await_healed(self, stop_flag: asyncio.Event) -> None:
        """A partitioned member cannot reach the hub: it tries again once the fault is over."""
        while self.member.faults().partitioned and not stop_flag.is_set():
            await self._clock.wait(stop_flag, FAULT_POLL)

    async def _session(self, channel: grpc.aio.Channel, stop_flag: asyncio.Event) -> None:
        stub = member_pb2_grpc.MemberServiceStub(channel)
        registered = await stub.Register(await self.member.introduce(), metadata=self._metadata,
                                         timeout=10)
        interval = registered.heartbeat_interval.ToNanoseconds() / 1e9 or 2.0
        call = stub.Session(metadata=self._metadata)
        self.hub_seq = 0  # echoes count within a session: a restarted hub numbers anew
        hello = member_pb2.Hello(cluster=self.cluster, commands=await self.member.resync())
        await call.write(member_pb2.MemberMessage(hello=hello))
        outbox: asyncio.Queue[member_pb2.MemberMessage] = asyncio.Queue(OUTBOX)
        behind = asyncio.Event()
        self._outbox, self._behind = outbox, behind
        commands: asyncio.Queue[member_pb2.HubMessage] = asyncio.Queue(COMMANDS)
        tasks = [
            asyncio.create_task(self._fall_behind(behind), name=f"link-behind-{self.cluster}"),
            asyncio.create_task(self._write(call, outbox), name=f"link-write-{self.cluster}"),
            asyncio.create_task(self._heartbeat(outbox, interval),
                                name=f"link-beat-{self.cluster}"),
            asyncio.create_task(self._execute(commands, outbox),
                                name=f"link-exec-{self.cluster}"),
            asyncio.create_task(self._read(call, commands), name=f"link-read-{self.cluster}"),
            asyncio.create_task(self._until_healed(), name=f"link-heal-{self.cluster}"),
            asyncio.create_task(stop_flag.wait(), name=f"link-stop-{self.cluster}"),
        ]
        self.sessions += 1
        self.member.connected(True, f"session open with the hub at {self.hub.address}")
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error
        finally:
            self._outbox = self._behind = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            call.cancel()

    async def _fall_behind(self, behind: asyncio.Event) -> None:
        await behind.wait()
        raise Behind(f"more than {OUTBOX} messages wait for the hub; a new session's Hello "
                     f"reports every result")

    async def _write(self, call: grpc.aio.StreamStreamCall[member_pb2.MemberMessage,
                                                          member_pb2.HubMessage],
                     outbox: asyncio.Queue[member_pb2.MemberMessage]) -> None:
        while True:
            message = await outbox.get()
            faults = self.member.faults()
            if faults.to_hub_dropped:
                continue
            if faults.latency:
                await self._clock.sleep(faults.latency)
            await call.write(message)

    async def _heartbeat(self, outbox: asyncio.Queue[member_pb2.MemberMessage],
                         interval: float) -> None:
        seq = 0
        while True:
            seq += 1
            beat = member_pb2.MemberHeartbeat(seq=seq, hub_seq=self.hub_seq)
            beat.sent_at.FromNanoseconds(int(self._clock.now() * 1e9))
            inventory = await self.member.inventory()
            if inventory is not None:
                beat.inventory.CopyFrom(inventory)
            await outbox.put(member_pb2.MemberMessage(heartbeat=beat))
            await self._clock.sleep(interval)

    async def _read(self, call: grpc.aio.StreamStreamCall[member_pb2.MemberMessage,
                                                         member_pb2.HubMessage],
                    commands: asyncio.Queue[member_pb2.HubMessage]) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            assert isinstance(message, member_pb2.HubMessage)
            faults = self.member.faults()
            if faults.from_hub_dropped:
                continue
            if faults.latency:
                await self._clock.sleep(faults.latency)
            kind = message.WhichOneof("kind")
            if kind == "heartbeat":
                self.hub_seq = max(self.hub_seq, message.heartbeat.seq)
            elif kind == "command":
                await commands.put(message)  # full: the hub waits (flow control)

    async def _execute(self, commands: asyncio.Queue[member_pb2.HubMessage],
                       outbox: asyncio.Queue[member_pb2.MemberMessage]) -> None:
        while True:
            message = await commands.get()
            command = message.command
            # A child of the hub's span that sent the command: the member's work is part of
            # the run's trace. A command without context (an untraced hub) starts its own.
            with self._tracer.start_as_current_span(
                    "member.execute_command", context=propagation.parent(message.traceparent),
                    kind=trace.SpanKind.CONSUMER,
                    attributes=tracing.command_attributes(self.cluster, command)) as span:
                duplicate = await self.member.execute(command)
                span.set_attribute(tracing.DUPLICATE, duplicate)
            await outbox.put(member_pb2.MemberMessage(
                ack=member_pb2.CommandAck(command_id=command.id, duplicate=duplicate),
                traceparent=propagation.traceparent(span)))

    async def _until_healed(self) -> None:
        """Returns when a partition that began during this session ends: a new session
        resynchronises what either side missed. Meanwhile the member hears it is cut off."""
        partitioned = False
        while True:
            faults = self.member.faults()
            if partitioned and not faults.partitioned:
                return
            if faults.partitioned and not partitioned:
                self.member.connected(False, f"the link is partitioned ({faults.describe()})")
            partitioned = partitioned or faults.partitioned
            await self._clock.sleep(FAULT_POLL)


async def deregister(hub: HubAddress, token: str, cluster: str, host: str, *,
                     timeout: float = 10) -> None:
    """Take ``cluster`` (its name in the fleet) out of the fleet (its FakeCluster is gone), if
    ``host`` registered it."""
    channel = open_channel(hub)
    try:
        stub = member_pb2_grpc.MemberServiceStub(channel)
        await stub.Deregister(member_pb2.DeregisterRequest(cluster=cluster, host=host),
                              metadata=bearer(token), timeout=timeout)
    finally:
        await channel.close()
