"""Bad input is rejected by the API server itself (schema, enums, CEL), naming the field."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from e2e.conftest import KUBECTL, Fleet, kubectl

NAMESPACE = "validation"


def submit(fleet: Fleet, manifest: str, *, dry_run: bool = True) -> subprocess.CompletedProcess[
        str]:
    argv = [str(KUBECTL), "--kubeconfig", str(fleet.host), "-n", NAMESPACE, "apply", "-f", "-"]
    if dry_run:
        argv.append("--dry-run=server")
    return subprocess.run(argv, input=manifest, text=True, capture_output=True, timeout=60,
                          check=False)


def cluster(spec: str) -> str:
    return f"apiVersion: fakefleet.dev/v1alpha1\nkind: FakeCluster\nmetadata: {{name: bad}}\n" \
           f"spec:\n{spec}"


def pool(spec: str) -> str:
    return f"apiVersion: fakefleet.dev/v1alpha1\nkind: FakeNodePool\nmetadata: {{name: bad}}\n" \
           f"spec:\n  clusterRef: somewhere\n{spec}"


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
    "missing clusterRef": (
        "apiVersion: fakefleet.dev/v1alpha1\nkind: FakeNodePool\nmetadata: {name: bad}\n"
        "spec: {replicas: 1}\n",
        ["spec.clusterRef", "Required value"]),
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


def test_valid_manifests_pass_the_same_checks(fleet: Fleet, namespace: str) -> None:
    assert submit(fleet, cluster("  labels: {region: x}\n")).returncode == 0
    assert submit(fleet, pool("  replicas: 0\n  gpu: {preset: GB200}\n")).returncode == 0


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
