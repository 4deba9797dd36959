"""An in-process hub on a free loopback port, and clients of it, for the tests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from federation.api import common_pb2, member_pb2, member_pb2_grpc
from federation.client import tokens
from federation.client.channels import HubAddress, bearer, open_channel
from federation.client.discovery import HubFiles, HubInfo
from federation.client.fleet import FleetClient
from federation.hub.core import MAX_LIVE_WORKLOADS, HubSettings
from federation.hub.server import ServeSettings, Tls, serve
from primitives.clocks import SystemClock
from primitives.names import member_name

HEARTBEAT = 0.2
GRACE = 0.8


class HandClock(SystemClock):
    """Time a test sets by hand (``at``), with the wall clock's waits: a hub driven directly
    sees only the times the test gives it, while its ticker keeps its own pace (unlike
    ``tests.fakes.clocks.FakeClock``, moving time here wakes no one)."""

    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


@dataclasses.dataclass
class RunningHub:
    info: HubInfo
    key: bytes
    address: HubAddress

    def member_token(self, cluster: str) -> str:
        return tokens.member_token(self.key, cluster)

    @property
    def fleet_token(self) -> str:
        return tokens.fleet_token(self.key)

    def fleet(self) -> FleetClient:
        return FleetClient(self.address, self.fleet_token)

    def stub(self, channel: grpc.aio.Channel) -> member_pb2_grpc.MemberServiceStub:
        return member_pb2_grpc.MemberServiceStub(channel)


@contextlib.asynccontextmanager
async def running_hub(state_dir: Path, *, tls: Tls | None = None,
                      heartbeat: float = HEARTBEAT, grace: float = GRACE,
                      listen: str = "127.0.0.1:0",
                      max_live_workloads: int = MAX_LIVE_WORKLOADS
                      ) -> AsyncIterator[RunningHub]:
    """A hub serving on ``listen`` (by default a free loopback port; a restarted hub may take
    its predecessor's address, so that links reconnect to it by themselves)."""
    stop = asyncio.Event()
    ready: asyncio.Future[HubInfo] = asyncio.get_running_loop().create_future()
    settings = ServeSettings(hub=HubSettings(state_dir=state_dir, heartbeat_interval=heartbeat,
                                             grace=grace, fsync=False,
                                             max_live_workloads=max_live_workloads),
                             tls=tls, listen=listen)
    task = asyncio.create_task(serve(settings, stop_flag=stop, ready=ready.set_result))
    done, _ = await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    info = ready.result()
    key = HubFiles(state_dir).key.read_bytes()
    address = HubAddress(info.address, tls.ca.read_bytes() if tls else None)
    try:
        yield RunningHub(info=info, key=key, address=address)
    finally:
        stop.set()
        await task


def identity(name: str, namespace: str = "", host: str = "test",
             **labels: str) -> common_pb2.ClusterIdentity:
    return common_pb2.ClusterIdentity(name=name, namespace=namespace, host=host, labels=labels,
                                      kubernetes_version="v1.36.3",
                                      endpoint="https://127.0.0.1:6443")


class RawMember:
    """One member speaking the protocol by hand: every message is the test's choice.
    ``name``: its FakeCluster's name, in ``namespace`` (empty: default), on ``host``."""

    def __init__(self, hub: RunningHub, name: str, token: str | None = None, *,
                 namespace: str = "", host: str = "test") -> None:
        self.hub = hub
        self.cluster = name
        self.namespace = namespace
        self.host = host
        #: Its name in the fleet.
        self.name = member_name(namespace, name)
        self.channel = open_channel(hub.address)
        self.stub = hub.stub(self.channel)
        self.metadata = bearer(token or hub.member_token(self.name))
        self.call: grpc.aio.StreamStreamCall[member_pb2.MemberMessage,
                                             member_pb2.HubMessage] | None = None
        self.commands: asyncio.Queue[member_pb2.Command] = asyncio.Queue()
        self.reader: asyncio.Task[None] | None = None
        #: Whether heartbeats are answered (echoed) by the reader.
        self.echo = True

    async def register(self, **labels: str) -> member_pb2.RegisterResponse:
        return await self.stub.Register(
            member_pb2.RegisterRequest(cluster=identity(self.cluster, self.namespace,
                                                        self.host, **labels)),
            metadata=self.metadata, timeout=5)

    async def deregister(self) -> None:
        await self.stub.Deregister(member_pb2.DeregisterRequest(cluster=self.name,
                                                                host=self.host),
                                   metadata=self.metadata, timeout=5)

    async def hello(self, *reports: member_pb2.CommandResult) -> None:
        self.call = self.stub.Session(metadata=self.metadata)
        await self.call.write(member_pb2.MemberMessage(
            hello=member_pb2.Hello(cluster=self.name, commands=list(reports))))

    def read_in_background(self) -> None:
        """Commands go to :attr:`commands`; hub heartbeats are echoed (if :attr:`echo`)."""
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.call is not None
        while True:
            message = await self.call.read()
            if message is grpc.aio.EOF:
                return
            assert isinstance(message, member_pb2.HubMessage)
            if message.WhichOneof("kind") == "command":
                self.commands.put_nowait(message.command)
            elif self.echo:
                await self.beat(message.heartbeat.seq)

    async def send(self, message: member_pb2.MemberMessage) -> None:
        assert self.call is not None
        await self.call.write(message)

    async def beat(self, hub_seq: int) -> None:
        await self.send(member_pb2.MemberMessage(
            heartbeat=member_pb2.MemberHeartbeat(seq=1, hub_seq=hub_seq)))

    async def next_command(self, timeout: float = 5.0) -> member_pb2.Command:
        """The next command; the session's end (or refusal) is raised as it happened."""
        if self.reader is None:
            self.read_in_background()
        assert self.reader is not None
        getter = asyncio.ensure_future(self.commands.get())
        done, _ = await asyncio.wait([getter, self.reader], timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        if self.reader in done:
            self.reader.result()
            raise AssertionError("the hub ended the session")
        raise TimeoutError

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)
        if self.call is not None:
            self.call.cancel()
        await self.channel.close()
