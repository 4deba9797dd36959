"""``kubectl port-forward`` over a SPDY session, as the kubelet's port-forward server runs it
(``k8s.io/cri-streaming`` ``pkg/streaming/portforward/httpstream.go``), with a static answer per
port where a container would listen.

Every connection the client forwards is a pair of streams with the headers ``streamtype``
(``error`` first, then ``data``), ``port`` and ``requestid``; one SPDY connection carries as
many pairs as the user opens connections, for as long as kubectl runs. Once a pair is complete:

- a port with an answer: an HTTP answer waits for the request's head (or the end of what the
  client sends), raw bytes go at once; then the data stream and the error stream are closed, as
  a server that closes the connection;
- a port nothing answers on: the kubelet's error text on the error stream (its prefix exact,
  the runtime's part approximate: containerd's "connection refused"), then both streams reset.
  kubectl prints it and ends the forwarding.

A stream without a valid ``port`` or ``streamtype`` header is refused (reset), and a pair not
complete within 30 s gets "timed out waiting for streams" on its error stream, as the kubelet
does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Callable

from operators.engine import spdy
from operators.engine.remotecommand import STREAM_CREATION_TIMEOUT, Timer, Timers

logger = logging.getLogger(__name__)

PROTOCOL = "portforward.k8s.io"
DATA, ERROR = "data", "error"
#: Most bytes of a request read before an HTTP answer goes anyway.
MAX_REQUEST = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Reply:
    """What a forwarded port answers each connection with."""

    data: bytes
    #: Wait for the request's head first (HTTP); else the bytes go as the connection opens.
    after_request: bool


def refused(port: int, sandbox: str) -> str:
    """The kubelet's words for a port nothing listens on: its prefix is exact (the pod named
    by its sandbox id, the uid empty, as the CRI streaming server has them), the rest is
    containerd's, approximately."""
    netns = hashlib.sha256(f"netns/{sandbox}".encode()).hexdigest()
    namespace = f"cni-{netns[:8]}-{netns[8:12]}-{netns[12:16]}-{netns[16:20]}-{netns[20:32]}"
    return (f"error forwarding port {port} to pod {sandbox}, uid : failed to execute "
            f"portforward in network namespace \"/var/run/netns/{namespace}\": failed to "
            f"connect to localhost:{port} inside namespace \"{sandbox}\", IPv4: dial tcp4 "
            f"127.0.0.1:{port}: connect: connection refused IPv6 dial tcp6 [::1]:{port}: "
            f"connect: connection refused ")


class _Pair:
    """One forwarded connection: its two streams, and what its client sent so far."""

    __slots__ = ("data", "error", "request", "request_id", "timer")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.data: spdy.Stream | None = None
        self.error: spdy.Stream | None = None
        self.request = b""
        self.timer: Timer | None = None


