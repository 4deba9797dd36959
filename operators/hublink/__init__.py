"""The hub link: a member cluster's side of the federation hub, inside the operator.

``convert`` turns CRD models into protobuf messages and hub commands into FaultPlans (pure);
``member`` is the member the link speaks for: it observes the host API and acts through it.
The conversation itself (sessions, heartbeats, back-off) is :mod:`federation.client.member`.
"""
