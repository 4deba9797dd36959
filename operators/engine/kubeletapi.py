"""The kubelet API of every fake node, over TLS, on one listening socket: what the member's API
server calls for ``kubectl logs`` (and, through an :data:`~operators.engine.upgrading.
Upgrader`, exec, attach and port-forward).

The API server reaches a kubelet only over HTTPS, at the node's InternalIP and the port its
status advertises (``daemonEndpoints``), verifying the node's certificate and presenting its
client certificate (:mod:`operators.controlplane.components` gives it the flags). So the nodes
advertise this port: one socket bound to the loopback interface's wildcard address, as the
plain endpoints' (:mod:`operators.engine.serving`, which stays for metrics-server and the DCGM
endpoint, that scrape too often for TLS), each connection encrypted with the certificate of the
node whose address it came to (:mod:`~operators.engine.encrypting`,
:mod:`~operators.engine.certifying`). A client without a certificate of the kubelets' CA fails
the handshake; one with another name than the API server's is answered 403.

Routes, as a kubelet's: ``GET /containerLogs/{namespace}/{pod}/{container}``
(:mod:`~operators.engine.logserving`); ``/exec``, ``/attach`` and ``/portForward`` (GET or
POST), which upgrade the connection: the :data:`~operators.engine.upgrading.Upgrader`
(:mod:`~operators.engine.streaming` in the engine) answers every request to them, refusing
with the kubelet's words or taking the connection over, and then every byte after the request
goes to its session; ``/healthz``; ``/metrics/resource`` (so ``kubectl get --raw
/api/v1/nodes/<node>/proxy/metrics/resource`` works). HTTP/1.1 with keep-alive, one request at
a time, no request bodies.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from operators.controlplane.pki import KUBELET_CLIENT
from operators.engine.certifying import NodeCertificates
from operators.engine.encrypting import IDLE, Encrypted
from operators.engine.logserving import LogServer, LogStream
from operators.engine.responding import (
    BAD_REQUEST_LINE,
    MAX_HEAD,
    REASONS,
    TEXT,
    Answer,
    request_line,
)
from operators.engine.serving import BACKLOG, listen_patiently
from operators.engine.upgrading import Link, Request, Session, Switch, Upgrader
from operators.metrics.text import CONTENT_TYPE

logger = logging.getLogger(__name__)

#: The paths whose requests upgrade the connection.
UPGRADES = ("/exec/", "/attach/", "/portForward/")
NOT_FOUND = Answer(404, b"404 page not found\n")


class KubeletAPIServer:
    """Serves the nodes' kubelet API over TLS until :meth:`close`."""

    def __init__(self, node_at: Callable[[str], str | None], logs: LogServer,
                 certificates: NodeCertificates, *, upgrader: Upgrader,
                 metrics: Callable[[str], bytes] | None = None, port: int = 0,
                 idle: float = IDLE) -> None:
        """``node_at``: the played node whose InternalIP an address is (None: no node's);
        ``metrics``: a node's ``/metrics/resource`` body (None: the engine measures no
        usage)."""
        self._node_at = node_at
        self._metrics = metrics
        self._logs = logs
        self._certificates = certificates
        self._port = port
        self._upgrader = upgrader
        self._idle = idle
        self._server: asyncio.Server | None = None
        self._connections: set[Encrypted] = set()
        self.port = 0  # the port it listens on, once started

    async def start(self) -> int:
        sock = await listen_patiently(self._port)
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: Encrypted(self._certificates.context_for, self._exchange,
                                  idle=self._idle, open_=self._connections),
                sock=sock, backlog=BACKLOG)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        logger.info("serving the kubelet API of the nodes over TLS (https://<node "
                    "InternalIP>:%d, the port they advertise)", self.port)
        return self.port

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.abort()
        await self._server.wait_closed()
        self._server = None

    def _exchange(self, channel: Encrypted) -> Exchange:
        return Exchange(channel, self)

    # -- routes ---------------------------------------------------------------------------------

    def answer(self, request: Request, local: str, peer: str) -> Answer | LogStream:
        """What a request that upgrades nothing gets."""
        if peer != KUBELET_CLIENT:
            return _forbidden(request, peer)
        path = request.path
        if path == "/healthz":
            return Answer(200, b"ok")
        node = self._node_at(local)
        if node is None:
            return Answer(404, f"no fake node has the address {local}\n".encode())
        if path.startswith("/containerLogs/"):
            if request.method != "GET":
                return Answer(405, b"405: Method Not Allowed")
            return self._logs.answer(request, node)
        if path == "/metrics/resource" and self._metrics is not None:
            return Answer(200, self._metrics(node), CONTENT_TYPE)
        return NOT_FOUND

    def upgrade(self, request: Request, local: str, peer: str,
                link: Link) -> Switch | Answer:
        """What a request to a path that upgrades the connection gets (a request that does
        not ask to upgrade it too: the upgrader refuses it in the kubelet's words)."""
        if peer != KUBELET_CLIENT:
            return _forbidden(request, peer)
        node = self._node_at(local)
        if node is None:
            return Answer(404, f"no fake node has the address {local}\n".encode())
        return self._upgrader(request, node, link)


