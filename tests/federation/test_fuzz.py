"""The hub's wire API under fuzzing: whatever a client sends, each call ends OK or with a status
that means something to it (never INTERNAL or UNKNOWN), the hub logs no error, it holds nothing
it should have refused (names and labels that break Kubernetes' rules), and it serves on.

Requests are built from the protobuf descriptors, so every field of every request type is
reached: strings (empty, unicode, huge, and values near the valid ones), integers at their
bounds, nested messages, repeated fields, maps and oneofs. Near-valid requests start from a
valid one and change a single field, or nudge one of its strings, to get past the first checks
to the deeper ones. One hub serves the whole test, in an event loop of this module's own; each
example first registers two members, starts a run and submits a workload (named in requests
as :data:`KNOWN_RUN` and :data:`KNOWN_WORKLOAD`), and ends by cancelling every running
workload and taking every member out again, so that its runs finish and the next example
starts from the same fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from federation.api import common_pb2, fleet_pb2, fleet_pb2_grpc, member_pb2, member_pb2_grpc
from federation.client import tokens
from federation.client.channels import bearer, open_channel
from federation.hub import store, validation
from primitives import names
from tests.federation.hubs import RunningHub, running_hub

Code = grpc.StatusCode
ALLOWED = frozenset({
    Code.OK, Code.INVALID_ARGUMENT, Code.PERMISSION_DENIED, Code.UNAUTHENTICATED,
    Code.NOT_FOUND, Code.FAILED_PRECONDITION, Code.ALREADY_EXISTS, Code.RESOURCE_EXHAUSTED,
    Code.DEADLINE_EXCEEDED})
#: Each call's deadline; a hub that hangs on a request shows up as DEADLINE_EXCEEDED in time.
TIMEOUT = 5.0
MEMBERS = ("fuzz-a", "fuzz-b")
#: Stands for the id of the run each example starts (substituted in every string field).
KNOWN_RUN = "r-known"
KNOWN_WORKLOAD = "w-known"
PLAN = json.dumps({"steps": [{"name": "xid", "target": {}, "fault": {"type": "GPUXid",
                                                                     "xid": 79}}]})
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
MAX_DEPTH = 4

# -- generic strategies from the descriptors ---------------------------------------------------

#: Values next to the valid ones (and the valid ones), for fields whose checks look at shapes.
NEAR = [
    "", " ", "fuzz-a", "fuzz-b", "fuzz-a\n", "Fuzz-A", "-a", "a-", "a" * 63, "a" * 64,
    "a.b", "a/b", "/a", "a/", "example.com/gpu", "nvidia.com/gpu", "8", "-1", "1.5", "1e3",
    "500m", "1Ti", "8x", "+8", "In", "NotIn", "Exists", "DoesNotExist", "Near", "Running",
    "Pending", "Unknown", "Passed", "Failed", "v1.36.3", "v1.36.3+k3s1", "1.36.3",
    "https://127.0.0.1:6443", "ftp://x", TRACEPARENT, TRACEPARENT.upper(), "00-00-00-00",
    f"{KNOWN_RUN}/fuzz-a/start", f"{KNOWN_RUN}/fuzz-b/start", f"{KNOWN_RUN}/fuzz-a/stop",
    f"{KNOWN_RUN}/fuzz-a/other", f"{KNOWN_RUN}//start", "/fuzz-a/start", KNOWN_RUN,
    KNOWN_WORKLOAD, f"{KNOWN_WORKLOAD}/fuzz-a/job-0-1", f"{KNOWN_WORKLOAD}/fuzz-a/delete",
    "fixed", "lognormal", "poisson", "times", "spread", "manager",
    "r00000000", "\x00", "\u202e", "é", "😀", "\ufeff", "a\x00b", PLAN, "{}", "[]", "{",
    '{"steps": []}', '{"steps": [{}], "clusters": []}', '{"steps": [{}], "startAt": ""}',
    "NaN",
]

#: Huge strings: past every length limit (text 4096, plan 256 KiB), under the message limit.
_HUGE = st.integers(min_value=4000, max_value=300_000)
#: JSON nested up to and past the hub's limit (32) and a parser's recursion limit, in a plan
#: or where a plan is not.
_NESTINGS = [("[", "]"), ('{"a": ', "}"), ('{"steps": [', "]}")]
NESTED = st.tuples(st.sampled_from(_NESTINGS),
                   st.sampled_from([2, 32, 33, 999, 1000, 40_000, 100_000])
                   | st.integers(min_value=1, max_value=50_000)
                   ).map(lambda t: t[0][0] * t[1] + "0" + t[0][1] * t[1])
STRINGS = st.one_of(
    st.text(max_size=20), st.text(max_size=20), st.sampled_from(NEAR), st.sampled_from(NEAR),
    st.text(alphabet="abcxyz019-./_", max_size=70), NESTED,
    _HUGE.map(lambda n: "x" * n), _HUGE.map(lambda n: "é" * (n // 2)))
_INTS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({low, high, max(low, -1), 0, 1, min(high, 2**31 - 1)})
    return st.one_of(st.sampled_from(edges), st.integers(max(low, -10), 10),
                     st.integers(low, high))


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and \
        field.message_type.GetOptions().map_entry


def _scalar(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    if kind == FieldDescriptor.TYPE_STRING:
        return STRINGS
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if kind == FieldDescriptor.TYPE_ENUM:  # proto3 enums are open: any int32 is carried
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]),
                         _integers(-(2**31), 2**31 - 1))
    return _integers(*_INTS[kind])


def values(field: FieldDescriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """What ``field`` may hold: a value, a list (repeated) or a dict (map)."""
    if _is_map(field):
        entry = field.message_type
        return st.dictionaries(_scalar(entry.fields_by_name["key"], depth),
                               _scalar(entry.fields_by_name["value"], depth), max_size=5)
    if field.is_repeated:
        return st.lists(_scalar(field, depth), max_size=4)
    return _scalar(field, depth)


def assign(message: Message, field: FieldDescriptor, value: Any) -> None:
    message.ClearField(field.name)
    if _is_map(field):
        container = getattr(message, field.name)
        for key, item in value.items():
            if isinstance(item, Message):
                container[key].CopyFrom(item)
            else:
                container[key] = item
    elif field.is_repeated:
        getattr(message, field.name).extend(value)
    elif isinstance(value, Message):
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def _build(kind: type[Message], plain: dict[str, Any],
           chosen: tuple[tuple[str, Any] | None, ...]) -> Message:
    message = kind()
    fields = message.DESCRIPTOR.fields_by_name
    for name, value in [*plain.items(), *(c for c in chosen if c is not None)]:
        if value is not None:
            assign(message, fields[name], value)
    return message


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Any instance of the message type: each field unset or any value, at most one field of
    each oneof set."""
    kind = message_factory.GetMessageClass(descriptor)
    if depth > MAX_DEPTH:
        return st.just(kind())
    plain = {field.name: st.none() | values(field, depth) for field in descriptor.fields
             if field.containing_oneof is None}
    chosen = [st.none() | st.one_of([st.tuples(st.just(field.name), values(field, depth))
                                     for field in oneof.fields])
              for oneof in descriptor.oneofs]
    return st.builds(_build, st.just(kind), st.fixed_dictionaries(plain), st.tuples(*chosen))


