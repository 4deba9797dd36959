"""Create-or-replace of whole objects, and waiting for CRDs to be served."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def collection_path(obj: dict[str, Any], plural: str) -> str:
    """The collection URL of ``obj`` (core or grouped, namespaced or not)."""
    group_version: str = obj["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    namespace = obj.get("metadata", {}).get("namespace")
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


async def apply(client: Client, obj: dict[str, Any], plural: str) -> Any:
    """Create ``obj``, or replace it (keeping its resourceVersion) when it exists."""
    collection = collection_path(obj, plural)
    try:
        return await client.create(collection, obj)
    except Conflict as error:
        if not error.already_exists:
            raise
    path = f"{collection}/{obj['metadata']['name']}"
    for _ in range(5):
        current = await client.get(path)
        body = {**obj, "metadata": {**obj["metadata"],
                                    "resourceVersion": current["metadata"]["resourceVersion"]}}
        try:
            return await client.replace(path, body)
        except Conflict:
            continue
    raise K8sError(f"could not replace {path}: it kept changing")


async def install_crds(client: Client, crds: list[dict[str, Any]], *,
                       timeout: float = 60.0) -> None:
    """Apply CRDs and wait until the API server serves each of them (condition Established)."""
    for crd in crds:
        await apply(client, crd, "customresourcedefinitions")
    await wait_established(client, [crd["metadata"]["name"] for crd in crds], timeout=timeout)


async def wait_established(client: Client, names: list[str], *, timeout: float = 60.0) -> None:
    """Wait until the API server serves each of the CRDs ``names`` (condition Established)."""
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            try:
                current = await client.get(f"{CRDS}/{name}")
                # A CRD just created may show "conditions": null for a moment.
                conditions = (current.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True"
                       for c in conditions):
                    break
            except NotFound:
                pass
            if time.monotonic() > deadline:
                raise K8sError(f"CRD {name} was not Established after {timeout:.0f}s")
            await asyncio.sleep(0.2)
