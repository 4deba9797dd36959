"""The member's fault sets (:mod:`operators.api.faultsets`): watched, indexed by target, and
marked done once every target ran its stages.

A FaultPlan step writes one set per member it hits. This module lists and watches them (the
ConfigMaps labelled ``fakefleet.dev/fault-set`` in ``fakefleet-system``) and gives each node
and pod the entries its sets carry for it (:meth:`FaultSets.node`, :meth:`FaultSets.pod`), in
the order the sets were made: the heartbeats and the pod lifecycle run them through the same
:class:`~operators.engine.stages.Rulebook` as the defaults. When a set comes, changes state or
goes, its targets are planned again (:class:`Listener`). A ConfigMap that holds no set is
ignored, with a Warning Event about it (``InvalidFaultSet``).

Done: when a target's stage with ``endFault`` was written (:meth:`FaultSets.finished`), the
entry is done for that target, in memory; once every target of a set is done, or gone, the set
is marked done with one conditional PATCH (:func:`~operators.api.faultsets.done_patch`): one
write per set, not one per target. A set whose state changed meanwhile (the plan turned it to
its recovery) is not marked: what its targets finished belonged to the old state.

The engine runs no stage and renews no Lease before the sets are listed
(:attr:`FaultSets.listed`): the defaults would undo what a fault holds (make a NotReady node
Ready, an Unreachable one heartbeat). A restarted engine knows nothing of what finished before
it: it runs a set's live stages on every target again. Fault stages select what their write
changes (a NotReady only a node not NotReady yet, a one-shot exit only at the restart count it
was written for), and a recovery written again changes nothing the API shows, so no target is
hit twice and none is skipped; the set is marked done once, by the engine that sees its last
target finish.

Gone: a node the engine does not play, once its nodes are listed; a pod it does not run, once
its pods are listed and the set was seen GONE_AFTER seconds before (a pod bound a moment before
the set was written may not have reached the engine's watch yet). Gone targets are looked for
every REVIEW seconds.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from operators.api import faultsets
from operators.api.faultsets import FaultSet, Kind, SetError
from operators.engine.recording import EventRecorder
from operators.engine.stages import Carried, Faults
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.k8s.patching import patch_until_current
from operators.k8s.watching import list_and_watch
from primitives import keys
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

#: Seconds after a set was first seen before a pod target the engine does not run counts as
#: gone (the watch of pods may lag the watch of sets, never by this much).
GONE_AFTER = 30.0
#: How often the open sets are looked over for targets that went (s).
REVIEW = 2.0


class Listener(Protocol):
    """What the engine's halves hear of the sets, and tell of their targets."""

    def faults_changed(self, kind: Kind, targets: Iterable[str]) -> None:
        """The entries of these targets (node names, pod uids) changed: plan them again."""

    def present(self, kind: Kind, target: str) -> bool | None:
        """Whether the engine plays the node (runs the pod) now; None while it cannot tell
        (its nodes or pods are not listed yet)."""


class _Set:
    """A set as the engine holds it: what the API shows, the targets done in its state, and
    its entries as each target carries them."""

    __slots__ = ("carried", "done", "found", "seen_at")

    def __init__(self, found: FaultSet, seen_at: float) -> None:
        self.found = found
        self.seen_at = seen_at
        self.done: set[str] = set()
        self.carried = tuple(Carried((found.uid, index, found.state), group.entry)
                             for index, group in enumerate(found.groups))

    def live(self, target: str) -> bool:
        """Whether the set's entry is live for ``target``."""
        return self.found.state != "done" and target not in self.done

    def targets(self) -> Iterator[tuple[int, str]]:
        """(group, target) of every target, pods by uid."""
        pods = self.found.kind == "Pod"
        for index, group in enumerate(self.found.groups):
            for target in group.targets:
                yield index, faultsets.pod_uid(target) if pods else target


