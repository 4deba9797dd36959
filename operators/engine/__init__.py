"""The fake kubelet of one member cluster: nodes Ready, Leases renewed, pods through their
lifecycle, all driven by stages (data) and run as one process per cluster
(``python -m operators.engine``).

Pure planning and rendering (:mod:`~operators.engine.nodes`, :mod:`~operators.engine.pods`,
:mod:`~operators.engine.stages`) is kept apart from the loops that write
(:mod:`~operators.engine.registering`, :mod:`~operators.engine.heartbeating`,
:mod:`~operators.engine.lifecycle`, :mod:`~operators.engine.pooling`), wired together in
:mod:`~operators.engine.running`; their conditional writes go through
:mod:`operators.k8s.patching`.
Faults reach the engine as stages the objects carry (:mod:`operators.api.injections`).
"""
