"""The operator's kopf side, and what its handlers share:

- the handlers of FakeCluster (:mod:`~operators.handlers.clusters`, with its add-ons
  :mod:`~operators.handlers.kueue` and :mod:`~operators.handlers.metricsserver`), FakeNodePool
  (:mod:`~operators.handlers.nodepools`), FaultPlan (:mod:`~operators.handlers.faultplans`),
  Replay (:mod:`~operators.handlers.replays`) and the hub links
  (:mod:`~operators.handlers.hublinks`): each observes, calls the planners and runners below it
  (``reconciling``, ``faults``, ``recording``, ``hublink``), applies what they return and
  reports;
- :mod:`~operators.handlers.registry`: which handler serves which event, kopf's settings, and
  the embeddable ``run``;
- :mod:`~operators.handlers.runtime`: the Runtime the handlers share through kopf's memo (the
  host client, the member control planes, engines and add-ons the operator supervises);
- :mod:`~operators.handlers.provisioning`: the span of a FakeCluster reconcile;
  :mod:`~operators.handlers.permissions`: the RBAC rules the chart is generated from.

What to do is decided below (``reconciling``, ``faults``), not here; the operator's own API
requests go through :mod:`operators.k8s`.
"""
