"""Property test of the CRDs on a real fleet: whatever the API server accepts gets somewhere.

Hypothesis writes FakeClusters, FakeNodePools and FaultPlans, valid and not: names with dots
or capitals, durations of ``1e300h``, quantities that are not, unknown presets, CEL that does
not compile, targets that match nothing. Each example is applied object by object with
kubectl. What the API server refuses must say which field (its schema and CEL rules); what it
accepts must, within 60 s, reach Ready (a FaultPlan: a final phase), or say why not in a
condition with a message. No fakefleet process may crash meanwhile.

Sizes stay small (at most 20 nodes a pool, no ``kubernetesVersion``, which would build a
Kubernetes release), and the examples are derandomized so that CI runs the same ones every
time; ``FAKEFLEET_PROPERTY_SEED`` explores others.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, seed, settings
from hypothesis import strategies as st

from e2e.conftest import KUBECTL, Fleet, eventually, kubectl
from operators.controlplane.state import StateDir, read_host, read_operator

NAMESPACE = "props"
BASE = "pbase"
GHOST = "nowhere"
#: How long an accepted object may take to reach a state that says where it is.
SETTLE = 60.0
EXAMPLES = 20
#: A rejection names the field it is about, as the API server writes it.
FIELD = re.compile(r"(spec|metadata)(\.[A-Za-z]+|\[)")

counter = itertools.count()

# Values a user means: most of each object is made of these.
durations = st.sampled_from(["0s", "1s", "2s", "3s", "500ms", "1m", "90s"])
short_durations = st.sampled_from(["0s", "1s", "2s", "3s", "4s"])
quantities = st.sampled_from(["64", "1", "512Gi", "110", "2Ti", "500m"])
profiles = st.sampled_from(["0.5", "2", "ramp(5m, 0, 1)", "sine(1m, 0.2, 0.8)", "0"])
label_keys = st.sampled_from(["region", "zone", "fakefleet.dev/x", "example.com/role"])
label_values = st.sampled_from(["us-west", "a", "", "v" * 63])
cel = st.sampled_from([
    "self.status.phase == 'Running'",
    "self.metadata.name.startsWith('p')",
    "self.status.phase ==",  # does not compile: the API server or the plan says so
    "[1, 2, 3].map(x, [1, 2, 3].map(y, [1, 2, 3].map(z, x * y * z))).size() > 0",
    "size(self.metadata.name) > 0",
])
#: What a careless user writes instead, by what it stands in for.
NONSENSE: dict[str, list[Any]] = {
    "duration": ["-1s", "1e300h", "99999999999h", "soon", "", "1.5.5s", "1s" * 20],
    "quantity": ["-1", "1e300", "abc", "", "1Zi"],
    "profile": ["bogus(", "-3", "1e300", "ramp(", "nan"],
    "label key": ["Bad Key", "a" * 64, "/x", "fakefleet.dev/"],
    "label value": ["has space", "v" * 64, "-x"],
    "name suffix": [".eu", "-X", "_bad", "-" + "n" * 60, "..", "UPPER"],
    "number": [-1, 0, 17, 10**6, 2**63],
    "word": ["", "remote", "fast", "Sometimes", "magic", "Z9", "Teleport"],
}


def names(prefix: str) -> st.SearchStrategy[str]:
    """Object names: valid ones, dotted ones among them (a DNS subdomain is a valid name)."""
    return st.sampled_from(["", "", "", ".eu"]).map(
        lambda suffix: f"{prefix}{next(counter)}{suffix}")


@st.composite
def spoiled(draw: st.DrawFn, obj: dict[str, Any], places: list[tuple[list[Any], str]]
            ) -> dict[str, Any]:
    """``obj`` as it is (about two times in three), or with one value in ``places`` (a path
    into it, and what the value stands for) replaced by nonsense of that kind."""
    if not places or draw(st.integers(0, 2)) > 0:
        return obj
    path, kind = draw(st.sampled_from(places))
    bad = draw(st.sampled_from(NONSENSE[kind]))
    *parents, last = path
    target = obj
    for step in parents:
        target = target.setdefault(step, {}) if isinstance(step, str) else target[step]
    if kind == "name suffix":
        target[last] = f"{target[last]}{bad}"
    else:
        target[last] = bad
    return obj


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    places: list[tuple[list[Any], str]] = [(["metadata", "name"], "name suffix")]
    if draw(st.booleans()):
        spec["labels"] = draw(st.dictionaries(label_keys, label_values, max_size=2))
        places.append((["spec", "labels", "region"], "label value"))
    if draw(st.booleans()):
        external = draw(st.integers(0, 4)) == 0
        plane: dict[str, Any] = {
            "backend": "external" if external else "local",
            "scheduler": draw(st.booleans()),
            "controllerManager": draw(st.booleans()),
            "profile": draw(st.sampled_from(["default", "load"])),
        }
        if external:  # a Secret that is not there: the status must say so
            plane["kubeconfigSecretRef"] = {"name": "missing", "key": "kubeconfig"}
        spec["controlPlane"] = plane
        places += [(["spec", "controlPlane", "backend"], "word"),
                   (["spec", "controlPlane", "profile"], "word")]
    if draw(st.integers(0, 3)) == 0:
        spec["federation"] = {"enabled": draw(st.booleans())}
    if draw(st.integers(0, 2)) == 0:
        spec["addons"] = {"metricsServer": {"enabled": draw(st.booleans()),
                                            "resolution": draw(st.sampled_from(
                                                ["10s", "15s", "30s"]))}}
        places.append((["spec", "addons", "metricsServer", "resolution"], "duration"))
    made = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
            "metadata": {"name": draw(names("pc"))}, "spec": spec}
    return draw(spoiled(made, places))


@st.composite
def pools(draw: st.DrawFn, cluster: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterRef": draw(st.sampled_from([BASE, cluster, cluster, GHOST])),
        "replicas": draw(st.integers(0, 20)),
    }
    places: list[tuple[list[Any], str]] = [(["metadata", "name"], "name suffix"),
                                           (["spec", "replicas"], "number")]
    if draw(st.booleans()):
        spec["gpu"] = {
            "preset": draw(st.sampled_from(["H100-SXM5-80GB", "A100-SXM4-80GB", "B200"])),
            "count": draw(st.integers(1, 16)),
            "allocation": draw(st.sampled_from(["extended", "dra", "both"])),
        }
        places += [(["spec", "gpu", "preset"], "word"), (["spec", "gpu", "count"], "number"),
                   (["spec", "gpu", "allocation"], "word")]
    if draw(st.booleans()):
        spec["template"] = {
            "capacity": {"cpu": draw(quantities), "memory": draw(quantities)},
            "taints": draw(st.lists(st.fixed_dictionaries({
                "key": label_keys, "value": label_values,
                "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])}),
                max_size=2, unique_by=lambda taint: (taint["key"], taint["effect"]))),
            "labels": draw(st.dictionaries(label_keys, label_values, max_size=2)),
        }
        places += [(["spec", "template", "capacity", "cpu"], "quantity"),
                   (["spec", "template", "labels", "a"], "label value")]
    if draw(st.booleans()):
        spec["topology"] = {"zones": draw(st.lists(st.sampled_from(["a", "b", "c"]),
                                                   max_size=3, unique=True)),
                            "racks": draw(st.integers(0, 3))}
    if draw(st.booleans()):
        spec["leaseDurationSeconds"] = draw(st.integers(10, 60))
        places.append((["spec", "leaseDurationSeconds"], "number"))
    if draw(st.booleans()):
        spec["pods"] = {"startDelay": draw(durations), "jobRunTime": draw(durations)}
        places += [(["spec", "pods", "startDelay"], "duration"),
                   (["spec", "pods", "jobRunTime"], "duration")]
    if draw(st.booleans()):
        spec["usage"] = {"node": {"cpu": draw(profiles)}, "pod": {"cpu": draw(profiles)}}
        places.append((["spec", "usage", "pod", "cpu"], "profile"))
    made = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeNodePool",
            "metadata": {"name": draw(names("pp"))}, "spec": spec}
    return draw(spoiled(made, places))


FAULTS: st.SearchStrategy[dict[str, Any]] = st.sampled_from([
    {"type": "NotReady"}, {"type": "Unreachable"}, {"type": "GPUXid", "xid": 79},
    {"type": "GPUXid", "xid": 48}, {"type": "Cordon"},
    {"type": "Taint", "taint": {"key": "a", "effect": "NoSchedule"}},
    {"type": "ContainerExit", "exitCode": 3}, {"type": "CrashLoop"}, {"type": "OOMKilled"},
    {"type": "Evict"}, {"type": "Delete"}, {"type": "APIServerSlow", "latency": "50ms"},
    {"type": "Condition", "condition": {"type": "Disk", "status": "True"}},
    {"type": "SchedulerDown"},
])
NODE_FAULTS = ("NotReady", "Unreachable", "GPUXid", "Cordon", "Taint", "Delete", "Condition")
POD_FAULTS = ("ContainerExit", "CrashLoop", "OOMKilled", "Evict")


@st.composite
def plans(draw: st.DrawFn, cluster: str) -> dict[str, Any]:
    steps = []
    places: list[tuple[list[Any], str]] = [(["metadata", "name"], "name suffix")]
    for index in range(draw(st.integers(1, 2))):
        fault = draw(FAULTS)
        target: dict[str, Any] = {"clusters": {"names": [draw(st.sampled_from(
            [BASE, BASE, cluster, GHOST]))]}}
        if fault["type"] in NODE_FAULTS:
            target["nodes"] = draw(st.sampled_from([{}, {"pools": [f"{BASE}-cpu"]},
                                                    {"selector": {"matchLabels": {"a": "b"}}}]))
        elif fault["type"] in POD_FAULTS:
            target["pods"] = {"namespace": "default", "selector": {"matchLabels": {
                "app": draw(st.sampled_from(["props", "none"]))}}}
        mode = draw(st.sampled_from(["one", "all", "fixed", "percent"]))
        target["mode"] = mode
        if mode == "fixed":
            target["count"] = draw(st.integers(1, 3))
        if mode == "percent":
            target["percent"] = draw(st.integers(1, 100))
        step: dict[str, Any] = {"name": f"s{index}", "target": target, "fault": fault,
                                "at": draw(short_durations)}
        places += [(["spec", "steps", index, "at"], "duration"),
                   (["spec", "steps", index, "fault", "type"], "word")]
        if draw(st.booleans()):
            step["duration"] = draw(short_durations)
            places.append((["spec", "steps", index, "duration"], "duration"))
        if draw(st.booleans()):
            step["expectations"] = [{
                "name": "e", "within": draw(short_durations),
                "objects": {"kind": "Node", "victims": True},
                "cel": draw(cel)}]
            places.append((["spec", "steps", index, "expectations", 0, "within"], "duration"))
        steps.append(step)
    made = {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FaultPlan",
            "metadata": {"name": draw(names("pf"))},
            "spec": {"seed": draw(st.integers(0, 2**31)), "steps": steps}}
    return draw(spoiled(made, places))


@st.composite
def scenes(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Objects applied together: maybe a new cluster, pools on it or elsewhere, a plan."""
    objects: list[dict[str, Any]] = []
    cluster = GHOST
    if draw(st.integers(0, 2)) == 0:
        made = draw(clusters())
        cluster = made["metadata"]["name"]
        objects.append(made)
    objects += draw(st.lists(pools(cluster), max_size=2))
    if draw(st.booleans()):
        objects.append(draw(plans(cluster)))
    return objects