def _paths(message: Message, at: tuple[str | int, ...] = ()
           ) -> Iterator[tuple[tuple[str | int, ...], FieldDescriptor]]:
    """Every field of ``message`` and of the messages set in it (to change one)."""
    for field in message.DESCRIPTOR.fields:
        yield at, field
        if _is_map(field) or field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.is_repeated:
            for index, item in enumerate(getattr(message, field.name)):
                yield from _paths(item, (*at, field.name, index))
        elif message.HasField(field.name):
            yield from _paths(getattr(message, field.name), (*at, field.name))


def _nudged(text: str) -> st.SearchStrategy[str]:
    """A valid string one step off: where a check's edges are."""
    return st.sampled_from([text + "\n", text + " ", " " + text, text + "\x00", text.upper(),
                            text + "-", "-" + text, text[:-1], text * 5, text + "é"])


@st.composite
def near_valid(draw: st.DrawFn, base: Message) -> Message:
    """``base`` (a valid request) with one field given any value, or one of its strings (a
    value, a map entry's key or value, a list's item) nudged off its valid value."""
    message = type(base)()
    message.CopyFrom(base)
    at, field = draw(st.sampled_from(list(_paths(message))))
    target: Any = message
    for step in at:
        target = target[step] if isinstance(step, int) else getattr(target, step)
    current = getattr(target, field.name)
    nudge = draw(st.booleans())
    if _is_map(field) and current and nudge and \
            field.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING:
        key = draw(st.sampled_from(sorted(current)))
        if draw(st.booleans()):
            current[key] = draw(_nudged(current[key]))
        else:
            current[draw(_nudged(key))] = current.pop(key)
    elif field.type == FieldDescriptor.TYPE_STRING and current and nudge:
        if field.is_repeated:
            index = draw(st.integers(0, len(current) - 1))
            current[index] = draw(_nudged(current[index]))
        else:
            setattr(target, field.name, draw(_nudged(current)))
    else:
        assign(target, field, draw(values(field, depth=2)))
    return message


