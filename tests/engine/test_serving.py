"""The kubelet endpoints' socket: a burst of connections waits to be accepted, none is dropped."""

from __future__ import annotations

import select
import socket

from operators.engine.serving import BACKLOG, KubeletServer

#: More than aiohttp's and asyncio's default backlog (128), far less than BACKLOG.
BURST = 400


class _Nothing:
    def node_at(self, address: str) -> str | None:
        return None

    def resource_metrics(self, node: str) -> str:
        return ""

    def dcgm_metrics(self) -> str:
        return ""


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
