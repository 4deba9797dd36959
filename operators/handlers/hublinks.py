"""kopf glue for hub links: one daemon per FakeCluster that joins a hub.

The daemon works out where the cluster's hub is and which token to show (the host's own hub
from its published ``hub.json`` and key, or ``spec.federation``'s address and credentials
Secret), runs :class:`~federation.client.member.MemberLink` for a
:class:`~operators.hublink.member.HostMember` beside the member's observer, and notes the link's
state for the HubConnected condition. It starts the link again when that target changes, and
deregisters the cluster from the hub when the FakeCluster is deleted.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from typing import Any

import grpc
import kopf

from federation.client import tokens
from federation.client.channels import HubAddress
from federation.client.discovery import HubFiles, local_credentials
from federation.client.member import MemberLink, deregister
from operators.api.base import API_VERSION
from operators.api.clusters import CA_KEY, TOKEN_KEY, FakeCluster
from operators.controlplane.state import StateDir
from operators.handlers.clusters import linked_access, member_access
from operators.handlers.runtime import Runtime
from operators.hublink.jobwatching import MEMBER_CONNECTIONS, WORKER_CONNECTIONS
from operators.hublink.member import HostMember
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.reconciling.clusters import HubState, cluster_key
from primitives.names import member_name
from primitives.tasks import spawn

logger = logging.getLogger(__name__)

#: How often a cluster with no usable hub looks again, and a running link checks its target.
RECHECK = 5.0
SECRETS = "/api/v1/namespaces/{namespace}/secrets/{name}"


@dataclasses.dataclass(frozen=True)
class Target:
    hub: HubAddress
    token: str


async def target(runtime: Runtime, cluster: FakeCluster) -> Target | HubState:
    """Where the cluster's hub is, or why there is none to join (as its HubConnected)."""
    federation = cluster.spec.effective_federation
    name, namespace = cluster.metadata["name"], cluster.metadata["namespace"]
    if not federation.enabled:
        return HubState(False, "Disabled", "spec.federation.enabled is false")
    if federation.address is None:
        local = local_credentials(HubFiles(runtime.state_dir / "hub"))
        if local is None:
            return HubState(False, "NoHub", "no hub runs on this host ('fakefleet up' starts "
                                            "one unless --no-hub) and spec.federation.address "
                                            "is not set")
        info, key = local
        return Target(HubAddress.of(info.address, info.ca),
                      tokens.member_token(key, member_name(namespace, name)))
    secret_name = federation.credentialsSecret or ""
    try:
        secret = await runtime.host.get(SECRETS.format(namespace=namespace, name=secret_name))
    except NotFound:
        return HubState(False, "CredentialsMissing",
                        f"Secret {namespace}/{secret_name} (spec.federation.credentialsSecret) "
                        f"does not exist: create it with keys {TOKEN_KEY} and {CA_KEY}")
    data = secret.get("data") or {}
    missing = [key for key in (TOKEN_KEY, CA_KEY) if key not in data]
    if missing:
        return HubState(False, "CredentialsMissing",
                        f"Secret {namespace}/{secret_name} has no key {', '.join(missing)}: a "
                        f"hub link needs {TOKEN_KEY} (the member token) and {CA_KEY} (the "
                        f"hub's CA)")
    return Target(HubAddress(federation.address, base64.b64decode(data[CA_KEY])),
                  base64.b64decode(data[TOKEN_KEY]).decode().strip())


async def run(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
              **_: Any) -> None:
    runtime: Runtime = memo.runtime
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    key = cluster_key(namespace, name)
    joined: Target | None = None
    try:
        while not stopped:
            cluster = FakeCluster.model_validate(dict(body))
            try:
                found = await target(runtime, cluster)
            except K8sError as error:
                found = HubState(False, "CredentialsUnreadable", str(error))
            if isinstance(found, HubState):
                runtime.hub_links[key] = found
                await stopped.wait(RECHECK)
                continue
            joined = found
            await _link(runtime, body, key, found, stopped)
    finally:
        runtime.hub_links.pop(key, None)
        if joined is not None and body.get("metadata", {}).get("deletionTimestamp"):
            await _deregister(joined, member_name(namespace, name),
                              StateDir(runtime.state_dir).host_id())


async def _link(runtime: Runtime, body: kopf.Body, key: str, found: Target,
                stopped: kopf.DaemonStopped) -> None:
    """Run the link until the daemon stops or the cluster's hub target changes."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    members: list[Client] = []

    def member_client() -> Client | None:
        if members:
            return members[0]
        cluster = FakeCluster.model_validate(dict(body))
        access = linked_access(runtime, cluster, key)
        if access is None:
            return None
        members.append(Client.connect(access, connections=MEMBER_CONNECTIONS, timeout=30))
        return members[0]

    workers: dict[str, Client] = {}

    async def worker_client(worker: str) -> Client | None:
        """The FakeCluster ``worker`` beside this one: MultiKueue names its workers after
        them (its MultiKueueClusters are made from ``spec.addons.kueue.multiKueue.workers``)."""
        if worker not in workers:
            try:
                raw = await runtime.host.get(
                    f"/apis/{API_VERSION}/namespaces/{namespace}/fakeclusters/{worker}")
            except K8sError as error:  # asked again later
                logger.debug("hub link of %s: worker %s: %s", key, worker, error)
                return None
            access = member_access(runtime, FakeCluster.model_validate(raw),
                                   cluster_key(namespace, worker))
            if access is None:
                return None
            workers[worker] = Client.connect(access, connections=WORKER_CONNECTIONS, timeout=30)
        return workers[worker]

    def on_state(up: bool, message: str) -> None:
        runtime.hub_links[key] = HubState(up, "Connected" if up else "Disconnected", message)

    runtime.hub_links[key] = HubState(False, "Connecting", f"connecting to {found.hub.address}")
    member = HostMember(runtime.host, namespace, name,
                        host_id=StateDir(runtime.state_dir).host_id(),
                        annotations=lambda: body.get("metadata", {}).get("annotations") or {},
                        member_client=member_client, worker_client=worker_client,
                        on_state=on_state)
    link = MemberLink(found.hub, found.token, member, member.fleet_name)
    member.report = link.report
    stop = asyncio.Event()
    # Supervised: a defect in either is logged and it starts again, rather than leaving the
    # cluster linked but silent (or observed but unlinked) until the operator restarts.
    tasks = [spawn(f"hub-link-{key}", lambda: link.run(stop)),
             spawn(f"hub-observe-{key}", lambda: member.observe(stop))]
    try:
        while not stopped:
            await stopped.wait(RECHECK)
            try:
                now = await target(runtime, FakeCluster.model_validate(dict(body)))
            except K8sError:
                continue  # the Secret cannot be read now: keep the link as it is
            if now != found:
                logger.info("hub link of %s: its hub changed; linking again", key)
                break
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in [*members, *workers.values()]:
            await client.close()


async def _deregister(found: Target, name: str, host: str) -> None:
    try:
        await deregister(found.hub, found.token, name, host)
        logger.info("cluster %s left the hub", name)
    except grpc.aio.AioRpcError as error:  # the hub's grace says Unreachable instead
        logger.warning("cluster %s could not leave the hub: %s", name, error.details())
