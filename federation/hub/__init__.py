"""The federation hub: ``python -m federation.hub``.

``membership`` (who is in the fleet and whether they answer) and ``runs`` (fleet-wide plans
and each member's part) are pure state with no I/O; ``store`` persists them; ``validation``
and ``convert`` stand between them and the wire; ``sessions`` and ``server`` are the grpc.aio
side.
"""
