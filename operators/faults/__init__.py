"""Pure fault planning: which objects a FaultPlan's steps hit, and when they inject and recover.

No I/O here: callers pass the fleet as they observed it to :func:`planning.plan` and carry out
the schedule it returns.
"""
