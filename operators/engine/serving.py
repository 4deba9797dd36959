"""The engine's HTTP endpoints: every fake node's kubelet (``/metrics/resource``) and the
cluster's DCGM exporter (``/metrics``), on one listening socket.

Every node has a loopback address of its own (its InternalIP, :func:`~operators.engine.nodes.
node_ip`), so a client that scrapes kubelets by node address, as metrics-server and Prometheus
do, reaches ``http://<node address>:<port>/metrics/resource``. The nodes advertise this port as
their kubelet's (``status.daemonEndpoints``) only when the engine serves no kubelet API over TLS
(:mod:`operators.engine.kubeletapi`, what the API server calls for ``kubectl logs``); when it
does, scrapers are given this port (metrics-server's ``--kubelet-port``). One socket serves all
of them: it is bound to the wildcard address *of the loopback interface only*
(``SO_BINDTODEVICE lo``, allowed without privileges since Linux 5.7), so it accepts connections
to any 127.x.y.z and none from another host, and each connection tells which node it is for by
the local address it arrived on. Thousands of nodes cost no more sockets than one.
``http://127.0.0.1:<port>/metrics`` is the DCGM endpoint of the whole cluster. A pod's
application metrics are at its node's address,
``http://<node address>:<port>/pods/<namespace>/<pod>/metrics``: pod addresses are not routed
on this host, so Prometheus reaches a pod through its node at this port, as its scrape
configuration says (:mod:`operators.addons.prometheus.rendering`).

Plain HTTP, no TLS: a TLS connection in asyncio holds a 256 KiB buffer and costs a handshake,
which for 5000 nodes scraped every 15 s is a gigabyte or a core; these endpoints carry simulated
numbers only, to this host only. metrics-server reads them with
``--deprecated-kubelet-completely-insecure`` (its flag for a kubelet without TLS). The HTTP
is :mod:`operators.engine.responding`'s, a protocol as small as scrapers need.

Idle connections stay open longer than Go's HTTP clients keep them (:data:`KEEPALIVE`), so the
client always ends an idle connection, never the engine: a scraper reuses what it kept from one
round to the next, and never sends a request on a connection the engine is closing (which
reads as a reset or an EOF). metrics-server v0.8.0 itself keeps few: with
``--deprecated-kubelet-completely-insecure`` client-go hands it Go's ``http.DefaultTransport``,
whose pool holds at most 100 idle connections over all hosts, so of 6000 nodes' connections
about 100 outlive a round and the rest are opened anew each round. Every kept connection holds
a file descriptor: :func:`raise_open_files` gives the process all it may have.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable
from typing import Protocol

from operators.engine.responding import Answer, Connection
from operators.metrics.text import CONTENT_TYPE

logger = logging.getLogger(__name__)

#: How long Go's HTTP clients keep an idle connection (``IdleConnTimeout`` of Go's
#: ``http.DefaultTransport``, and of client-go's transports, which metrics-server's and
#: Prometheus' kubelet clients are).
GO_IDLE_TIMEOUT = 90.0
#: Seconds an idle connection stays open: past :data:`GO_IDLE_TIMEOUT`, so past every scrape
#: interval a Go client keeps a connection for.
KEEPALIVE = 120.0
#: Connections the kernel completes before the engine accepts them: metrics-server opens one
#: per node each round (5000 nodes every 15 s), faster than one Python loop accepts in bursts.
BACKLOG = 4096
DEVICE = b"lo"
#: Open files wanted when serving: a connection per node for thousands of nodes, and the API
#: connections.
OPEN_FILES_WANTED = 8192
#: How long a port in use is tried again (s), and how often.
BIND_PATIENCE, BIND_RETRY = 15.0, 0.5


class ServingError(RuntimeError):
    """The endpoints cannot be served here; the message says why and what to do."""


class Source(Protocol):
    """What the endpoints show: the engine's nodes and their usage, rendered on demand."""

    def node_at(self, address: str) -> str | None:
        """The played node whose InternalIP is ``address`` (None: no such node)."""

    def resource_metrics(self, node: str) -> bytes:
        """The node's ``/metrics/resource`` body."""

    def dcgm_metrics(self) -> bytes:
        """The cluster's DCGM body."""

    def pod_metrics(self, node: str, namespace: str, name: str) -> bytes | None:
        """The application metrics of the pod ``namespace/name`` on ``node`` (None: no such
        pod runs there)."""


