"""Files that only their owner may read: the state directory, private keys and kubeconfigs.

A key or kubeconfig is never visible to others, not even for an instant: it is written under a
temporary name that is created with mode 0600 (whatever the umask), then renamed into place, so
a reader sees either the old complete file or the new complete one. Nothing here fsyncs: every
caller regenerates what a machine crash could truncate (a PKI that does not parse is rebuilt,
kubeconfigs are rewritten at each start).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

PRIVATE_DIRECTORY = 0o700
PRIVATE_FILE = 0o600


def private_directory(path: Path) -> Path:
    """Create ``path`` (and its parents) so that only its owner can enter it; tighten it if it
    already exists with a wider mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created 0700 rather than chmod-ed after, so it is never open to others; the chmod then
    # tightens a directory that an earlier version created with the umask's mode.
    path.mkdir(mode=PRIVATE_DIRECTORY, exist_ok=True)
    path.chmod(PRIVATE_DIRECTORY)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Create or replace ``path`` with ``data``, readable and writable by its owner only."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
