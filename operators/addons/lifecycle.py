"""The life every add-on of a member lives, and what its condition says about it: pure.

Every add-on goes the same way. Its binary is built once, in the background, from the Go module
proxy; it starts once the member's API server answers; its hooks into the member (Kueue's
webhooks, metrics-server's APIService) are applied once it serves, never before, as a webhook
or an APIService whose server does not answer fails the member's requests (Pods, Jobs,
discovery); when the spec stops asking for it, it stops and its hooks go. :func:`plan` decides
these steps and :func:`condition` tells where the add-on is on that way, both from an
:class:`Observed` that each add-on extends with what is its own; the add-on's planner calls
them, then says what only it knows (MultiKueue's objects, how it runs).

No I/O here: :mod:`operators.addons.running` observes, and executes the steps.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from operators.reconciling.clusters import AddonState


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the operator sees of any add-on on one member; each add-on's extends it."""

    control_plane_running: bool = False
    binary: bool = False
    building_for: float | None = None
    """Seconds the background build has run, None when none runs."""
    build_error: str = ""
    installed: bool = False
    """Its files exist in the member's state (it was set up, and may need tearing down)."""
    supervised: bool = False
    hooked: bool = False
    """Its hooks were applied since it started."""
    restarts: int = 0
    log_tail: str = ""


@dataclasses.dataclass(frozen=True)
class Build:
    """Build the add-on's binary into the cache, in the background (once for every member)."""


@dataclasses.dataclass(frozen=True)
class Start:
    """Set the member up for the add-on (its files, certificates, CRDs, RBAC), then start it."""


@dataclasses.dataclass(frozen=True)
class Hook:
    """Point the member at the running add-on (webhooks, APIService)."""


@dataclasses.dataclass(frozen=True)
class Stop:
    """Stop the add-on; ``unhook``: remove its hooks and then its files too (the member stays,
    and a hook whose server is gone would fail the member's requests)."""

    unhook: bool = True


Step = Build | Start | Hook | Stop


def plan(observed: Observed, *, wanted: bool, serving: bool,
         restart: bool = False) -> Sequence[Step] | None:
    """The add-on's next steps: ``wanted``, the spec asks for it; ``serving``, it answers the
    probe its hooks wait for; ``restart``, it runs with settings the spec no longer has. None
    once it serves with its hooks in place: what else it needs is the add-on's to say."""
    if not wanted:
        return [Stop()] if observed.supervised or observed.installed else []
    if not observed.binary:
        return [Build()] if observed.building_for is None and not observed.build_error else []
    if not observed.control_plane_running:
        return []
    if observed.supervised and restart:
        return [Stop(unhook=False), Start()]
    if not observed.supervised:
        return [Start()]
    if not serving:
        return []
    return None if observed.hooked else [Hook()]


def condition(observed: Observed, *, serving: bool, title: str, crashed: str,
              cold_build: str) -> AddonState | None:
    """The add-on's condition until it serves with its hooks in place (None then: how it runs
    is the add-on's to say). ``title`` names it with its version, ``crashed`` names it in the
    message of a crash, ``cold_build`` says how long a build with nothing in Go's caches
    takes."""
    if observed.build_error:
        return AddonState(False, "BuildFailed",
                          f"{title} could not be built: {observed.build_error}")
    if not observed.binary:
        so_far = f" ({observed.building_for:.0f}s so far)" if observed.building_for else ""
        return AddonState(False, "Building",
                          f"building {title} from the Go module proxy into the cache{so_far}; "
                          f"a cold build takes {cold_build} ('fakefleet binaries' builds it "
                          f"ahead of time)")
    if not observed.control_plane_running:
        return AddonState(False, "Waiting", "waiting for the cluster's API server")
    if serving and observed.hooked:
        return None
    if observed.restarts:
        return AddonState(False, "Crashed",
                          f"{crashed} exited and was restarted {observed.restarts} times: "
                          f"{crash_summary(observed.log_tail)}")
    return AddonState(False, "Starting", f"starting {title}")


def crash_summary(log: str) -> str:
    """The line of an add-on's log that says why it stopped: a panic, else the last error's
    message (a log of JSON lines, as Kueue's and Karpenter's), else its last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith(("panic:", "fatal error:")):
            return line
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            # Kueue logs {"level": "error", "msg"}, Karpenter {"level": "ERROR", "message"}.
            if str(entry.get("level", "")).lower() == "error":
                error = f": {entry['error']}" if entry.get("error") else ""
                return f"{entry.get('msg') or entry.get('message', '')}{error}"
    return lines[-1] if lines else "(its log is empty)"
