"""The kubelet API over TLS with real ssl clients on loopback: each node's certificate at its
own address, the API server's client certificate required (another CA's refused at the
handshake, another name answered 403), the log routes with the kubelet's words, a followed
log, upgrades handed to a session that writes when it likes, idle connections closed."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from operators.api.logs import LogLines
from operators.controlplane import pki as pki_module
from operators.controlplane.pki import KubeletPKI, ensure_kubelet_pki, ensure_pki
from operators.engine import streaming
from operators.engine.certifying import NodeCertificates
from operators.engine.kubeletapi import Exchange, KubeletAPIServer
from operators.engine.logs import compile_script
from operators.engine.logserving import BATCH, LogServer, LogStream
from operators.engine.pods import Exit, PodFacts, PodLife
from operators.engine.responding import Answer
from operators.engine.scripting import PodSight, Scripts, sight
from operators.engine.stages import LogRule, default_lifecycle
from operators.engine.timers import ClockTimers
from operators.engine.upgrading import Link, Request, Switch
from operators.k8s.times import rfc3339
from tests.engine.harness import pod
from tests.engine.kubeletclient import (
    SPDY,
    api_server_context,
    client_context,
    connect,
    get,
    read_chunk,
    response,
)
from tests.fakes.clocks import FakeClock

NODES = {"127.64.0.1": "cpu-0", "127.64.0.2": "cpu-1"}
SCRIPT = compile_script(LogLines.model_validate({
    "start": ["hello from {pod}"],
    "every": {"interval": "10s", "lines": ["tick {n}"]},
    "exit": ["bye {exitCode}"]}))


class Pods:
    """The engine's pods, as the log routes see them."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.pods: dict[tuple[str, str], tuple[PodFacts, PodLife]] = {}
        self.rules: Sequence[LogRule] = (LogRule("all", lambda facts, life: True, SCRIPT),)

    def add(self, name: str, node: str, life: PodLife, **annotations: str) -> PodFacts:
        body = pod(name, node, annotations=annotations)
        body["metadata"]["uid"] = f"uid-{name}"
        facts = PodFacts(body)
        self.pods[("default", name)] = (facts, life)
        return facts

    def named(self, namespace: str, name: str) -> tuple[PodFacts, PodLife] | None:
        return self.pods.get((namespace, name))

    def log_rules(self, uid: str) -> Sequence[LogRule]:
        return self.rules

    def pod(self, node: str, namespace: str, name: str) -> PodSight | None:
        found = self.pods.get((namespace, name))
        return sight(*found) if found is not None and found[0].node == node else None


class Echo:
    """A session that echoes what it gets, and says when its connection is gone."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.lost = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.link.write(b"echo:" + data)

    def connection_lost(self) -> None:
        self.lost.set()


@pytest.fixture
def kubelet(tmp_path: Path) -> KubeletPKI:
    return ensure_kubelet_pki(tmp_path / "kubelet", "west")


class Served:
    def __init__(self, server: KubeletAPIServer, pods: Pods, logs: LogServer,
                 sessions: list[Echo]) -> None:
        self.server, self.pods, self.logs, self.sessions = server, pods, logs, sessions

    @property
    def port(self) -> int:
        return self.server.port


@contextlib.asynccontextmanager
async def serving(kubelet: KubeletPKI, *, idle: float = 15.0,
                  engine_s: bool = False) -> AsyncIterator[Served]:
    """``engine_s``: the engine's upgrader over the pods (else: one that echoes)."""
    clock = FakeClock(1_767_225_600.0 + 35)
    pods = Pods(clock)
    logs = LogServer(pods, clock=clock)
    sessions: list[Echo] = []

    def echo(request: Request, node: str, link: Link) -> Switch | Answer:
        session = Echo(link)
        sessions.append(session)
        return Switch(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                      b"Upgrade: SPDY/3.1\r\n\r\n", session)
    upgrader = streaming.Upgrader(pods=pods, scripts=Scripts(default_lifecycle()),
                                  timers=ClockTimers(clock=clock)) if engine_s else echo
    server = KubeletAPIServer(NODES.get, logs, NodeCertificates(kubelet, NODES.get),
                              upgrader=upgrader, idle=idle)
    await server.start()
    following = asyncio.create_task(logs.run())
    try:
        yield Served(server, pods, logs, sessions)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await server.close()