def apply(fleet: Fleet, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(fleet.host), "-n", NAMESPACE, "apply", "-f", "-"],
        input=yaml.safe_dump(obj), text=True, capture_output=True, timeout=60, check=False)


def settled(obj: dict[str, Any]) -> str | None:
    """Where an accepted object got, or None while it is still on its way."""
    status = obj.get("status") or {}
    current = status.get("observedGeneration", 0) == obj["metadata"].get("generation", 0)
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    stalled = conditions.get("Stalled", {})
    if stalled.get("status") == "True" and stalled.get("message"):
        return f"Stalled: {stalled['message']}"
    if obj["kind"] == "FaultPlan":
        phase = status.get("phase")
        return phase if current and phase in ("Succeeded", "Failed", "Aborted") else None
    ready = conditions.get("Ready", {})
    if current and ready.get("status") == "True":
        return "Ready"
    # Why not, said in words: a pool waiting for a cluster that is not there (the operator
    # speaks for it, while no engine has acted on its spec), a cluster that cannot start.
    if ready.get("status") == "False" and ready.get("message") and \
            ready.get("reason") not in ("Scaling", "Provisioning", "Starting", "Reconciling"):
        return f"{ready.get('reason')}: {ready['message']}"
    return None


def resource(kind: str) -> str:
    return {"FakeCluster": "fakeclusters", "FakeNodePool": "fakenodepools",
            "FaultPlan": "faultplans"}[kind]