def requests(base: Message) -> st.SearchStrategy[Message]:
    """Of ``base``'s type: itself, near it, or anything."""
    if not base.DESCRIPTOR.fields:
        return st.just(base)
    return st.one_of(st.just(base), near_valid(base), near_valid(base),
                     messages(base.DESCRIPTOR))


# -- valid requests, and what to send ----------------------------------------------------------

INVENTORY = common_pb2.Inventory(
    pools=[common_pb2.PoolInventory(name="gpu", ready=1, total=2,
                                    allocatable={"nvidia.com/gpu": "8", "memory": "1Ti"})],
    nodes_ready=1, nodes_total=2, allocatable={"nvidia.com/gpu": "8"},
    pods_by_phase={"Running": 3})
REGISTER = member_pb2.RegisterRequest(
    cluster=common_pb2.ClusterIdentity(name="fuzz-a", host="fuzz", labels={"gpu": "h100"},
                                       kubernetes_version="v1.36.3",
                                       endpoint="https://127.0.0.1:6443"),
    capacity=INVENTORY, traceparent=TRACEPARENT)
RESULT = member_pb2.CommandResult(command_id=f"{KNOWN_RUN}/fuzz-a/start",
                                  phase=member_pb2.COMMAND_PHASE_SUCCEEDED, verdict="Passed",
                                  steps_done="1/1", message="done", object="FaultPlan x/y")
HELLO = member_pb2.MemberMessage(hello=member_pb2.Hello(cluster="fuzz-a", commands=[RESULT]))
SESSION_MESSAGES = (
    member_pb2.MemberMessage(heartbeat=member_pb2.MemberHeartbeat(seq=1, hub_seq=1,
                                                                  inventory=INVENTORY)),
    member_pb2.MemberMessage(ack=member_pb2.CommandAck(command_id=f"{KNOWN_RUN}/fuzz-a/start")),
    member_pb2.MemberMessage(result=RESULT),
)
SELECTOR = common_pb2.ClusterSelector(
    names=["fuzz-a", "fuzz-b"], match_labels={"gpu": "h100"},
    match_expressions=[common_pb2.LabelRequirement(key="gpu", operator="In", values=["h100"])])
RUN_PLAN = fleet_pb2.RunPlanRequest(plan=PLAN, clusters=SELECTOR, name="fuzz",
                                    start_delay=Duration(seconds=1), traceparent=TRACEPARENT)
SUBMIT = fleet_pb2.SubmitWorkloadRequest(
    spec=fleet_pb2.WorkloadSpec(
        jobs=2, pods_per_job=1, resources={"nvidia.com/gpu": "8", "cpu": "1"},
        run_time=fleet_pb2.RunTimeDistribution(distribution="lognormal", seconds=60, sigma=1,
                                               cap=600),
        arrivals=fleet_pb2.ArrivalProcess(process="poisson", rate=1), seed=7,
        labels={"team": "ml"}, namespace="default", max_attempts=2,
        target=fleet_pb2.WorkloadTarget(placement="weighted", clusters=SELECTOR,
                                        weights={"fuzz-a": 2})),
    name="fuzz", start_delay=Duration(seconds=1), traceparent=TRACEPARENT)
