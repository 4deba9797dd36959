"""The add-ons of member clusters: real upstream controllers a user tests against the fleet
(Kueue with MultiKueue, metrics-server, Karpenter's KWOK provider, KubeRay's operator), built
from the Go module proxy, run per member.

- :mod:`~operators.addons.lifecycle`: the life every add-on lives (built, started, hooked,
  stopped) and what its condition says about it, decided purely;
- :mod:`~operators.addons.running`: the :class:`~operators.addons.running.Addon` protocol and
  the one runner of every add-on (supervision per member, observe → plan → act);
- :mod:`~operators.addons.building`: the background build of a binary, the module source read
  once;
- :mod:`~operators.addons.registry`: every add-on, in the order of their conditions;
- one package per add-on (``kueue/``, ``metricsserver/``, ``karpenter/``, ``kuberay/``): its
  binary, manifests, pure rendering and planning, and its class of the protocol.

The layering: above :mod:`operators.controlplane` (whose Go builds and supervision it uses) and
:mod:`operators.reconciling` (whose condition types it fills), below :mod:`operators.handlers`
(whose :mod:`~operators.handlers.addons` runs it from kopf); it never imports the handlers.
"""