async def healthz(port: int, context: ssl.SSLContext) -> int:
    reader, writer = await connect(port, "127.64.0.1", context)
    try:
        return (await get(reader, writer, "/healthz"))[0]
    finally:
        writer.close()


def peer_certificate(writer: asyncio.StreamWriter) -> x509.Certificate:
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der)


RUNNING = PodLife(phase="Running", started_at=rfc3339(1_767_225_600.0))


# -- TLS --------------------------------------------------------------------------------------

async def test_each_node_presents_its_own_certificate_at_its_own_address(
        kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        for address, node in NODES.items():
            reader, writer = await connect(served.port, address, api_server_context(kubelet))
            cert = peer_certificate(writer)
            assert cert.subject.rfc4514_string() == f"CN=system:node:{node},O=system:nodes"
            assert writer.get_extra_info("ssl_object").selected_alpn_protocol() in (
                None, "http/1.1")
            status, _, body = await get(reader, writer, "/healthz")
            assert (status, body) == (200, b"ok")
            writer.close()


async def test_a_client_certificate_of_another_ca_is_refused_at_the_handshake(
        kubelet: KubeletPKI, tmp_path: Path) -> None:
    """The member's own CA issued the admin's certificate: it opens no kubelet."""
    member = ensure_pki(tmp_path / "pki", "west")
    async with serving(kubelet) as served:
        for context in (client_context(kubelet, member.client_cert("admin"),
                                       member.client_key("admin")),
                        client_context(kubelet)):  # and no certificate at all
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await healthz(served.port, context)


async def test_another_name_from_the_kubelet_ca_is_forbidden(kubelet: KubeletPKI,
                                                             tmp_path: Path) -> None:
    ca_cert, ca_key = pki_module.load_authority(kubelet)
    key = ec.generate_private_key(ec.SECP256R1())
    now = ca_cert.not_valid_before_utc
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intruder")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + pki_module.NODE_VALIDITY)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .sign(ca_key, hashes.SHA256()))
    (tmp_path / "c.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "c.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = client_context(kubelet, tmp_path / "c.crt", tmp_path / "c.key")
    async with serving(kubelet) as served:
        served.pods.add("web", "cpu-0", RUNNING)
        reader, writer = await connect(served.port, "127.64.0.1", context)
        status, _, body = await get(reader, writer, "/containerLogs/default/web/main")
        assert status == 403
        assert body == b"Forbidden (user=intruder, verb=get, resource=nodes, subresource=proxy)"
        writer.close()


async def test_an_address_no_node_has_is_closed_before_the_handshake(
        kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await connect(served.port, "127.64.0.9", api_server_context(kubelet))


async def test_an_idle_connection_is_closed(kubelet: KubeletPKI) -> None:
    async with serving(kubelet, idle=0.2) as served:
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        assert (await get(reader, writer, "/healthz"))[0] == 200
        assert await asyncio.wait_for(reader.read(), 5) == b"", "closed by the engine"
        writer.close()


# -- logs -------------------------------------------------------------------------------------

async def test_a_log_is_answered_chunked_and_the_connection_kept(kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        served.pods.add("web", "cpu-0", RUNNING)
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        status, fields, body = await get(reader, writer, "/containerLogs/default/web/main")
        assert (status, fields["transfer-encoding"]) == (200, "chunked")
        assert body == b"hello from web\ntick 1\ntick 2\ntick 3\n"
        status, _, body = await get(reader, writer,
                                    "/containerLogs/default/web/main?tailLines=1&timestamps=true")
        assert body == b"2026-01-01T00:00:30.000000000Z tick 3\n"
        _, _, body = await get(reader, writer, "/containerLogs/default/web/main?limitBytes=20")
        assert body == b"hello from web\ntick "
        writer.close()


@pytest.mark.parametrize(("path", "status", "text"), [
    ("/containerLogs/default/web/main?previous=true", 400,
     'previous terminated container "main" in pod "web" not found'),
    ("/containerLogs/default/gone/main", 404, 'pod "gone" does not exist'),
    ("/containerLogs/default/elsewhere/main", 404, 'pod "elsewhere" does not exist'),
    ("/containerLogs/default/web/nope", 404, 'container "nope" not found in pod "web"'),
    ("/containerLogs/default/pending/main", 400,
     'container "main" in pod "pending" is waiting to start: ContainerCreating'),
    ("/containerLogs/default/web/main?tailLines=-1", 422, '{"message": "Invalid request."}'),
    ("/containerLogs/default/web/main?follow=maybe", 400,
     '{"message": "Unable to decode query."}'),
    ("/containerLogs/default/web/main?stream=Stdout", 400,
     'unable to return the given log stream: "Stdout". Please enable '
     'PodLogsQuerySplitStreams feature gate in kubelet'),
    ("/containerLogs/default//main", 400, '{"message": "Missing podID."}'),
    ("/containerLogs/default/web", 404, "404 page not found\n"),
    ("/configz", 404, "404 page not found\n"),
])
async def test_the_kubelet_s_words_for_what_it_cannot_answer(kubelet: KubeletPKI, path: str,
                                                            status: int, text: str) -> None:
    async with serving(kubelet) as served:
        served.pods.add("web", "cpu-0", RUNNING)
        served.pods.add("elsewhere", "cpu-1", RUNNING)
        served.pods.add("pending", "cpu-0", PodLife(waiting=("ContainerCreating", "")))
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        got, _, body = await get(reader, writer, path)
        assert got == status
        assert body.decode().startswith(text)
        writer.close()


async def test_a_container_no_script_covers_has_an_empty_log(kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        served.pods.rules = ()
        served.pods.add("web", "cpu-0", RUNNING)
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        assert await get(reader, writer, "/containerLogs/default/web/main") == (
            200, {"content-type": "text/plain; charset=utf-8", "transfer-encoding": "chunked"},
            b"")
        writer.close()


async def test_a_followed_log_gets_each_line_when_written_and_ends_with_the_run(
        kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        facts = served.pods.add("web", "cpu-0", RUNNING)
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        writer.write(b"GET /containerLogs/default/web/main?follow=true&tailLines=1 HTTP/1.1\r\n"
                     b"Host: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert b"Transfer-Encoding: chunked" in head
        assert await read_chunk(reader) == b"tick 3\n"
        clock = served.pods.clock
        await clock.advance(6)  # 41 s in: tick 4 is written (at 40 s)
        assert await read_chunk(reader) == b"tick 4\n"
        # The container exits at 45 s: the engine commits it and tells the follower.
        ended = PodLife(phase="Failed", exit=Exit(3, "Error", "", RUNNING.started_at,
                                                  rfc3339(1_767_225_600.0 + 45)))
        served.pods.pods[("default", "web")] = (facts, ended)
        await clock.advance(10)
        served.logs.changed(facts.uid)
        assert await read_chunk(reader) == b"bye 3\n"
        assert await read_chunk(reader) == b"", "the end of the answer"
        status, _, _ = await get(reader, writer, "/healthz")
        assert status == 200, "the connection serves the next request"
        writer.close()


async def test_a_followed_log_ends_when_the_pod_leaves_the_node(kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        facts = served.pods.add("web", "cpu-0", RUNNING)
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        writer.write(b"GET /containerLogs/default/web/main?follow=1&tailLines=0 HTTP/1.1\r\n"
                     b"Host: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        del served.pods.pods[("default", "web")]
        served.logs.changed(facts.uid)
        assert await read_chunk(reader) == b""
        writer.close()


# -- upgrades ---------------------------------------------------------------------------------

async def test_an_upgrade_hands_the_connection_to_a_session_that_writes_when_it_likes(
        kubelet: KubeletPKI) -> None:
    async with serving(kubelet) as served:
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        writer.write(SPDY + b"first")  # bytes right behind the request go to the session
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        assert await asyncio.wait_for(reader.readexactly(10), 5) == b"echo:first"
        session = served.sessions[0]
        asyncio.get_running_loop().call_later(0.05, session.link.write, b"unasked")
        assert await asyncio.wait_for(reader.readexactly(7), 5) == b"unasked"
        writer.write(b"GET / HTTP/1.1\r\n\r\n")  # no longer HTTP: the session's
        assert await asyncio.wait_for(reader.readexactly(23), 5) == \
            b"echo:GET / HTTP/1.1\r\n\r\n"
        writer.close()
        await asyncio.wait_for(session.lost.wait(), 5)


async def test_exec_attach_and_port_forward_are_the_engine_s_upgrader_s(
        kubelet: KubeletPKI) -> None:
    async with serving(kubelet, engine_s=True) as served:
        served.pods.add("web", "cpu-0", RUNNING)
        reader, writer = await connect(served.port, "127.64.0.1", api_server_context(kubelet))
        assert await get(reader, writer, "/exec/default/web/main?command=ls&output=1") == (
            500, {"content-type": "text/plain; charset=utf-8", "content-length": "25"},
            b"Upgrade request required\n"), "a request that does not upgrade: the kubelet's words"
        assert (await get(reader, writer, "/portForward/default/gone"))[::2] == (
            404, b"pod does not exist")
        writer.write(b"GET /exec/default/web/main?command=ls&output=1 HTTP/1.1\r\nHost: x\r\n"
                     b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
                     b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
        status, _, body = await response(reader)
        assert status == 400, "a plain refusal, on which kubectl falls back to SPDY"
        assert body.startswith(b"unable to upgrade: missing upgrade headers in request: ")
        writer.write(SPDY)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        assert b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n" in head
        writer.close()


# -- back-pressure ----------------------------------------------------------------------------

class Channel:
    """A connection whose send buffer fills at ``room`` bytes, as a peer that reads slowly."""

    local, peer = "127.64.0.1", "kube-apiserver-kubelet-client"

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent = bytearray()
        self.reading = True
        self.exchange: Exchange | None = None

    def write(self, data: bytes) -> None:
        self.sent += data
        if len(self.sent) >= self.room and self.exchange is not None:
            self.exchange.pause_writing()

    def close(self) -> None: ...

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def busy(self) -> None: ...

    def idle(self) -> None: ...


async def test_a_long_log_is_written_as_the_connection_takes_it() -> None:
    """An hour of lines every 100 ms is not put in memory at once: the engine writes a
    batch, and no more (nor reads another request) until the connection drains."""
    clock = FakeClock(1_767_225_600.0 + 3600)
    pods = Pods(clock)
    pods.rules = (LogRule("all", lambda facts, life: True, compile_script(
        LogLines.model_validate({"every": {"interval": "100ms", "lines": ["x" * 20]}}))),)
    pods.add("web", "cpu-0", RUNNING)
    logs = LogServer(pods, clock=clock)

    class Router:
        def answer(self, request: Request, local: str, peer: str) -> Answer | LogStream:
            return logs.answer(request, NODES[local])

        def upgrade(self, request: Request, local: str, peer: str,
                    link: Link) -> Switch | Answer:
            raise AssertionError("no upgrade here")
    channel = Channel(room=64 * 1024)
    exchange = channel.exchange = Exchange(channel, Router())
    exchange.data_received(b"GET /containerLogs/default/web/main HTTP/1.1\r\n\r\n")
    assert 64 * 1024 <= len(channel.sent) < 64 * 1024 + 2 * BATCH
    assert not channel.reading, "nothing more is read meanwhile"
    for _ in range(200):
        channel.room = len(channel.sent) + 64 * 1024
        exchange.resume_writing()
        if channel.sent.endswith(b"0\r\n\r\n"):
            break
    written = len(channel.sent)
    channel.room = written + 64 * 1024
    exchange.resume_writing()  # drained
    assert channel.reading
    assert len(channel.sent) == written
    body = bytes(channel.sent).split(b"\r\n\r\n", 1)[1]
    assert body.count(b"x" * 20 + b"\n") == 36000
