"""A fleet snapshot's hub state, taken in as the hub starts.

``fakefleet snapshot restore`` writes the saved state into the hub's directory
(:attr:`~federation.client.discovery.HubFiles.restore`: the state as ``state.json`` held it,
when it was saved, this host's id and the members it restored) and has the hub restarted. The
starting hub takes the saved members, runs and workloads in place of its own
(:func:`merged`: times shifted by the time since the save, the restored members owned by this
host), stores them, and only then removes the file: a hub killed in between takes the same file
in again at its next start, shifted from the same save. A file it cannot read is set aside as
:attr:`~federation.client.discovery.HubFiles.refused`, with why, and the hub carries on with the
state it had: a bad import never keeps a hub from starting.

Members the hub knows that the snapshot does not are kept; runs and workloads become the
snapshot's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection
from typing import Any

from federation.client.discovery import HubFiles
from federation.hub import shifting
from federation.hub.store import Snapshot, decode
from primitives.files import write_private

logger = logging.getLogger(__name__)


def merged(current: Snapshot, saved: Snapshot, *, saved_at: float, now: float, host: str,
           restored: Collection[str]) -> Snapshot:
    """``current`` with the members, runs and workloads of ``saved`` (taken at ``saved_at``),
    every time moved by ``now - saved_at``; the ``restored`` members (``namespace/name``)
    belong to ``host`` now: they were restored on it, and it registers them again."""
    seconds = now - saved_at
    members = {}
    for member in saved.members:
        moved = shifting.member(member, seconds)
        if member.name in restored:
            moved = dataclasses.replace(moved, identity=dataclasses.replace(moved.identity,
                                                                            host=host))
        members[member.name] = moved
    kept = [member for member in current.members if member.name not in members]
    return Snapshot(hub_id=current.hub_id, members=[*members.values(), *kept],
                    runs=[shifting.run(run, seconds) for run in saved.runs],
                    workloads=[shifting.workload(w, seconds) for w in saved.workloads])


def take(files: HubFiles, current: Snapshot, now: float) -> Snapshot | None:
    """The state with the pending import taken in, or None when there is none (or it was
    refused: then set aside with why)."""
    try:
        text = files.restore.read_bytes()
    except FileNotFoundError:
        return None
    raw: Any = None
    try:
        raw = json.loads(text)
        state = merged(current, decode(raw["state"]), saved_at=float(raw["savedAt"]), now=now,
                       host=str(raw["host"]), restored=frozenset(raw["members"]))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        reason = f"{files.restore} cannot be taken in ({type(error).__name__}: {error})"
        logger.error("%s: set aside as %s; the hub keeps its state", reason, files.refused)
        kept = raw if isinstance(raw, dict) else {}
        write_private(files.refused, json.dumps({**kept, "refused": reason}).encode())
        files.restore.unlink(missing_ok=True)
        return None
    logger.info("taking in the state of a snapshot saved %.0fs ago: %d members, %d runs, "
                "%d workloads", now - float(raw["savedAt"]), len(state.members),
                len(state.runs), len(state.workloads))
    return state


def taken(files: HubFiles) -> None:
    """The import is stored: it is not taken in again."""
    files.restore.unlink(missing_ok=True)
