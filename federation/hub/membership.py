"""Who is in the fleet, and whether they answer: pure state, no I/O, time passed in.

A member is **Ready** while two things hold: its messages arrive (``heard_at`` fresh) and it
answers the hub's heartbeats (``echoed_at``: when its heartbeat last carried a newer hub
sequence number). Either going stale for longer than the grace makes it **Unreachable**; a
link that drops only what the hub sends shows up as the second. A closed session makes it
Unreachable at once. The next heartbeat after that makes it Ready again.

Every method returns the members whose state or inventory changed, for watchers; what is
persisted (identity, inventory, state) is kept apart from what is only liveness bookkeeping.

A member is known by its name in the fleet, ``namespace/name`` (:func:`primitives.names.
member_name`), and belongs to the host that registered it: another host's registration of
the same member is refused until the first has been Unreachable for :data:`TAKEOVER_AFTER`
(a host that is gone for good), and only its own host may deregister it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

from primitives.names import DEFAULT_NAMESPACE, member_name

#: How long a member must have been Unreachable before another host may register it (s): long
#: enough that a host restarting its operator, or cut off for a while, keeps its members.
TAKEOVER_AFTER = 300.0


class State(enum.Enum):
    READY = "Ready"
    UNREACHABLE = "Unreachable"


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    host: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kubernetes_version: str = ""
    endpoint: str = ""
    namespace: str = DEFAULT_NAMESPACE

    @property
    def key(self) -> str:
        """The member's name in the fleet."""
        return member_name(self.namespace, self.name)


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    ready: int
    total: int
    allocatable: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Inventory:
    pools: tuple[Pool, ...] = ()
    nodes_ready: int = 0
    nodes_total: int = 0
    allocatable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pods_by_phase: Mapping[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Member:
    identity: Identity
    state: State
    reason: str
    message: str
    registered_at: float
    state_since: float
    inventory: Inventory = dataclasses.field(default_factory=Inventory)
    last_heartbeat: float = 0.0
    # Liveness only (never persisted): a restarted hub starts them at its start.
    heard_at: float = 0.0
    echoed_at: float = 0.0
    hub_seq: int = 0
    connected: bool = False

    @property
    def name(self) -> str:
        """Its name in the fleet (``namespace/name``)."""
        return self.identity.key


class HostConflict(Exception):
    """A member that another host registered."""


class Ambiguous(ValueError):
    """A member name without its namespace that several namespaces have."""


class Membership:
    """Every member, by its name in the fleet."""

    def __init__(self, *, grace: float, takeover: float = TAKEOVER_AFTER) -> None:
        self.grace = grace
        self.takeover = takeover
        self.members: dict[str, Member] = {}

    def restore(self, members: Iterable[Member], now: float) -> None:
        """Members a restarted hub read from its store: each has a grace from now to return."""
        for member in members:
            member.heard_at = member.echoed_at = now
            member.connected = False
            self.members[member.name] = member

    def register(self, identity: Identity, inventory: Inventory, now: float) -> Member:
        """A member introduces itself (again). Refused while another host holds it: two
        FakeClusters cannot be one member."""
        key = identity.key
        member = self.members.get(key)
        if member is None:
            member = Member(identity=identity, state=State.UNREACHABLE, reason="Registered",
                            message="registered; no session yet", registered_at=now,
                            state_since=now, inventory=inventory, heard_at=now, echoed_at=now)
            self.members[key] = member
            return member
        held = member.identity.host
        if held and identity.host != held:
            gone = now - member.state_since if member.state is State.UNREACHABLE else 0.0
            if gone < self.takeover:
                where = "connected" if member.state is State.READY \
                    else f"Unreachable for {gone:.0f}s"
                raise HostConflict(
                    f"cluster {key!r} is registered by host {held!r} ({where}); host "
                    f"{identity.host or '(none)'!r} cannot register it too: rename or move one "
                    f"of the two FakeClusters, or delete it on host {held!r} (another host may "
                    f"take it over once it has been Unreachable for {self.takeover:.0f}s)")
        member.identity = identity
        member.inventory = inventory
        member.heard_at = now
        return member

    def resolve(self, name: str) -> str:
        """A member name as a user writes it, as the fleet knows it: ``west`` is the member
        of namespace default when there is one, else the only member of that FakeCluster
        name in any namespace (left as it is when there is none, for one that registers
        later). :class:`Ambiguous` when several namespaces have one."""
        if "/" in name or name in self.members:
            return name
        found = sorted(key for key, member in self.members.items()
                       if member.identity.name == name)
        if len(found) > 1:
            raise Ambiguous(f"{name!r} is the name of {len(found)} members "
                            f"({', '.join(found)}); write namespace/name")
        return found[0] if found else name

    def holder(self, key: str) -> str | None:
        """The host that registered member ``key`` ("" for none given; None: no such
        member)."""
        member = self.members.get(key)
        return None if member is None else member.identity.host

    def connect(self, name: str, now: float) -> Member | None:
        """A session opened: the member is Ready. Returns it when its state changed."""
        member = self.members[name]
        member.connected = True
        member.heard_at = member.echoed_at = now
        return self._become(member, State.READY, "SessionOpened", "session open", now)

    def disconnect(self, name: str, now: float) -> Member | None:
        member = self.members.get(name)
        if member is None:
            return None
        member.connected = False
        return self._become(member, State.UNREACHABLE, "SessionClosed",
                            "the member's session closed", now)

    def heartbeat(self, name: str, hub_seq: int, inventory: Inventory | None,
                  now: float) -> Member | None:
        """A heartbeat arrived; returns the member when its state or inventory changed."""
        member = self.members[name]
        member.heard_at = now
        member.last_heartbeat = now
        if hub_seq > member.hub_seq:
            member.hub_seq = hub_seq
            member.echoed_at = now
        changed = False
        if inventory is not None and inventory != member.inventory:
            member.inventory = inventory
            changed = True
        if member.connected and self._fresh(member, now):
            changed = self._become(member, State.READY, "HeartbeatsResumed",
                                   "heartbeats arrive", now) is not None or changed
        return member if changed else None

    def heard(self, name: str, now: float) -> None:
        """Any other message: the member speaks."""
        member = self.members.get(name)
        if member is not None:
            member.heard_at = now

    def sweep(self, now: float) -> list[Member]:
        """Members that went silent: Unreachable, with why."""
        changed = []
        for member in self.members.values():
            if member.state is not State.READY:
                continue
            if now - member.heard_at > self.grace:
                reason, message = "HeartbeatsStopped", \
                    f"nothing heard for {now - member.heard_at:.1f}s (grace {self.grace:g}s)"
            elif now - member.echoed_at > self.grace:
                reason, message = "HubHeartbeatsUnanswered", \
                    f"the hub's heartbeats went unanswered for {now - member.echoed_at:.1f}s " \
                    f"(grace {self.grace:g}s): the link drops what the hub sends"
            else:
                continue
            if (became := self._become(member, State.UNREACHABLE, reason, message, now)):
                changed.append(became)
        return changed

    def remove(self, name: str) -> Member | None:
        return self.members.pop(name, None)

    def _fresh(self, member: Member, now: float) -> bool:
        return now - member.heard_at <= self.grace and now - member.echoed_at <= self.grace

    @staticmethod
    def _become(member: Member, state: State, reason: str, message: str,
                now: float) -> Member | None:
        if member.state is state:
            return None
        member.state, member.reason, member.message, member.state_since = \
            state, reason, message, now
        return member
