"""What the hub accepts from the wire, checked before anything acts on it.

Each check returns problems as ``"<field path>: <what is wrong>; <what would be accepted>"``;
the server answers a message with any problem with INVALID_ARGUMENT carrying all of them, and
changes nothing. Bounds keep one message from costing the hub much (labels, pools, names).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.hub.arrivals import DistributionError
from federation.hub.convert import arrivals, run_time
from primitives import keys, names
from primitives.selectors import OPERATORS

#: Patterns end in \Z, not $: $ also matches before a final newline ("west\n").
_QUANTITY = re.compile(r"^[+]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?\Z")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")
_VERSION = re.compile(r"^v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?\Z")
_RESOURCE = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
MAX_LABELS = 64
MAX_POOLS = 1000
MAX_RESOURCES = 64
MAX_NAMES = 1000
MAX_COMMANDS = 10_000
MAX_PLAN_BYTES = 256 * 1024
#: Levels of JSON objects and arrays in a plan: a FaultPlan spec has at most 10; much deeper
#: JSON is past what a member can parse or serialise (Python's recursion limit).
MAX_PLAN_DEPTH = 32
MAX_START_DELAY = 3600
MAX_TEXT = 4096
MAX_ID = 256
#: The last second of year 9999, the end of protobuf's Timestamp (and of Python's datetime).
MAX_TIMESTAMP = 253_402_300_799


def cluster_name(value: str, field: str) -> list[str]:
    """A member's name in the fleet: ``[namespace/]name``."""
    if not names.is_member_name(value):
        return [f"{field}: {value[:80]!r} is not a member name; use {names.MEMBER_NAME_SYNTAX} "
                f"(e.g. west-1, west.eu or team-a/west-1)"]
    return []


def host(value: str, field: str) -> list[str]:
    return _text(value, field, 253)


def labels(values: Mapping[str, str], field: str) -> list[str]:
    if len(values) > MAX_LABELS:
        return [f"{field}: {len(values)} labels; at most {MAX_LABELS}"]
    problems = []
    for key, value in sorted(values.items()):
        if not names.is_qualified_name(key):
            problems.append(f"{field}[{key[:80]!r}]: not a label key; use [prefix/]name with "
                            f"name of at most 63 letters, digits, '-', '_' or '.'")
        if not names.is_label_value(value):
            problems.append(f"{field}[{key[:80]!r}]: {value[:80]!r} is not a label value; use "
                            f"at most 63 letters, digits, '-', '_' or '.', starting and ending "
                            f"with a letter or digit")
    return problems


def _text(value: str, field: str, limit: int = MAX_TEXT) -> list[str]:
    return [f"{field}: {len(value)} characters; at most {limit}"] if len(value) > limit else []


def traceparent(value: str, field: str = "traceparent") -> list[str]:
    if value and not _TRACEPARENT.match(value):
        return [f"{field}: {value[:80]!r} is not a W3C traceparent; use "
                f"00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, or leave it empty"]
    return []


def _quantities(values: Mapping[str, str], field: str) -> list[str]:
    if len(values) > MAX_RESOURCES:
        return [f"{field}: {len(values)} resources; at most {MAX_RESOURCES}"]
    problems = []
    for name, quantity in sorted(values.items()):
        if not _RESOURCE.match(name) or len(name) > 253:
            problems.append(f"{field}[{name[:80]!r}]: not a resource name (e.g. cpu, memory, "
                            f"nvidia.com/gpu)")
        if not _QUANTITY.match(quantity) or len(quantity) > 64:
            problems.append(f"{field}[{name[:80]!r}]: {quantity[:80]!r} is not a quantity "
                            f"(e.g. 8, 500m, 1Ti)")
    return problems


def _count(value: int, field: str) -> list[str]:
    return [f"{field}: {value} is negative; counts are 0 or more"] if value < 0 else []


