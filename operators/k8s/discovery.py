"""Which resource serves a kind, as an API server's discovery says, and the objects of a kind.

Callers name objects the way users write them (``apiVersion`` and ``kind``, as in a FaultPlan's
expectations); the API serves them under a plural, namespaced or not. :func:`resource` asks the
server's discovery document once per group version and keeps every kind it lists in ``known``,
a cache the caller owns (one per FaultPlan runner: a CRD installed meanwhile is found by the
next runner); :func:`list_objects` lists by it.

I/O and nothing else: what the objects mean is the caller's (:mod:`operators.faults.
expectations` judges them).
"""

from __future__ import annotations

from typing import Any

from operators.k8s.client import Client

#: (server, apiVersion, kind) → (plural, namespaced).
Known = dict[tuple[str, str, str], tuple[str, bool]]


class UnknownKind(LookupError):
    """The server's discovery lists no such kind in that group version (for good: not an API
    error to try again)."""


def group_path(api_version: str) -> str:
    """The path of a group version: ``/api/v1`` for the core group, else ``/apis/<gv>``."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


async def resource(client: Client, api_version: str, kind: str, *,
                   known: Known) -> tuple[str, bool]:
    """(plural, namespaced) of ``kind`` on ``client``'s server; UnknownKind if it serves none."""
    key = (client.server, api_version, kind)
    if key not in known:
        found = await client.get(group_path(api_version))
        for listed in found.get("resources") or ():
            if "/" not in listed["name"]:  # not a subresource
                known[(client.server, api_version, listed["kind"])] = (
                    listed["name"], bool(listed.get("namespaced")))
        if key not in known:
            raise UnknownKind(f"the API has no kind {kind} in {api_version}")
    return known[key]


async def list_objects(client: Client, api_version: str, kind: str, *, namespace: str = "",
                       name: str = "", known: Known) -> list[Any]:
    """The objects of ``kind`` (in ``namespace`` if it is namespaced and one is given; the one
    named ``name`` if given)."""
    plural, namespaced = await resource(client, api_version, kind, known=known)
    prefix = group_path(api_version)
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespaced and namespace else \
        f"{prefix}/{plural}"
    params = {"fieldSelector": f"metadata.name={name}"} if name else None
    found = await client.get(path, params)
    items: list[Any] = found.get("items") or []
    return items
