"""SPDY/3.1, the server's side, as far as Kubernetes' clients use it: the streams of
``kubectl exec``, ``attach`` and ``port-forward`` on one upgraded connection.

Why SPDY at all: kube-apiserver v1.36 turns kubectl's WebSockets into SPDY/3.1 towards a
kubelet that does not declare ``ExtendWebSocketsToKubelet`` (the engine does not), and
port-forward reaches every kubelet as SPDY/3.1; there is no maintained Python server of it.
The clients are Go's ``github.com/moby/spdystream`` v0.5.1 under ``k8s.io/streaming``, so this
module speaks what that library sends and expects, and no more:

- Frames (all integers big-endian). A control frame is ``0x8003, u16 type, u8 flags, u24
  length`` and a payload; a data frame is ``u31 stream id, u8 flags, u24 length`` and the
  bytes. The client opens every stream (SYN_STREAM, odd ids, increasing); the server answers
  each at once with a SYN_REPLY of no headers, or refuses it with RST_STREAM CANCEL, as the
  kubelet's stream handler does. A side ends its half of a stream with an empty DATA frame with
  FIN; RST_STREAM ends both halves. PINGs the client sends are echoed unchanged (client-go pings
  every 5 s); a GOAWAY says no more streams come.
- Header blocks (``u32 count``, then ``u32`` length-prefixed lower-case names and values, a
  value's parts joined by NUL) are zlib-compressed with the SPDY/3 dictionary, one zlib stream
  per direction for the whole connection, each block ended by a sync flush: a block can only
  be read after every block before it.
- Flow control (SPDY/3.1: 64 KiB windows per stream and per session). The engine gives window
  back as it consumes what the client sends (WINDOW_UPDATE for the stream and for the session,
  once half a window is used). It does not wait for window itself: spdystream v0.5.1 never sends
  a WINDOW_UPDATE (its reader drops them as frames it does not handle) and has no receive
  window to overrun, so a sender that waited would stall after 64 KiB. SETTINGS are ignored
  for the same reason.

The session is driven by bytes in (:meth:`Session.data_received`) and writes to a
:class:`~operators.engine.upgrading.Link`; the protocol on top (exec, port-forward) is a
:class:`Streams` that the session tells of each stream's life. No I/O of its own, no clock.

The SPDY/3 header dictionary below is from the SPDY/3 draft, as Go's ``spdy`` package
(BSD licence, Copyright 2013 The Go Authors) holds it in ``spdy/dictionary.go``.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from operators.engine.upgrading import Link

logger = logging.getLogger(__name__)

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS = 1, 2, 3, 4
PING, GOAWAY, HEADERS, WINDOW_UPDATE = 6, 7, 8, 9
FLAG_FIN, FLAG_UNIDIRECTIONAL = 0x01, 0x02
# RST_STREAM statuses.
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, CANCEL = 1, 2, 3, 5
# GOAWAY statuses.
GOAWAY_OK, GOAWAY_PROTOCOL_ERROR = 0, 1

#: SPDY/3.1's initial window, per stream and per session (bytes).
INITIAL_WINDOW = 64 * 1024
#: Most bytes of a control frame, and of a header block once inflated: the headers of
#: Kubernetes' streams take under a hundred.
MAX_CONTROL = 64 * 1024
#: Most bytes in one DATA frame the engine sends (spdystream reads any up to 16 MiB).
CHUNK = 32 * 1024

_WORDS = (
    'options', 'head', 'post', 'put', 'delete', 'trace', 'accept', 'accept-charset',
    'accept-encoding', 'accept-language', 'accept-ranges', 'age', 'allow', 'authorization',
    'cache-control', 'connection', 'content-base', 'content-encoding', 'content-language',
    'content-length', 'content-location', 'content-md5', 'content-range', 'content-type',
    'date', 'etag', 'expect', 'expires', 'from', 'host', 'if-match', 'if-modified-since',
    'if-none-match', 'if-range', 'if-unmodified-since', 'last-modified', 'location',
    'max-forwards', 'pragma', 'proxy-authenticate', 'proxy-authorization', 'range', 'referer',
    'retry-after', 'server', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'user-agent',
    'vary', 'via', 'warning', 'www-authenticate', 'method', 'get', 'status', '200 OK',
    'version', 'HTTP/1.1', 'url', 'public', 'set-cookie', 'keep-alive', 'origin',
)
_TEXT = (
    '10010120120220520630030230330430530630740240540640740840941041141241341441541641'
    '7502504505203 Non-Authoritative Information204 No Content301 Moved Permanently40'
    '0 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error'
    '501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept O'
    'ct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag'
    'e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/'
    'javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1'
    ',utf-,*,enq=0.'
)
#: The SPDY/3 zlib dictionary (1423 bytes): each word length-prefixed, then the text.
DICTIONARY = b"".join(struct.pack(">I", len(word)) + word.encode() for word in _WORDS) + \
    _TEXT.encode()

#: Header names and their values (SPDY's NUL-joined parts, split), bytes as latin-1 text: Go's
#: headers are bytes, and nothing Kubernetes sends is outside ASCII.
Headers = Mapping[str, tuple[str, ...]]


class ProtocolError(ValueError):
    """Bytes that are not SPDY/3.1 as its clients write it; the connection cannot go on."""


# -- frames -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class SynStream:
    stream_id: int
    associated: int
    priority: int
    flags: int
    headers: Headers


@dataclasses.dataclass(frozen=True, slots=True)
class SynReply:
    stream_id: int
    flags: int
    headers: Headers


@dataclasses.dataclass(frozen=True, slots=True)
class RstStream:
    stream_id: int
    status: int


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    flags: int
    #: (flags, id, value) per setting.
    entries: tuple[tuple[int, int, int], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class GoAway:
    last_good: int
    status: int


@dataclasses.dataclass(frozen=True, slots=True)
class HeadersFrame:
    stream_id: int
    flags: int
    headers: Headers


@dataclasses.dataclass(frozen=True, slots=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclasses.dataclass(frozen=True, slots=True)
class Data:
    """A DATA frame's bytes, or a piece of them as they arrive: ``fin`` is set on the last
    piece of a frame that carries FIN."""

    stream_id: int
    fin: bool
    data: bytes


Frame = (SynStream | SynReply | RstStream | Settings | Ping | GoAway | HeadersFrame
         | WindowUpdate | Data)


def control(kind: int, payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, kind, flags << 24 | len(payload)) + payload


def data_frame(stream_id: int, data: bytes, *, fin: bool = False) -> bytes:
    return struct.pack(">II", stream_id, (FLAG_FIN if fin else 0) << 24 | len(data)) + data


def syn_reply(stream_id: int, block: bytes, *, fin: bool = False) -> bytes:
    return control(SYN_REPLY, struct.pack(">I", stream_id) + block, FLAG_FIN if fin else 0)


def rst_stream(stream_id: int, status: int) -> bytes:
    return control(RST_STREAM, struct.pack(">II", stream_id, status))


def ping(ping_id: int) -> bytes:
    return control(PING, struct.pack(">I", ping_id))


def goaway(last_good: int, status: int) -> bytes:
    return control(GOAWAY, struct.pack(">II", last_good, status))


def window_update(stream_id: int, delta: int) -> bytes:
    return control(WINDOW_UPDATE, struct.pack(">II", stream_id, delta))


# -- header blocks ----------------------------------------------------------------------------

def pack_headers(headers: Mapping[str, Iterable[str]]) -> bytes:
    """A header block before compression."""
    parts = [struct.pack(">I", len(headers))]
    for name, values in headers.items():
        raw_name, raw_value = name.lower().encode("latin-1"), "\0".join(values).encode("latin-1")
        parts += [struct.pack(">I", len(raw_name)), raw_name,
                  struct.pack(">I", len(raw_value)), raw_value]
    return b"".join(parts)


def unpack_headers(block: bytes) -> dict[str, tuple[str, ...]]:
    """A header block after decompression."""
    try:
        (count,), offset = struct.unpack_from(">I", block), 4
        headers: dict[str, tuple[str, ...]] = {}
        for _ in range(count):
            (size,) = struct.unpack_from(">I", block, offset)
            name = block[offset + 4:offset + 4 + size].decode("latin-1")
            offset += 4 + size
            (size,) = struct.unpack_from(">I", block, offset)
            value = block[offset + 4:offset + 4 + size].decode("latin-1")
            offset += 4 + size
            if offset > len(block):
                raise ProtocolError("a header block ends inside a name or value")
            headers[name.lower()] = headers.get(name.lower(), ()) + tuple(value.split("\0"))
    except struct.error as error:
        raise ProtocolError(f"a header block cannot be read: {error}") from error
    if offset != len(block):
        raise ProtocolError(f"a header block has {len(block) - offset} bytes after its headers")
    return headers


class Deflater:
    """The compressing half of a connection's headers: one zlib stream for all its blocks."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY,
                                      DICTIONARY)

    def __call__(self, headers: Mapping[str, Iterable[str]]) -> bytes:
        return self._zlib.compress(pack_headers(headers)) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class Inflater:
    """The reading half: one zlib stream for all the blocks the peer sends."""

    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(zdict=DICTIONARY)

    def __call__(self, compressed: bytes) -> dict[str, tuple[str, ...]]:
        try:
            block = self._zlib.decompress(compressed, MAX_CONTROL)
        except zlib.error as error:
            raise ProtocolError(f"a header block does not inflate: {error}") from error
        if self._zlib.unconsumed_tail:
            raise ProtocolError(f"a header block inflates to more than {MAX_CONTROL} bytes")
        return unpack_headers(block)