def inventory(message: common_pb2.Inventory, field: str) -> list[str]:
    problems = []
    if len(message.pools) > MAX_POOLS:
        problems.append(f"{field}.pools: {len(message.pools)} pools; at most {MAX_POOLS}")
    for index, pool in enumerate(message.pools[:MAX_POOLS]):
        at = f"{field}.pools[{index}]"
        if not names.is_dns_subdomain(pool.name):
            problems.append(f"{at}.name: {pool.name[:80]!r} is not an object name (lowercase "
                            f"letters, digits, '-' and '.')")
        problems += _count(pool.ready, f"{at}.ready") + _count(pool.total, f"{at}.total")
        if pool.ready > pool.total:
            problems.append(f"{at}.ready: {pool.ready} is more than total {pool.total}")
        problems += _quantities(pool.allocatable, f"{at}.allocatable")
    problems += _count(message.nodes_ready, f"{field}.nodes_ready")
    problems += _count(message.nodes_total, f"{field}.nodes_total")
    if message.nodes_ready > message.nodes_total:
        problems.append(f"{field}.nodes_ready: {message.nodes_ready} is more than nodes_total "
                        f"{message.nodes_total}")
    problems += _quantities(message.allocatable, f"{field}.allocatable")
    for phase, count in sorted(message.pods_by_phase.items()):
        if phase not in PHASES:
            problems.append(f"{field}.pods_by_phase[{phase[:80]!r}]: not a pod phase; one of "
                            f"{', '.join(PHASES)}")
        problems += _count(count, f"{field}.pods_by_phase[{phase[:80]!r}]")
    return problems


def register(request: member_pb2.RegisterRequest) -> list[str]:
    if not request.HasField("cluster"):
        return ["cluster: missing; give the cluster's identity (namespace, name, host, "
                "labels, kubernetes_version, endpoint)"]
    cluster = request.cluster
    problems = []
    if not names.is_cluster_name(cluster.name):
        problems.append(f"cluster.name: {cluster.name[:80]!r} is not a FakeCluster name; use "
                        f"{names.CLUSTER_NAME_SYNTAX} (e.g. west-1 or west.eu)")
    if cluster.namespace and not names.is_dns_label(cluster.namespace):
        problems.append(f"cluster.namespace: {cluster.namespace[:80]!r} is not a namespace; use "
                        f"{names.DNS_LABEL_SYNTAX}, or leave it empty for default")
    problems += host(cluster.host, "cluster.host")
    problems += labels(cluster.labels, "cluster.labels")
    if cluster.kubernetes_version and not _VERSION.match(cluster.kubernetes_version):
        problems.append(f"cluster.kubernetes_version: {cluster.kubernetes_version[:80]!r} is "
                        f"not a release such as v1.36.3")
    if cluster.endpoint and not cluster.endpoint.startswith(("https://", "http://")):
        problems.append(f"cluster.endpoint: {cluster.endpoint[:80]!r} is not a URL; use "
                        f"https://host:port")
    problems += _text(cluster.endpoint, "cluster.endpoint", 2048)
    problems += inventory(request.capacity, "capacity")
    return problems + traceparent(request.traceparent)


def _timestamp(stamp: Timestamp, field: str) -> list[str]:
    if not (0 <= stamp.seconds <= MAX_TIMESTAMP and 0 <= stamp.nanos < 1_000_000_000):
        return [f"{field}: {stamp.seconds}s {stamp.nanos}ns; give a time from 1970 to the end "
                f"of 9999, or leave it unset"]
    return []


def _command_id(value: str, field: str) -> list[str]:
    if not value:
        return [f"{field}: missing; give the id of the command"]
    return _text(value, field, MAX_ID)


_PHASES = {member_pb2.COMMAND_PHASE_RUNNING, member_pb2.COMMAND_PHASE_SUCCEEDED,
           member_pb2.COMMAND_PHASE_FAILED, member_pb2.COMMAND_PHASE_REFUSED}


