"""Conditional writes of an object others write too: a merge patch computed from the object as
observed, carrying its resourceVersion, computed again from a fresh read after a 409.

Two writers share objects this way. The engine writes the Node's taints (a list replaced whole:
the node-lifecycle controller's taints must survive it) and marks a fault set done; the
FaultPlan runner turns fault sets to their recovery, adds and removes a FakeCluster's fault
entries (``fakefleet.dev/faults``) and holds deleted nodes in their pools
(``fakefleet.dev/held-nodes``). Neither may undo a change it did not see, so each write is
conditional on the version it was computed from; on a conflict the object is read again and
the change computed anew, from what is there now (the set may have turned meanwhile: then
there is nothing left to write).

This module sends the requests and nothing else: what to change is the caller's ``change``,
and what a failure means (retry later, give up, tell the user) is the caller's to decide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from operators.k8s.client import Client
from operators.k8s.errors import Conflict, NotFound

T = TypeVar("T")

ATTEMPTS = 4


async def patch_until_current(
    client: Client,
    path: str,
    observed: T,
    change: Callable[[T], dict[str, Any] | None],
    reread: Callable[[Any], T | None],
    *,
    attempts: int = ATTEMPTS,
    decode: bool = True,
) -> tuple[Any, T]:
    """Merge-patch ``path`` with ``change(observed)`` (which carries the resourceVersion it was
    computed from); on a 409, GET the object, ``reread`` it and compute again. Returns the
    object the PATCH answered (None when there was nothing to change, or ``decode`` is off)
    and what the change was last computed from. Raises NotFound when the object is gone or
    ``reread`` finds it replaced (None), Conflict when it changed ``attempts`` times in a row,
    and any other K8sError as it comes."""
    for _ in range(attempts):
        patch = change(observed)
        if patch is None:
            return None, observed
        try:
            return await client.patch(path, patch, decode=decode), observed
        except Conflict:
            fresh = reread(await client.get(path))
            if fresh is None:
                raise NotFound(404, "NotFound", f"{path} was deleted and made again") from None
            observed = fresh
    raise Conflict(409, "Conflict", f"{path} changed {attempts} times while being written")
