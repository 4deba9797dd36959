"""The engine's book of nodes: what the node watch shows, and which of those nodes it plays.
Pure book-keeping: no I/O, no clock.

Two views, kept apart on purpose:

- ``facts``: every node carrying the pool label as last observed (foreign ones included), plus
  what a successful write just created, so the planner never makes a node twice;
- ``records``: the nodes the engine plays (its own and those it took over from a provisioner,
  usable), with what it needs to keep them alive: pod CIDR slot, Lease timing, and their
  :class:`~operators.engine.nodes.NodeLife`.

A record appears when a create (or a take-over) succeeded or when the watch shows a node the
engine plays that it did not know (adoption after a restart; never one whose take-over is
under way); it goes when a delete succeeded
or the watch shows the node gone. Listeners hear of each so timers start and stop with the
node (and pods bound to it before its record came run), and of a node gone that was never
played. A provisioner's node that the watch shows gone leaves its name in ``released``, until
its Lease is deleted.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from operators.api.injections import FaultEntry
from operators.engine import nodes
from operators.engine.nodes import NodeFacts, NodeLife

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 40


class NodeRecord:
    """What the engine remembers of one node it plays: a few words, not the object."""

    __slots__ = ("failures", "lease_duration", "leased", "life", "pool", "provisioned",
                 "renew_at", "renewed_at", "slot", "uid")

    def __init__(self, pool: str, slot: int, uid: str, lease_duration: int,
                 life: NodeLife, *, provisioned: bool = False) -> None:
        self.pool = pool
        self.provisioned = provisioned  # made by a provisioner, taken over
        self.slot = slot
        self.uid = uid
        self.lease_duration = lease_duration
        self.life = life
        self.leased = True  # False: its Lease is missing and must be created
        self.renew_at = 0.0  # when the next renewal is due (0: not scheduled yet)
        #: When the Lease was last renewed, as far as the engine knows (0: not known), for the
        #: renewal gaps (:mod:`~operators.engine.alerting`).
        self.renewed_at = 0.0
        self.failures = 0  # consecutive failed writes (for back-off)


class Listener(Protocol):
    def adopted(self, name: str) -> None:
        """A node of the engine's own, not known before, is now played."""

    def updated(self, name: str) -> None:
        """Someone changed a played node (its Ready condition, its annotations...)."""

    def forgotten(self, name: str) -> None:
        """A played node is gone."""

    def vanished(self, name: str) -> None:
        """A node the engine did not play is gone (one about to be played, perhaps)."""

    def foreign(self, facts: NodeFacts) -> None:
        """A node the engine cannot use appeared (it carries the pool label)."""

    def carried(self, name: str) -> Iterable[FaultEntry]:
        """The fault entries in force on the node (what they did to its GPUs is part of the
        life of a node adopted after a restart)."""

    def provisioned(self, facts: NodeFacts) -> None:
        """A node a provisioner made for a pool appeared: the engine takes it over."""


