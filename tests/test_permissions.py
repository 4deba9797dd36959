"""The operator's permissions: one list, expanded into the questions the operator asks at start
(over a transport that answers SelfSubjectAccessReviews), the refusal that names each verb and
resource it lacks, and the chart's generated copy."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import yaml

from operators.handlers import permissions
from operators.k8s.client import Client
from operators.k8s.requests import Request
from operators.k8s.transport import Response, StreamResponse

CHART_FILES = Path(__file__).parent.parent / "charts" / "fakefleet" / "files"


class Authorizer:
    """Answers SelfSubjectAccessReviews: allowed unless (verb, resource[/sub], namespace) is
    in ``denied``."""

    def __init__(self, denied: set[tuple[str, str, str]]) -> None:
        self.denied = denied
        self.asked: list[dict[str, Any]] = []

    async def send(self, request: Request) -> Response:
        assert (request.method, request.path) == ("POST", permissions.REVIEWS)
        review = request.json()
        attributes = review["spec"]["resourceAttributes"]
        self.asked.append(attributes)
        resource = attributes["resource"] + (f"/{attributes['subresource']}"
                                             if "subresource" in attributes else "")
        allowed = (attributes["verb"], resource, attributes.get("namespace", "")) \
            not in self.denied
        body = {**review, "status": {"allowed": allowed}}
        return Response(201, {}, json.dumps(body).encode())

    def stream(self, request: Request) -> contextlib.AbstractAsyncContextManager[StreamResponse]:
        raise NotImplementedError

    def refresh_credentials(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_namespaced_operator_asks_only_about_its_namespaces() -> None:
    wanted = permissions.accesses(namespaces=["fleet-a", "fleet-b"], install_crds=False)
    assert {a.namespace for a in wanted} == {"fleet-a", "fleet-b"}
    assert not any(a.resource == "customresourcedefinitions" for a in wanted)
    authorizer = Authorizer(set())
    assert await permissions.missing(Client(authorizer), wanted) == []
    assert len(authorizer.asked) == len(wanted)
    status = next(a for a in authorizer.asked if a.get("subresource") == "status")
    assert status["group"] == "fakefleet.dev"
    assert status["verb"] == "patch"


async def test_a_cluster_wide_operator_needs_all_namespaces_and_to_watch_crds() -> None:
    wanted = permissions.accesses(namespaces=[], install_crds=True)
    assert {a.namespace for a in wanted} == {""}
    crds = {(a.verb, a.resource) for a in wanted if a.group == "apiextensions.k8s.io"}
    assert crds == {(verb, "customresourcedefinitions")
                    for verb in ("list", "watch", "get", "create", "update")}


async def test_what_is_missing_is_named_verb_and_resource() -> None:
    wanted = permissions.accesses(namespaces=["fleet"], install_crds=False)
    authorizer = Authorizer({("patch", "fakeclusters/status", "fleet"),
                             ("create", "events", "fleet")})
    lacking = await permissions.missing(Client(authorizer), wanted)
    assert [a.describe() for a in lacking] == [
        "patch fakeclusters/status in API group 'fakefleet.dev' in namespace fleet",
        "create events in namespace fleet"]
    message = permissions.refusal(lacking, "the pod's service account (/sa)")
    assert message.startswith("forbidden: the pod's service account (/sa) may not patch "
                              "fakeclusters/status in API group 'fakefleet.dev' in namespace "
                              "fleet; create events in namespace fleet.")
    assert "does not start" in message


def test_the_chart_holds_exactly_the_generated_rules(tmp_path: Path) -> None:
    written = permissions.write_chart_files(tmp_path)
    for path in written:
        assert (CHART_FILES / path.name).read_text() == path.read_text(), \
            f"charts/fakefleet/files/{path.name} drifted: run 'make generate'"
    rules = yaml.safe_load((tmp_path / "rbac-namespaced.yaml").read_text())
    verbs = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
             for resource in rule["resources"] for verb in rule["verbs"]}
    assert ("fakefleet.dev", "fakenodepools/status", "patch") in verbs
    assert ("", "secrets", "get") in verbs
    assert not any(verb in ("*", "deletecollection") or resource == "*"
                   for _, resource, verb in verbs), "least privilege: no wildcards"