#: Times of a workload's arrivals: also a list as long as its Jobs.
TIMES = st.lists(st.floats(), min_size=2, max_size=2)


def _changed(base: Message, **fields: Any) -> Message:
    message = type(base)()
    message.CopyFrom(base)
    for name, value in fields.items():
        assign(message, message.DESCRIPTOR.fields_by_name[name], value)
    return message


#: Plan texts: JSON of any shape, nested deep, or near a FaultPlan spec.
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["steps", "startAt", "clusters", "seed"])
                                       | st.text(max_size=5), inner, max_size=3),
                     max_leaves=10)
PLANS = st.one_of(
    st.just(PLAN), STRINGS, _JSON.map(json.dumps),
    st.lists(_JSON, min_size=1, max_size=3).map(lambda steps: json.dumps({"steps": steps})),
    NESTED, NESTED)  # twice: where parsers break is worth more tries

#: Who a call claims to be: "own" is the member token of the cluster the request names.
MEMBER_TOKENS = st.sampled_from(["own"] * 6 + ["fuzz-a", "fleet", "foreign", "junk", "none"])
FLEET_TOKENS = st.sampled_from(["fleet"] * 6 + ["fuzz-a", "foreign", "junk", "none"])


@dataclasses.dataclass
class Call:
    method: str
    request: Any  # a message, or the messages of a Session
    token: str


def _call(method: str, requests_: st.SearchStrategy[Any],
          token: st.SearchStrategy[str]) -> st.SearchStrategy[Call]:
    return st.builds(Call, st.just(method), requests_, token)


def _run_ids(kind: type[Message]) -> st.SearchStrategy[Message]:
    return requests(kind(run_id=KNOWN_RUN))  # type: ignore[call-arg]


CALLS = st.one_of(
    _call("Register", requests(REGISTER), MEMBER_TOKENS),
    _call("Deregister", requests(member_pb2.DeregisterRequest(cluster="fuzz-b")),
          MEMBER_TOKENS),
    _call("Session", st.one_of(
        st.tuples(requests(HELLO), st.lists(st.one_of(*map(requests, SESSION_MESSAGES)),
                                            max_size=4)).map(lambda t: [t[0], *t[1]]),
        st.lists(messages(member_pb2.MemberMessage.DESCRIPTOR), max_size=3)), MEMBER_TOKENS),
    _call("ListClusters", requests(fleet_pb2.ListClustersRequest(selector=SELECTOR)),
          FLEET_TOKENS),
    _call("WatchClusters", requests(fleet_pb2.WatchClustersRequest(selector=SELECTOR)),
          FLEET_TOKENS),
    _call("RunPlan", requests(RUN_PLAN), FLEET_TOKENS),
    _call("RunPlan", PLANS.map(lambda plan: fleet_pb2.RunPlanRequest(plan=plan,
                                                                     clusters=SELECTOR)),
          FLEET_TOKENS),
    _call("GetRun", _run_ids(fleet_pb2.GetRunRequest), FLEET_TOKENS),
    _call("WatchRun", _run_ids(fleet_pb2.WatchRunRequest), FLEET_TOKENS),
    _call("CancelRun", _run_ids(fleet_pb2.CancelRunRequest), FLEET_TOKENS),
    _call("ListRuns", requests(fleet_pb2.ListRunsRequest()), FLEET_TOKENS),
)
#: Workloads, and what members say of their Jobs (a test of their own, so that the calls
#: above keep their share of examples).
JOB_RESULT = member_pb2.CommandResult(
    command_id=f"{KNOWN_WORKLOAD}/fuzz-a/job-0-1", phase=member_pb2.COMMAND_PHASE_RUNNING,
    object="Job default/w-known-0", job=member_pb2.JobProgress(
        created_at=Timestamp(seconds=1_800_000_000), admitted_at=Timestamp(seconds=1_800_000_001),
        placed_on="fuzz-b", redispatched=1))
