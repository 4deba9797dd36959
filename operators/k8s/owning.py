"""Objects fakefleet writes by name, and the rule that it never takes over one it did not make.

A FakeCluster's kubeconfig Secret, a FaultPlan's list of victims and its fault sets in a member
(and the member namespace ``fakefleet-system`` that holds them), an add-on's Services,
APIService, webhooks, CRDs, RBAC and MultiKueue objects in a member: each has a name fixed in
advance, so a user's object may already stand there. fakefleet marks what it makes with the
annotation ``fakefleet.dev/owned-by: <Kind>/<name>`` of its writer (an :class:`Owner`), and
before it replaces or deletes an object by name it reads it: one that is not its own (no
marker of this writer, nor what the writer put on its objects before the marker existed, the
owner's ``legacy`` test) raises :class:`~operators.k8s.errors.NotOwned`, naming the object
and the fix, and the object is left untouched.

Replacing is conditional on the resourceVersion that was judged, so an object changed hands
between the read and the write is judged again. Creating is not (the API has no "create only
if absent" for server-side apply): an object a user makes in the milliseconds between fakefleet's
read and its create is merged into, as before this rule.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from operators.k8s.applying import collection_path
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound, NotOwned
from operators.k8s.requests import delete_options
from primitives import keys

logger = logging.getLogger(__name__)

#: Tries of a conditional replace whose object keeps changing.
REPLACE_TRIES = 5

Test = Callable[[Mapping[str, Any]], bool]


def never(obj: Mapping[str, Any]) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who writes an object: the marker it puts on it, and how it recognises what it made
    before it put one (``legacy``)."""

    writer: str
    """``<Kind>/<name>`` of the writer: ``FakeCluster/west``, ``Addon/kueue``."""
    legacy: Test = never

    def mark(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """``obj`` with the marker."""
        marked = copy.deepcopy(dict(obj))
        metadata = marked.setdefault("metadata", {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                   keys.OWNED_BY: self.writer}
        return marked

    def owns(self, obj: Mapping[str, Any]) -> bool:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        return annotations.get(keys.OWNED_BY) == self.writer or self.legacy(obj)


def owner_reference(uid: str) -> Test:
    """Made for the object with ``uid`` (its ownerReferences name it)."""
    return lambda obj: bool(uid) and any(
        ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or ())


def labelled(key: str, value: str) -> Test:
    return lambda obj: ((obj.get("metadata") or {}).get("labels") or {}).get(key) == value


def field_manager(manager: str) -> Test:
    """Written by server-side apply under ``manager`` (its managedFields say so)."""
    return lambda obj: any(entry.get("manager") == manager
                           for entry in (obj.get("metadata") or {}).get("managedFields") or ())


def any_of(*tests: Test) -> Test:
    return lambda obj: any(test(obj) for test in tests)


def refusal(obj: Mapping[str, Any], owner: Owner) -> NotOwned:
    """The error that says ``obj`` is not ``owner``'s, who seems to have made it, and what to
    do."""
    meta = obj.get("metadata") or {}
    kind, namespace, name = str(obj.get("kind") or "object"), str(meta.get("namespace") or ""), \
        str(meta.get("name") or "")
    where = f"{namespace}/{name}" if namespace else name
    managers = sorted({str(entry.get("manager")) for entry in meta.get("managedFields") or ()
                       if entry.get("manager")})
    said = (meta.get("annotations") or {}).get(keys.OWNED_BY)
    made = f"; it says it belongs to {said}" if said else (
        f"; it was written by {', '.join(managers)}" if managers else "")
    return NotOwned(
        f"{kind} {where} exists and {owner.writer} did not make it (no annotation "
        f"{keys.OWNED_BY}: {owner.writer}){made}: fakefleet leaves it untouched; delete or "
        f"rename it, and fakefleet makes its own", kind=kind, namespace=namespace, name=name)


async def _current(client: Client, path: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await client.get(path)
    except NotFound:
        return None
    return found


async def apply(client: Client, obj: Mapping[str, Any], plural: str, *, owner: Owner) -> Any:
    """Create ``obj`` marked as ``owner``'s, or replace it if it is ``owner``'s; NotOwned if an
    object of another stands there."""
    body = owner.mark(obj)
    collection = collection_path(body, plural)
    try:
        return await client.create(collection, body)
    except Conflict as error:
        if not error.already_exists:
            raise
    path = f"{collection}/{body['metadata']['name']}"
    for _ in range(REPLACE_TRIES):
        current = await _current(client, path)
        if current is None:
            return await client.create(collection, body)
        if not owner.owns(current):
            raise refusal(current, owner)
        replacing = {**body, "metadata": {**body["metadata"], "resourceVersion":
                                          current["metadata"]["resourceVersion"]}}
        try:
            return await client.replace(path, replacing)
        except Conflict:
            continue
    raise K8sError(f"could not replace {path}: it kept changing")


async def server_side_apply(client: Client, path: str, obj: Mapping[str, Any], *,
                            owner: Owner, field_manager: str) -> Any:
    """Server-side apply of ``obj`` marked as ``owner``'s, unless an object of another stands
    at ``path`` (NotOwned); conditional on the resourceVersion judged."""
    body = owner.mark(obj)
    for _ in range(REPLACE_TRIES):
        current = await _current(client, path)
        if current is not None and not owner.owns(current):
            raise refusal({**current, "kind": current.get("kind") or body.get("kind")}, owner)
        applied = body if current is None else {**body, "metadata": {
            **body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        try:
            return await client.server_side_apply(path, applied, field_manager=field_manager)
        except Conflict:
            continue  # changed since it was judged: judge it again
    raise K8sError(f"could not apply {path}: it kept changing")


async def ensure_namespace(client: Client, name: str, *, owner: Owner) -> None:
    """Make namespace ``name``, marked as ``owner``'s, unless it is there and ``owner``'s
    already; NotOwned when one of another stands there (then nothing of ours goes into it)."""
    path = f"/api/v1/namespaces/{name}"
    current = await _current(client, path)
    if current is None:
        try:
            await client.create("/api/v1/namespaces", owner.mark({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                decode=False)
            return
        except Conflict as error:
            if not error.already_exists:
                raise
        current = await client.get(path)
    if not owner.owns(current):
        raise refusal({**current, "kind": "Namespace"}, owner)


async def delete(client: Client, path: str, *, owner: Owner) -> bool:
    """Delete the object at ``path`` if it is ``owner``'s (exactly the one judged: a uid
    precondition); whether it was deleted. One of another's stays, with a line in the log."""
    current = await _current(client, path)
    if current is None:
        return False
    if not owner.owns(current):
        logger.info("%s", refusal(current, owner))
        return False
    try:
        await client.delete(path, body=delete_options(uid=current["metadata"].get("uid")))
    except NotFound:
        return False
    return True
