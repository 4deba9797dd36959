"""Wiring: which kopf handler serves which event, kopf's settings, and the embeddable runner.

``run(runtime=..., stop_flag=..., ready_flag=...)`` runs the whole operator in the current event
loop, so tests drive a real operator in-process and ``python -m operators`` is a thin shell.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import yaml

from operators.api.base import GROUP, VERSION
from operators.handlers import clusters, nodepools
from operators.handlers.runtime import Runtime

FINALIZER = f"{GROUP}/finalizer"
CLUSTER_TIMER = 2.0
POOL_TIMER = 2.0


def build_registry(kubeconfig: str) -> kopf.OperatorRegistry:
    """Handlers of FakeCluster and FakeNodePool, and a login to the host cluster."""
    registry = kopf.OperatorRegistry()
    fc = {"group": GROUP, "version": VERSION, "plural": "fakeclusters", "registry": registry}
    fnp = {"group": GROUP, "version": VERSION, "plural": "fakenodepools", "registry": registry}

    for on in (kopf.on.create, kopf.on.resume):
        on(**fc, id="reconcile")(clusters.reconcile)  # type: ignore[arg-type]
        on(**fnp, id="reconcile")(nodepools.reconcile)  # type: ignore[arg-type]
    kopf.on.update(**fc, id="reconcile", field="spec")(clusters.reconcile)  # type: ignore[arg-type]
    kopf.on.update(**fnp, id="reconcile", field="spec")(  # type: ignore[arg-type]
        nodepools.reconcile)
    kopf.timer(**fc, id="refresh", interval=CLUSTER_TIMER)(  # type: ignore[arg-type]
        clusters.reconcile)
    kopf.timer(**fnp, id="refresh", interval=POOL_TIMER)(nodepools.refresh)  # type: ignore[arg-type]
    kopf.on.delete(**fc, id="teardown")(clusters.delete)  # type: ignore[arg-type]
    kopf.on.delete(**fnp, id="teardown")(nodepools.delete)  # type: ignore[arg-type]

    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(kubeconfig)

    kopf.on.login(registry=registry)(login)
    return registry


def connection_info(kubeconfig: str) -> kopf.ConnectionInfo:
    config = yaml.safe_load(kubeconfig)
    context = next(c["context"] for c in config["contexts"]
                   if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    return kopf.ConnectionInfo(
        server=cluster["server"],
        ca_data=cluster.get("certificate-authority-data"),
        certificate_data=user.get("client-certificate-data"),
        private_key_data=user.get("client-key-data"),
        token=user.get("token"),
    )


def settings() -> kopf.OperatorSettings:
    configured = kopf.OperatorSettings()
    # Progress and the last-handled spec live in annotations: our CRDs' structural schemas
    # would prune kopf's default status fields.
    configured.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    configured.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    configured.persistence.finalizer = FINALIZER
    configured.posting.level = logging.WARNING
    configured.networking.request_timeout = 30
    configured.watching.server_timeout = 300
    return configured


async def run(
    *,
    runtime: Runtime,
    kubeconfig: str,
    stop_flag: asyncio.Event,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set; engines stop with it."""
    memo = kopf.Memo(runtime=runtime)
    try:
        await kopf.operator(
            registry=build_registry(kubeconfig), settings=settings(), memo=memo,
            clusterwide=True, standalone=True, stop_flag=stop_flag, ready_flag=ready_flag,
        )
    finally:
        await runtime.engines.stop_all()