# -- reading ----------------------------------------------------------------------------------

class Reader:
    """Frames out of a byte stream as it arrives. A DATA frame's bytes are handed on as they
    come, so no frame (up to 16 MiB) is held whole; a control frame is read once complete."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._inflate = Inflater()
        #: The DATA frame being read: its stream, whether it ends the stream, bytes to come.
        self._data: tuple[int, bool, int] | None = None

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while True:
            if self._data is not None:
                if not self._buffer:
                    break
                stream_id, fin, remaining = self._data
                piece = bytes(self._buffer[:remaining])
                del self._buffer[:remaining]
                remaining -= len(piece)
                frames.append(Data(stream_id, fin and not remaining, piece))
                self._data = (stream_id, fin, remaining) if remaining else None
                continue
            if len(self._buffer) < 8:
                break
            first, second = struct.unpack_from(">II", self._buffer)
            flags, length = second >> 24, second & 0xFFFFFF
            if not first & 0x80000000:
                if not first:
                    raise ProtocolError("a DATA frame on stream 0")
                del self._buffer[:8]
                if length:
                    self._data = (first, bool(flags & FLAG_FIN), length)
                else:
                    frames.append(Data(first, bool(flags & FLAG_FIN), b""))
                continue
            if length > MAX_CONTROL:
                raise ProtocolError(f"a control frame of {length} bytes (at most {MAX_CONTROL})")
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8:8 + length])
            del self._buffer[:8 + length]
            version, kind = first >> 16 & 0x7FFF, first & 0xFFFF
            if version != VERSION:
                raise ProtocolError(f"a control frame of SPDY version {version}, not {VERSION}")
            frame = self._control(kind, flags, payload)
            if frame is not None:
                frames.append(frame)
        return frames

    def _control(self, kind: int, flags: int, payload: bytes) -> Frame | None:
        """A control frame of ``kind`` (None: a kind SPDY/3.1 says to ignore)."""
        try:
            if kind == SYN_STREAM:
                stream_id, associated, priority = struct.unpack_from(">IIB", payload)
                return SynStream(stream_id & 0x7FFFFFFF, associated & 0x7FFFFFFF, priority >> 5,
                                 flags, self._inflate(payload[10:]))
            if kind in (SYN_REPLY, HEADERS):
                (stream_id,) = struct.unpack_from(">I", payload)
                made = SynReply if kind == SYN_REPLY else HeadersFrame
                return made(stream_id & 0x7FFFFFFF, flags, self._inflate(payload[4:]))
            if kind == RST_STREAM:
                stream_id, status = struct.unpack(">II", payload)
                return RstStream(stream_id & 0x7FFFFFFF, status)
            if kind == SETTINGS:
                (count,) = struct.unpack_from(">I", payload)
                if len(payload) != 4 + 8 * count:
                    raise ProtocolError(f"a SETTINGS frame of {len(payload)} bytes holds "
                                        f"{count} settings")
                entries = tuple((word >> 24, word & 0xFFFFFF, value) for word, value in
                                struct.iter_unpack(">II", payload[4:]))
                return Settings(flags, entries)
            if kind == PING:
                (ping_id,) = struct.unpack(">I", payload)
                return Ping(ping_id)
            if kind == GOAWAY:
                last_good, status = struct.unpack(">II", payload)
                return GoAway(last_good & 0x7FFFFFFF, status)
            if kind == WINDOW_UPDATE:
                stream_id, delta = struct.unpack(">II", payload)
                return WindowUpdate(stream_id & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        except struct.error as error:
            raise ProtocolError(f"a control frame of type {kind} has {len(payload)} bytes, "
                                f"which do not fit it: {error}") from error
        return None


# -- the session ------------------------------------------------------------------------------

class Streams(Protocol):
    """The protocol over a session (exec, attach, port-forward): told of each stream's life."""

    def admit(self, stream: Stream) -> str:
        """Whether to take a stream the client opened: ``""`` takes it (the session replies),
        else why not (the session resets it)."""
        ...

    def opened(self, stream: Stream) -> None:
        """A stream taken and replied to: it may be written to from now on."""
        ...

    def received(self, stream: Stream, data: bytes) -> None: ...

    def ended(self, stream: Stream) -> None:
        """The client will send no more on the stream (FIN)."""
        ...

    def reset(self, stream: Stream) -> None:
        """The client reset the stream: neither side sends on it any more."""
        ...

    def lost(self) -> None:
        """The connection is gone: whatever is pending must stop."""
        ...


