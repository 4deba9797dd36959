"""A minimal SPDY/3.1 client for the tests, written apart from the engine's framing (only the
public dictionary is shared, and checked against its checksum): it builds the frames
spdystream's client sends, and reads back what the server wrote with its own parser and its
own zlib stream. Also a link that keeps what the server writes, and timers moved by hand."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
import struct
import zlib
from collections.abc import Callable, Mapping

from operators.engine.spdy import DICTIONARY


@dataclasses.dataclass
class Frame:
    """A frame the server wrote, decoded: a control frame's type (0 for DATA), flags, stream
    (or ping/last-good id), the second word (status, delta), headers, data."""

    kind: int
    flags: int
    stream: int
    word: int = 0
    headers: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    data: bytes = b""

    @property
    def fin(self) -> bool:
        return bool(self.flags & 1)


class Client:
    """One client side of a session: frames out, the server's frames in."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY,
                                         DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._pending = b""

    # -- frames the client sends ------------------------------------------------------------

    @staticmethod
    def control(kind: int, payload: bytes, flags: int = 0) -> bytes:
        return struct.pack(">HHI", 0x8003, kind, flags << 24 | len(payload)) + payload

    def block(self, headers: Mapping[str, str]) -> bytes:
        raw = struct.pack(">I", len(headers))
        for name, value in headers.items():
            raw += struct.pack(">I", len(name)) + name.encode()
            raw += struct.pack(">I", len(value.encode())) + value.encode()
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def syn_stream(self, stream: int, headers: Mapping[str, str], *, flags: int = 0) -> bytes:
        payload = struct.pack(">IIBB", stream, 0, 0, 0) + self.block(headers)
        return self.control(1, payload, flags)

    @staticmethod
    def data(stream: int, data: bytes, *, fin: bool = False) -> bytes:
        return struct.pack(">II", stream, (1 if fin else 0) << 24 | len(data)) + data

    def rst(self, stream: int, status: int = 5) -> bytes:
        return self.control(3, struct.pack(">II", stream, status))

    def ping(self, ping_id: int) -> bytes:
        return self.control(6, struct.pack(">I", ping_id))

    def goaway(self, last: int) -> bytes:
        return self.control(7, struct.pack(">II", last, 0))

    def window_update(self, stream: int, delta: int) -> bytes:
        return self.control(9, struct.pack(">II", stream, delta))

    def settings(self, *entries: tuple[int, int]) -> bytes:
        payload = struct.pack(">I", len(entries)) + b"".join(
            struct.pack(">II", key, value) for key, value in entries)
        return self.control(4, payload)

    # -- reading what the server wrote ------------------------------------------------------

    def read(self, written: bytes) -> list[Frame]:
        """The frames in ``written`` (bytes the server wrote since the last read)."""
        buffer = self._pending + written
        frames: list[Frame] = []
        while len(buffer) >= 8:
            first, second = struct.unpack_from(">II", buffer)
            flags, length = second >> 24, second & 0xFFFFFF
            if len(buffer) < 8 + length:
                break
            payload, buffer = buffer[8:8 + length], buffer[8 + length:]
            if not first & 0x80000000:
                frames.append(Frame(0, flags, first, data=payload))
                continue
            assert first >> 16 == 0x8003, f"not a SPDY/3 control frame: {first:#x}"
            kind = first & 0xFFFF
            if kind == 2:  # SYN_REPLY
                (stream,) = struct.unpack_from(">I", payload)
                frames.append(Frame(2, flags, stream, headers=self._headers(payload[4:])))
            elif kind in (3, 7, 9):  # RST_STREAM, GOAWAY, WINDOW_UPDATE
                stream, word = struct.unpack(">II", payload)
                frames.append(Frame(kind, flags, stream, word))
            elif kind == 6:
                (ping_id,) = struct.unpack(">I", payload)
                frames.append(Frame(6, flags, ping_id))
            else:
                raise AssertionError(f"the server sent control frame type {kind}")
        self._pending = buffer
        return frames

    def _headers(self, compressed: bytes) -> dict[str, list[str]]:
        raw = self._inflate.decompress(compressed)
        (count,), offset = struct.unpack_from(">I", raw), 4
        headers: dict[str, list[str]] = {}
        for _ in range(count):
            (size,) = struct.unpack_from(">I", raw, offset)
            name = raw[offset + 4:offset + 4 + size].decode()
            offset += 4 + size
            (size,) = struct.unpack_from(">I", raw, offset)
            headers[name] = raw[offset + 4:offset + 4 + size].decode().split("\0")
            offset += 4 + size
        assert offset == len(raw)
        return headers


class Link:
    """Keeps what the server writes; says whether it closed the connection."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self._read = 0

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after close"
        self.written += data

    def close(self) -> None:
        self.closed = True

    def fresh(self) -> bytes:
        """What was written since the last call."""
        fresh = bytes(self.written[self._read:])
        self._read = len(self.written)
        return fresh


class Handle:
    def __init__(self, timers: Timers) -> None:
        self._timers = timers
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timers:
    """``call_later`` whose time moves only by :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._due: list[tuple[float, int, Handle, Callable[[], object]]] = []
        self._order = itertools.count()

    def call_later(self, delay: float, callback: Callable[[], object]) -> Handle:
        handle = Handle(self)
        heapq.heappush(self._due, (self.now + delay, next(self._order), handle, callback))
        return handle

    @property
    def pending(self) -> int:
        return sum(not handle.cancelled for _, _, handle, _ in self._due)

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while self._due and self._due[0][0] <= target:
            when, _, handle, callback = heapq.heappop(self._due)
            self.now = when
            if not handle.cancelled:
                callback()
        self.now = target


def stream_data(frames: list[Frame], stream: int) -> bytes:
    return b"".join(frame.data for frame in frames if frame.kind == 0 and frame.stream == stream)


def status_of(frames: list[Frame], stream: int) -> dict[str, object]:
    loaded = json.loads(stream_data(frames, stream))
    assert isinstance(loaded, dict)
    return loaded
