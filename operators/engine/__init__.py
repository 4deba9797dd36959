"""The fake kubelet: nodes Ready, leases renewed (and, later, pods through their lifecycle).

Pure planning (:mod:`~operators.engine.nodes`) is kept apart from the loops that apply it
(:mod:`~operators.engine.running`); :mod:`~operators.engine.fleet` isolates clusters.
"""
