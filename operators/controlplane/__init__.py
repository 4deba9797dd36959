"""Real upstream control planes on one machine: binaries, certificates, processes, kubeconfigs.

A :class:`~operators.controlplane.substrate.Substrate` runs one shared etcd and any number of
clusters on it; :mod:`~operators.controlplane.daemon` keeps the host cluster of ``fakefleet up``
alive in the background.
"""
