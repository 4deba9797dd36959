"""HTTP/1.1 for the kubelet endpoints, as little of it as scrapers use: GET and HEAD requests
without a body, answered in order on connections kept alive, each answer computed at once by a
plain function of the path and the local address the connection arrived on.

Why not aiohttp's server: at 6000 nodes metrics-server opens about 5900 new connections every
round (its client keeps only 100), within 4 s, into one Python process. aiohttp spends a task,
a stream reader and its request and response machinery on each of them, about as much CPU as
the connection itself; this protocol answers from ``data_received`` with one write, and costs
about a third less per scrape (``python -m bench.scrapes``). What it leaves out is what no
scraper sends: request bodies (refused with 400), chunked requests, upgrades, ``Expect``.

It must not block: an answer is computed on the event loop, so a route is a function that
returns bytes it has or renders quickly, never one that waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple, cast

logger = logging.getLogger(__name__)

#: The most a request's line and headers may take (bytes); more is answered 431 and closed.
MAX_HEAD = 16 * 1024
#: Bodies shorter than this are sent with their head in one write (bytes): a copy is cheaper
#: than a second system call, up to a size.
COPY_BELOW = 64 * 1024
TEXT = "text/plain; charset=utf-8"
BAD_REQUEST_LINE = b"expected a request line METHOD TARGET HTTP/1.1\n"
REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 422: "Unprocessable Entity",
           431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class Answer(NamedTuple):
    status: int
    body: bytes
    content_type: str = TEXT


#: What a request is answered with: ``route(path, local address)``.
Route = Callable[[bytes, str], Answer]


def request_line(head: bytes) -> tuple[bytes, bytes, bytes, list[bytes]] | None:
    """A request head's method, target, version and header lines (None: its first line is
    not an HTTP/1.x request line)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    return parts[0], parts[1], parts[2], lines[1:]


class Connection(asyncio.Protocol):
    """One client's connection: its requests answered in the order they came, the connection
    closed once idle for ``keepalive`` seconds (from its last answer) or when asked."""

    __slots__ = ("_buffer", "_idle", "_keepalive", "_local", "_open", "_paused", "_route",
                 "_transport")

    def __init__(self, route: Route, *, keepalive: float, open_: set[Connection]) -> None:
        """``open_``: the server's connections, this one among them while open."""
        self._route = route
        self._keepalive = keepalive
        self._open = open_
        self._buffer = b""
        self._local = ""
        self._paused = False
        self._transport: asyncio.Transport | None = None
        self._idle: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's transports read and write (other event loops' transports are not
        # subclasses of asyncio.Transport, only alike).
        self._transport = cast(asyncio.Transport, transport)
        sockname = transport.get_extra_info("sockname")
        self._local = str(sockname[0]) if sockname else ""
        self._open.add(self)
        self._idle = asyncio.get_running_loop().call_later(self._keepalive, self.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._open.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        self._serve()

    def pause_writing(self) -> None:
        # A client that asks faster than it reads (pipelining, a large body): nothing more is
        # read, so answers are not queued up in memory without bound.
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
            self._serve()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- requests -------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Answer every complete request in the buffer, in order."""
        answered = False
        while not self._paused and self._transport is not None \
                and not self._transport.is_closing():
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    self._answer(Answer(431, f"a request's line and headers may take "
                                             f"{MAX_HEAD} bytes\n".encode()), keep=False)
                break
            head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
            self._request(head)
            answered = True
        if answered and self._transport is not None and not self._transport.is_closing():
            assert self._idle is not None
            self._idle.cancel()
            self._idle = asyncio.get_running_loop().call_later(self._keepalive, self.close)

    def _request(self, head: bytes) -> None:
        parsed = request_line(head)
        if parsed is None:
            self._answer(Answer(400, BAD_REQUEST_LINE), keep=False)
            return
        method, target, version, lines = parsed
        keep = version == b"HTTP/1.1"
        for line in lines:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"connection":
                tokens = value.lower()
                if b"close" in tokens:
                    keep = False
                elif b"keep-alive" in tokens:
                    keep = True
            elif (name == b"content-length" and value.strip() != b"0") or \
                    name == b"transfer-encoding":
                self._answer(Answer(400, b"these endpoints take no request body\n"), keep=False)
                return
        if method not in (b"GET", b"HEAD"):
            self._answer(Answer(405, b"these endpoints answer GET and HEAD only\n"), keep=keep,
                         allow=True)
            return
        try:
            answer = self._route(target.partition(b"?")[0], self._local)
        except Exception:
            logger.exception("answering %s %s on %s failed", method.decode(errors="replace"),
                             target.decode(errors="replace"), self._local)
            answer, keep = Answer(500, b"the engine failed to answer; its log says why\n"), False
        self._answer(answer, keep=keep, body=method == b"GET")

    def _answer(self, answer: Answer, *, keep: bool, body: bool = True,
                allow: bool = False) -> None:
        transport = self._transport
        assert transport is not None
        lines = [f"HTTP/1.1 {answer.status} {REASONS[answer.status]}",
                 f"Content-Type: {answer.content_type}",
                 f"Content-Length: {len(answer.body)}"]
        if allow:
            lines.append("Allow: GET, HEAD")
        if not keep:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        if not body:
            transport.write(head)
        elif len(answer.body) < COPY_BELOW:
            transport.write(head + answer.body)  # one send
        else:
            transport.write(head)
            transport.write(answer.body)
        if not keep:
            transport.close()