JOB_MESSAGES = (
    member_pb2.MemberMessage(result=JOB_RESULT),
    member_pb2.MemberMessage(ack=member_pb2.CommandAck(command_id=JOB_RESULT.command_id)),
    member_pb2.MemberMessage(ack=member_pb2.CommandAck(
        command_id=f"{KNOWN_WORKLOAD}/fuzz-a/delete")),
    member_pb2.MemberMessage(result=member_pb2.CommandResult(
        command_id=f"{KNOWN_WORKLOAD}/fuzz-a/delete", phase=member_pb2.COMMAND_PHASE_REFUSED,
        message="forbidden")),
)
WORKLOAD_CALLS = st.one_of(
    _call("Session", st.tuples(
        requests(member_pb2.MemberMessage(hello=member_pb2.Hello(cluster="fuzz-a",
                                                                 commands=[JOB_RESULT]))),
        st.lists(st.one_of(*map(requests, JOB_MESSAGES)), max_size=4)
    ).map(lambda t: [t[0], *t[1]]), MEMBER_TOKENS),
    _call("Deregister", requests(member_pb2.DeregisterRequest(cluster="fuzz-a")),
          MEMBER_TOKENS),
    _call("SubmitWorkload", requests(SUBMIT), FLEET_TOKENS),
    _call("SubmitWorkload", TIMES.map(lambda times: _changed(SUBMIT, spec=_changed(
        SUBMIT.spec, arrivals=fleet_pb2.ArrivalProcess(process="times", times=times)))),
          FLEET_TOKENS),
    _call("GetWorkload", requests(fleet_pb2.GetWorkloadRequest(workload_id=KNOWN_WORKLOAD,
                                                               jobs=True)), FLEET_TOKENS),
    _call("WatchWorkload", requests(fleet_pb2.WatchWorkloadRequest(
        workload_id=KNOWN_WORKLOAD)), FLEET_TOKENS),
    _call("CancelWorkload", requests(fleet_pb2.CancelWorkloadRequest(
        workload_id=KNOWN_WORKLOAD)), FLEET_TOKENS),
    _call("ListWorkloads", requests(fleet_pb2.ListWorkloadsRequest()), FLEET_TOKENS),
)


# -- what the hub may hold --------------------------------------------------------------------

#: Kubernetes' rules, written out here apart from the hub's own checks.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_LABEL_VALUE = re.compile(rf"({_NAME})?")
_VERSION = re.compile(r"(v[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?)?")


def _labels(labels: Any, at: str) -> list[str]:
    return [f"{at}[{key!r}] = {value!r}" for key, value in labels.items()
            if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value)]


def _selector(selector: common_pb2.ClusterSelector, at: str) -> list[str]:
    wrong = [f"{at}.names: {name!r}" for name in selector.names if not _DNS_LABEL.fullmatch(name)]
    wrong += _labels(selector.match_labels, f"{at}.match_labels")
    for requirement in selector.match_expressions:
        if not _LABEL_KEY.fullmatch(requirement.key):
            wrong.append(f"{at}.match_expressions: key {requirement.key!r}")
        wrong += [f"{at}.match_expressions[{requirement.key!r}]: {value!r}"
                  for value in requirement.values if not _LABEL_VALUE.fullmatch(value)]
    return wrong


def malformed(members: list[common_pb2.Member], runs: list[fleet_pb2.Run]) -> list[str]:
    """What the hub holds that it should have refused: names and labels that break
    Kubernetes' rules (members' labels and runs' selectors go on to select FakeClusters)."""
    wrong = []
    for member in members:
        cluster = member.cluster
        if not _DNS_LABEL.fullmatch(cluster.name):
            wrong.append(f"member name {cluster.name!r}")
        if not _VERSION.fullmatch(cluster.kubernetes_version):
            wrong.append(f"{cluster.name}: kubernetes_version {cluster.kubernetes_version!r}")
        wrong += _labels(cluster.labels, f"{cluster.name}: labels")
    for run in runs:
        if run.name and not _DNS_SUBDOMAIN.fullmatch(run.name):
            wrong.append(f"run {run.id}: name {run.name!r}")
        wrong += _selector(run.clusters, f"run {run.id}: clusters")
    return wrong


# -- the hub under test ------------------------------------------------------------------------

