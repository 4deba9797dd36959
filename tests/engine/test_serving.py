"""The kubelet endpoints' socket: a burst of connections waits to be accepted, none is dropped;
idle connections are kept past a Go client's own idle timeout; open files are raised."""

from __future__ import annotations

import asyncio
import logging
import resource
import select
import socket

import pytest

from operators.api.clusters import MetricsServerSpec
from operators.api.durations import parse_duration
from operators.engine.serving import (
    BACKLOG,
    GO_IDLE_TIMEOUT,
    KEEPALIVE,
    OPEN_FILES_WANTED,
    KubeletServer,
    raise_open_files,
)

#: More than aiohttp's and asyncio's default backlog (128), far less than BACKLOG.
BURST = 400


class _Nothing:
    def node_at(self, address: str) -> str | None:
        return None

    def resource_metrics(self, node: str) -> bytes:
        return b""

    def dcgm_metrics(self) -> bytes:
        return b""

    def pod_metrics(self, node: str, namespace: str, name: str) -> bytes | None:
        return None


def _connected(port: int, count: int, timeout: float = 2.0) -> int:
    """How many of ``count`` connections the kernel completes while nobody accepts them."""
    clients = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for client in clients:
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
        poller = select.poll()
        for client in clients:
            poller.register(client, select.POLLOUT)
        done: set[int] = set()
        deadline = timeout * 1000
        while len(done) < count and deadline > 0:
            for fd, _ in poller.poll(100):
                poller.unregister(fd)
                done.add(fd)
            deadline -= 100
        return sum(1 for client in clients if client.fileno() in done
                   and client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    finally:
        for client in clients:
            client.close()


async def test_a_burst_of_scrapes_is_queued_not_dropped() -> None:
    assert BACKLOG > BURST
    server = KubeletServer(_Nothing())
    port = await server.start()
    try:
        # The loop does not run while this blocks, so nothing is accepted: every connection
        # the kernel completes sits in the accept queue, as in a scrape round's burst.
        assert _connected(port, BURST) == BURST
    finally:
        await server.close()


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               path: str) -> bytes:
    """One GET on an open connection; the body."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return await reader.readexactly(length)


def test_idle_connections_outlast_every_go_client_s_own_idle_timeout() -> None:
    # Go's clients (metrics-server's, Prometheus') keep an idle connection 90 s: the engine
    # keeps it longer, so the client ends it, never the engine just as a new round reuses it.
    assert KEEPALIVE > GO_IDLE_TIMEOUT
    resolution = parse_duration(MetricsServerSpec().resolution)
    assert resolution < KEEPALIVE, "kept from one scrape round to the next"


async def test_a_connection_is_reused_while_idle_less_than_the_keepalive_then_closed() -> None:
    server = KubeletServer(_Nothing(), keepalive=0.5)
    port = await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await _get(reader, writer, "/healthz") == b"ok"
        await asyncio.sleep(0.3)
        assert await _get(reader, writer, "/healthz") == b"ok", "the same connection"
        await asyncio.sleep(0.3)
        assert await _get(reader, writer, "/healthz") == b"ok", "idle time counts from the last"
        assert await asyncio.wait_for(reader.read(), 2) == b"", "closed once idle too long"
        writer.close()
    finally:
        await server.close()


class _Limits:
    def __init__(self, soft: int, hard: int, *, refuse: bool = False) -> None:
        self.soft, self.hard, self.refuse = soft, hard, refuse

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.soft, self.hard

    def set(self, which: int, limits: tuple[int, int]) -> None:
        assert which == resource.RLIMIT_NOFILE
        if self.refuse:
            raise ValueError("not allowed")
        self.soft, self.hard = limits


def test_the_open_files_limit_is_raised_to_the_hard_one(caplog: pytest.LogCaptureFixture) -> None:
    limits = _Limits(1024, 524288)
    with caplog.at_level(logging.INFO, logger="operators.engine.serving"):
        assert raise_open_files(limits=(limits.get, limits.set)) == 524288
    assert (limits.soft, limits.hard) == (524288, 524288)
    assert "open files limit raised from 1024 to 524288" in caplog.text
    assert "cannot be raised" not in caplog.text


def test_a_low_hard_limit_is_named_with_what_to_do(caplog: pytest.LogCaptureFixture) -> None:
    limits = _Limits(1024, 1024)
    assert raise_open_files(limits=(limits.get, limits.set)) == 1024
    assert f"raise the hard limit (ulimit -Hn, or LimitNOFILE in systemd) to " \
           f"{OPEN_FILES_WANTED}" in caplog.text
    refused = _Limits(1024, resource.RLIM_INFINITY, refuse=True)
    assert raise_open_files(limits=(refused.get, refused.set)) == 1024, "kept when refused"


def test_enough_open_files_are_left_as_they_are(caplog: pytest.LogCaptureFixture) -> None:
    limits = _Limits(65536, 65536)
    with caplog.at_level(logging.INFO, logger="operators.engine.serving"):
        assert raise_open_files(limits=(limits.get, limits.set)) == 65536
    assert caplog.text == ""