class Stream:
    """One stream the client opened, as the server sees it."""

    __slots__ = ("headers", "id", "local_closed", "remote_closed", "session", "unacknowledged")

    def __init__(self, session: Session, stream_id: int, headers: Headers) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self.local_closed = False  # the server sent FIN or RST_STREAM
        self.remote_closed = False  # the client did
        self.unacknowledged = 0  # bytes received and not yet given back as window

    def header(self, name: str) -> str:
        """A header's first value, as Go's ``Header.Get`` reads it ("" when absent)."""
        values = self.headers.get(name.lower(), ())
        return values[0] if values else ""

    def write(self, data: bytes) -> None:
        """Send ``data`` on the stream (nothing once this side ended it)."""
        if self.local_closed or self.session.closed:
            return
        for start in range(0, len(data), CHUNK):
            self.session.send(data_frame(self.id, data[start:start + CHUNK]))

    def close(self) -> None:
        """End this side of the stream (an empty DATA frame with FIN), as spdystream's
        ``Close``."""
        if self.local_closed:
            return
        self.local_closed = True
        self.session.send(data_frame(self.id, b"", fin=True))
        self.session.settle(self)

    def reset(self) -> None:
        """End both sides (RST_STREAM CANCEL), as spdystream's ``Reset``: a stream this side
        already ended is only forgotten."""
        if not self.local_closed:
            self.session.send(rst_stream(self.id, CANCEL))
        self.local_closed = self.remote_closed = True
        self.session.settle(self)


