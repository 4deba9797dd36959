"""The SPDY/3.1 session, driven by an independent client: streams replied to or refused, PINGs
echoed, header compression carried over a connection's blocks, window given back as data is
consumed, data sent without waiting for window (spdystream never grants any), and the end."""

from __future__ import annotations

import zlib

import pytest

from operators.engine import spdy
from tests.engine.spdyclient import Client, Frame, Link


class Recorder:
    """A protocol that takes every stream (but those with ``refuse: yes``) and notes events."""

    def __init__(self, session: spdy.Session) -> None:
        self.session = session
        self.events: list[tuple[str, int, bytes]] = []
        self.streams: dict[int, spdy.Stream] = {}
        self.lost_count = 0

    def admit(self, stream: spdy.Stream) -> str:
        return "refused by the test" if stream.header("refuse") == "yes" else ""

    def opened(self, stream: spdy.Stream) -> None:
        self.streams[stream.id] = stream
        self.events.append(("opened", stream.id, b""))

    def received(self, stream: spdy.Stream, data: bytes) -> None:
        self.events.append(("received", stream.id, data))

    def ended(self, stream: spdy.Stream) -> None:
        self.events.append(("ended", stream.id, b""))

    def reset(self, stream: spdy.Stream) -> None:
        self.events.append(("reset", stream.id, b""))

    def lost(self) -> None:
        self.lost_count += 1


def connect() -> tuple[spdy.Session, Recorder, Client, Link]:
    link = Link()
    session = spdy.Session(link, Recorder)
    assert isinstance(session.protocol, Recorder)
    return session, session.protocol, Client(), link


def test_the_dictionary_is_spdy3s() -> None:
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2  # the id in every SPDY/3 zlib header


def test_a_stream_is_replied_to_with_no_headers_and_a_refused_one_reset() -> None:
    session, protocol, client, link = connect()
    session.data_received(client.syn_stream(1, {"streamtype": "error"}) +
                          client.syn_stream(3, {"streamtype": "stdout", "refuse": "yes"}))
    frames = client.read(link.fresh())
    assert frames == [Frame(2, 0, 1, headers={}), Frame(3, 0, 3, spdy.CANCEL)]
    assert protocol.events == [("opened", 1, b"")]
    assert protocol.streams[1].header("streamType") == "error"


def test_header_compression_carries_over_the_connection_in_both_directions() -> None:
    session, protocol, client, link = connect()
    headers = {"streamtype": "data", "port": "8080", "requestid": "0"}
    blocks = [client.syn_stream(stream, {**headers, "requestid": str(stream)})
              for stream in (1, 3, 5, 7)]
    # The later blocks refer back into the earlier ones: they are shorter, and do not inflate
    # on their own.
    assert len(blocks[3]) < len(blocks[0])
    with pytest.raises(zlib.error):
        zlib.decompressobj(zdict=spdy.DICTIONARY).decompress(blocks[3][18:])
    session.data_received(b"".join(blocks))
    assert [protocol.streams[s].header("requestid") for s in (1, 3, 5, 7)] == ["1", "3", "5", "7"]
    replies = client.read(link.fresh())
    assert [frame.stream for frame in replies] == [1, 3, 5, 7]
    assert all(frame.kind == 2 and frame.headers == {} for frame in replies)


def test_a_header_block_out_of_its_connections_zlib_stream_ends_the_connection() -> None:
    session, protocol, client, link = connect()
    other = Client()
    other.block({"streamtype": "error"})  # the other client's stream moves on
    session.data_received(other.syn_stream(1, {"streamtype": "error"}))
    frames = client.read(link.fresh())
    assert frames == [Frame(7, 0, 0, spdy.GOAWAY_PROTOCOL_ERROR)]
    assert link.closed
    assert protocol.lost_count == 1


def test_pings_from_the_client_are_echoed_and_answers_to_its_own_ignored() -> None:
    session, _, client, link = connect()
    session.data_received(client.ping(1) + client.ping(2) + client.ping(7))
    assert client.read(link.fresh()) == [Frame(6, 0, 1), Frame(6, 0, 7)]


def test_data_a_byte_at_a_time_reaches_the_stream_whole_and_in_order() -> None:
    session, protocol, client, _ = connect()
    wire = client.syn_stream(1, {"streamtype": "stdin"}) + client.data(1, b"hello") + \
        client.data(1, b"", fin=True)
    for byte in wire:
        session.data_received(bytes([byte]))
    received = b"".join(data for kind, _, data in protocol.events if kind == "received")
    assert received == b"hello"
    assert protocol.events[-1] == ("ended", 1, b"")


