"""The hub link: a member cluster's side of the federation hub, inside the operator.

``convert`` turns CRD models into protobuf messages and hub commands into FaultPlans, ``jobs``
hub commands into Jobs and what a Job shows into its progress (both pure). ``member`` is the
member the link speaks for, composed of ``plans`` (plan commands), ``jobwatching`` (job
commands and their watches), ``inventorying`` (the inventory) and ``reporting`` (results); they
observe the host and member APIs and act through them. The conversation itself (sessions,
heartbeats, back-off) is :mod:`federation.client.member`.
"""
