"""What the hub link of a member reads its workload Jobs through: after an operator
restart, before the member's control plane is adopted again, the Hello must still list the
member's Jobs (soak run of 2026-12-03: a Hello that found no client listed none, and the hub
failed both Jobs of workload soak-11 as deleted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from operators.api.clusters import FakeCluster
from operators.controlplane.state import StateDir
from operators.handlers.clusters import linked_access
from operators.handlers.runtime import Runtime
from operators.k8s.config import HostConfig

KEY = "default.west"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: west
  cluster: {server: "https://127.0.0.1:13178", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: secret}
contexts:
- name: west
  context: {cluster: west, user: admin}
current-context: west
"""


class Substrate:
    def __init__(self) -> None:
        self.clusters: dict[str, Any] = {}  # this operator started or adopted nothing yet


def runtime(tmp_path: Path) -> Runtime:
    return Runtime(state_dir=tmp_path, host=cast(Any, None),
                   host_config=HostConfig(kubeconfig=tmp_path / "kubeconfig"),
                   substrate=cast(Any, Substrate()),
                   resolve_binaries=lambda *_, **__: cast(Any, object()), addons=())


def west(spec: dict[str, Any] | None = None) -> FakeCluster:
    return FakeCluster.model_validate({
        "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
        "metadata": {"name": "west", "namespace": "default"}, "spec": spec or {}})


ADOPTED = {"controlPlane": {"backend": "external",
                            "kubeconfigSecretRef": {"name": "west-admin"}}}


def test_a_member_not_adopted_yet_is_read_through_the_kubeconfig_left_for_it(
        tmp_path: Path) -> None:
    left = StateDir(tmp_path).kubeconfig(KEY)
    left.parent.mkdir(parents=True)
    left.write_text(KUBECONFIG)
    access = linked_access(runtime(tmp_path), west(), KEY)
    assert access is not None
    assert access.server == "https://127.0.0.1:13178"


def test_a_member_that_never_had_an_api_server_has_no_access(tmp_path: Path) -> None:
    assert linked_access(runtime(tmp_path), west(), KEY) is None


def test_an_adopted_cluster_not_adopted_again_yet_is_read_through_its_copied_kubeconfig(
        tmp_path: Path) -> None:
    """The same race for an external member: its Hello before the restarted operator read its
    Secret again goes through the copy the earlier operator wrote (not the local admin's)."""
    state = StateDir(tmp_path)
    state.kubeconfig(KEY).parent.mkdir(parents=True)
    state.kubeconfig(KEY).write_text(KUBECONFIG.replace("13178", "1"))
    state.member_kubeconfig(KEY).write_text(KUBECONFIG)
    access = linked_access(runtime(tmp_path), west(ADOPTED), KEY)
    assert access is not None
    assert access.server == "https://127.0.0.1:13178"


def test_an_adopted_cluster_never_adopted_here_has_no_access(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.kubeconfig(KEY).parent.mkdir(parents=True)
    state.kubeconfig(KEY).write_text(KUBECONFIG)  # not its: an adopted cluster has none
    assert linked_access(runtime(tmp_path), west(ADOPTED), KEY) is None