class PortForward:
    """The forwarded connections of one session (a :class:`~operators.engine.spdy.Streams`).
    ``sandbox``: the pod's sandbox id; ``replies(port)``: what the port answers (None:
    nothing listens)."""

    def __init__(self, session: spdy.Session, *, sandbox: str,
                 replies: Callable[[int], Reply | None], timers: Timers) -> None:
        self.session = session
        self._sandbox = sandbox
        self._replies = replies
        self._timers = timers
        self._pairs: dict[str, _Pair] = {}
        #: Data streams whose reply waits for the request's head.
        self._waiting: dict[int, tuple[_Pair, Reply]] = {}

    # -- spdy.Streams ---------------------------------------------------------------------------

    def admit(self, stream: spdy.Stream) -> str:
        port = stream.header("port")
        if not port:
            return '"port" header is required'
        if not re.fullmatch("[0-9]+", port) or int(port) > 65535:
            problem = "invalid syntax" if not re.fullmatch("[0-9]+", port) else \
                "value out of range"
            return f'unable to parse "{port}" as a port: strconv.ParseUint: parsing ' \
                   f'"{port}": {problem}'
        if int(port) < 1:
            return f'port "{port}" must be > 0'
        kind = stream.header("streamtype")
        if not kind:
            return '"streamType" header is required'
        if kind not in (DATA, ERROR):
            return f'invalid stream type "{kind}"'
        return ""

    def opened(self, stream: spdy.Stream) -> None:
        request_id = self._request_id(stream)
        pair = self._pairs.get(request_id)
        if pair is None:
            pair = self._pairs[request_id] = _Pair(request_id)
            pair.timer = self._timers.call_later(STREAM_CREATION_TIMEOUT,
                                                 lambda: self._expired(pair))
        kind = stream.header("streamtype")
        if (pair.data if kind == DATA else pair.error) is not None:
            message = (f"error processing stream for request {request_id}: {kind} stream "
                       f"already assigned")
            logger.info("port-forward: %s", message)
            if pair.error is not None:
                pair.error.write(message.encode())
            return
        if kind == DATA:
            pair.data = stream
        else:
            pair.error = stream
        if pair.data is not None and pair.error is not None:
            self._forget(pair)
            self._forward(pair)

    def received(self, stream: spdy.Stream, data: bytes) -> None:
        waiting = self._waiting.get(stream.id)
        if waiting is None:
            return  # after the answer, or raw: what the client sends is dropped
        pair, reply = waiting
        pair.request += data
        if b"\r\n\r\n" in pair.request or len(pair.request) >= MAX_REQUEST:
            self._answer(pair, reply)

    def ended(self, stream: spdy.Stream) -> None:
        waiting = self._waiting.get(stream.id)
        if waiting is not None:
            self._answer(*waiting)

    def reset(self, stream: spdy.Stream) -> None:
        waiting = self._waiting.pop(stream.id, None)
        if waiting is not None and waiting[0].error is not None:
            # The client gave up on the connection before it was answered: like a copy
            # ended, the error stream ends, which the client reads to its end.
            waiting[0].error.close()

    def lost(self) -> None:
        for pair in list(self._pairs.values()):
            self._forget(pair)
        self._waiting.clear()

    # -- pairs ----------------------------------------------------------------------------------

    @staticmethod
    def _request_id(stream: spdy.Stream) -> str:
        """The pair a stream belongs to; a client too old to send ``requestid`` opens each
        pair's error stream, then its data stream, one after the other (the kubelet's guess)."""
        given = stream.header("requestid")
        if given:
            return given
        return str(stream.id if stream.header("streamtype") == ERROR else stream.id - 2)

    def _forget(self, pair: _Pair) -> None:
        self._pairs.pop(pair.request_id, None)
        if pair.timer is not None:
            pair.timer.cancel()
            pair.timer = None

    def _expired(self, pair: _Pair) -> None:
        pair.timer = None
        self._pairs.pop(pair.request_id, None)
        message = (f"(conn={id(self.session):#x}, request={pair.request_id}) timed out "
                   f"waiting for streams")
        logger.info("port-forward: %s", message)
        if pair.error is not None:
            pair.error.write(message.encode())

    def _forward(self, pair: _Pair) -> None:
        assert pair.data is not None
        assert pair.error is not None
        port = int(pair.data.header("port"))
        try:
            reply = self._replies(port)
            problem = refused(port, self._sandbox) if reply is None else ""
        except ValueError as error:  # what the port should answer is not readable
            reply = None
            problem = f"error forwarding port {port} to pod {self._sandbox}, uid : {error}"
        if reply is None:
            pair.error.write(problem.encode())
            pair.data.reset()
            pair.error.reset()
        elif reply.after_request and not pair.data.remote_closed:
            self._waiting[pair.data.id] = (pair, reply)
        else:
            self._answer(pair, reply)

    def _answer(self, pair: _Pair, reply: Reply) -> None:
        assert pair.data is not None
        assert pair.error is not None
        self._waiting.pop(pair.data.id, None)
        pair.request = b""
        pair.data.write(reply.data)
        pair.data.close()
        pair.error.close()
