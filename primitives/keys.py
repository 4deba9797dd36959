"""Every key fakefleet writes into Kubernetes objects under its own name, spelled once.

The operator, the engine, the hub link and the hub read and write these on both sides of the
wire (a hub's workload labels its Jobs, a member's engine reads the run time the hub put on
them), so they are constants here and nowhere else. Each says who writes it and who reads it.
"""

from __future__ import annotations

#: The API group of fakefleet's kinds, and the prefix of every key below.
GROUP = "fakefleet.dev"

# -- on FakeClusters, FakeNodePools and FaultPlans ---------------------------------------------

#: The operator's finalizer on the three kinds.
FINALIZER = f"{GROUP}/finalizer"
#: The W3C traceparent an object carries (a FaultPlan the hub link made, a FakeCluster, the
#: objects a fault touched), so that what acts on it later joins its trace.
TRACEPARENT = f"{GROUP}/traceparent"
#: A FakeCluster's fault entries (control-plane and hub-link faults): JSON, written by the
#: FaultPlan runner, read by the operator, the cluster's engine and its hub link.
FAULTS = f"{GROUP}/faults"
#: The label of a fault set (a ConfigMap in a member's ``fakefleet-system``) that carries a
#: node or pod fault to its targets: a digest of the occurrence's entry id, shared by its
#: chunks. Written by the FaultPlan runner, read by the member's engine.
FAULT_SET = f"{GROUP}/fault-set"
#: A pool's node names a Delete fault holds (JSON ``{"<entry id>": ["<node>", ...]}``).
HELD_NODES = f"{GROUP}/held-nodes"
#: On a FaultPlan the hub link made: the fleet run it belongs to, and the command that made it.
FLEET_RUN = f"{GROUP}/fleet-run"
FLEET_COMMAND = f"{GROUP}/fleet-command"

# -- on objects fakefleet writes by name ---------------------------------------------------------

#: Who made an object that fakefleet writes by name: ``<Kind>/<name>`` of the writer
#: (``FakeCluster/west`` on its kubeconfig Secret, ``FaultPlan/p`` on its list of victims,
#: ``Addon/kueue`` on Kueue's objects in a member). fakefleet replaces or deletes such an object
#: only while it carries its own writer here (or what fakefleet put on it before this key
#: existed); one it did not make, it leaves as it is and says so.
OWNED_BY = f"{GROUP}/owned-by"

# -- on the members' nodes -----------------------------------------------------------------------

#: The FakeCluster a node belongs to; objects made for a FakeCluster (its kubeconfig Secret)
#: carry the cluster's name here too. A label value, so a cluster's name has at most 63
#: characters.
CLUSTER = f"{GROUP}/cluster"
#: Every fake node carries the name of its pool here; the engine lists its nodes by it, and the
#: pool's scale selector uses it.
POOL = f"{GROUP}/pool"
#: The rack a node stands in (``spec.topology.racksPerZone``).
RACK = f"{GROUP}/rack"
#: What the pool's template gave the node: a hash of it, and the keys it set (JSON), so a
#: changed template removes what it no longer gives and leaves what others added.
TEMPLATE_HASH = f"{GROUP}/template-hash"
TEMPLATE_KEYS = f"{GROUP}/template-keys"
#: A node's state by hand (``NotReady``, ``Unreachable``): read by the default node stages.
STATE = f"{GROUP}/state"
#: The taint a GPU that needs a reset or a drain puts on its node (a GPU Xid fault). NoExecute:
#: pods that do not tolerate it are evicted by the node-lifecycle controller, as after a drain.
GPU_XID = f"{GROUP}/gpu-xid"
#: On a ResourceSlice: the digest of the devices the engine last published in it.
SLICE_DIGEST = f"{GROUP}/slice-digest"

# -- on pods (annotations a user or the hub link sets, the engine reads) ------------------------

RUN_TIME = f"{GROUP}/run-time"
EXIT_CODE = f"{GROUP}/exit-code"
START_DELAY = f"{GROUP}/start-delay"
SEED = f"{GROUP}/seed"
#: The recorded lives a controller's pods take, one each in the order the engine takes them:
#: the name of a ConfigMap in the member's ``fakefleet-system``
#: (:mod:`operators.api.lives`). Set on a replayed workload's pod template by
#: ``fakefleet replay``, read by the engine.
LIVES = f"{GROUP}/lives"
USAGE_CPU = f"{GROUP}/usage-cpu"
USAGE_MEMORY = f"{GROUP}/usage-memory"
USAGE_GPU_UTIL = f"{GROUP}/usage-gpu-util"
USAGE_GPU_MEMORY = f"{GROUP}/usage-gpu-memory"
#: The prefix of a pod's application metrics: ``fakefleet.dev/metric.<name>: <profile>``, served
#: by the engine in Prometheus' text format (:mod:`operators.api.appmetrics`).
METRIC_PREFIX = f"{GROUP}/metric."
#: What ``kubectl logs`` shows of the pod's containers: one log script (JSON or YAML, the
#: schema of :class:`operators.api.logs.LogLines`), before the stages' ``logs`` section.
LOGS = f"{GROUP}/logs"
#: What commands exec'd into the pod's containers print and exit with, and what its forwarded
#: ports answer: a list in the schema of the Lifecycle's ``exec`` and ``portForward``
#: (JSON), matched before the stages' (:mod:`operators.engine.scripting`).
EXEC = f"{GROUP}/exec"
PORT_FORWARD = f"{GROUP}/port-forward"

# -- on Jobs the hub link creates for a fleet workload --------------------------------------------

#: The hub's workload id, set by the hub on every Job; a workload cannot set it.
WORKLOAD = f"{GROUP}/workload"

# -- on FakeClusters a snapshot is restored into --------------------------------------------------
# Under their own prefix: kopf leaves every annotation under the operator's prefix
# (``fakefleet.dev/``) out of the changes it reacts to, and the operator must react to these at
# once rather than on its next timer.

#: A restore in progress (JSON ``{"id": "...", "run": ["kube-apiserver", "engine"]}``): the
#: member runs only what ``run`` names, everything else of it stays stopped. Written by
#: ``fakefleet snapshot restore``, read by the operator.
RESTORE = f"snapshots.{GROUP}/restore"
#: The hold the operator has carried out (the ``token`` of :data:`RESTORE`'s value): the restore
#: waits for it before it touches etcd. Removed by the operator once the hold is released.
RESTORE_HELD = f"snapshots.{GROUP}/restore-held"
