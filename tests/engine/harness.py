"""An engine on in-memory API servers (member and host) and a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from opentelemetry import trace

from operators.api import faultsets
from operators.api.injections import FaultEntry
from operators.api.nodepools import FakeNodePoolSpec
from operators.controlplane.pki import KubeletPKI
from operators.engine import authorizing
from operators.engine.heartbeating import LEASE_NAMESPACE
from operators.engine.pooling import ClusterRef
from operators.engine.running import ClusterEngine, EngineSettings
from operators.engine.stages import Rules
from operators.k8s.client import Client
from operators.k8s.requests import MERGE_PATCH, STRATEGIC_PATCH, Request
from operators.k8s.transport import Response, StreamResponse, Transport
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

NODES = "/api/v1/nodes"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
PODS = "/api/v1/namespaces/default/pods"
POOLS = "/apis/fakefleet.dev/v1alpha1/namespaces/default/fakenodepools"
CLUSTER = ClusterRef("default", "west")
ENGINE_NAME = "default.west"


def spec(**fields: Any) -> FakeNodePoolSpec:
    return FakeNodePoolSpec.model_validate({"clusterRef": "west", **fields})


def pool(name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterRef": "west", **fields}}


def pod(name: str, node: str, *, annotations: dict[str, str] | None = None,
        restart: str = "Always", job: bool = False,
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default",
                                "annotations": annotations or {}}
    if job:
        metadata["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                        "uid": "job-uid", "controller": True}]
    spec_: dict[str, Any] = {"nodeName": node, "restartPolicy": restart,
                             "containers": [{"name": "main", "image": "app:1"}]}
    if init:
        spec_["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec_,
            "status": {}}


class Recorded:
    """The engines' side of the member API: what they send, kept apart from others' requests
    (the tests' own, as other writers)."""

    def __init__(self, transport: MemoryTransport, sent: list[Request]) -> None:
        self._transport = transport
        self._sent = sent

    async def send(self, request: Request) -> Response:
        self._sent.append(request)
        return await self._transport.send(request)

    def stream(self, request: Request) -> contextlib.AbstractAsyncContextManager[StreamResponse]:
        self._sent.append(request)
        return self._transport.stream(request)

    def refresh_credentials(self) -> None:
        self._transport.refresh_credentials()

    async def close(self) -> None:
        await self._transport.close()


#: The fleets the running test made (tests/engine/conftest.py checks their engines' requests).
FLEETS: list[Fleet] = []


class Fleet:
    """One member cluster (and a host) in memory, and engines started against them."""

    def __init__(self) -> None:
        FLEETS.append(self)
        self.clock = FakeClock()
        self.member = MemoryTransport(self.clock)
        self.host = MemoryTransport(self.clock)
        #: Every request the engines sent to the member, in order.
        self.engine_requests: list[Request] = []

    def engine(self, *, hosted: bool = True, pools: dict[str, FakeNodePoolSpec] | None = None,
               seed: int = 1, rules: Rules | None = None, tracer: trace.Tracer | None = None,
               kubelet_pki: KubeletPKI | None = None,
               heartbeat_server: Callable[[Transport], Transport] | None = None,
               **settings: Any) -> ClusterEngine:
        """``heartbeat_server``: what the heartbeats' own connections reach, in front of the
        member (default: the member, on the engine's one client)."""
        client = Client(Recorded(self.member, self.engine_requests), clock=self.clock)
        heartbeat_client = None if heartbeat_server is None else Client(
            heartbeat_server(Recorded(self.member, self.engine_requests)), clock=self.clock)
        return ClusterEngine(
            ENGINE_NAME, client, heartbeat_client=heartbeat_client,
            host=Client(self.host, clock=self.clock) if hosted else None,
            serves=CLUSTER if hosted else None, pools=None if hosted else pools,
            settings=EngineSettings(**settings), clock=self.clock, rng=random.Random(seed),
            rules=rules, tracer=tracer, kubelet_pki=kubelet_pki)

    @contextlib.asynccontextmanager
    async def running(self, engine: ClusterEngine) -> AsyncIterator[ClusterEngine]:
        task = asyncio.create_task(engine.run())
        try:
            await self.clock.settle()
            yield engine
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if task.done() and not task.cancelled() and task.exception():
                raise task.exception()  # type: ignore[misc]

    async def host_client_patch(self, path: str, body: dict[str, Any]) -> None:
        """A user's change to a host object (a kubectl patch)."""
        await Client(self.host, clock=self.clock).patch(path, body)

    async def member_client_patch(self, path: str, body: dict[str, Any], *,
                                  strategic: bool = False, bypass_faults: bool = False) -> None:
        """Someone else's change to a member object (kubectl, a controller)."""
        faults, self.member.faults = self.member.faults, [] if bypass_faults else \
            self.member.faults
        try:
            await Client(self.member, clock=self.clock).patch(
                path, body, content_type=STRATEGIC_PATCH if strategic else MERGE_PATCH)
        finally:
            self.member.faults = faults

    def engine_sent(self, method: str, pattern: str = ".*") -> list[Request]:
        """The requests the engines sent with ``method`` to paths matching ``pattern``."""
        compiled = re.compile(pattern)
        return [r for r in self.engine_requests
                if r.method == method and compiled.fullmatch(r.path)]

    def nodes(self) -> dict[str, dict[str, Any]]:
        return {n["metadata"]["name"]: n for n in self.member.objects(NODES)}

    def uids(self) -> dict[str, str]:
        return {name: node["metadata"]["uid"] for name, node in self.nodes().items()}

    def leases(self) -> dict[str, dict[str, Any]]:
        return {lease["metadata"]["name"]: lease for lease in self.member.objects(LEASES)}

    def pod(self, name: str) -> dict[str, Any]:
        found = self.member.object(f"{PODS}/{name}")
        assert found is not None, f"pod {name} is gone"
        return found

    def inject(self, written: dict[str, Any], *targets: str, kind: str = "Node") -> None:
        """A plan's fault set, written (nodes by name, pods by name: their uids are looked
        up)."""
        if kind == "Pod":
            targets = tuple(self.pod_target(name) for name in targets)
        self.member.put(faultsets.CONFIGMAPS, fault_set(written, *targets, kind=kind))

    def pod_target(self, name: str) -> str:
        return faultsets.pod_target("default", name, self.pod(name)["metadata"]["uid"])

    async def recover(self, entry_id: str, traceparent: str = "") -> None:
        """The plan turns every set of entry ``entry_id`` to its recovery (in the span of
        ``traceparent``)."""
        data = {"state": "recover", **({"traceparent": traceparent} if traceparent else {})}
        for found in self.member.objects(faultsets.CONFIGMAPS):
            if found["data"]["id"] == entry_id:
                await self.member_client_patch(
                    f"{faultsets.CONFIGMAPS}/{found['metadata']['name']}", {"data": data},
                    bypass_faults=True)

    def set_state(self, entry_id: str) -> str:
        """The state of entry ``entry_id``'s fault set ("": there is none)."""
        found = [s["data"]["state"] for s in self.member.objects(faultsets.CONFIGMAPS)
                 if s["data"]["id"] == entry_id]
        return found[0] if found else ""

    def pool_status(self, name: str) -> dict[str, Any]:
        found = self.host.object(f"{POOLS}/{name}")
        assert found is not None
        status: dict[str, Any] = found.get("status") or {}
        return status


def entry(entry_id: str, stages: list[dict[str, Any]],
          recovery: list[dict[str, Any]] | None = None, *,
          state: str = "inject", traceparent: str = "") -> dict[str, Any]:
    """A fault entry as a FaultPlan writes it into a fault set (with the trace context of the
    step that wrote it, if given)."""
    written: dict[str, Any] = {"id": entry_id, "state": state, "stages": stages,
                               "recovery": recovery or []}
    if traceparent:
        written["traceparent"] = traceparent
    return written


def as_written(made: FaultEntry) -> dict[str, Any]:
    """An entry the fault catalogue made, as :func:`entry` gives one."""
    dumped = made.model_dump(mode="json", exclude_none=True)
    return entry(made.id, dumped["stages"], dumped["recovery"], state=made.state,
                 traceparent=made.traceparent or "")


def fault_set(written: dict[str, Any], *targets: str, kind: str = "Node",
              chunk: int = 0) -> dict[str, Any]:
    """The fault set (a ConfigMap) that carries entry ``written`` to ``targets`` (nodes by
    name, pods as namespace/name/uid), as a FaultPlan writes it."""
    data = {"id": written["id"], "kind": kind, "state": written["state"],
            "entries": json.dumps([{"stages": written["stages"],
                                    "recovery": written["recovery"],
                                    "targets": list(targets)}])}
    if written.get("traceparent"):
        data["traceparent"] = written["traceparent"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": faultsets.set_name(written["id"], chunk),
                         "namespace": faultsets.NAMESPACE,
                         "labels": {keys.FAULT_SET: faultsets.digest(written["id"])}},
            "data": data}


def ready(node: dict[str, Any]) -> str:
    return next((c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"), "")


#: Paths outside the API's resources that any authenticated client may GET.
PUBLIC = frozenset({"/version"})


def granted(request: Request) -> bool:
    """Whether the engine's RBAC (:mod:`operators.engine.authorizing`) lets ``request`` go
    through, as the API server's RBAC authorizer decides it."""
    if request.path in PUBLIC:
        return request.method == "GET"
    parts = [part for part in request.path.split("/") if part]
    group, rest = ("", parts[2:]) if parts[:1] == ["api"] else (parts[1], parts[3:])
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = "/".join(rest[:1] + rest[2:3])  # nodes, nodes/status
    named = len(rest) > 1
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update"}.get(request.method) or (
        ("delete" if named else "deletecollection") if request.method == "DELETE" else
        "get" if named else
        "watch" if request.query.get("watch") in ("1", "true") else "list")
    rules = authorizing.CLUSTER + {LEASE_NAMESPACE: authorizing.LEASES,
                                   faultsets.NAMESPACE: authorizing.FAULT_SETS}.get(namespace, ())
    return any(rule.group == group and resource in rule.resources and verb in rule.verbs
               for rule in rules)