def substitute(message: Message, old: str, new: str) -> None:
    """Replace ``old`` with ``new`` in every string (map keys aside) of ``message``."""
    for field, value in message.ListFields():
        if _is_map(field):
            inner = field.message_type.fields_by_name["value"]
            if inner.type == FieldDescriptor.TYPE_STRING:
                for key in list(value):
                    value[key] = value[key].replace(old, new)
            elif inner.type == FieldDescriptor.TYPE_MESSAGE:
                for item in value.values():
                    substitute(item, old, new)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                substitute(item, old, new)
        elif field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                value[:] = [item.replace(old, new) for item in value]
            else:
                setattr(message, field.name, value.replace(old, new))


class Errors(logging.Handler):
    """Error records (a hub failure, a task that died unseen) kept for the test to see."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclasses.dataclass
class Fuzzed:
    runner: asyncio.Runner
    hub: RunningHub
    channel: grpc.aio.Channel
    errors: Errors
    foreign_key: bytes = dataclasses.field(default_factory=tokens.new_key)

    @property
    def members(self) -> member_pb2_grpc.MemberServiceStub:
        return member_pb2_grpc.MemberServiceStub(self.channel)

    @property
    def fleet(self) -> fleet_pb2_grpc.FleetServiceStub:
        return fleet_pb2_grpc.FleetServiceStub(self.channel)

    def metadata(self, token: str, claimed: str) -> tuple[tuple[str, str], ...]:
        if token == "none":
            return ()
        if token == "own":
            printable = claimed and all(" " < char <= "~" for char in claimed)
            return bearer(self.hub.member_token(claimed if printable else "fuzz-a"))
        return bearer({"fuzz-a": self.hub.member_token("fuzz-a"),
                       "fleet": self.hub.fleet_token,
                       "foreign": tokens.member_token(self.foreign_key, "fuzz-a"),
                       "junk": "fm1..x"}[token])


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    """One hub, in an event loop of this module's own (each example runs in it).

    Its store writes unpaced: pacing (:data:`federation.hub.store.PACE`, tested in
    tests/federation/test_hub_store.py) spaces writes by four times the state's encoding, so
    that a busy hub with much state goes on serving; here every example waits in turn for about
    eight commits of a state that grows to some 300 KB (the finished runs and workloads the
    examples leave), and pacing was two thirds of this module's time."""
    errors = Errors()
    loggers = [logging.getLogger(name) for name in ("federation", "asyncio", "grpc")]
    for logger in loggers:
        logger.addHandler(errors)
    with pytest.MonkeyPatch.context() as patch, \
            asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        patch.setattr(store, "PACE", 0)
        stack = contextlib.AsyncExitStack()
        hub = runner.run(stack.enter_async_context(running_hub(tmp_path_factory.mktemp("hub"))))
        channel = runner.run(_open(hub))
        stack.push_async_callback(channel.close)
        try:
            yield Fuzzed(runner=runner, hub=hub, channel=channel, errors=errors)
        finally:
            errors.records.clear()  # each example checked its own: these are the hub's last
            runner.run(stack.aclose())
            leftover = runner.run(_others())
            for logger in loggers:
                logger.removeHandler(errors)
    assert leftover == [], "tasks left running after the hub stopped"
    assert errors.records == []


async def _open(hub: RunningHub) -> grpc.aio.Channel:
    return open_channel(hub.address)  # in the loop it is used in


async def _others() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]


def _claimed(call: Call) -> str:
    if call.method == "Register":
        return names.member_name(call.request.cluster.namespace, call.request.cluster.name)
    if call.method == "Deregister":
        return str(call.request.cluster)
    if call.method == "Session" and call.request:
        return str(call.request[0].hello.cluster)
    return ""


@dataclasses.dataclass(frozen=True)
class Answer:
    method: str
    code: Code
    details: str
    #: The client lost the hub's status (see :func:`_lost`): the hub's logs tell the rest.
    lost: bool = False


def _lost(error: grpc.aio.AioRpcError) -> bool:
    """grpc's client, not the hub: when a server ends a bidirectional call (a refusal) while
    the client still writes, the client may fail its own send and put INTERNAL "Internal error
    from Core" in place of the status the server sent. Measured here: 4 of 5 sessions refused
    at once lose their code when the client writes 4 messages. A hub's own INTERNAL comes with
    its message and an error in its log, which the test checks apart."""
    return error.code() == Code.INTERNAL and error.details() == "Internal error from Core" \
        and 'Failed "execute_batch"' in (error.debug_error_string() or "")


