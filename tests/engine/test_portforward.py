"""``kubectl port-forward`` to fake pods, as client-go's port forwarder drives it: a pair of
streams per forwarded connection, a static answer where a rule names the port, the kubelet's
error text where none does."""

from __future__ import annotations

import json

from operators.engine import portforward
from primitives import keys
from tests.engine.spdyclient import Frame, stream_data
from tests.engine.streamingkit import Connected, Pods, connect, pod

FORWARD = "/portForward/default/trainer"
RULES = json.dumps([
    {"name": "api", "ports": [8000],
     "http": {"status": 200, "contentType": "application/json", "body": '{"status":"ok"}',
              "headers": {"X-Served-By": "fakefleet"}}},
    {"name": "banner", "ports": [6379], "raw": "+PONG\r\n"},
])


def forwarding(**given: object) -> Connected:
    return connect(Pods(pod(annotations={keys.PORT_FORWARD: RULES})), FORWARD,
                   protocols=["portforward.k8s.io"], **given)


def pair(connected: Connected, request_id: int, port: int, first: int) -> list[Frame]:
    """client-go's order: the error stream (half-closed at once), then the data stream."""
    client = connected.client
    headers = {"port": str(port), "requestid": str(request_id)}
    return connected.send(client.syn_stream(first, {**headers, "streamtype": "error"}) +
                          client.data(first, b"", fin=True) +
                          client.syn_stream(first + 2, {**headers, "streamtype": "data"}))


def test_an_http_port_answers_its_static_response_once_the_request_came() -> None:
    connected = forwarding()
    assert b"X-Stream-Protocol-Version: portforward.k8s.io\r\n" in connected.switch.head
    assert [frame.kind for frame in pair(connected, 0, 8000, 1)] == [2, 2]
    assert connected.send(connected.client.data(3, b"GET /health HTTP/1.1\r\nHost: x")) == []
    frames = connected.send(connected.client.data(3, b"\r\n\r\n"))
    body = b'{"status":"ok"}'
    assert stream_data(frames, 3) == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
        b"X-Served-By: fakefleet\r\nConnection: close\r\n\r\n" + body)
    assert [(frame.stream, frame.fin) for frame in frames if frame.fin] == [(3, True), (1, True)]
    assert stream_data(frames, 1) == b""  # nothing went wrong
    # The connection stays for the next forwarded connection, as kubectl keeps it.
    assert not connected.link.closed
    assert [frame.kind for frame in pair(connected, 1, 6379, 5)][:2] == [2, 2]


def test_a_raw_port_answers_at_once_and_connections_interleave() -> None:
    connected = forwarding()
    client = connected.client
    wire = (client.syn_stream(1, {"port": "6379", "requestid": "0", "streamtype": "error"}) +
            client.syn_stream(3, {"port": "8000", "requestid": "1", "streamtype": "error"}) +
            client.syn_stream(5, {"port": "8000", "requestid": "1", "streamtype": "data"}) +
            client.syn_stream(7, {"port": "6379", "requestid": "0", "streamtype": "data"}))
    frames = connected.send(wire)
    assert stream_data(frames, 7) == b"+PONG\r\n"
    assert stream_data(frames, 5) == b""  # the HTTP one waits for its request
    frames = connected.send(client.data(5, b"GET / HTTP/1.0\r\n\r\n"))
    assert stream_data(frames, 5).startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_port_nothing_listens_on_gets_the_kubelets_error_and_both_streams_reset() -> None:
    connected = forwarding()
    frames = pair(connected, 0, 9999, 1)
    error = stream_data(frames, 1).decode()
    sandbox = pod().sandbox_id
    assert error.startswith(f"error forwarding port 9999 to pod {sandbox}, uid : failed to "
                            f"execute portforward in network namespace")
    assert "dial tcp4 127.0.0.1:9999: connect: connection refused" in error
    assert [(frame.kind, frame.stream) for frame in frames if frame.kind == 3] == [(3, 3), (3, 1)]
    assert error == portforward.refused(9999, sandbox)


def test_a_stream_without_a_port_or_type_is_refused() -> None:
    connected = forwarding()
    client = connected.client
    frames = connected.send(client.syn_stream(1, {"streamtype": "error", "requestid": "0"}) +
                            client.syn_stream(3, {"port": "0x50", "streamtype": "data"}) +
                            client.syn_stream(5, {"port": "80", "streamtype": "other"}))
    assert [(frame.kind, frame.stream) for frame in frames] == [(3, 1), (3, 3), (3, 5)]


def test_a_pair_left_incomplete_hears_it_timed_out() -> None:
    connected = forwarding()
    connected.send(connected.client.syn_stream(1, {"port": "8000", "requestid": "7",
                                                   "streamtype": "error"}))
    frames = connected.advance(30.0)
    assert b"request=7) timed out waiting for streams" in stream_data(frames, 1)
    assert connected.timers.pending == 0


def test_a_connection_the_client_resets_before_its_request_ends_its_error_stream() -> None:
    connected = forwarding()
    pair(connected, 0, 8000, 1)
    frames = connected.send(connected.client.rst(3))
    assert [(frame.stream, frame.fin) for frame in frames] == [(1, True)]


def test_streams_of_an_old_client_pair_up_by_their_ids() -> None:
    connected = forwarding()
    client = connected.client
    frames = connected.send(client.syn_stream(1, {"port": "6379", "streamtype": "error"}) +
                            client.syn_stream(3, {"port": "6379", "streamtype": "data"}))
    assert stream_data(frames, 3) == b"+PONG\r\n"


def test_an_invalid_port_forward_annotation_is_named_on_the_error_stream() -> None:
    broken = pod(annotations={keys.PORT_FORWARD: '[{"name": "x", "ports": [80]}]'})
    connected = connect(Pods(broken), FORWARD, protocols=["portforward.k8s.io"])
    frames = pair(connected, 0, 80, 1)
    error = stream_data(frames, 1).decode()
    assert error.startswith(f"error forwarding port 80 to pod {broken.sandbox_id}, uid : "
                            f"annotation fakefleet.dev/port-forward of pod default/trainer is "
                            f"invalid: 0: Value error, give http")