def result(message: member_pb2.CommandResult, field: str) -> list[str]:
    problems = _command_id(message.command_id, f"{field}.command_id")
    if message.phase not in _PHASES:
        problems.append(f"{field}.phase: {message.phase} is not a phase; use RUNNING, "
                        f"SUCCEEDED, FAILED or REFUSED")
    if message.verdict not in ("", "Passed", "Failed"):
        problems.append(f"{field}.verdict: {message.verdict[:80]!r}; use Passed, Failed or ''")
    problems += _text(message.steps_done, f"{field}.steps_done", 32)
    problems += _text(message.message, f"{field}.message")
    if message.HasField("job"):
        problems += _text(message.job.placed_on, f"{field}.job.placed_on", 253)
        problems += _count(message.job.redispatched, f"{field}.job.redispatched")
        for step in ("created_at", "admitted_at", "running_at", "finished_at", "released_at"):
            problems += _timestamp(getattr(message.job, step), f"{field}.job.{step}")
    return problems + _text(message.object, f"{field}.object", 512)


def member_message(message: member_pb2.MemberMessage, *, first: bool) -> list[str]:
    """A message of a Session; the first must be a Hello, and only the first."""
    kind = message.WhichOneof("kind")
    problems = traceparent(message.traceparent)
    if first and kind != "hello":
        return [f"kind: the first message of a session is a hello, not {kind or 'empty'}; "
                f"send Hello(cluster=..., commands=...) first", *problems]
    if not first and kind == "hello":
        return ["hello: a session says hello once; open a new session to say it again"]
    if kind is None:
        return ["kind: empty message; set one of hello, heartbeat, ack, result", *problems]
    if kind == "hello":
        problems += cluster_name(message.hello.cluster, "hello.cluster")
        if len(message.hello.commands) > MAX_COMMANDS:
            problems.append(f"hello.commands: {len(message.hello.commands)} reports; at most "
                            f"{MAX_COMMANDS}")
        for index, report in enumerate(message.hello.commands[:MAX_COMMANDS]):
            problems += result(report, f"hello.commands[{index}]")
    elif kind == "heartbeat":
        if message.heartbeat.HasField("inventory"):
            problems += inventory(message.heartbeat.inventory, "heartbeat.inventory")
    elif kind == "ack":
        problems += _command_id(message.ack.command_id, "ack.command_id")
    else:
        problems += result(message.result, "result")
    return problems


def selector(message: common_pb2.ClusterSelector, field: str) -> list[str]:
    problems = []
    if len(message.names) > MAX_NAMES:
        problems.append(f"{field}.names: {len(message.names)} names; at most {MAX_NAMES}")
    for index, name in enumerate(message.names[:MAX_NAMES]):
        problems += cluster_name(name, f"{field}.names[{index}]")
    problems += labels(message.match_labels, f"{field}.match_labels")
    if len(message.match_expressions) > MAX_LABELS:
        problems.append(f"{field}.match_expressions: at most {MAX_LABELS}")
    for index, requirement in enumerate(message.match_expressions[:MAX_LABELS]):
        at = f"{field}.match_expressions[{index}]"
        if not names.is_qualified_name(requirement.key):
            problems.append(f"{at}.key: {requirement.key[:80]!r} is not a label key")
        if requirement.operator not in OPERATORS:
            problems.append(f"{at}.operator: {requirement.operator[:80]!r}; use one of "
                            f"{', '.join(OPERATORS)}")
        elif requirement.operator in ("In", "NotIn") and not requirement.values:
            problems.append(f"{at}.values: {requirement.operator} needs at least one value")
        elif requirement.operator in ("Exists", "DoesNotExist") and requirement.values:
            problems.append(f"{at}.values: {requirement.operator} takes no values; remove them")
        for position, value in enumerate(requirement.values[:MAX_LABELS]):
            if not (value and names.is_label_value(value)):
                problems.append(f"{at}.values[{position}]: {value[:80]!r} is not a label value")
    return problems