async def _send(fuzzed: Fuzzed, call: Call) -> Answer:
    metadata = fuzzed.metadata(call.token, _claimed(call))
    stub: Any = fuzzed.members if call.method in ("Register", "Deregister", "Session") \
        else fuzzed.fleet
    method = getattr(stub, call.method)
    try:
        if call.method == "Session":
            session = method(metadata=metadata, timeout=TIMEOUT)
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                for message in call.request:  # until the hub ends the call (its code says why)
                    if session.done():
                        break
                    await session.write(message)
                if not session.done():
                    await session.done_writing()
            async for _ in session:
                pass
        elif call.method in ("WatchClusters", "WatchRun", "WatchWorkload"):
            stream = method(call.request, metadata=metadata, timeout=TIMEOUT)
            try:
                await stream.read()  # the first event, or the refusal
            finally:
                stream.cancel()
        else:
            await method(call.request, metadata=metadata, timeout=TIMEOUT)
    except grpc.aio.AioRpcError as error:
        return Answer(call.method, error.code(), error.details() or "", _lost(error))
    return Answer(call.method, Code.OK, "")


async def _example(fuzzed: Fuzzed, calls: list[Call], *, workload: bool = False
                   ) -> list[Answer]:
    """Send ``calls`` after two members joined and a run started (and a workload was
    submitted, if ``workload``); then check what the hub holds, and cancel every running
    workload and take every member out again (so that examples do not see each other's)."""
    hub = fuzzed.hub
    fleet = bearer(hub.fleet_token)
    fuzzed.errors.records.clear()
    for name in MEMBERS:
        register = member_pb2.RegisterRequest()
        register.CopyFrom(REGISTER)
        register.cluster.name = name
        await fuzzed.members.Register(register, metadata=bearer(hub.member_token(name)),
                                      timeout=TIMEOUT)
    run = await fuzzed.fleet.RunPlan(fleet_pb2.RunPlanRequest(plan=PLAN, clusters=SELECTOR),
                                     metadata=fleet, timeout=TIMEOUT)
    known = (await fuzzed.fleet.SubmitWorkload(SUBMIT, metadata=fleet, timeout=TIMEOUT)).id \
        if workload else KNOWN_WORKLOAD
    before = {r.id for r in (await fuzzed.fleet.ListRuns(fleet_pb2.ListRunsRequest(),
                                                         metadata=fleet, timeout=TIMEOUT)).runs}
    answers = []
    for call in calls:
        sent = Call(call.method, copy.deepcopy(call.request), call.token)
        for request in sent.request if isinstance(sent.request, list) else [sent.request]:
            substitute(request, KNOWN_RUN, run.run.id)
            substitute(request, KNOWN_WORKLOAD, known)
        answers.append(await _send(fuzzed, sent))
    # The hub serves on, and holds nothing it should have refused.
    health: Any = health_pb2_grpc.HealthStub(fuzzed.channel)
    checked = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
    assert checked.status == health_pb2.HealthCheckResponse.SERVING
    members = list((await fuzzed.fleet.ListClusters(fleet_pb2.ListClustersRequest(),
                                                    metadata=fleet, timeout=TIMEOUT)).members)
    try:
        runs = (await fuzzed.fleet.ListRuns(fleet_pb2.ListRunsRequest(), metadata=fleet,
                                            timeout=TIMEOUT)).runs
        assert malformed(members, [r for r in runs if r.id not in before]) == []
    finally:
        # Every workload is cancelled and every member leaves: their runs finish (and the
        # oldest finished are forgotten).
        listed = await fuzzed.fleet.ListWorkloads(fleet_pb2.ListWorkloadsRequest(),
                                                  metadata=fleet, timeout=TIMEOUT) \
            if workload else fleet_pb2.ListWorkloadsResponse()
        for running in listed.workloads:
            if running.phase == fleet_pb2.WORKLOAD_PHASE_RUNNING:
                await fuzzed.fleet.CancelWorkload(
                    fleet_pb2.CancelWorkloadRequest(workload_id=running.id), metadata=fleet,
                    timeout=TIMEOUT)
        for member in members:
            name = names.member_name(member.cluster.namespace, member.cluster.name)
            await fuzzed.members.Deregister(
                member_pb2.DeregisterRequest(cluster=name, host=member.cluster.host),
                metadata=bearer(hub.member_token(name)), timeout=TIMEOUT)
    return answers


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(calls=st.lists(CALLS, min_size=1, max_size=4))
# Found by this test: a plan nested past the parser's recursion limit (which Hypothesis raises
# while it runs a test: hence so deep) made the hub answer INTERNAL with a RecursionError.
@example(calls=[Call("RunPlan", fleet_pb2.RunPlanRequest(plan="[" * 100_000), "fleet")])
# Found by this test: names and labels with a newline at the end were accepted and kept (the
# checks' patterns ended in $, which matches before a final newline).
@example(calls=[Call("RunPlan", _changed(RUN_PLAN, name="fuzz\n"), "fleet")])
@example(calls=[Call("Register", _changed(REGISTER, cluster=common_pb2.ClusterIdentity(
    name="fuzz-a", labels={"gpu": "h100\n"})), "own")])
