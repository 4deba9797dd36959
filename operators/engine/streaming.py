"""The kubelet's exec, attach and port-forward endpoints on fake pods: which request is taken
over as a SPDY/3.1 session, and which is refused, with the kubelet's status and words.

The member's API server proxies ``kubectl exec``, ``attach`` and ``port-forward`` to the node's
kubelet port; for a node that does not declare ``ExtendWebSocketsToKubelet`` (the engine's
nodes do not) it speaks SPDY/3.1 there, whatever kubectl spoke to it. The routes, as the
kubelet's (``pkg/kubelet/server/server.go``, GET or POST):

    /exec/{namespace}/{pod}[/{uid}]/{container}?command=..&input=1&output=1&error=1&tty=1
    /attach/{namespace}/{pod}[/{uid}]/{container}?input=1&output=1&error=1&tty=1
    /portForward/{namespace}/{pod}[/{uid}]

What is refused, in the kubelet's order, with its words (its plain-text bodies):

- no stream asked for (exec, attach): 400 ``you must specify at least 1 of stdin, stdout,
  stderr``;
- a pod not on this node: 404 ``pod does not exist`` (port-forward with another uid: 404 ``pod
  not found``);
- a container that does not run (waiting, crash-looping, terminated, or not there): exec 500
  ``container not found ("c")``, attach 500 ``container c not found in pod p_ns``; a pod whose
  sandbox does not run, for port-forward: 500 ``pod not found ("p_ns")``;
- not an upgrade: 500 ``Upgrade request required``;
- ``X-Stream-Protocol-Version`` missing or empty: 400; no protocol in common: 403 (remotecommand
  v4, v3, v2 and ``channel.k8s.io``; ``portforward.k8s.io``);
- an upgrade to anything but SPDY/3.1 (a WebSocket): 400 ``unable to upgrade: missing upgrade
  headers in request: ...``. A non-101 answer is what makes kubectl and client-go fall back to
  SPDY, so a WebSocket an API server passes through (≤1.29) ends up served too.

What is taken gets ``101 Switching Protocols`` naming the protocol chosen, and the connection
becomes a :class:`~operators.engine.spdy.Session` running a
:class:`~operators.engine.remotecommand.RemoteCommand` or a
:class:`~operators.engine.portforward.PortForward`. What the command does and what a port
answers is :mod:`~operators.engine.scripting`'s.

The upgrader knows the node's pods through :class:`Pods`, a read-only view the engine gives it.
"""

from __future__ import annotations

from typing import Protocol
from urllib.parse import unquote

from operators.engine import portforward, remotecommand, spdy
from operators.engine.responding import Answer
from operators.engine.scripting import PodSight, Scripts
from operators.engine.upgrading import Link, Request, Switch

SPDY = "SPDY/3.1"
PROTOCOL_HEADER = "X-Stream-Protocol-Version"


class Pods(Protocol):
    """What the upgrader reads of the engine's pods."""

    def pod(self, node: str, namespace: str, name: str) -> PodSight | None:
        """The pod ``namespace/name`` if the engine runs it on ``node`` (None otherwise)."""
        ...


def _text(status: int, words: str) -> Answer:
    return Answer(status, words.encode())


#: go-restful's own answers, for a route it does not have and a method it does not take.
NOT_FOUND = _text(404, "404: Page Not Found")
NOT_ALLOWED = _text(405, "405: Method Not Allowed")


def _go_list(values: list[str]) -> str:
    """A list of strings as Go's ``%v`` prints a ``[]string``."""
    return "[" + " ".join(values) + "]"


def negotiate(request: Request, protocols: tuple[str, ...]) -> str | Answer:
    """The first protocol the client offers that the kubelet speaks, or the kubelet's refusal
    (``httpstream.Handshake``: its ``http.Error`` bodies end in a line feed)."""
    given = request.headers.get(PROTOCOL_HEADER.lower())
    if given is None:
        count = len(request.headers) - ("host" in request.headers)  # Go keeps Host apart
        return _text(400, f"unable to upgrade: header {PROTOCOL_HEADER} does not exist in "
                          f"request with {count} headers\n")
    offered = request.header_tokens(PROTOCOL_HEADER.lower())
    if not offered:
        return _text(400, f"unable to upgrade: header {PROTOCOL_HEADER} contains "
                          f"{_go_list([given])}, but no valid protocols\n")
    for protocol in offered:
        if protocol in protocols:
            return protocol
    return _text(403, f"unable to upgrade: unable to negotiate protocol: client supports "
                      f"{_go_list(offered)}, server accepts {_go_list(list(protocols))}\n")