def _depth(value: object) -> int:
    """Levels of JSON objects and arrays in ``value`` (counted without recursion)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in children)
    return deepest


def plan(text: str, field: str = "plan") -> list[str]:
    """The hub does not interpret a plan (its members' API servers validate it fully); it only
    makes sure it is a FaultPlan spec in shape."""
    if len(text.encode()) > MAX_PLAN_BYTES:
        return [f"{field}: {len(text.encode())} bytes; at most {MAX_PLAN_BYTES}"]
    if not text:
        return [f"{field}: missing; give a FaultPlan spec as JSON ({{\"steps\": [...]}})"]
    too_deep = f"a FaultPlan spec is at most {MAX_PLAN_DEPTH} levels of objects and arrays deep"
    try:
        spec = json.loads(text)
    except RecursionError:
        return [f"{field}: JSON nested too deeply to read; {too_deep}"]
    except ValueError as error:
        return [f"{field}: not JSON ({error}); give a FaultPlan spec as JSON"]
    if (depth := _depth(spec)) > MAX_PLAN_DEPTH:
        return [f"{field}: JSON nested {depth} levels deep; {too_deep}"]
    if not isinstance(spec, dict):
        return [f"{field}: a JSON {type(spec).__name__}; give a FaultPlan spec, a JSON object "
                f"with steps"]
    steps = spec.get("steps")
    if not isinstance(steps, list) or not steps:
        return [f"{field}.steps: missing or empty; a FaultPlan spec has at least one step"]
    for forbidden in ("startAt", "clusters"):
        if forbidden in spec:
            return [f"{field}.{forbidden}: set by the hub for each member (start time and "
                    f"cluster); remove it from the plan"]
    return []


def start_delay(delay: Duration) -> list[str]:
    if delay.seconds < 0 or delay.nanos < 0 or delay.nanos >= 1_000_000_000 \
            or delay.seconds > MAX_START_DELAY:
        return [f"start_delay: {delay.seconds}s {delay.nanos}ns; use 0 to {MAX_START_DELAY}s"]
    return []


def run_plan(request: fleet_pb2.RunPlanRequest) -> list[str]:
    problems = plan(request.plan)
    problems += selector(request.clusters, "clusters")
    problems += start_delay(request.start_delay)
    if request.name and not names.is_dns_subdomain(request.name):
        problems.append(f"name: {request.name[:80]!r}; use lowercase letters, digits, '-' and "
                        f"'.' (at most 253)")
    return problems + traceparent(request.traceparent)


def run_id(value: str, field: str = "run_id") -> list[str]:
    if not value:
        return [f"{field}: missing; give a run id (fakefleet fleet runs lists them)"]
    return _text(value, field, 64)




MAX_JOBS = 100_000
MAX_PODS_PER_JOB = 1000
MAX_ATTEMPTS = 10
_PLACEMENTS = ("spread", "binpack", "weighted", "clusters", "manager")
_PROCESSES = ("rate", "poisson", "times")
_DISTRIBUTIONS = ("fixed", "uniform", "lognormal")


def _bounded(value: int, low: int, high: int, field: str, example: str) -> list[str]:
    if not low <= value <= high:
        return [f"{field}: {value}; give {low} to {high} (e.g. {example})"]
    return []


def workload_spec(spec: fleet_pb2.WorkloadSpec, field: str = "spec") -> list[str]:
    """Shape and bounds of a workload; whether its targets exist is the hub's to say."""
    problems = _bounded(spec.jobs, 1, MAX_JOBS, f"{field}.jobs", "50")
    problems += _bounded(spec.pods_per_job, 1, MAX_PODS_PER_JOB, f"{field}.pods_per_job", "8")
    problems += _bounded(spec.max_attempts, 0, MAX_ATTEMPTS, f"{field}.max_attempts", "3")
    problems += _quantities(spec.resources, f"{field}.resources")
    gpus = spec.resources.get("nvidia.com/gpu")
    if gpus is not None and not (gpus.isdigit() and len(gpus) <= 6):
        problems.append(f"{field}.resources[nvidia.com/gpu]: {gpus[:40]!r}; GPUs are whole: "
                        f"give a count such as \"8\"")
    problems += labels(spec.labels, f"{field}.labels")
    if keys.WORKLOAD in spec.labels:
        problems.append(f"{field}.labels[{keys.WORKLOAD}]: set by the hub; remove it")
    if spec.namespace and not names.is_dns_label(spec.namespace):
        problems.append(f"{field}.namespace: {spec.namespace[:80]!r} is not a namespace name; "
                        f"use a DNS label (e.g. default)")
    if spec.priority_class and not names.is_dns_subdomain(spec.priority_class):
        problems.append(f"{field}.priority_class: {spec.priority_class[:80]!r} is not a "
                        f"PriorityClass name; use lowercase letters, digits, '-' and '.'")
    if spec.arrivals.process not in _PROCESSES:
        problems.append(f"{field}.arrivals.process: {spec.arrivals.process[:40]!r}; use "
                        f"{', '.join(_PROCESSES)}")
    elif spec.jobs <= MAX_JOBS:
        try:
            arrivals(spec.arrivals).check(spec.jobs)
        except DistributionError as error:
            problems.append(f"{field}.{error}")
    if spec.run_time.distribution not in _DISTRIBUTIONS:
        problems.append(f"{field}.run_time.distribution: {spec.run_time.distribution[:40]!r}; "
                        f"use {', '.join(_DISTRIBUTIONS)}")
    else:
        try:
            run_time(spec.run_time).check()
        except DistributionError as error:
            problems.append(f"{field}.{str(error).replace('runTime.', 'run_time.')}")
    return problems + _target(spec.target, f"{field}.target")


def _target(target: fleet_pb2.WorkloadTarget, field: str) -> list[str]:
    problems = selector(target.clusters, f"{field}.clusters")
    placement = target.placement
    if placement not in _PLACEMENTS:
        return [*problems,
                f"{field}.placement: {placement[:40]!r}; use {', '.join(_PLACEMENTS)}"]
    if placement == "manager":
        if not target.manager:
            problems.append(f"{field}.manager: missing; placement manager names the member "
                            f"whose scheduler (Kueue MultiKueue) places the Jobs")
        else:
            problems += cluster_name(target.manager, f"{field}.manager")
        if not target.queue:
            problems.append(f"{field}.queue: missing; name the manager's LocalQueue (label "
                            f"kueue.x-k8s.io/queue-name) that takes the Jobs")
    elif target.manager:
        problems.append(f"{field}.manager: only for placement manager; remove it")
    if target.queue and not names.is_dns_subdomain(target.queue):
        problems.append(f"{field}.queue: {target.queue[:80]!r} is not a LocalQueue name")
    if placement == "clusters" and not target.clusters.names:
        problems.append(f"{field}.clusters.names: placement clusters takes turns among named "
                        f"clusters; name at least one")
    if target.weights and placement != "weighted":
        problems.append(f"{field}.weights: only for placement weighted; remove them")
    for name, weight in sorted(target.weights.items()):
        problems += cluster_name(name, f"{field}.weights[{name[:40]}]")
        if not (weight >= 0 and weight < 1e9):
            problems.append(f"{field}.weights[{name[:40]}]: {weight!r}; give 0 or more")
    return problems


def submit_workload(request: fleet_pb2.SubmitWorkloadRequest) -> list[str]:
    problems = workload_spec(request.spec)
    problems += start_delay(request.start_delay)
    problems += _text(request.name, "name", 253)
    return problems + traceparent(request.traceparent)


def workload_id(value: str, field: str = "workload_id") -> list[str]:
    if not value:
        return [f"{field}: missing; give a workload id (fakefleet fleet workloads lists them)"]
    return _text(value, field, 64)
