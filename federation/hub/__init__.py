"""The federation hub: ``python -m federation.hub``.

Pure state with no I/O: ``membership`` (who is in the fleet and whether they answer), ``runs``
(fleet-wide plans and each member's part), ``workloads`` (fleet workloads and their Jobs), with
``arrivals`` and ``placement`` (when Jobs arrive, where they fit); ``store`` persists them.

The hub acts on them, one protocol a module, composed by ``core.Hub``: ``sessions`` (members
registering, their sessions and what they say), ``running`` (runs), ``dispatching``
(workloads), ``watching`` (watchers), all sending through ``sending``. ``validation`` and
``convert`` stand between them and the wire; ``services`` and ``server`` are the grpc.aio side.
"""
