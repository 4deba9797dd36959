"""kopf glue for Replay: a daemon per Replay that runs it
(:class:`operators.recording.running.ReplayRun`) until it has Succeeded or Failed.

kopf runs each daemon as its own task, so a long replay, or one waiting for its cluster, holds
up no other object; it starts the daemon again when the operator restarts (the runner carries
on from the status), and stops it when the Replay is deleted (its finalizer waits for that).
Here is only what the runner needs of the operator: members reached as the FakeCluster handler
reaches them.
"""

from __future__ import annotations

from typing import Any

import kopf

from operators.api.clusters import FakeCluster
from operators.api.replays import Replay
from operators.handlers.clusters import member_access
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.reconciling.clusters import cluster_key
from operators.recording.running import REPLAY, Connect, ReplayRun
from primitives.clocks import SYSTEM_CLOCK, Clock

#: Writes in flight to one member at most (the Replayer's own bound).
CONNECTIONS = 16


def connector(runtime: Runtime, namespace: str) -> Connect:
    """How a Replay in ``namespace`` reaches its FakeCluster's API server: with the admin
    credentials the operator holds for it (None until it has them)."""
    def connect(cluster: FakeCluster, name: str) -> Client | None:
        access = member_access(runtime, cluster, cluster_key(namespace, name))
        if access is None:
            return None
        return Client.connect(access, connections=CONNECTIONS, timeout=30)
    return connect


async def run(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, *,
              clock: Clock = SYSTEM_CLOCK, **_: Any) -> None:
    """Daemon: one per Replay, for as long as it runs (kopf starts it again on resume)."""
    runtime: Runtime = memo.runtime
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        replay = Replay.model_validate(await runtime.host.get(REPLAY.format(
            namespace=namespace, name=name)))
    except NotFound:
        return
    except K8sError as error:
        raise kopf.TemporaryError(f"replay {namespace}/{name}: {error}", delay=2) from error
    if replay.metadata.get("deletionTimestamp"):
        return
    runner = ReplayRun(replay, host=runtime.host, connect=connector(runtime, namespace),
                       clock=clock)
    try:
        await runner.run(lambda: bool(stopped))
    except K8sError as error:
        raise kopf.TemporaryError(f"replay {namespace}/{name}: {error}", delay=2) from error
