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
