"""What the streaming tests share: fake pods on a node, an upgrader over them, requests as the
API server sends them, and a client's side of the upgraded connection."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from operators.engine import streaming
from operators.engine.responding import Answer
from operators.engine.scripting import ContainerSight, PodSight, Scripts, gpus_on
from operators.engine.stages import default_lifecycle
from operators.engine.upgrading import Request, Switch
from tests.engine.spdyclient import Client, Frame, Link, Timers

NODE = "gpu-node-1"
#: The GPUs the GPU pod's container holds: indices 2 and 5 of its node.
GPUS = gpus_on("west", NODE, "H100-SXM5-80GB", [2, 5])


def pod(name: str = "trainer", *, running: bool = True, sandbox: bool = True,
        annotations: Mapping[str, str] | None = None, gpus: bool = True,
        uid: str = "uid-1") -> PodSight:
    return PodSight(uid, "default", name, NODE, {"app": name}, dict(annotations or {}),
                    sandbox, (ContainerSight("main", running, GPUS if gpus else ()),
                              ContainerSight("sidecar", running)))


class Pods:
    """The view the upgrader reads: pods by node, namespace and name."""

    def __init__(self, *pods: PodSight) -> None:
        self.pods = {(p.node, p.namespace, p.name): p for p in pods}

    def pod(self, node: str, namespace: str, name: str) -> PodSight | None:
        return self.pods.get((node, namespace, name))

    def put(self, changed: PodSight) -> None:
        self.pods[(changed.node, changed.namespace, changed.name)] = changed


def request(target: str, *, method: str = "POST", protocols: Sequence[str] | None = None,
            upgrade: str = "SPDY/3.1", connection: str = "Upgrade") -> Request:
    lines = [b"Host: 127.64.0.2:10250"]
    if connection:
        lines.append(f"Connection: {connection}".encode())
    if upgrade:
        lines.append(f"Upgrade: {upgrade}".encode())
    for protocol in protocols if protocols is not None else ("v4.channel.k8s.io",
                                                             "v3.channel.k8s.io",
                                                             "v2.channel.k8s.io",
                                                             "channel.k8s.io"):
        lines.append(f"X-Stream-Protocol-Version: {protocol}".encode())
    return Request.parse(method.encode(), target.encode(), lines)


@dataclasses.dataclass
class Connected:
    """An upgraded connection: the session, the client, what the server wrote, the timers."""

    switch: Switch
    client: Client
    link: Link
    timers: Timers

    def send(self, wire: bytes) -> list[Frame]:
        """Send ``wire``; the frames the server wrote back."""
        self.switch.session.data_received(wire)
        return self.client.read(self.link.fresh())

    def advance(self, seconds: float) -> list[Frame]:
        self.timers.advance(seconds)
        return self.client.read(self.link.fresh())


def upgrader(pods: Pods, timers: Timers, scripts: Scripts | None = None) -> streaming.Upgrader:
    return streaming.Upgrader(pods=pods, scripts=scripts or Scripts(default_lifecycle()),
                              timers=timers)


def answer(pods: Pods, target: str, **given: object) -> Answer:
    result = upgrader(pods, Timers())(request(target, **given), NODE, Link())  # type: ignore[arg-type]
    assert isinstance(result, Answer), result
    return result


def connect(pods: Pods, target: str, scripts: Scripts | None = None,
            **given: object) -> Connected:
    timers, link = Timers(), Link()
    result = upgrader(pods, timers, scripts)(request(target, **given),  # type: ignore[arg-type]
                                             NODE, link)
    assert isinstance(result, Switch), result
    return Connected(result, Client(), link, timers)