# Found by this test: a token over gRPC's metadata limit ends a stream before its handler has
# answered; the hub took its failed answer for a defect of its own and logged two errors.
@example(calls=[Call("Session", [member_pb2.MemberMessage(hello=member_pb2.Hello(
    cluster="x" * 16_297))], "own")])
def test_every_request_ends_ok_or_with_a_status_that_means_something(
        fuzzed: Fuzzed, calls: list[Call]) -> None:
    _judge(fuzzed, fuzzed.runner.run(_example(fuzzed, calls)))


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(calls=st.lists(WORKLOAD_CALLS, min_size=1, max_size=4))
# Found in use (issue 25): a run time of 1e300 was taken, and the dispatcher, failing on it at
# every round, moved no workload on.
@example(calls=[Call("SubmitWorkload", _changed(SUBMIT, spec=_changed(
    SUBMIT.spec, run_time=fleet_pb2.RunTimeDistribution(distribution="fixed", seconds=1e300))),
    "fleet")])
def test_every_workload_request_ends_ok_or_with_a_status_that_means_something(
        fuzzed: Fuzzed, calls: list[Call]) -> None:
    _judge(fuzzed, fuzzed.runner.run(_example(fuzzed, calls, workload=True)))


def _judge(fuzzed: Fuzzed, answers: list[Answer]) -> None:
    for answer in answers:
        event(f"{answer.method}: {'lost' if answer.lost else answer.code.name}")
    unexpected = [answer for answer in answers if answer.code not in ALLOWED and not answer.lost]
    assert unexpected == []
    assert fuzzed.errors.records == []


async def test_a_refused_token_is_named_briefly(tmp_path: Path) -> None:
    """Found by the fuzz test: the hub sent a refused token's cluster name back whole, and an
    answer over the client's metadata limit reaches it as RESOURCE_EXHAUSTED instead."""
    async with running_hub(tmp_path) as hub:
        channel = open_channel(hub.address)
        token = tokens.member_token(tokens.new_key(), "x" * 6000)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await member_pb2_grpc.MemberServiceStub(channel).Register(
                REGISTER, metadata=bearer(token), timeout=TIMEOUT)
        await channel.close()
    assert refused.value.code() == Code.UNAUTHENTICATED
    assert len(refused.value.details() or "") < 200


@pytest.mark.parametrize(("depth", "accepted"), [(10, True), (32, True), (33, False),
                                                  (900, False), (100_000, False)])
def test_a_plan_is_at_most_32_levels_deep(depth: int, accepted: bool) -> None:
    """A spec has at most 10 levels; deeper JSON is refused with the field named, never parsed
    into a RecursionError here or handed to members that cannot serialise it."""
    steps = "[" * (depth - 3) + "{}" + "]" * (depth - 3)  # in {"steps": [...]}: depth levels
    problems = validation.plan(f'{{"steps": [{steps}]}}' if depth < 1000 else "[" * depth)
    assert (problems == []) is accepted, problems
    if not accepted:
        assert problems[0].startswith("plan: JSON nested")
