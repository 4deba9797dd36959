"""kopf glue for FakeNodePool: hand the pool to its cluster's engine, report what it achieved.

The engine does the work (creating, reshaping, deleting nodes at its own pace); these handlers
only tell it the desired pool and copy its counts into ``status`` on a timer, so ``kubectl scale``
and ``kubectl get fnp`` see progress.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import kopf

from operators.api.nodepools import FakeNodePool
from operators.handlers.runtime import Runtime, wait_until_none
from operators.k8s.errors import NotFound
from operators.k8s.times import rfc3339
from operators.reconciling.clusters import cluster_key
from operators.reconciling.nodepools import pool_status

logger = logging.getLogger(__name__)

POOLS = "/apis/fakefleet.dev/v1alpha1/namespaces/{namespace}/fakenodepools/{name}"
DELETE_TIMEOUT = 120.0


async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Create/update/resume handler: give the pool to the engine of its cluster."""
    runtime: Runtime = memo.runtime
    pool = FakeNodePool.model_validate(dict(body))
    namespace, name = pool.metadata["namespace"], pool.metadata["name"]
    engine = runtime.engines.get(cluster_key(namespace, pool.spec.clusterRef))
    if engine is None:
        await report(runtime, pool)
        raise kopf.TemporaryError(
            f"FakeCluster {namespace}/{pool.spec.clusterRef} is not running yet", delay=3)
    engine.set_pool(name, pool.spec)
    await report(runtime, pool)


async def refresh(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Timer: keep the engine's copy current (engines restart) and the status fresh."""
    runtime: Runtime = memo.runtime
    pool = FakeNodePool.model_validate(dict(body))
    engine = runtime.engines.get(cluster_key(pool.metadata["namespace"], pool.spec.clusterRef))
    if engine is not None:
        engine.set_pool(pool.metadata["name"], pool.spec)
    await report(runtime, pool)


async def delete(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: the pool's nodes are deleted from the member cluster before the pool goes."""
    runtime: Runtime = memo.runtime
    pool = FakeNodePool.model_validate(dict(body))
    name = pool.metadata["name"]
    engine = runtime.engines.get(cluster_key(pool.metadata["namespace"], pool.spec.clusterRef))
    if engine is None:
        return  # the cluster (and its nodes) are gone already
    engine.remove_pool(name)
    left = await wait_until_none(lambda: engine.counts(name).replicas, DELETE_TIMEOUT)
    if left:
        raise kopf.TemporaryError(f"{left} nodes still being deleted", delay=5)


async def report(runtime: Runtime, pool: FakeNodePool) -> None:
    engine = runtime.engines.get(cluster_key(pool.metadata["namespace"], pool.spec.clusterRef))
    if engine is not None and not engine.synced.is_set():
        return  # a (re)started engine knows no nodes until its first listing: no false zeros
    counts = engine.counts(pool.metadata["name"]) if engine else None
    status = pool_status(pool, counts.replicas if counts else 0, counts.ready if counts else 0,
                         cluster_running=engine is not None, now=rfc3339())
    if status == pool.status:
        return
    path = POOLS.format(namespace=pool.metadata["namespace"], name=pool.metadata["name"])
    with contextlib.suppress(NotFound):
        await runtime.host.patch(f"{path}/status", {"status": status.model_dump(mode="json")})