class Session:
    """One upgraded connection: frames read, streams kept, replies and window sent back.

    It is an :class:`~operators.engine.upgrading.Session`; ``protocol(session)`` makes the
    :class:`Streams` that runs over it. It writes only in answer to what the client sent: the
    client reads the ``101`` through a buffer of its own (client-go's ``SpdyRoundTripper``) and
    would lose frames that came in the same read.
    """

    def __init__(self, link: Link, protocol: Callable[[Session], Streams]) -> None:
        self._link = link
        self._reader = Reader()
        self._deflate = Deflater()
        self._streams: dict[int, Stream] = {}
        self._last_id = 0  # the highest stream id the client opened
        self._unacknowledged = 0  # session-wide bytes received, not yet given back
        self._gone_away = False  # the client sent GOAWAY: no stream comes any more
        self.closed = False
        self.protocol = protocol(self)

    # -- upgrading.Session ----------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            frames = self._reader.feed(data)
        except ProtocolError as error:
            logger.info("closing a SPDY connection: %s", error)
            self._link.write(goaway(self._last_id, GOAWAY_PROTOCOL_ERROR))
            self._end()
            return
        for frame in frames:
            if self.closed:
                return
            self._dispatch(frame)

    def connection_lost(self) -> None:
        if not self.closed:
            self.closed = True
            self.protocol.lost()

    # -- what the protocol and its streams call -------------------------------------------------

    def send(self, frame: bytes) -> None:
        if not self.closed:
            self._link.write(frame)

    def settle(self, stream: Stream) -> None:
        """Forget a stream both sides have ended."""
        if stream.local_closed and stream.remote_closed:
            self._streams.pop(stream.id, None)

    def finish(self) -> None:
        """End the connection as the kubelet does when its work is done: every stream it has
        not ended reset, GOAWAY naming the last stream the client opened, then closed."""
        if self.closed:
            return
        for stream in list(self._streams.values()):
            stream.reset()
        self._link.write(goaway(self._last_id, GOAWAY_OK))
        self._end()

    def _end(self) -> None:
        self.closed = True
        self._link.close()
        self.protocol.lost()

    # -- frames ---------------------------------------------------------------------------------

    def _dispatch(self, frame: Frame) -> None:
        match frame:
            case Data():
                self._data(frame)
            case SynStream():
                self._open(frame)
            case RstStream():
                stream = self._streams.pop(frame.stream_id, None)
                if stream is not None:
                    stream.local_closed = stream.remote_closed = True
                    self.protocol.reset(stream)
            case Ping() if frame.id % 2:  # the client's (odd): echoed; even ones answer ours
                self.send(ping(frame.id))
            case GoAway():
                self._gone_away = True
            case _:
                # SYN_REPLY and HEADERS answer streams a server opens (the engine opens none);
                # SETTINGS and WINDOW_UPDATE only matter to a sender that waits for window.
                pass

    def _open(self, frame: SynStream) -> None:
        if self._gone_away:
            return
        if frame.stream_id % 2 == 0 or frame.stream_id <= self._last_id:
            # As spdystream: a stream id out of order is refused, the connection goes on.
            self.send(rst_stream(frame.stream_id, PROTOCOL_ERROR))
            return
        self._last_id = frame.stream_id
        stream = Stream(self, frame.stream_id, frame.headers)
        stream.remote_closed = bool(frame.flags & FLAG_FIN)
        stream.local_closed = bool(frame.flags & FLAG_UNIDIRECTIONAL)
        refusal = self.protocol.admit(stream)
        if refusal:
            logger.info("stream %d refused: %s", stream.id, refusal)
            self.send(rst_stream(stream.id, CANCEL))
            return
        self._streams[stream.id] = stream
        self.send(syn_reply(stream.id, self._deflate({})))
        self.protocol.opened(stream)
        self.settle(stream)

    def _data(self, frame: Data) -> None:
        self._unacknowledged += len(frame.data)
        if self._unacknowledged >= INITIAL_WINDOW // 2:
            self.send(window_update(0, self._unacknowledged))
            self._unacknowledged = 0
        stream = self._streams.get(frame.stream_id)
        if stream is None or stream.remote_closed:
            return  # a stream reset or ended meanwhile: dropped, as spdystream drops it
        if frame.data:
            stream.unacknowledged += len(frame.data)
            self.protocol.received(stream, frame.data)
        if self.closed:
            return
        if frame.fin:
            stream.remote_closed = True
            self.protocol.ended(stream)
            self.settle(stream)
        elif stream.unacknowledged >= INITIAL_WINDOW // 2:
            self.send(window_update(stream.id, stream.unacknowledged))
            stream.unacknowledged = 0