class FaultSets:
    """The fault sets of one member cluster; :meth:`run` until cancelled."""

    def __init__(self, cluster: str, client: Client, listener: Listener,
                 recorder: EventRecorder, *, clock: Clock) -> None:
        self.cluster = cluster
        self._client = client
        self._listener = listener
        self._recorder = recorder
        self._clock = clock
        self._sets: dict[str, _Set] = {}
        #: (kind, target) → (set name, group), in the order the sets were made.
        self._index: dict[tuple[Kind, str], list[tuple[str, int]]] = {}
        self._warned: dict[str, str] = {}  # ConfigMap name → its unreadable version warned of
        self._dirty = asyncio.Event()
        self._reviewed = float("-inf")
        #: Set once the sets were listed: before that, no stage may run (a node a fault holds
        #: NotReady would be made Ready by the defaults).
        self.listed = asyncio.Event()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(list_and_watch(
                self._client, faultsets.CONFIGMAPS, {"labelSelector": keys.FAULT_SET},
                on_list=self._relisted, on_event=self._changed, clock=self._clock))
            group.create_task(self._review())

    # -- what the targets carry --------------------------------------------------------------

    def node(self, name: str) -> Faults:
        return self._carried("Node", name)

    def pod(self, uid: str) -> Faults:
        return self._carried("Pod", uid)

    def _carried(self, kind: Kind, target: str) -> Faults:
        found: list[Carried] = []
        for name, group in self._index.get((kind, target), ()):
            held = self._sets[name]
            if held.live(target):
                found.append(held.carried[group])
        return tuple(found)

    def finished(self, entry: str, state: str, kind: Kind, target: str) -> None:
        """``target`` ran the stage that ends entry ``entry`` in ``state``: done for it."""
        for name, _ in self._index.get((kind, target), ()):
            held = self._sets[name]
            if held.found.id == entry and held.found.state == state:
                held.done.add(target)
                self._dirty.set()

    # -- the watch ---------------------------------------------------------------------------

    def _relisted(self, items: list[Any]) -> None:
        present = {item["metadata"]["name"] for item in items}
        for name in [name for name in self._sets if name not in present]:
            self._forget(name)
        for item in items:
            self._changed("ADDED", item)
        self.listed.set()

    def _changed(self, kind: str, obj: Any) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self._forget(name)
            return
        try:
            found = faultsets.read(obj)
        except SetError as error:
            self._forget(name)
            self._warn(obj, str(error))
            return
        self._warned.pop(name, None)
        held = self._sets.get(name)
        if held is not None and held.found.uid == found.uid and \
                _shape(held.found) == _shape(found):
            self._moved(held, found)
            return
        if held is not None:
            self._forget(name)
        self._add(_Set(found, self._clock.now()))

    def _add(self, held: _Set) -> None:
        found = held.found
        self._sets[found.name] = held
        for group, target in held.targets():
            refs = self._index.setdefault((found.kind, target), [])
            bisect.insort(refs, (found.name, group), key=self._made)
        self._listener.faults_changed(found.kind, {target for _, target in held.targets()})
        self._dirty.set()

    def _made(self, ref: tuple[str, int]) -> tuple[str, str]:
        """Where a target's entry from set ``ref`` comes: in the order the sets were made."""
        return self._sets[ref[0]].found.created, ref[0]

    def _moved(self, held: _Set, found: FaultSet) -> None:
        """The same set in a new version: a new state starts with nothing done."""
        before = held.found
        live = {target: held.live(target) for _, target in held.targets()}
        if found.state != before.state:
            held.done.clear()
        held.found = found
        held.carried = tuple(Carried((found.uid, index, found.state), group.entry)
                             for index, group in enumerate(found.groups))
        self._dirty.set()
        if (found.state, found.traceparent) == (before.state, before.traceparent):
            return  # another version of the same: the targets carry what they carried
        changed = {target for target, was in live.items() if was or held.live(target)}
        if changed:
            self._listener.faults_changed(found.kind, changed)

    def _forget(self, name: str) -> None:
        held = self._sets.pop(name, None)
        if held is None:
            return
        kind = held.found.kind
        targets = set()
        for group, target in held.targets():
            refs = self._index.get((kind, target), [])
            if (name, group) in refs:
                refs.remove((name, group))
            if not refs:
                self._index.pop((kind, target), None)
            targets.add(target)
        self._listener.faults_changed(kind, targets)

    def _warn(self, obj: Any, problem: str) -> None:
        metadata = obj["metadata"]
        version = metadata.get("resourceVersion", "")
        if self._warned.get(metadata["name"]) == version:
            return
        self._warned[metadata["name"]] = version
        logger.warning("engine %s: %s; it is ignored", self.cluster, problem)
        self._recorder.emit(kind="ConfigMap", name=metadata["name"], uid=metadata.get("uid", ""),
                            namespace=faultsets.NAMESPACE, event_type="Warning",
                            reason="InvalidFaultSet", message=f"{problem}; it is ignored",
                            host=self.cluster)

    # -- done ----------------------------------------------------------------------------------

    async def _review(self) -> None:
        """Mark done every set whose targets are all done (at once) or gone (every REVIEW)."""
        while True:
            await self._clock.wait(self._dirty, REVIEW)
            self._dirty.clear()
            now = self._clock.now()
            thorough = now - self._reviewed >= REVIEW
            if thorough:
                self._reviewed = now
            for name, held in list(self._sets.items()):
                if held.found.state != "done" and self._finished(held, now, thorough=thorough):
                    await self._mark_done(name, held)

    def _finished(self, held: _Set, now: float, *, thorough: bool) -> bool:
        if len(held.done) >= held.found.targets:
            return True
        if not thorough:
            return False
        kind = held.found.kind
        for _, target in held.targets():
            if target in held.done:
                continue
            present = self._listener.present(kind, target)
            if present is None or present or (kind == "Pod"
                                               and now - held.seen_at < GONE_AFTER):
                return False
        return True

    async def _mark_done(self, name: str, held: _Set) -> None:
        state = held.found.state
        uid = held.found.uid

        def reread(obj: Any) -> FaultSet | None:
            try:
                fresh = faultsets.read(obj)
            except SetError:
                return None
            return fresh if fresh.uid == uid else None
        try:
            written, _ = await patch_until_current(
                self._client, f"{faultsets.CONFIGMAPS}/{name}", held.found,
                lambda found: faultsets.done_patch(found, state), reread)
        except NotFound:
            return  # deleted meanwhile (the plan went): nothing to mark
        except K8sError as error:
            logger.info("engine %s: fault set %s not marked done yet: %s", self.cluster, name,
                        error)
            self._dirty.set()
            await self._clock.sleep(REVIEW)
            return
        if written is not None and self._sets.get(name) is held:
            self._changed("MODIFIED", written)  # before the watch shows it: not twice


def _shape(found: FaultSet) -> list[tuple[tuple[str, ...], Any, Any]]:
    """What a set does to which targets, whatever its state and trace: a set whose shape is
    the same is the same set in a new state."""
    return [(group.targets, group.entry.stages, group.entry.recovery) for group in found.groups]