def fetch(fleet: Fleet, obj: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(
        fleet.host, "-n", NAMESPACE, "get", resource(obj["kind"]), obj["metadata"]["name"],
        "-o", "json").stdout)
    return found


def components(fleet: Fleet) -> dict[str, int]:
    """Restarts of every process the daemon and the operator run, and the operator's pid
    (a crashed operator is a new pid, not a restart the operator counts itself)."""
    state = StateDir(fleet.state)
    host, operator = read_host(state), read_operator(state)
    assert host is not None
    assert operator is not None
    found = {f"{c.cluster or ''}/{c.name}": c.restarts
             for c in [*host.components, *operator.components]}
    found["operator pid"] = operator.pid
    return found


@pytest.fixture(scope="module")
def base(fleet: Fleet) -> Iterator[None]:
    kubectl(fleet.host, "create", "namespace", NAMESPACE, check=False)
    fleet.apply(f"""
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {BASE}, namespace: {NAMESPACE}}}
spec: {{}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {BASE}-cpu, namespace: {NAMESPACE}}}
spec: {{clusterRef: {BASE}, replicas: 4}}
""")
    eventually(lambda: settled(fleet.get("fc", "-n", NAMESPACE, BASE)) == "Ready",
               timeout=120, what=f"FakeCluster {BASE}")
    member = fleet.state / f"{BASE}.kubeconfig"
    member.write_text(subprocess.run(
        [str(KUBECTL.parent / "fakefleet"), "kubeconfig", "--state-dir", str(fleet.state),
         f"{NAMESPACE}/{BASE}"], capture_output=True, text=True, check=True, timeout=60).stdout)
    kubectl(member, "create", "deployment", "props", "--image=busybox", "--replicas=4")
    yield
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


