"""What the plan commands act on: where the host cluster and its FaultPlans are
(:class:`PlanTarget`), and the FaultPlans of a file, checked against the API's model before
anything is sent.

Reading and deciding only: nothing here writes to the host cluster or prints.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from operators.api.base import API_VERSION
from operators.api.faultplans import FaultPlan, FaultPlanSpec
from operators.cli import documents
from operators.cli.terminal import default_state_dir, host_client
from operators.controlplane.errors import StateError
from operators.controlplane.state import StateDir
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError


@dataclasses.dataclass(frozen=True)
class PlanTarget:
    """Where the plan commands find the host cluster and the plans."""

    state_dir: Path
    host_kubeconfig: Path | None

    def client(self) -> Client:
        if self.host_kubeconfig is None:
            return host_client(self.state_dir)
        try:
            return Client.connect(load_kubeconfig_file(self.host_kubeconfig))
        except K8sError as error:
            raise StateError(f"--kubeconfig {self.host_kubeconfig}: {error}") from error

    def kubeconfig_path(self) -> Path:
        return self.host_kubeconfig or StateDir(self.state_dir.resolve()).host_kubeconfig

    def flags(self, namespace: str) -> str:
        """The options that lead another fakefleet command to the same plan."""
        flags = f" -n {namespace}" if namespace != "default" else ""
        if self.host_kubeconfig is not None:
            return f"{flags} --kubeconfig {self.host_kubeconfig}"
        if self.state_dir.resolve() != default_state_dir().resolve():
            return f"{flags} --state-dir {self.state_dir}"
        return flags


@dataclasses.dataclass(frozen=True)
class PlanDocument:
    """A FaultPlan of a file: where it goes, the body to create, and its validated spec."""

    namespace: str
    name: str
    body: dict[str, Any]
    spec: FaultPlanSpec


def read_plans(file: TextIO, namespace: str | None) -> list[PlanDocument]:
    """The FaultPlans of ``file``, checked against the API's model before anything is sent."""
    source = file.name
    try:
        found = documents.read(file)
    except documents.DocumentError as error:
        raise StateError(str(error)) from None
    if not found:
        raise StateError(f"{source} holds no document: give a file with a FaultPlan")
    plans: list[PlanDocument] = []
    for number, document in enumerate(found, 1):
        where = f"{source}, document {number}"
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind != "FaultPlan":
            raise StateError(
                f"{where} is {f'a {kind}' if kind else 'not a Kubernetes object'}, not a "
                f"FaultPlan: apply other objects with kubectl (workloads go to the member "
                f"cluster: kubectl --kubeconfig <(fakefleet kubeconfig CLUSTER) apply -f ...)")
        if document.get("apiVersion") != API_VERSION:
            raise StateError(f"{where}: apiVersion {document.get('apiVersion')!r}: a FaultPlan "
                             f"is {API_VERSION}")
        try:
            metadata = documents.mapping(document.get("metadata"), f"{where}: metadata")
        except documents.DocumentError as error:
            raise StateError(str(error)) from None
        name = metadata.get("name")
        if not name or not isinstance(name, str):
            raise StateError(f"{where}: the FaultPlan has no metadata.name: give it one (a "
                             f"name, as text)")
        own = metadata.get("namespace")
        if namespace and own and own != namespace:
            raise StateError(f"{where}: FaultPlan {name} is in namespace {own}, but -n gives "
                             f"{namespace}: drop one of them")
        try:
            spec = FaultPlan.model_validate(document).spec
        except ValidationError as error:
            raise StateError(f"{where}: FaultPlan {name} is not valid:\n"
                             f"{_validation_errors(error)}") from None
        namespace_ = namespace or own or "default"
        if any((p.namespace, p.name) == (namespace_, name) for p in plans):
            raise StateError(f"{where}: FaultPlan {namespace_}/{name} is in {source} twice: "
                             f"give each plan its own name")
        body = {**document, "metadata": {**metadata, "namespace": namespace_}}
        plans.append(PlanDocument(namespace_, name, body, spec))
    return plans


def _validation_errors(error: ValidationError) -> str:
    return "\n".join(
        f"  {'.'.join(str(part) for part in detail['loc'])}: {detail['msg']} "
        f"(got {detail['input']!r})" for detail in error.errors())


def plans_path(namespace: str, name: str = "") -> str:
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/faultplans"
    return f"{path}/{name}" if name else path


def same_spec(existing: dict[str, Any], spec: FaultPlanSpec) -> bool:
    """Whether the plan in the API has ``spec``, defaults filled in on both sides."""
    try:
        current = FaultPlanSpec.model_validate(existing.get("spec") or {})
    except ValidationError:
        return False
    return current.model_dump() == spec.model_dump()
