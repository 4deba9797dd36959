"""Where a hub on this host is: its state directory and the ``hub.json`` it publishes.

The hub writes these; the CLI and the operator on the same host read them (this module is the
contract between them, so the file names are spelled here only).
"""

from __future__ import annotations

import dataclasses

from primitives.files import Named, ProcessDirectory, Published


@dataclasses.dataclass(frozen=True)
class HubFiles(ProcessDirectory):
    """The paths of a hub's state directory, spelled once: ``hub.json``, ``hub.log`` and
    these."""

    process = "hub"
    key = Named("hub.key")
    fleet_token = Named("fleet.token")
    #: Its members, runs and workloads (federation.hub.store), which a fleet snapshot saves.
    state = Named("state.json")
    #: A fleet snapshot's hub state that the hub takes in at its next start
    #: (federation.hub.importing), written by ``fakefleet snapshot restore``; one it could not
    #: take in is set aside as ``refused``, with why.
    restore = Named("restore.json")
    refused = Named("restore.refused.json")


@dataclasses.dataclass(frozen=True)
class HubInfo(Published):
    """What a running hub publishes (``hub.json``)."""

    pid: int
    address: str
    ca: str | None
    fleet_token_file: str
    hub_id: str


def local_credentials(files: HubFiles) -> tuple[HubInfo, bytes] | None:
    """The running hub of this host and its key (to mint tokens), or None when none runs."""
    info = HubInfo.read(files.info)
    if info is None:
        return None
    try:
        return info, files.key.read_bytes()
    except FileNotFoundError:
        return None