def test_window_is_given_back_as_data_is_consumed() -> None:
    session, protocol, client, link = connect()
    session.data_received(client.syn_stream(1, {"streamtype": "stdin"}))
    client.read(link.fresh())
    megabyte = 1024 * 1024
    for _ in range(megabyte // 16384):
        session.data_received(client.data(1, b"x" * 16384))
    updates = [frame for frame in client.read(link.fresh()) if frame.kind == 9]
    per_stream = sum(frame.word for frame in updates if frame.stream == 1)
    per_session = sum(frame.word for frame in updates if frame.stream == 0)
    # Half a window at a time: nothing is held back longer, and SPDY/3.1's 64 KiB window is
    # never used up.
    assert per_stream == per_session == megabyte
    assert all(frame.word == spdy.INITIAL_WINDOW // 2 for frame in updates)
    assert sum(len(data) for kind, _, data in protocol.events if kind == "received") == megabyte


def test_a_megabyte_goes_out_without_the_client_granting_window() -> None:
    # spdystream v0.5.1 never sends WINDOW_UPDATE: a server that waited for it would stall.
    session, protocol, client, link = connect()
    session.data_received(client.syn_stream(1, {"streamtype": "stdout"}))
    client.read(link.fresh())
    output = bytes(range(256)) * 4096
    protocol.streams[1].write(output)
    protocol.streams[1].close()
    frames = client.read(link.fresh())
    assert all(frame.kind == 0 and len(frame.data) <= spdy.CHUNK for frame in frames)
    assert b"".join(frame.data for frame in frames) == output
    assert frames[-1].fin
    assert frames[-1].data == b""


def test_settings_and_window_updates_from_the_client_change_nothing() -> None:
    session, _protocol, client, link = connect()
    session.data_received(client.settings((7, 65536)) + client.window_update(0, 1000) +
                          client.syn_stream(1, {"streamtype": "stdout"}) +
                          client.window_update(1, 1000))
    assert [frame.kind for frame in client.read(link.fresh())] == [2]
    assert not link.closed


def test_a_reset_stream_hears_nothing_more() -> None:
    session, protocol, client, link = connect()
    session.data_received(client.syn_stream(1, {"streamtype": "stdin"}) + client.rst(1) +
                          client.data(1, b"late"))
    assert protocol.events == [("opened", 1, b""), ("reset", 1, b"")]
    protocol.streams[1].write(b"nobody reads this")
    protocol.streams[1].close()
    assert [frame.kind for frame in client.read(link.fresh())] == [2]


def test_stream_ids_must_be_odd_and_rise() -> None:
    session, _protocol, client, link = connect()
    session.data_received(client.syn_stream(3, {"streamtype": "error"}) +
                          client.syn_stream(1, {"streamtype": "stdin"}) +
                          client.syn_stream(4, {"streamtype": "stdout"}))
    frames = client.read(link.fresh())
    assert frames == [Frame(2, 0, 3), Frame(3, 0, 1, spdy.PROTOCOL_ERROR),
                      Frame(3, 0, 4, spdy.PROTOCOL_ERROR)]
    assert not link.closed


def test_no_stream_is_taken_after_the_clients_goaway() -> None:
    session, protocol, client, link = connect()
    session.data_received(client.goaway(0) + client.syn_stream(1, {"streamtype": "error"}))
    assert client.read(link.fresh()) == []
    assert protocol.events == []


def test_finishing_resets_what_is_open_says_goaway_and_closes() -> None:
    session, protocol, client, link = connect()
    session.data_received(client.syn_stream(1, {"streamtype": "error"}, flags=1) +
                          client.syn_stream(3, {"streamtype": "stdin"}) +
                          client.syn_stream(5, {"streamtype": "stdout"}))
    client.read(link.fresh())
    protocol.streams[5].write(b"out")
    protocol.streams[5].close()
    protocol.streams[1].write(b"status")
    protocol.streams[1].close()
    session.finish()
    frames = client.read(link.fresh())
    assert frames == [Frame(0, 0, 5, data=b"out"), Frame(0, 1, 5), Frame(0, 0, 1, data=b"status"),
                      Frame(0, 1, 1), Frame(3, 0, 3, spdy.CANCEL), Frame(7, 0, 5, spdy.GOAWAY_OK)]
    assert link.closed
    assert protocol.lost_count == 1
    session.data_received(client.ping(9))  # after the end: nothing
    session.connection_lost()
    assert protocol.lost_count == 1


@pytest.mark.parametrize(("wire", "problem"), [
    (Client.control(1, b"\0" * 4), "do not fit"),
    (b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01", "version 2"),
    (b"\x80\x03\x00\x01\x00\x01\x00\x01", f"(at most {spdy.MAX_CONTROL})"),
    (b"\x00\x00\x00\x00\x00\x00\x00\x00", "stream 0"),
])
def test_what_is_not_spdy_ends_the_connection(wire: bytes, problem: str) -> None:
    reader = spdy.Reader()
    with pytest.raises(spdy.ProtocolError) as raised:
        reader.feed(wire)
    assert problem in str(raised.value)
    session, _protocol, client, link = connect()
    session.data_received(wire)
    assert client.read(link.fresh()) == [Frame(7, 0, 0, spdy.GOAWAY_PROTOCOL_ERROR)]
    assert link.closed


def test_a_header_block_that_inflates_beyond_bounds_is_refused() -> None:
    client = Client()
    huge = client.syn_stream(1, {"x": "a" * (spdy.MAX_CONTROL + 1)})
    # Compressed it is tiny: the bound is on what it inflates to.
    assert len(huge) < spdy.MAX_CONTROL
    with pytest.raises(spdy.ProtocolError, match="inflates to more than"):
        spdy.Reader().feed(huge)
