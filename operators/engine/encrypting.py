"""TLS for the kubelet API, by hand: one connection's TLS over memory BIOs, with the node's
certificate chosen from the local address the connection arrived on, before the handshake.

Why not ``loop.create_server(ssl=...)``: the certificate depends on the node, and the node on
the local address (every node has an address of its own on one listening socket), which an
``sni_callback`` cannot see (it gets no socket), and Go sends no server name to an IP address
anyway. Why not ``loop.start_tls``: it keeps a 256 KiB read buffer per connection (asyncio's
``sslproto``), and the API server keeps idle connections to every kubelet it spoke to (25 per
host, for 90 s): after ``kubectl logs`` on 5000 nodes that would be over a gigabyte. Here a
connection holds what OpenSSL holds and reads plaintext :data:`READ_CHUNK` at a time, and an
idle one is closed after :data:`IDLE` seconds (Go sends a GET again on a connection a server
closed while it was idle).

The plaintext side (:class:`Plain`, the kubelet API's HTTP) writes through
:meth:`Encrypted.write` whenever it likes, also long after the last bytes came in (a log being
followed, a session taken over by an upgrade). Back-pressure: while the socket's send buffer
is full, the plaintext side is told (``pause_writing``) and, until it drains, nothing more is
read from the peer (whose requests would only make more to send); a connection whose peer
reads nothing while more than :data:`MAX_BUFFERED` bytes wait for it is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any, Protocol, cast

logger = logging.getLogger(__name__)

#: Plaintext taken out of TLS at once (bytes).
READ_CHUNK = 16 * 1024
#: Seconds a connection with nothing to do (no handshake done, no request being answered, no
#: session) stays open: less than Go's 90 s, so the engine holds few idle connections.
IDLE = 15.0
#: The most bytes that may wait to be sent on one connection before it is cut.
MAX_BUFFERED = 8 * 1024 * 1024


class Plain(Protocol):
    """What runs inside a TLS connection once its handshake is done."""

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class Encrypted(asyncio.Protocol):
    """One client's TLS connection: handshake with the context of its local address, then
    plaintext both ways between the socket and a :class:`Plain` made for it."""

    __slots__ = ("_contexts", "_idle", "_idle_timer", "_incoming", "_make_plain", "_open",
                 "_outgoing", "_plain", "_reading_paused", "_tls", "_transport", "local",
                 "peer")

    def __init__(self, contexts: Callable[[str], ssl.SSLContext | None],
                 plain: Callable[[Encrypted], Plain], *, idle: float = IDLE,
                 open_: set[Encrypted]) -> None:
        """``contexts``: the TLS context for a local address (None: no node is there, and
        the connection is closed at once); ``plain``: what serves the connection once its
        peer is known; ``open_``: the server's connections, this one among them while open."""
        self._contexts = contexts
        self._make_plain = plain
        self._idle = idle
        self._open = open_
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls: ssl.SSLObject | None = None
        self._plain: Plain | None = None
        self._transport: asyncio.Transport | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        self.local = ""  # the address the client connected to (a node's InternalIP)
        self.peer = ""  # the common name of the client's certificate, once verified

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sockname = transport.get_extra_info("sockname")
        self.local = str(sockname[0]) if sockname else ""
        try:
            context = self._contexts(self.local)
        except Exception:
            logger.exception("kubelet API: no TLS context for %s", self.local)
            context = None
        if context is None:
            transport.close()  # no node has this address (or no certificate for it)
            return
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._open.add(self)
        self.idle()  # the handshake, too, must end in time

    def data_received(self, data: bytes) -> None:
        if self._tls is None:
            return
        self._incoming.write(data)
        if self._plain is None and not self._handshake():
            return
        self._read()

    def eof_received(self) -> bool:
        return False  # the peer is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        self._open.discard(self)
        self.busy()
        self._transport = None
        plain, self._plain = self._plain, None
        if plain is not None:
            plain.connection_lost()

    def pause_writing(self) -> None:
        if self._plain is not None:
            self._plain.pause_writing()

    def resume_writing(self) -> None:
        if self._plain is not None:
            self._plain.resume_writing()

    # -- what the plaintext side uses ------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Send ``data`` (dropped once the connection is closing)."""
        if self._tls is None or self._transport is None or self._transport.is_closing():
            return
        view = memoryview(data)
        while view:
            view = view[self._tls.write(view):]
        self._flush()
        if self._transport.get_write_buffer_size() > MAX_BUFFERED:
            logger.warning("kubelet API: the client on %s reads nothing while %d bytes wait "
                           "for it: connection cut", self.local,
                           self._transport.get_write_buffer_size())
            self.abort()

    def close(self) -> None:
        """Say so to the peer (TLS close_notify), then close once what waits is sent."""
        if self._transport is None or self._transport.is_closing():
            return
        if self._plain is not None and self._tls is not None:
            with contextlib.suppress(ssl.SSLError):  # the peer's close_notify is not awaited
                self._tls.unwrap()
            self._flush()
        self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def pause_reading(self) -> None:
        """Read nothing more from the peer until :meth:`resume_reading`."""
        self._reading_paused = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._reading_paused = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
            self._read()  # what came in meanwhile

    def busy(self) -> None:
        """Something is going on: not idle."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def idle(self) -> None:
        """Nothing is going on: closed after the idle timeout unless something starts."""
        self.busy()
        if self._transport is not None:
            self._idle_timer = asyncio.get_running_loop().call_later(self._idle, self.close)

    # -- TLS ------------------------------------------------------------------------------------

    def _handshake(self) -> bool:
        """Go on with the handshake; True once it is done and the plaintext side made."""
        assert self._tls is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return False
        except ssl.SSLError as error:
            # A client without a certificate of the kubelets' CA, or no TLS at all.
            logger.info("kubelet API: TLS handshake on %s failed: %s", self.local, error)
            self._flush()  # the alert says why
            if self._transport is not None:
                self._transport.close()
            return False
        self._flush()
        self.peer = common_name(self._tls.getpeercert())
        self._plain = self._make_plain(self)
        return True

    def _read(self) -> None:
        """Hand the plaintext that came in to the plaintext side, while it reads."""
        tls = self._tls
        assert tls is not None
        while self._plain is not None and not self._reading_paused and \
                self._transport is not None and not self._transport.is_closing():
            try:
                data = tls.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLError as error:
                logger.info("kubelet API: TLS on %s failed: %s", self.local, error)
                self.abort()
                break
            if not data:  # the peer's close_notify: it is done
                self.close()
                break
            self._plain.data_received(data)
        self._flush()

    def _flush(self) -> None:
        data = self._outgoing.read()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)


def common_name(certificate: dict[str, Any] | None) -> str:
    """The subject's common name of a certificate as :meth:`ssl.SSLObject.getpeercert`
    gives it ("" if none)."""
    for attribute in (certificate or {}).get("subject", ()):
        for key, value in attribute:
            if key == "commonName":
                return str(value)
    return ""