def accept(request: Request, protocols: tuple[str, ...]) -> str | Answer:
    """The protocol ``request`` is upgraded to, or why it is not: not an upgrade (the kubelet's
    proxy, 500), no protocol in common (:func:`negotiate`), an upgrade to something else than
    SPDY/3.1 (400)."""
    connection = request.headers.get("connection", "")
    if "upgrade" not in connection.lower():
        return _text(500, "Upgrade request required\n")
    chosen = negotiate(request, protocols)
    if isinstance(chosen, Answer):
        return chosen
    upgrade = request.headers.get("upgrade", "")
    if SPDY.lower() not in upgrade.lower():
        # spdy.UpgradeResponse's words, with the two headers it looked at (Go prints all).
        shown = ", ".join(f'"{name}":[]string{{"{value}"}}' for name, value in
                          (("Connection", connection), ("Upgrade", upgrade)) if value)
        return _text(400, f"unable to upgrade: missing upgrade headers in request: "
                          f"http.Header{{{shown}}}\n")
    return chosen


def switching(protocol: str) -> bytes:
    return ("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
            f"Upgrade: {SPDY}\r\n{PROTOCOL_HEADER}: {protocol}\r\n\r\n").encode()


class Upgrader:
    """An :data:`~operators.engine.upgrading.Upgrader` for exec, attach and port-forward."""

    def __init__(self, *, pods: Pods, scripts: Scripts, timers: remotecommand.Timers) -> None:
        self._pods = pods
        self._scripts = scripts
        self._timers = timers

    def __call__(self, request: Request, node: str, link: Link) -> Switch | Answer:
        segments = [unquote(part) for part in request.path.split("/")[1:]]
        if not all(segments):
            return NOT_FOUND
        kind, args = segments[0], segments[1:]
        if (kind in ("exec", "attach") and len(args) in (3, 4)) or \
                (kind == "portForward" and len(args) in (2, 3)):
            if request.method not in ("GET", "POST"):
                return NOT_ALLOWED
            if kind == "portForward":
                return self._port_forward(request, node, link, *args)
            return self._remote_command(request, node, link, kind, args)
        return NOT_FOUND

    def _remote_command(self, request: Request, node: str, link: Link, kind: str,
                        args: list[str]) -> Switch | Answer:
        namespace, name, container_name = args[0], args[1], args[-1]
        uid = args[2] if len(args) == 4 else ""
        try:
            options = remotecommand.Options.of(request.query)
        except ValueError as error:
            return _text(400, str(error))
        pod = self._pods.pod(node, namespace, name)
        if pod is None:
            return _text(404, "pod does not exist")
        container = pod.container(container_name) if uid in ("", pod.uid) else None
        if container is None or not container.running:
            # The kubelet looks among the running containers only.
            return _text(500, f'container not found ("{container_name}")' if kind == "exec"
                         else f"container {container_name} not found in pod {name}_{namespace}")
        chosen = accept(request, remotecommand.PROTOCOLS)
        if isinstance(chosen, Answer):
            return chosen
        if kind == "exec":
            outcome = self._scripts.exec(pod, container, request.query.get("command", []))
            run = remotecommand.execute(outcome)
        else:
            run = remotecommand.attach(lambda: self._runs(node, pod, container_name))
        session = spdy.Session(link, lambda conn: remotecommand.RemoteCommand(
            conn, protocol=chosen, options=options, timers=self._timers, run=run))
        return Switch(switching(chosen), session)

    def _port_forward(self, request: Request, node: str, link: Link, namespace: str, name: str,
                      uid: str = "") -> Switch | Answer:
        pod = self._pods.pod(node, namespace, name)
        if pod is None:
            return _text(404, "pod does not exist")
        if uid and uid != pod.uid:
            return _text(404, "pod not found")
        if not pod.sandbox:
            return _text(500, f'pod not found ("{name}_{namespace}")')
        chosen = accept(request, (portforward.PROTOCOL,))
        if isinstance(chosen, Answer):
            return chosen

        def replies(port: int) -> portforward.Reply | None:
            # Read again for each connection: a port-forward runs for as long as the user
            # keeps it, and the pod's annotation may change meanwhile.
            current = self._pods.pod(node, namespace, name)
            if current is None or current.uid != pod.uid:
                return None
            return self._scripts.reply(current, port)
        session = spdy.Session(link, lambda conn: portforward.PortForward(
            conn, sandbox=pod.sandbox_id, replies=replies, timers=self._timers))
        return Switch(switching(chosen), session)

    def _runs(self, node: str, pod: PodSight, container: str) -> bool:
        current = self._pods.pod(node, pod.namespace, pod.name)
        if current is None or current.uid != pod.uid:
            return False
        found = current.container(container)
        return found is not None and found.running