def listen(port: int) -> socket.socket:
    """A listening socket for every loopback address on ``port`` (0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, DEVICE)
        except (AttributeError, OSError) as error:
            raise ServingError(
                f"cannot restrict the kubelet endpoints to the loopback interface ({error}): "
                f"they need Linux 5.7 or newer (SO_BINDTODEVICE without privileges); start "
                f"the engine with --no-metrics to run without them") from error
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as error:
            raise ServingError(f"cannot serve the kubelet endpoints on port {port} of the "
                               f"loopback addresses: {error}") from error
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def listen_patiently(port: int) -> socket.socket:
    """:func:`listen`; a port still held (by the engine this one replaces, as it exits) is
    tried again for a while."""
    waited = 0.0
    while True:
        try:
            return listen(port)
        except ServingError as error:
            if not port or not isinstance(error.__cause__, OSError) or \
                    error.__cause__.errno != errno.EADDRINUSE or waited >= BIND_PATIENCE:
                raise
        await asyncio.sleep(BIND_RETRY)
        waited += BIND_RETRY


def raise_open_files(*, limits: tuple[Callable[[int], tuple[int, int]],
                                      Callable[[int, tuple[int, int]], None]] = (
        resource.getrlimit, resource.setrlimit)) -> int:
    """Raise the soft limit of open files to the hard one, and say so; the soft limit now.

    Each connection a scraper keeps to a node's kubelet is a file descriptor, on top of the
    API connections; a soft limit of 1024 (a common default) is spent at a few hundred nodes
    scraped at once, and asyncio answers EMFILE by accepting nothing for a second.
    """
    get, set_ = limits
    soft, hard = get(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return soft
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            set_(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            pass  # an unlimited hard limit is more than a soft one may be: keep the soft one
        else:
            logger.info("open files limit raised from %d to %d (the hard limit): each "
                        "connection a scraper keeps to a node's kubelet holds one", soft, hard)
            soft = hard
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_WANTED:
        logger.warning("open files limit is %d and cannot be raised: each connection a scraper "
                       "keeps to a node's kubelet holds one, so thousands of nodes need more; "
                       "raise the hard limit (ulimit -Hn, or LimitNOFILE in systemd) to %d or "
                       "more before the engine starts", soft, OPEN_FILES_WANTED)
    return soft


class KubeletServer:
    """Serves a :class:`Source` until :meth:`close`."""

    def __init__(self, source: Source, *, port: int = 0, keepalive: float = KEEPALIVE) -> None:
        self._source = source
        self._port = port
        self._keepalive = keepalive
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self.port = 0  # the port it listens on, once started

    async def start(self) -> int:
        sock = await listen_patiently(self._port)
        try:
            # The backlog again: asyncio listens anew on the socket it is given, with 100
            # unless told, and a scrape round of thousands of nodes overflows that (each
            # dropped SYN costs its scrape a second or more).
            self._server = await asyncio.get_running_loop().create_server(
                lambda: Connection(self._route, keepalive=self._keepalive,
                                   open_=self._connections),
                sock=sock, backlog=BACKLOG)
        except BaseException:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        logger.info("serving the kubelet endpoints of the nodes (http://<node InternalIP>:%d"
                    "/metrics/resource) and DCGM metrics (http://127.0.0.1:%d/metrics)",
                    self.port, self.port)
        return self.port

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self._connections):
            connection.close()
        await self._server.wait_closed()
        self._server = None

    def _route(self, path: bytes, local: str) -> Answer:
        if path == b"/metrics/resource":
            node = self._source.node_at(local)
            if node is None:
                return Answer(404, f"no fake node has the address {local}: a node's kubelet "
                                   f"is at its InternalIP\n".encode())
            return Answer(200, self._source.resource_metrics(node), CONTENT_TYPE)
        if path == b"/metrics":
            return Answer(200, self._source.dcgm_metrics(), CONTENT_TYPE)
        if path == b"/healthz":
            return Answer(200, b"ok")
        if path.startswith(b"/pods/"):
            return self._pod_metrics(path, local)
        return Answer(404, b"not found: a node's kubelet answers /metrics/resource and "
                           b"/pods/<namespace>/<pod>/metrics, the DCGM endpoint /metrics, and "
                           b"/healthz\n")

    def _pod_metrics(self, path: bytes, local: str) -> Answer:
        """``/pods/<namespace>/<pod>/metrics``, for a pod that runs on the node addressed."""
        parts = path.decode(errors="replace").split("/")
        if len(parts) != 5 or parts[4] != "metrics":
            return Answer(404, b"not found: a pod's metrics are at "
                               b"/pods/<namespace>/<pod>/metrics\n")
        node = self._source.node_at(local)
        body = self._source.pod_metrics(node, parts[2], parts[3]) if node is not None else None
        if body is None:
            return Answer(404, f"no pod {parts[2]}/{parts[3]} runs on the node at {local}: a "
                               f"pod's metrics are at its node's InternalIP\n".encode())
        return Answer(200, body, CONTENT_TYPE)
