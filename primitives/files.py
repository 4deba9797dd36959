"""Files that only their owner may read, replaced whole and durably.

Everything fakefleet keeps on disk (the state directory, keys and certificates, kubeconfigs,
the hub's state, the ``*.json`` a running process publishes) is written the one way here: under
a temporary name created with mode 0600 (whatever the umask), flushed to disk, renamed into
place, and the directory flushed after the rename. So a reader sees either the old complete
file or the new complete one, never a key open to others for an instant, and after a machine
crash the file is the old one or the new one, not an empty one. ``durable=False`` skips the
flushes, for what a test or a benchmark writes often and may lose.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

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


def write_private(path: Path, data: bytes, *, durable: bool = True,
                  replace: bool = True) -> None:
    """Create or replace ``path`` with ``data``, readable and writable by its owner only.

    ``replace=False`` only creates it: FileExistsError if it exists, so that of two processes
    making the same file (a key) at once, the second takes the first one's rather than
    replacing what the first may already use."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        if replace:
            temporary.replace(path)
        else:
            os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    if durable:
        sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Flush a directory's entries, so that a rename in it survives a crash."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class Named:
    """A file at a fixed name in its owner's directory: ``files.log`` reads as a Path."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, owner: Directory, kind: type[Directory]) -> Path:
        return owner.directory / self.name


@dataclasses.dataclass(frozen=True)
class Directory:
    """The paths of one directory that a process keeps (a hub's, a collector's, a PKI's), each
    spelled once: a class attribute that is :class:`Named`."""

    directory: Path

    def declared(self) -> Iterator[Path]:
        """Every file the class names, in the order they are declared (base classes first)."""
        seen: set[str] = set()
        for kind in reversed(type(self).__mro__):
            for attribute, value in vars(kind).items():
                if isinstance(value, Named) and attribute not in seen:
                    seen.add(attribute)
                    yield self.directory / value.name


@dataclasses.dataclass(frozen=True)
class ProcessDirectory(Directory):
    """The directory of a long-running process: it publishes ``<process>.json`` (a
    :class:`Published`) once it serves, and its supervisor logs it to ``<process>.log``."""

    process: ClassVar[str]

    @property
    def info(self) -> Path:
        return self.directory / f"{self.process}.json"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.process}.log"


class Published:
    """A frozen dataclass that a running process publishes as a JSON file for others to read
    (``hub.json``, ``collector.json``): written whole, read as None when absent or torn."""

    @classmethod
    def read(cls, path: Path) -> Self | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def write(self, path: Path) -> None:
        fields: dict[str, Any] = dataclasses.asdict(self)  # type: ignore[call-overload]
        write_private(path, (json.dumps(fields, indent=2) + "\n").encode())
