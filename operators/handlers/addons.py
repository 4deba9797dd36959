"""kopf glue for the add-ons of member clusters: every add-on, run the same way.

Called by the FakeCluster handler (:mod:`operators.handlers.clusters`) on every reconcile
(create, update, resume, the 5 s timer), so each add-on is supervised like the member's control
plane: started when the spec asks for it, restarted by its supervisor when it crashes, stopped
(and its hooks removed) when the spec no longer asks, stopped with the cluster. The add-ons are
those of :func:`operators.addons.registry.runners`, kept in the :class:`Runtime`; this module
names none of them, and what is an add-on's own lives in its package under
``operators/addons/``.
"""

from __future__ import annotations

import logging
from typing import Any

from operators.addons.running import Runner, Site
from operators.api.clusters import FakeCluster, FakeClusterStatus
from operators.controlplane.errors import ControlPlaneError
from operators.controlplane.state import ComponentState, StateDir
from operators.handlers.runtime import Runtime
from operators.k8s.errors import K8sError, brief
from operators.reconciling.clusters import Addons, AddonState

logger = logging.getLogger(__name__)


async def reconcile(runtime: Runtime, cluster: FakeCluster, key: str, *,
                    control_plane_running: bool) -> Addons:
    """Bring every add-on of the member to its spec; the conditions of those asked for."""
    found = []
    for runner in runtime.addons:
        state = await _reconcile(runner, _site(runtime, key), cluster,
                                 control_plane_running=control_plane_running)
        if state is not None:
            found.append((runner.addon.condition, state))
    return tuple(found)


async def _reconcile(runner: Runner[Any, Any], site: Site, cluster: FakeCluster, *,
                     control_plane_running: bool) -> AddonState | None:
    """One add-on's reconcile; a failure to look is reported, not raised: the cluster's own
    reconcile is done by then."""
    try:
        return await runner.reconcile(site, cluster,
                                      control_plane_running=control_plane_running)
    except (ControlPlaneError, K8sError) as failure:
        logger.warning("cluster %s: %s: %s", site.key, runner.addon.name, failure)
        return AddonState(False, "SetupFailed", brief(failure))


def reported(runtime: Runtime, status: FakeClusterStatus) -> Addons:
    """The add-ons' conditions as the status says them, for a report made before the add-ons
    are looked at."""
    found = []
    for runner in runtime.addons:
        addon = runner.addon.condition
        said = next((c for c in status.conditions if c.type == addon.type), None)
        if said is not None:
            found.append((addon, AddonState(said.status == "True", said.reason, said.message)))
    return tuple(found)


async def remove(runtime: Runtime, key: str) -> None:
    """The member is going: stop its add-ons (their hooks go with the member's data)."""
    for runner in runtime.addons:
        await runner.stop(_site(runtime, key))


def components(runtime: Runtime) -> list[ComponentState]:
    """Each member's add-ons, as ``fakefleet status`` lists them."""
    state = StateDir(runtime.state_dir)
    return [component for runner in runtime.addons for component in runner.components(state)]


def _site(runtime: Runtime, key: str) -> Site:
    return Site(key=key, state=StateDir(runtime.state_dir), host=runtime.host,
                local=runtime.substrate.clusters.get(key), subreaper=runtime.subreaper)
