"""FaultPlans, from the spec to the verdict.

Pure, no I/O: which objects a step hits and when (:mod:`~operators.faults.planning`,
:mod:`~operators.faults.targets`, :mod:`~operators.faults.executing`), what a running plan does
next and what it found means for its status (:mod:`~operators.faults.deciding`), faults as
stages (:mod:`~operators.faults.catalogue`), expectations and their verdicts
(:mod:`~operators.faults.expectations`, :mod:`~operators.faults.cel`), the plan's trace
(:mod:`~operators.faults.tracing`) and its progress as the CLI shows it
(:mod:`~operators.faults.progress`).

I/O, through :mod:`operators.k8s` only: the runner that carries a plan out
(:mod:`~operators.faults.running`) and the writes that deliver its faults
(:mod:`~operators.faults.delivering`). Nothing here imports kopf, the handlers, the engine or the
hub link: the FaultPlan handler passes in what the runner needs of the operator.
"""