def property_seed() -> int:
    return int(os.environ.get("FAKEFLEET_PROPERTY_SEED", "0"))


@seed(property_seed())
# No shrinking: each example runs against a real fleet for up to a minute, and the failure
# message prints the whole scene.
@settings(max_examples=EXAMPLES, deadline=None, derandomize="FAKEFLEET_PROPERTY_SEED" not in
          os.environ, database=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.generate])
@given(scene=scenes())
def test_whatever_the_api_server_accepts_gets_somewhere_and_says_so(
        fleet: Fleet, base: None, scene: list[dict[str, Any]]) -> None:
    before = components(fleet)
    accepted = []
    for obj in scene:
        result = apply(fleet, obj)
        if result.returncode == 0:
            event(f"{obj['kind']} accepted")
            accepted.append(obj)
            continue
        event(f"{obj['kind']} refused")
        refusal = result.stderr.strip()
        assert "Traceback" not in refusal, refusal
        assert FIELD.search(refusal), f"the refusal names no field: {refusal}\n{obj}"
    try:
        for obj in accepted:
            started = time.monotonic()

            def where(obj: dict[str, Any] = obj) -> str | None:
                return settled(fetch(fleet, obj))
            try:
                event(f"{obj['kind']}: {eventually(where, timeout=SETTLE, what='').split(':')[0]}")
            except pytest.fail.Exception:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} said nothing within "
                            f"{SETTLE:.0f}s ({time.monotonic() - started:.0f}s): "
                            f"{json.dumps(fetch(fleet, obj).get('status'))}\n"
                            f"{yaml.safe_dump(obj)}")
    finally:
        # One kubectl for all of them, as `kubectl delete -f` a user's file: it asks for each
        # deletion in turn (the plan first, the cluster last) and then waits for them together,
        # not for one finalizer after another.
        if accepted:
            subprocess.run(
                [str(KUBECTL), "--kubeconfig", str(fleet.host), "-n", NAMESPACE, "delete",
                 *(f"{resource(obj['kind'])}/{obj['metadata']['name']}"
                   for obj in reversed(accepted)), "--wait=true", "--timeout=90s"],
                capture_output=True, text=True, check=False, timeout=60 * len(accepted))
    after = components(fleet)
    restarted = {name: (before[name], count) for name, count in after.items()
                 if name in before and count != before[name]}
    assert not restarted, f"restarted while the scene ran: {restarted}"
