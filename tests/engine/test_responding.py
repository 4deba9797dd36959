"""The kubelet endpoints' HTTP: answers in order on a kept connection (pipelined too), closed
when asked or when HTTP/1.0, HEAD without a body, and every request it does not serve refused
with a status that says why; a failing route costs its own request only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from operators.engine.responding import MAX_HEAD, Answer, Connection

BIG = b"x" * (3 * 1024 * 1024)


def route(path: bytes, local: str) -> Answer:
    if path == b"/where":
        return Answer(200, local.encode())
    if path == b"/big":
        return Answer(200, BIG, "text/plain; version=0.0.4")
    if path == b"/fail":
        raise RuntimeError("the route broke")
    return Answer(404, b"no such path\n")


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[int]:
    connections: set[Connection] = set()
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(route, keepalive=30.0, open_=connections), "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for connection in list(connections):
            connection.close()
        await server.wait_closed()
        await asyncio.sleep(0)
        assert not connections, "every connection closed with the server"


async def read_answer(reader: asyncio.StreamReader, *,
                      body: bool = True) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status_line, *lines = head.strip().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in
               (line.partition(":") for line in lines)}
    length = int(headers["content-length"]) if body else 0
    return int(status_line.split()[1]), headers, await reader.readexactly(length)


async def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /where HTTP/1.1\r\nHost: a\r\n\r\nGET /nowhere?x=1 HTTP/1.1\r\n"
                     b"Host: a\r\n\r\nGET /where?query HTTP/1.1\r\n")
        first = await read_answer(reader)
        second = await read_answer(reader)
        assert (first[0], first[2]) == (200, b"127.0.0.1"), "the local address it came to"
        assert first[1]["content-type"] == "text/plain; charset=utf-8"
        assert second[0] == 404
        writer.write(b"Host: a\r\n\r\n")  # the third request, completed later
        assert (await read_answer(reader))[0] == 200, "the query is not the path"
        writer.close()


@pytest.mark.parametrize(("request_", "kept"), [
    (b"GET /where HTTP/1.1\r\n\r\n", True),
    (b"GET /where HTTP/1.1\r\nConnection: close\r\n\r\n", False),
    (b"GET /where HTTP/1.0\r\n\r\n", False),
    (b"GET /where HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", True),
])
async def test_a_connection_is_kept_as_http_says(request_: bytes, kept: bool) -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_)
        status, headers, _ = await read_answer(reader)
        assert status == 200
        assert ("connection" not in headers) is kept
        if not kept:
            assert await asyncio.wait_for(reader.read(), 2) == b"", "closed after the answer"
        writer.close()


async def test_head_is_answered_without_the_body() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD /where HTTP/1.1\r\n\r\nGET /where HTTP/1.1\r\n\r\n")
        status, headers, _ = await read_answer(reader, body=False)
        assert (status, headers["content-length"]) == (200, str(len(b"127.0.0.1")))
        assert (await read_answer(reader))[2] == b"127.0.0.1", "the next answer follows at once"
        writer.close()


@pytest.mark.parametrize(("request_", "status", "says"), [
    (b"POST /where HTTP/1.1\r\n\r\n", 405, b"GET and HEAD only"),
    (b"GET /where HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", 400, b"no request body"),
    (b"GET /where HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, b"no request body"),
    (b"GET /where\r\n\r\n", 400, b"METHOD TARGET HTTP/1.1"),
    (b"GET /where HTTP/2.0\r\n\r\n", 400, b"METHOD TARGET HTTP/1.1"),
    (b"GET /where HTTP/1.1\r\nX: " + b"y" * MAX_HEAD, 431, b"may take"),
])
async def test_what_is_not_served_is_refused_with_why(request_: bytes, status: int,
                                                      says: bytes) -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_)
        got, headers, body = await read_answer(reader)
        assert got == status
        assert says in body
        if status == 405:
            assert headers["allow"] == "GET, HEAD"
        else:
            assert headers["connection"] == "close"
            assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()


async def test_a_failing_route_fails_its_request_only(caplog: pytest.LogCaptureFixture) -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with caplog.at_level(logging.ERROR, logger="operators.engine.responding"):
            writer.write(b"GET /fail HTTP/1.1\r\n\r\n")
            status, _, body = await read_answer(reader)
        assert status == 500
        assert b"its log says why" in body
        assert "answering GET /fail on 127.0.0.1 failed" in caplog.text
        assert "the route broke" in caplog.text
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /where HTTP/1.1\r\n\r\n")
        assert (await read_answer(reader))[0] == 200, "the others are still served"
        writer.close()


async def test_a_client_that_reads_slowly_gets_every_answer_whole() -> None:
    async with serving() as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2 ** 16)
        writer.write(b"GET /big HTTP/1.1\r\n\r\n" * 3 + b"GET /where HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.2)  # the engine's buffers fill: it stops reading requests
        for _ in range(3):
            status, headers, body = await read_answer(reader)
            assert (status, body == BIG) == (200, True)
            assert headers["content-type"] == "text/plain; version=0.0.4"
        assert (await read_answer(reader))[2] == b"127.0.0.1"
        writer.close()


class _Transport:
    """A transport alike asyncio's without being one (as another event loop's are)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def get_extra_info(self, name: str) -> object:
        return ("127.64.0.9", 10250) if name == "sockname" else None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


async def test_any_transport_alike_asyncio_s_is_served() -> None:
    connections: set[Connection] = set()
    connection = Connection(route, keepalive=30.0, open_=connections)
    transport = _Transport()
    connection.connection_made(transport)
    connection.data_received(b"GET /where HTTP/1.1\r\n\r\n")
    assert b"".join(transport.written).endswith(b"\r\n\r\n127.64.0.9")
    connection.connection_lost(None)
    assert not connections
