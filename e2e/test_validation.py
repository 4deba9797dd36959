"""Bad input is rejected by the API server itself (schema, enums, CEL), naming the field."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from e2e.conftest import KUBECTL, Fleet, kubectl
from operators.api.clusters import MAX_CLUSTER_NAME_LENGTH
from operators.api.nodepools import MAX_POOL_NAME_LENGTH

NAMESPACE = "validation"


def submit(fleet: Fleet, manifest: str, *, dry_run: bool = True) -> subprocess.CompletedProcess[
        str]:
    argv = [str(KUBECTL), "--kubeconfig", str(fleet.host), "-n", NAMESPACE, "apply", "-f", "-"]
    if dry_run:
        argv.append("--dry-run=server")
    return subprocess.run(argv, input=manifest, text=True, capture_output=True, timeout=60,
                          check=False)


def cluster(spec: str, *, name: str = "bad") -> str:
    return f"apiVersion: fakefleet.dev/v1alpha1\nkind: FakeCluster\nmetadata: {{name: {name}}}\n" \
           f"spec:\n{spec}"


def pool(spec: str, *, name: str = "bad", cluster_ref: str = "somewhere") -> str:
    return f"apiVersion: fakefleet.dev/v1alpha1\nkind: FakeNodePool\nmetadata: {{name: {name}}}\n" \
           f"spec:\n  clusterRef: {cluster_ref}\n{spec}"


def fault_plan(*steps: str, name: str = "bad", spec: str = "") -> str:
    return (f"apiVersion: fakefleet.dev/v1alpha1\nkind: FaultPlan\nmetadata: {{name: {name}}}\n"
            f"spec:\n{spec}  steps:\n" + "".join(f"  - {step}\n" for step in steps))


def step(name: str = "s", *, target: str = "{nodes: {}}", fault: str = "{type: NotReady}",
         timing: str = "at: 10s", extra: str = "") -> str:
    return f"{{name: {name}, target: {target}, fault: {fault}, {timing}{extra}}}"


LONGEST_CLUSTER_NAME = "c" * MAX_CLUSTER_NAME_LENGTH
LONGEST_POOL_NAME = "p" * MAX_POOL_NAME_LENGTH
#: How the messages that say what would be accepted begin.
LABEL_VALUE = "must be a label value: at most 63 characters"
QUALIFIED_NAME = "a qualified name such as example.com/role"


INVALID = {
    "unknown backend": (
        cluster("  controlPlane: {backend: remote}\n"),
        ["spec.controlPlane.backend", 'Unsupported value: "remote"', '"local"', '"external"']),
    "external without secret": (
        cluster("  controlPlane: {backend: external}\n"),
        ["spec.controlPlane.kubeconfigSecretRef", "backend 'external' needs kubeconfigSecretRef"]),
    "local with secret": (
        cluster("  controlPlane: {backend: local, kubeconfigSecretRef: {name: x}}\n"),
        ["spec.controlPlane.kubeconfigSecretRef", "only for backend 'external'"]),
    "malformed version": (
        cluster("  kubernetesVersion: '1.36'\n"),
        ["spec.kubernetesVersion", "should match"]),
    "negative replicas": (
        pool("  replicas: -1\n"),
        ["spec.replicas", "should be greater than or equal to 0"]),
    "unknown gpu preset": (
        pool("  gpu: {preset: Z100}\n"),
        ["spec.gpu.preset", 'Unsupported value: "Z100"', '"H100-SXM5-80GB"']),
    "too many gpus": (
        pool("  gpu: {preset: B200, count: 17}\n"),
        ["spec.gpu.count", "less than or equal to 16"]),
    "bad taint effect": (
        pool("  template:\n    taints: [{key: a, effect: Sometimes}]\n"),
        ["spec.template.taints[0].effect", 'Unsupported value: "Sometimes"']),
    "a start delay of 400 digits": (
        pool(f"  pods: {{startDelay: {'9' * 400}s}}\n"),
        ["spec.pods.startDelay", "Too long: may not be more than 32"]),
    "a start delay of 4e9 hours": (
        pool("  pods: {startDelay: 4000000000h}\n"),
        ["spec.pods.startDelay", "should match"]),
    "lease too short": (
        pool("  leaseDurationSeconds: 5\n"),
        ["spec.leaseDurationSeconds", "greater than or equal to 10"]),
    "capacity not a quantity": (
        pool("  template:\n    capacity: {cpu: lots}\n"),
        ["spec.template.capacity.cpu", "should match"]),
    "duplicate zones": (
        pool("  topology: {zones: [a, a]}\n"),
        ["spec.topology.zones[1]", "Duplicate value"]),
    "misspelt field": (
        pool("  replica: 3\n"),
        ['unknown field "spec.replica"']),
    "cluster name too long": (
        cluster("  labels: {}\n", name="c" * 64),
        ["metadata.name", "a FakeCluster name has at most 63 characters",
         "label fakefleet.dev/cluster"]),
    "pool name too long": (
        pool("  replicas: 0\n", name="p" * 54),
        ["metadata.name", "a FakeNodePool name has at most 53 characters",
         "kubernetes.io/hostname=<pool>-<index> (index up to 32767)",
         "node.kubernetes.io/instance-type=fakefleet.<pool>"]),
    "negative capacity quantity": (
        pool("  template:\n    capacity: {cpu: '-4'}\n"),
        ["spec.template.capacity[cpu]", '"-4"', "quantity must not be negative: use 0 or more"]),
    "negative capacity integer": (
        pool("  template:\n    capacity: {pods: -1}\n"),
        ["spec.template.capacity[pods]", "quantity must not be negative"]),
    "extended resource in fractions": (
        pool("  template:\n    capacity: {cpu: 500m, example.com/widget: 500m}\n"),
        ["spec.template.capacity", "'example.com/widget' needs a whole number",
         "use an integer such as 8"]),
    "pods in fractions": (
        pool("  template:\n    capacity: {pods: '1.5'}\n"),
        ["spec.template.capacity", "'pods' needs a whole number"]),
    "capacity key not a resource name": (
        pool("  template:\n    capacity: {'bad key': 1}\n"),
        ["spec.template.capacity", "'bad key' is not a valid resource name", QUALIFIED_NAME]),
    "more replicas than pod CIDRs": (
        pool("  replicas: 32769\n"),
        ["spec.replicas", "less than or equal to 32768"]),
    "label key not a qualified name": (
        pool("  template:\n    labels: {'bad key': x}\n"),
        ["spec.template.labels", "'bad key' is not a valid label key", QUALIFIED_NAME,
         "a name of at most 63 characters"]),
    "label key name part too long": (
        pool(f"  template:\n    labels: {{example.com/{'n' * 64}: x}}\n"),
        ["spec.template.labels", f"'example.com/{'n' * 64}' is not a valid label key",
         "a name of at most 63 characters"]),
    "label key prefix too long": (
        pool(f"  template:\n    labels: {{{'d' * 250}.com/role: x}}\n"),
        ["spec.template.labels", "is not a valid label key",
         "DNS-subdomain prefix (at most 253 characters)"]),
    "label value with a space": (
        pool("  template:\n    labels: {role: 'a b'}\n"),
        ["spec.template.labels[role]", '"a b"', f"value {LABEL_VALUE}"]),
    "label value too long": (
        pool(f"  template:\n    labels: {{role: {'v' * 64}}}\n"),
        ["spec.template.labels.role", "may not be more than 63"]),
    "too many labels": (
        pool("  template:\n    labels: {"
             + ", ".join(f"k{i}: v" for i in range(65)) + "}\n"),
        ["spec.template.labels", "must have at most 64 items"]),
    "cluster label key": (
        cluster("  labels: {a/b/c: x}\n"),
        ["spec.labels", "'a/b/c' is not a valid label key", QUALIFIED_NAME]),
    "cluster label value": (
        cluster("  labels: {region: 'eu west'}\n"),
        ["spec.labels[region]", f"value {LABEL_VALUE}"]),
    "hub address without credentials": (
        cluster("  federation: {address: 'hub.example.com:7443'}\n"),
        ["spec.federation.credentialsSecret",
         "federation.address needs federation.credentialsSecret", "token and ca.crt"]),
    "hub credentials without an address": (
        cluster("  federation: {credentialsSecret: hub-member}\n"),
        ["spec.federation.address", "federation.credentialsSecret is for the hub that "
         "federation.address names: set address (host:port)"]),
    "hub address without a port": (
        cluster("  federation: {address: hub.example.com, credentialsSecret: hub-member}\n"),
        ["spec.federation.address", "should match"]),
    "hub credentials not a Secret name": (
        cluster("  federation: {address: 'hub:7443', credentialsSecret: Hub_Member}\n"),
        ["spec.federation.credentialsSecret", "should match"]),
    "annotation key": (
        pool("  template:\n    annotations: {'-x': note}\n"),
        ["spec.template.annotations", "'-x' is not a valid annotation key", QUALIFIED_NAME]),
    "taint key": (
        pool("  template:\n    taints: [{key: 'a b', effect: NoSchedule}]\n"),
        ["spec.template.taints[0].key", '"a b"', f"taint key must be {QUALIFIED_NAME}"]),
    "taint value": (
        pool("  template:\n    taints: [{key: a, value: 'c d', effect: NoSchedule}]\n"),
        ["spec.template.taints[0].value", f"taint value {LABEL_VALUE}"]),
    "zone": (
        pool("  topology: {zones: [a, 'z z']}\n"),
        ["spec.topology.zones[1]", '"z z"', f"zone {LABEL_VALUE}"]),
    "region": (
        pool("  topology: {region: 'r r'}\n"),
        ["spec.topology.region", f"region {LABEL_VALUE}"]),
    "clusterRef not a cluster name": (
        pool("  replicas: 0\n", cluster_ref="West"),
        ["spec.clusterRef", "must be the name of a FakeCluster"]),
    "clusterRef too long": (
        pool("  replicas: 0\n", cluster_ref="c" * 64),
        ["spec.clusterRef", "may not be more than 63"]),
    "missing clusterRef": (
        "apiVersion: fakefleet.dev/v1alpha1\nkind: FakeNodePool\nmetadata: {name: bad}\n"
        "spec: {replicas: 1}\n",
        ["spec.clusterRef", "Required value"]),
    "plan: percent above 100": (
        fault_plan(step(target="{nodes: {}, mode: percent, percent: 101}")),
        ["spec.steps[0].target.percent", "less than or equal to 100"]),
    "plan: percent 0": (
        fault_plan(step(target="{nodes: {}, mode: percent, percent: 0}")),
        ["spec.steps[0].target.percent", "greater than or equal to 1"]),
    "plan: fixed without count": (
        fault_plan(step(target="{nodes: {}, mode: fixed}")),
        ["spec.steps[0].target.count", "mode fixed needs target.count"]),
    "plan: both at and after": (
        fault_plan(step("a"), step("b", timing="at: 1s, after: [a]")),
        ["spec.steps[1]", "give exactly one of at"]),
    "plan: neither at nor after": (
        fault_plan(step(timing="delay: 1s")),
        ["spec.steps[0]", "give exactly one of at"]),
    "gpu: an unknown allocation": (
        pool("  gpu: {preset: H100-SXM5-80GB, allocation: mig}\n"),
        ["spec.gpu.allocation", 'Unsupported value: "mig"', '"extended"', '"dra"', '"both"']),
    "gpu: dra without a preset": (
        pool("  gpu: {allocation: dra}\n"),
        ["spec.gpu.preset", "Required value"]),
    "gpu: dra and nvidia.com/gpu in the template": (
        pool("  template: {capacity: {cpu: 8, nvidia.com/gpu: 8}}\n"
             "  gpu: {preset: H100-SXM5-80GB, allocation: dra}\n"),
        ["spec.gpu.allocation", "offers the GPUs through DRA only",
         "remove nvidia.com/gpu from template.capacity"]),
    "gpu: a driver version too long for its labels": (
        pool(f"  gpu: {{preset: B200, driverVersion: '{'1' * 31}.0'}}\n"),
        ["spec.gpu.driverVersion", "may not be more than 32 bytes"]),
    "plan: after an unknown step": (
        fault_plan(step("a"), step("b", timing="after: [nope]")),
        ["spec.steps", "after names a step that does not exist"]),
    "plan: steps waiting for each other": (
        fault_plan(step("a", timing="after: [b]"), step("b", timing="after: [a]")),
        ["spec.steps", "cycle"]),
    "plan: a step waiting for itself": (
        fault_plan(step("a", timing="after: [a]")),
        ["spec.steps", "cycle"]),
    "plan: unknown fault": (
        fault_plan(step(fault="{type: Meteor}")),
        ["spec.steps[0].fault.type", 'Unsupported value: "Meteor"']),
    "plan: xid zero": (
        fault_plan(step(fault="{type: GPUXid, xid: 0}")),
        ["spec.steps[0].fault.xid", "greater than or equal to 1"]),
    "plan: xid not a number": (
        fault_plan(step(fault="{type: GPUXid, xid: seventy-nine}")),
        ["spec.steps[0].fault.xid", "must be of type integer"]),
    "plan: xid missing": (
        fault_plan(step(fault="{type: GPUXid}")),
        ["spec.steps[0].fault.xid", "needs fault.xid"]),
    "plan: expectation without a deadline": (
        fault_plan(step(extra=", expectations: [{name: e, objects: {kind: Node}, "
                              "taint: {key: x}}]")),
        ["spec.steps[0].expectations[0].within", "Required value"]),
    "plan: a pod fault on nodes": (
        fault_plan(step(fault="{type: ContainerExit, exitCode: 3}")),
        ["spec.steps[0].target", "a pod fault needs target.pods"]),
    "plan: a parameter of another fault": (
        fault_plan(step(fault="{type: NotReady, exitCode: 3}")),
        ["spec.steps[0].fault.exitCode", "for fault type ContainerExit or CrashLoop only"]),
    "plan: a slow API server without a latency": (
        fault_plan(step(target="{}", fault="{type: APIServerSlow}")),
        ["spec.steps[0].fault.latency", "needs fault.latency"]),
    "plan: a hub latency without a latency": (
        fault_plan(step(target="{}", fault="{type: HubLatency}")),
        ["spec.steps[0].fault.latency", "fault type HubLatency needs fault.latency"]),
    "plan: a direction on another fault": (
        fault_plan(step(target="{}", fault="{type: APIServerDown, direction: toHub}")),
        ["spec.steps[0].fault.direction", "for fault type HubPartition only"]),
    "plan: an unknown hub direction": (
        fault_plan(step(target="{}", fault="{type: HubPartition, direction: sideways}")),
        ["spec.steps[0].fault.direction", 'Unsupported value: "sideways"', '"toHub"']),
    "plan: a hub partition of nodes": (
        fault_plan(step(fault="{type: HubPartition}")),
        ["spec.steps[0].target", "a cluster fault (control plane or hub link) targets "
         "clusters"]),
    "plan: a start that is no RFC 3339 time": (
        fault_plan(step(), spec="  startAt: '2030-01-02 15:04'\n"),
        ["spec.startAt", "should match"]),
    "plan: a cluster twice": (
        fault_plan(step(), spec="  clusters: [west, west]\n"),
        ["spec.clusters[1]", "Duplicate value"]),
    "plan: too many occurrences": (
        fault_plan(step("a", timing="at: 0s, repeat: {every: 1s, times: 150}"),
                   step("b", timing="at: 0s, repeat: {every: 1s, times: 51}")),
        ["spec.steps", "more than 200 occurrences"]),
    "pool: a usage that is no amount": (
        pool("  usage: {pod: {cpu: lots}}\n"),
        ["spec.usage.pod.cpu", "usage.pod.cpu must be CPU in cores such as 250m or 2"]),
    "pool: a sine without a period": (
        pool("  usage: {node: {memory: 'sine(1Gi, 2Gi, 0s)'}}\n"),
        ["spec.usage.node.memory", "sine(FROM, TO, PERIOD)"]),
    "pool: a GPU busier than 100 %": (
        pool("  usage: {gpu: {utilization: '150'}}\n"),
        ["spec.usage.gpu.utilization", "a percentage from 0 to 100"]),
    "cluster: metrics-server scraping too often": (
        cluster("  addons: {metricsServer: {resolution: 5s}}\n"),
        ["spec.addons.metricsServer.resolution", "give a resolution of 10s or more"]),
    "cluster: metrics-server for an adopted cluster": (
        cluster("  controlPlane: {backend: external, kubeconfigSecretRef: {name: k}}\n"
                "  addons: {metricsServer: {}}\n"),
        ["spec.addons.metricsServer", "needs controlPlane.backend 'local'"]),
    "plan: a GPU reading on a fault that has none": (
        fault_plan(step(fault="{type: NotReady, gpu: {temperature: 90}}")),
        ["spec.steps[0].fault.gpu", "for fault type Condition only"]),
    "plan: a GPU reading without a reading": (
        fault_plan(step(fault="{type: Condition, condition: {type: Hot}, gpu: {}}")),
        ["spec.steps[0].fault.gpu", "needs temperature or smClock"]),
    "plan: duration on a one-shot fault": (
        fault_plan(step(target="{pods: {}}", fault="{type: OOMKilled}",
                        extra=", duration: 10s")),
        ["spec.steps[0].duration", "happens once"]),
}


@pytest.fixture(scope="module")
def namespace(fleet: Fleet) -> Iterator[str]:
    kubectl(fleet.host, "create", "namespace", NAMESPACE)
    yield NAMESPACE
    kubectl(fleet.host, "delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_manifest_is_rejected_naming_the_field(
    fleet: Fleet, namespace: str, case: str
) -> None:
    manifest, expected = INVALID[case]
    result = submit(fleet, manifest)
    assert result.returncode != 0, f"{case}: accepted, but should not be"
    for fragment in expected:
        assert fragment in result.stderr, f"{case}: {fragment!r} not in {result.stderr!r}"


VALID = {
    "cluster labels": cluster("  labels: {region: x, example.com/tier: '', a.b/c_d: A-1.b_2}\n"),
    "longest cluster name": cluster("  labels: {}\n", name=LONGEST_CLUSTER_NAME),
    "longest pool name, in the cluster with the longest name": pool(
        "  replicas: 0\n", name=LONGEST_POOL_NAME, cluster_ref=LONGEST_CLUSTER_NAME),
    "gpu pool": pool("  replicas: 0\n  gpu: {preset: GB200}\n"),
    "dra gpu pool": pool("  replicas: 0\n  gpu: {preset: H100-SXM5-80GB, allocation: dra, "
                         "driverVersion: 535.104.05}\n"),
    "gpus both ways, with the resource in the template": pool(
        "  replicas: 0\n  template: {capacity: {cpu: 8, nvidia.com/gpu: 8}}\n"
        "  gpu: {preset: H100-SXM5-80GB, allocation: both}\n"),
    "cluster joining a remote hub": cluster(
        "  federation: {address: 'hub.example.com:7443', credentialsSecret: hub-member}\n"),
    "cluster joining no hub": cluster("  federation: {enabled: false}\n"),
    "plan for one member of a fleet run, with hub faults": fault_plan(
        step("cut", target="{}", fault="{type: HubPartition, direction: fromHub}",
             timing="at: 0s, duration: 10s"),
        step("slow", target="{clusters: {names: [west]}}",
             fault="{type: HubLatency, latency: 500ms}", timing="after: [cut], duration: 1m"),
        spec="  startAt: '2030-01-02T15:04:05.5+02:00'\n  clusters: [west]\n"),
    "as many nodes as pod CIDRs": pool("  replicas: 32768\n"),
    "pool with usage profiles": pool(
        "  usage:\n"
        "    node: {cpu: 'sine(100m, 300m, 10m)', memory: 2Gi}\n"
        "    pod: {cpu: 'ramp(2, 100m, 0s)', memory: '1.5e9'}\n"
        "    gpu: {utilization: 'sine(40, 100, 90s)', memory: '0'}\n"),
    "a thermal slowdown of two GPUs": fault_plan(step(
        fault="{type: Condition, condition: {type: GPUThermalSlowdown}, gpus: 2, "
              "gpu: {temperature: 92, smClock: 1005}}")),
    "zero capacity, prefixed keys": pool(
        "  template:\n"
        "    capacity: {cpu: 0, memory: '0', example.com/widget: '+2', pods: '1e3'}\n"
        f"    labels: {{example.com/role: worker, {'d' * 240}.com/{'n' * 63}: {'v' * 63}}}\n"
        "    annotations: {example.com/note: 'any text at all, even with spaces'}\n"
        "    taints: [{key: example.com/dedicated, value: '', effect: NoExecute}]\n"
        "  topology: {region: eu-west-1, zones: [eu-west-1a, EU_West.1b]}\n"),
    "plan with a DAG of steps": fault_plan(
        step("a", timing="at: 0s, duration: 1m, repeat: {every: 2m, times: 3}"),
        step("b", target="{clusters: {selector: {matchLabels: {region: x}}}, pods: "
                         "{namespace: ml, ownerKind: Job}, mode: percent, percent: 10, "
                         "maxTargets: 5}",
             fault="{type: ContainerExit, exitCode: 3, message: NCCL communicator aborted}",
             timing="after: [a], delay: 5s, jitter: 3s"),
        step("c", target="{}", fault="{type: APIServerDown}",
             timing="after: [a, b], duration: 30s",
             extra=", expectations: [{name: down, within: 60s, objects: {apiVersion: "
                   "fakefleet.dev/v1alpha1, kind: FakeCluster, cluster: host}, "
                   "condition: {type: Ready, status: 'False'}}, {name: running, within: 1m, "
                   "objects: {kind: Pod}, count: {where: {cel: \"self.status.phase == "
                   "'Running'\"}, atLeast: 1}}]")),
}


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_manifests_pass_the_same_checks(fleet: Fleet, namespace: str, case: str) -> None:
    result = submit(fleet, VALID[case])
    assert result.returncode == 0, f"{case}: {result.stderr}"


def test_engines_select_their_pools_by_cluster(fleet: Fleet, namespace: str) -> None:
    """spec.clusterRef is a selectable field: a per-cluster engine lists and watches only the
    pools of its cluster, filtered by the API server."""
    for name, ref in (("west-a", "west"), ("west-b", "west"), ("east-a", "east")):
        created = submit(fleet, pool("  replicas: 0\n", name=name, cluster_ref=ref),
                         dry_run=False)
        assert created.returncode == 0, created.stderr
    try:
        def names(selector: str) -> list[str]:
            found = kubectl(fleet.host, "-n", NAMESPACE, "get", "fnp", "--field-selector",
                            selector, "-o", "jsonpath={.items[*].metadata.name}")
            return sorted(found.stdout.split())

        assert names("spec.clusterRef=west") == ["west-a", "west-b"]
        assert names("spec.clusterRef=east") == ["east-a"]
        assert names("spec.clusterRef!=west") == ["east-a"]
        # The scale subresource goes through the same schema: the pod CIDR bound holds there too.
        scaled = kubectl(fleet.host, "-n", NAMESPACE, "scale", "fnp/east-a", "--replicas=32769",
                         check=False)
        assert scaled.returncode != 0
        assert "spec.replicas" in scaled.stderr
        assert "less than or equal to 32768" in scaled.stderr
    finally:
        kubectl(fleet.host, "-n", NAMESPACE, "delete", "fnp", "west-a", "west-b", "east-a",
                "--timeout=60s")


def test_immutable_fields_cannot_change(fleet: Fleet, namespace: str) -> None:
    created = submit(fleet, pool("  replicas: 0\n"), dry_run=False)
    assert created.returncode == 0, created.stderr
    moved = submit(fleet, pool("  replicas: 0\n").replace("somewhere", "elsewhere"))
    assert moved.returncode != 0
    assert "spec.clusterRef" in moved.stderr
    assert "clusterRef is immutable" in moved.stderr

    adopted = cluster("  controlPlane: {backend: external, kubeconfigSecretRef: {name: none}}\n")
    assert submit(fleet, adopted, dry_run=False).returncode == 0
    upgraded = submit(fleet, adopted + "  kubernetesVersion: v1.35.0\n")
    assert upgraded.returncode != 0
    assert "kubernetesVersion is immutable" in upgraded.stderr
    switched = submit(fleet, cluster("  controlPlane: {backend: local}\n"))
    assert "controlPlane is immutable" in switched.stderr
    kubectl(fleet.host, "-n", NAMESPACE, "delete", "fnp,fc", "--all", "--timeout=60s")
