"""Kinds found through API discovery, over the in-memory transport: one look per group version
and server, subresources ignored, a kind the server lacks said for good, and objects listed by
the plural and scope found (a namespace only where the kind has one)."""

from __future__ import annotations

import pytest

from operators.k8s.client import Client
from operators.k8s.discovery import Known, UnknownKind, list_objects, resource
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

CORE = [{"name": "nodes", "kind": "Node", "namespaced": False},
        {"name": "nodes/status", "kind": "Node", "namespaced": False},
        {"name": "pods", "kind": "Pod", "namespaced": True}]


def served() -> tuple[MemoryTransport, Client]:
    api = MemoryTransport(FakeClock())
    api.discover("v1", CORE)
    api.discover("batch/v1", [{"name": "jobs", "kind": "Job", "namespaced": True}])
    return api, Client(api, server="https://west")


async def test_a_group_version_is_asked_once_and_every_kind_in_it_kept() -> None:
    api, client = served()
    known: Known = {}
    assert await resource(client, "v1", "Node", known=known) == ("nodes", False)
    assert await resource(client, "v1", "Pod", known=known) == ("pods", True)
    assert len(api.sent("GET", "/api/v1")) == 1
    assert known[("https://west", "v1", "Node")] == ("nodes", False), \
        "the subresource does not pass for the kind"
    other = Client(api, server="https://east")
    await resource(other, "v1", "Node", known=known)
    assert len(api.sent("GET", "/api/v1")) == 2, "another server is asked for itself"


async def test_a_kind_the_server_lacks_is_unknown_for_good() -> None:
    _, client = served()
    with pytest.raises(UnknownKind, match="the API has no kind Widget in v1"):
        await resource(client, "v1", "Widget", known={})


async def test_objects_are_listed_by_plural_scope_and_name() -> None:
    api, client = served()
    api.put("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-0"}})
    api.put("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-1"}})
    for namespace in ("a", "b"):
        api.put(f"/apis/batch/v1/namespaces/{namespace}/jobs",
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}})
    known: Known = {}
    nodes = await list_objects(client, "v1", "Node", namespace="ignored", known=known)
    assert [n["metadata"]["name"] for n in nodes] == ["n-0", "n-1"]
    assert api.sent("GET", "/api/v1/nodes"), "a cluster-scoped kind has no namespace"
    named = await list_objects(client, "v1", "Node", name="n-1", known=known)
    assert [n["metadata"]["name"] for n in named] == ["n-1"]
    jobs = await list_objects(client, "batch/v1", "Job", namespace="b", known=known)
    assert [j["metadata"]["namespace"] for j in jobs] == ["b"]
    everywhere = await list_objects(client, "batch/v1", "Job", known=known)
    assert len(everywhere) == 2
