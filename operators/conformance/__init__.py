"""AI-conformance rehearsal: one automated check per requirement of the Kubernetes AI
Conformance checklist on a simulated GPU cluster, and the files the program expects
(PRODUCT.yaml, junit.xml, evidence) written from their results.

A rehearsal on simulated hardware, not a certification: what simulation cannot honestly judge
is reported N/A or Not Implemented with notes that say why, never Implemented.

    checklists   the upstream checklists as data, by version (pure)
    results      what a check found: status, evidence, notes, time (pure)
    reporting    PRODUCT.yaml, junit.xml and the table from the results (pure, and one writer)
    validating   the offline subset of upstream's validator, and what the file fails by design
    checking     what a check is given: the member, its FakeCluster, evidence, a deadline
    checks       one module per automated requirement
    running      every check of a checklist, each within its deadline; again under faults
    faulting     the FaultPlan each check runs under with --under-faults (pure)
"""