class NodeBook:
    """Facts and records of one cluster's fake nodes."""

    def __init__(self, cluster: str, listener: Listener) -> None:
        self.cluster = cluster
        self.facts: dict[str, NodeFacts] = {}
        self.records: dict[str, NodeRecord] = {}
        #: Pod CIDR slot → name of the played node that has it (its address says the slot).
        self.by_slot: dict[int, str] = {}
        self.lease_seconds: Mapping[str, int] = {}  # per pool, from the desired specs
        self._listener = listener
        self._slots_used: set[int] = set()
        self._slot_hint = 0  # no free slot below it
        #: Slots of creates whose outcome is unknown (no answer): the node may exist with it.
        self._reserved: dict[str, int] = {}
        self._deleted: set[str] = set()  # uids the engine deleted, until the watch agrees
        #: Provisioners' nodes gone, whose Leases are still to delete.
        self.released: set[str] = set()
        #: Provisioners' nodes whose take-over is under way, with the resourceVersions the
        #: watch showed meanwhile: it may show one with its pod CIDR before its status is
        #: written, and it is the take-over that plays it.
        self._taking: dict[str, set[str]] = {}
        #: Per node, the resourceVersion a take-over's write was answered with, until the watch
        #: shows it: the events before it show the node as it was before that write.
        self._awaited: dict[str, str] = {}

    # -- from the node watch ------------------------------------------------------------------

    def relisted(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full list: forget what is gone, adopt what is new."""
        by_name = {}
        for item in items:
            facts = nodes.observe(item, self.cluster)
            if facts is not None:
                by_name[facts.name] = (facts, item)
        present = {facts.uid for facts, _ in by_name.values()}
        self._awaited.clear()  # a list is newer than any write answered before it
        self._deleted &= present
        for name in [name for name in self.records if name not in by_name]:
            self._drop(name)  # deleted while the watch was away
        for name in [name for name in self.facts if name not in by_name]:
            self._listener.vanished(name)
        self.facts = {name: facts for name, (facts, _) in by_name.items()
                      if facts.uid not in self._deleted}
        for facts, item in by_name.values():
            self._see(facts, item)

    def changed(self, kind: str, node: Mapping[str, Any]) -> None:
        facts = nodes.observe(node, self.cluster)
        if facts is None:
            return
        if kind == "DELETED":
            self._awaited.pop(facts.name, None)
            self._deleted.discard(facts.uid)
            if self.facts.get(facts.name, facts).uid == facts.uid:
                self.facts.pop(facts.name, None)
            record = self.records.get(facts.name)
            if record is not None and record.uid == facts.uid:
                self._drop(facts.name)
            elif record is None:
                self._listener.vanished(facts.name)
            return
        if facts.uid in self._deleted:
            return  # an event from before our delete: the node is going
        seen = self._taking.get(facts.name)
        if seen is not None:
            seen.add(facts.resource_version)
        awaited = self._awaited.get(facts.name)
        if awaited is not None:
            if facts.resource_version != awaited:
                # Older than a take-over's write already answered (a watch shows a node's
                # changes in order): played as it is, its status not yet written, it would
                # be taken over again and post Ready a second time.
                return
            del self._awaited[facts.name]
        self.facts[facts.name] = facts
        self._see(facts, node)

    def _see(self, facts: NodeFacts, node: Mapping[str, Any]) -> None:
        record = self.records.get(facts.name)
        if record is not None and record.uid != facts.uid:  # made again while the watch was away
            self._drop(facts.name)
            record = None
        if record is not None and record.uid == facts.uid:
            self._listener.updated(facts.name)
        elif facts.provisioned and not facts.foreign and facts.slot is None:
            self._listener.provisioned(facts)
        elif facts.foreign or facts.slot is None:
            self._listener.foreign(facts)
        elif record is None and facts.name in self._taking:
            # Half written: adopted now, it would renew a Lease not made yet and post its
            # Ready condition a second time. The take-over plays it once its status is
            # written, or (it failed) the next plan takes it again from these facts.
            pass
        elif record is None and (facts.slot not in self._slots_used
                                 or self._reserved.get(facts.name) == facts.slot):
            self._reserved.pop(facts.name, None)
            lease = self.lease_seconds.get(facts.pool, DEFAULT_LEASE_SECONDS)
            self._remember(facts.name, NodeRecord(
                facts.pool, facts.slot, facts.uid, lease,
                nodes.life_from_node(node, self._listener.carried(facts.name)),
                provisioned=facts.provisioned))
            self._listener.adopted(facts.name)
        elif record is None:  # two nodes with one pod CIDR: this one is replaced
            # (a provisioner's is left alone: its pod CIDR cannot change, nor can it be
            # deleted by the engine)
            self.facts[facts.name] = dataclasses.replace(
                facts, slot=None, foreign=facts.provisioned,
                problem=f"node {facts.name} has the pod CIDR of another node: "
                        + ("the engine does not play it" if facts.provisioned
                           else "the engine replaces it"))
            self._listener.foreign(self.facts[facts.name])

    def coming(self, name: str) -> bool:
        """Whether node ``name``, not played, is about to be: its create is under way (a slot
        is reserved for it), or a provisioner made it for a pool, to be taken over."""
        if name in self.records:
            return False
        if name in self._reserved or name in self._taking:
            return True
        facts = self.facts.get(name)
        return facts is not None and facts.provisioned and not facts.foreign

    # -- from the engine's own writes ---------------------------------------------------------

    def taking(self, name: str) -> None:
        """A take-over of provisioner's node ``name`` starts (:meth:`took` when it ends)."""
        self._taking[name] = set()

    def took(self, name: str) -> None:
        self._taking.pop(name, None)

    def _answered(self, facts: NodeFacts) -> bool:
        """Whether the facts a write was answered with are the node's newest: not when the
        watch showed that write already (its facts are as new, or newer). A take-over's are
        kept until the watch shows its write."""
        seen = self._taking.get(facts.name)
        if seen is None:
            return True
        known = self.facts.get(facts.name)
        if facts.resource_version in seen or (
                known is not None and known.resource_version == facts.resource_version):
            return False
        self._awaited[facts.name] = facts.resource_version
        return True

    def created(self, name: str, node: Mapping[str, Any], record: NodeRecord) -> None:
        """A create succeeded: play the node before the watch reports it."""
        facts = nodes.observe(node, self.cluster)
        if facts is not None and self._answered(facts):
            self.facts[name] = facts
        self._reserved.pop(name, None)
        self._remember(name, record)
        self._listener.adopted(name)

    def deleted(self, name: str) -> None:
        """A delete succeeded (or found the node gone): stop playing it."""
        facts = self.facts.pop(name, None)
        if facts is not None:
            self._deleted.add(facts.uid)
        if name in self.records:
            self._drop(name)
        else:
            self._listener.vanished(name)

    def wrote(self, name: str, life: NodeLife, seen: NodeFacts | None = None) -> None:
        """A stage's writes succeeded: the node's life is what was written, and its facts
        what the API answered (``seen``), or else what they were with the conditions written;
        the next stage is chosen from them before the watch shows the change."""
        record = self.records.get(name)
        if record is None:
            return
        record.life = life
        facts = self.facts.get(name)
        if seen is not None and seen.uid == record.uid and self._answered(seen):
            facts = seen
        if facts is None:
            return
        conditions = {c.type: c.status for c in life.conditions}
        if any(facts.conditions.get(kind) != status for kind, status in conditions.items()):
            facts = dataclasses.replace(facts, ready=conditions.get("Ready", facts.ready),
                                        conditions={**facts.conditions, **conditions})
        self.facts[name] = facts

    # -- pod CIDR slots ------------------------------------------------------------------------

    def allocate_slot(self, name: str) -> int | None:
        """A pod CIDR slot for node ``name``, reserved until :meth:`created` or
        :meth:`release_slot`; the same one again while an earlier create of ``name`` may have
        succeeded unseen. None when the cluster has no room left."""
        if name in self._reserved:
            return self._reserved[name]
        for slot in range(self._slot_hint, nodes.MAX_NODES_PER_CLUSTER):
            if slot not in self._slots_used:
                self._slots_used.add(slot)
                self._slot_hint = slot + 1
                self._reserved[name] = slot
                return slot
        return None

    def release_slot(self, name: str) -> None:
        """The create of ``name`` certainly failed: its slot is free again."""
        slot = self._reserved.pop(name, None)
        if slot is not None:
            self._free(slot)

    def _free(self, slot: int) -> None:
        if not any(record.slot == slot for record in self.records.values()) and \
                slot not in self._reserved.values():
            self._slots_used.discard(slot)
            self._slot_hint = min(self._slot_hint, slot)

    # -- what the pools see --------------------------------------------------------------------

    def counts(self, pool: str) -> tuple[int, int]:
        """(nodes that exist, nodes whose Ready condition is True) of ``pool``."""
        existing = ready = 0
        for name, record in self.records.items():
            if record.pool == pool:
                existing += 1
                facts = self.facts.get(name)
                ready += facts is not None and facts.ready == "True"
        return existing, ready

    def _remember(self, name: str, record: NodeRecord) -> None:
        self.records[name] = record
        self.by_slot[record.slot] = name
        self._slots_used.add(record.slot)

    def _drop(self, name: str) -> None:
        record = self.records.pop(name)
        if self.by_slot.get(record.slot) == name:
            del self.by_slot[record.slot]
        self._free(record.slot)
        if record.provisioned:
            self.released.add(name)
        self._listener.forgotten(name)
