"""Every add-on the operator runs, in the order their conditions stand in a FakeCluster's
status.

A new add-on is a package under ``operators/addons/`` with a class of the
:class:`~operators.addons.running.Addon` protocol, and one entry here: the FakeCluster handler,
``fakefleet status`` and the operator's shutdown go through this list, and name no add-on.
"""

from __future__ import annotations

from typing import Any

from operators.addons.karpenter.running import Karpenter
from operators.addons.kuberay.running import KubeRay
from operators.addons.kueue.running import Kueue
from operators.addons.metricsserver.running import MetricsServer
from operators.addons.running import Runner


def runners() -> tuple[Runner[Any, Any], ...]:
    """One runner per add-on, each with nothing built or started yet (one set per operator)."""
    return (Runner(Kueue()), Runner(MetricsServer()), Runner(Karpenter()), Runner(KubeRay()))