def _forbidden(request: Request, peer: str) -> Answer:
    """The kubelet's refusal of a client it does not authorize (only the API server's kubelet
    client certificate is)."""
    verb = "get" if request.method in ("GET", "HEAD") else "create"
    return Answer(403, f"Forbidden (user={peer}, verb={verb}, resource=nodes, "
                       f"subresource=proxy)".encode())


class Channel(Protocol):
    """The connection an exchange writes to (:class:`~operators.engine.encrypting.
    Encrypted`), which is also the :class:`~operators.engine.upgrading.Link` of a session."""

    local: str
    peer: str

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def busy(self) -> None: ...

    def idle(self) -> None: ...


class Router(Protocol):
    def answer(self, request: Request, local: str, peer: str) -> Answer | LogStream: ...

    def upgrade(self, request: Request, local: str, peer: str,
                link: Link) -> Switch | Answer: ...


class Exchange:
    """HTTP/1.1 inside one TLS connection: requests answered one at a time; an answer that
    streams (a log) is written as the connection takes it; an upgraded connection belongs to
    its session from then on. A :class:`~operators.engine.encrypting.Plain`, and the
    :class:`~operators.engine.logserving.Sink` of the log it answers."""

    __slots__ = ("_body", "_buffer", "_channel", "_keep", "_router", "_serving", "_session",
                 "paused")

    def __init__(self, channel: Channel, router: Router) -> None:
        self._channel = channel
        self._router = router
        self._buffer = b""
        self._body: LogStream | None = None  # the answer being written
        self._keep = True  # whether the connection stays open after that answer
        self._session: Session | None = None
        self._serving = False  # within _serve: an answer that ends at once returns there
        self.paused = False
        channel.idle()

    # -- Plain ----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._session is not None:
            self._session.data_received(data)
            return
        self._buffer += data
        self._serve()

    def connection_lost(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            body.stop()
        session, self._session = self._session, None
        if session is not None:
            session.connection_lost()

    def pause_writing(self) -> None:
        # Nothing more is read (a request, or a session's input) until the peer reads.
        self.paused = True
        self._channel.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self._channel.resume_reading()
        if self._body is not None:
            self._body.pump()

    # -- Sink -----------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self._channel.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self) -> None:
        self._channel.write(b"0\r\n\r\n")
        self._body = None
        if not self._keep:
            self._channel.close()
        elif not self._serving:
            self._serve()  # the requests that came while it streamed

    # -- requests -------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Answer the requests in the buffer, one at a time; idle once none is left."""
        self._serving = True
        try:
            while self._body is None and self._session is None:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_HEAD:
                        self._answer(Answer(431, f"a request's line and headers may take "
                                                 f"{MAX_HEAD} bytes\n".encode()), keep=False)
                        return
                    break
                head, self._buffer = self._buffer[:end], self._buffer[end + 4:]
                self._channel.busy()
                if not self._request(head):
                    return  # closing
        finally:
            self._serving = False
        if self._body is None and self._session is None:
            self._channel.idle()

    def _request(self, head: bytes) -> bool:
        """Answer one request; False if the connection closes."""
        parsed = request_line(head)
        if parsed is None:
            self._answer(Answer(400, BAD_REQUEST_LINE), keep=False)
            return False
        method, target, version, lines = parsed
        request = Request.parse(method, target, lines)
        connection = request.header_tokens("connection")
        keep = "close" not in (token.lower() for token in connection) and (
            version == b"HTTP/1.1" or "keep-alive" in (t.lower() for t in connection))
        if request.headers.get("content-length", "0") != "0" or \
                "transfer-encoding" in request.headers:
            self._answer(Answer(400, b"the kubelet API takes no request body\n"), keep=False)
            return False
        try:
            if request.path.startswith(UPGRADES):
                return self._upgrade(request, keep)
            outcome = self._router.answer(request, self._channel.local, self._channel.peer)
        except Exception:
            logger.exception("kubelet API: answering %s %s on %s failed", request.method,
                             request.path, self._channel.local)
            self._answer(Answer(500, b"the engine failed to answer; its log says why\n"),
                         keep=False)
            return False
        if isinstance(outcome, Answer):
            return self._answer(outcome, keep=keep)
        self._body, self._keep = outcome, keep
        self._channel.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + TEXT.encode() +
                            b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            outcome.start(self)
        except Exception:
            # Too late for a 500: the answer ends short, and so does the connection.
            logger.exception("kubelet API: writing the answer to %s on %s failed",
                             request.path, self._channel.local)
            self._body = None
            outcome.stop()
            self._channel.close()
            return False
        return keep or self._body is not None

    def _upgrade(self, request: Request, keep: bool) -> bool:
        outcome = self._router.upgrade(request, self._channel.local, self._channel.peer,
                                       self._channel)
        if isinstance(outcome, Answer):
            return self._answer(outcome, keep=keep)
        self._channel.write(outcome.head)
        self._session = outcome.session
        rest, self._buffer = self._buffer, b""
        if rest:
            outcome.session.data_received(rest)
        return True

    def _answer(self, answer: Answer, *, keep: bool) -> bool:
        lines = [f"HTTP/1.1 {answer.status} {REASONS[answer.status]}",
                 f"Content-Type: {answer.content_type}",
                 f"Content-Length: {len(answer.body)}"]
        if not keep:
            lines.append("Connection: close")
        self._channel.write(("\r\n".join(lines) + "\r\n\r\n").encode() + answer.body)
        if not keep:
            self._channel.close()
        return keep
