"""Wiring: which kopf handler serves which event, kopf's settings, and the embeddable runner.

``run(runtime=..., stop_flag=..., ready_flag=...)`` runs the whole operator in the current event
loop, so tests drive a real operator in-process and ``python -m operators`` is a thin shell.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import kopf

from operators.api.base import VERSION
from operators.handlers import clusters, faultplans, hublinks, nodepools, replays
from operators.handlers.runtime import Runtime
from operators.k8s.config import ClusterAccess, HostConfig
from primitives import keys
from primitives.keys import GROUP

#: Heal members and refresh their node counts (engines write pool status themselves).
CLUSTER_TIMER = 5.0
#: A daemon asked to stop (the operator stops, or its object goes) gets DAEMON_GRACE seconds
#: to end by itself, then it is cancelled and gets DAEMON_CANCELLED more to close its clients.
#: Plan runners, replays and hub links may stop at any line (their progress is in the API); kopf's
#: default would cancel them at once, in the middle of closing what they hold.
DAEMON_GRACE = 3.0
DAEMON_CANCELLED = 2.0
#: The longest it takes to stop every daemon (they stop in parallel).
DAEMON_STOP = DAEMON_GRACE + DAEMON_CANCELLED


def build_registry(host: HostConfig) -> kopf.OperatorRegistry:
    """Handlers of FakeCluster, FakeNodePool, FaultPlan and Replay, and a login to the host
    cluster."""
    registry = kopf.OperatorRegistry()
    fc = {"group": GROUP, "version": VERSION, "plural": "fakeclusters", "registry": registry}
    fnp = {"group": GROUP, "version": VERSION, "plural": "fakenodepools", "registry": registry}
    fp = {"group": GROUP, "version": VERSION, "plural": "faultplans", "registry": registry}
    rp = {"group": GROUP, "version": VERSION, "plural": "replays", "registry": registry}

    for on in (kopf.on.create, kopf.on.resume):
        on(**fc, id="reconcile")(clusters.reconcile)  # type: ignore[arg-type]
        on(**fnp, id="reconcile")(nodepools.reconcile)  # type: ignore[arg-type]
    kopf.on.update(**fc, id="reconcile", field="spec")(clusters.reconcile)  # type: ignore[arg-type]
    kopf.on.update(**fnp, id="reconcile", field="spec")(  # type: ignore[arg-type]
        nodepools.reconcile)
    # A snapshot restore's hold, put on and taken off, is carried out at once (the timer
    # would take up to its interval at each of the restore's steps).
    kopf.on.update(**fc, id="restore", when=_restoring)(  # type: ignore[arg-type]
        clusters.reconcile)
    kopf.timer(**fc, id="refresh", interval=CLUSTER_TIMER)(  # type: ignore[arg-type]
        clusters.reconcile)
    kopf.on.delete(**fc, id="teardown")(clusters.delete)  # type: ignore[arg-type]
    kopf.on.delete(**fnp, id="teardown")(nodepools.delete)  # type: ignore[arg-type]
    stopping = {"cancellation_backoff": DAEMON_GRACE, "cancellation_timeout": DAEMON_CANCELLED}
    kopf.daemon(**fp, id="run", **stopping)(faultplans.run)  # type: ignore[arg-type]
    kopf.on.delete(**fp, id="recover")(faultplans.delete)  # type: ignore[arg-type]
    kopf.daemon(**rp, id="run", **stopping)(replays.run)  # type: ignore[arg-type]
    kopf.daemon(**fc, id="hub-link", **stopping)(hublinks.run)  # type: ignore[arg-type]

    def login(**_: Any) -> kopf.ConnectionInfo:
        # Read again at every login: kopf logs in anew when credentials expire (a projected
        # service-account token says when) or are refused.
        return connection_info(host.load())

    kopf.on.login(registry=registry)(login)
    return registry


def _restoring(annotations: kopf.Annotations, **_: Any) -> bool:
    return keys.RESTORE in annotations or keys.RESTORE_HELD in annotations


def connection_info(access: ClusterAccess) -> kopf.ConnectionInfo:
    """kopf's view of the same access the raw client uses."""
    return kopf.ConnectionInfo(
        server=access.server,
        ca_data=access.ca,
        insecure=access.insecure or None,
        certificate_data=access.client_cert,
        private_key_data=access.client_key,
        token=access.bearer_token(),
        expiration=access.expires,
    )


def settings(*, namespaced: bool = False) -> kopf.OperatorSettings:
    configured = kopf.OperatorSettings()
    # Watching named namespaces, the operator needs no cluster-wide access at all: kopf then
    # neither lists namespaces nor watches CRDs (the chart installs the CRDs first).
    configured.scanning.disabled = namespaced
    # Progress and the last-handled spec live in annotations: our CRDs' structural schemas
    # would prune kopf's default status fields.
    configured.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    configured.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    configured.persistence.finalizer = keys.FINALIZER
    configured.posting.level = logging.WARNING
    configured.networking.request_timeout = 30
    configured.watching.server_timeout = 300
    return configured


async def run(
    *,
    runtime: Runtime,
    stop_flag: asyncio.Event,
    ready_flag: asyncio.Event | None = None,
    namespaces: Sequence[str] = (),
    liveness_endpoint: str | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set; engines stop with it. ``namespaces``: watch
    only those (default: every namespace); ``liveness_endpoint``: kopf's health endpoint."""
    memo = kopf.Memo(runtime=runtime)
    try:
        await kopf.operator(
            registry=build_registry(runtime.host_config),
            settings=settings(namespaced=bool(namespaces)), memo=memo,
            clusterwide=not namespaces, namespaces=list(namespaces), standalone=True,
            stop_flag=stop_flag, ready_flag=ready_flag, liveness_endpoint=liveness_endpoint,
        )
    finally:
        await runtime.stop_all()
