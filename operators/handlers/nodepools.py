"""kopf glue for FakeNodePool: the finalizer, and a status while no engine serves the pool.

The pool's engine (one process per FakeCluster) watches the pool and writes its status itself;
the operator only says why nothing happens while there is no engine (the FakeCluster is
missing or not Ready), and holds the pool's deletion until the member API shows none of its
nodes left (the engine deletes them, serving a deleted pool with zero replicas).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.nodepools import FakeNodePool
from operators.engine.registering import count_nodes
from operators.handlers.clusters import member_access, tell_pool
from operators.handlers.runtime import Runtime, wait_until_none
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.reconciling.clusters import cluster_key

logger = logging.getLogger(__name__)

CLUSTER = f"/apis/{API_VERSION}/namespaces/{{namespace}}/fakeclusters/{{name}}"
DELETE_TIMEOUT = 120.0


async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Create/update/resume handler: while no engine serves the pool, its status says why."""
    runtime: Runtime = memo.runtime
    pool = FakeNodePool.model_validate(dict(body))
    namespace, ref = pool.metadata["namespace"], pool.spec.clusterRef
    if runtime.engine_running(cluster_key(namespace, ref)):
        return  # the engine has it
    try:
        cluster = await runtime.host.get(CLUSTER.format(namespace=namespace, name=ref))
    except NotFound:
        await tell_pool(runtime, pool, f"FakeCluster {ref} does not exist in namespace "
                                       f"{namespace}: create it, or set clusterRef to one")
        return
    phase = (cluster.get("status") or {}).get("phase", "Pending")
    await tell_pool(runtime, pool, f"waiting for FakeCluster {ref} ({phase})")


async def delete(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: the pool goes once its cluster's API shows none of its nodes."""
    runtime: Runtime = memo.runtime
    pool = FakeNodePool.model_validate(dict(body))
    namespace, ref, name = (pool.metadata["namespace"], pool.spec.clusterRef,
                            pool.metadata["name"])
    key = cluster_key(namespace, ref)
    if not runtime.engine_running(key):
        return  # no engine: nothing serves it; a later engine deletes what is left
    try:
        cluster = FakeCluster.model_validate(
            await runtime.host.get(CLUSTER.format(namespace=namespace, name=ref)))
    except NotFound:
        return
    access = member_access(runtime, cluster, key)
    if access is None:
        return
    try:
        async with Client.connect(access, connections=1, timeout=10) as client:
            left = await wait_until_none(lambda: count_nodes(client, key, name), DELETE_TIMEOUT)
    except K8sError as error:
        raise kopf.TemporaryError(f"cannot see the member cluster: {error}", delay=5) from error
    if left:
        raise kopf.TemporaryError(f"{left} nodes still being deleted", delay=5)
