"""Where snapshots are kept: ``<state>/snapshots/<NAME>.snapshot``, private (0700 directory,
0600 files, written aside, fsynced and renamed), since a snapshot holds Secrets and the
members' keys unless it was saved without them. A NAME is a DNS subdomain; anything with a
``/`` (or ending in ``.snapshot``) is a path, so a copied file restores from where it lies.
"""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

from operators.controlplane.state import StateDir
from operators.snapshots.encoding import Header, SnapshotError, read_header
from primitives.files import private_directory, write_private
from primitives.names import is_dns_subdomain

SUFFIX = ".snapshot"


def path_of(state_dir: Path, name: str) -> Path:
    """Where the snapshot ``name`` is kept; SnapshotError for a name that is no name."""
    if not is_dns_subdomain(name):
        raise SnapshotError(f"snapshot name {name!r} is not a DNS subdomain (lowercase letters, "
                            f"digits, '-' and '.', at most 253): give a name such as "
                            f"'before-upgrade', or a path with a '/'")
    return StateDir(state_dir).snapshots / f"{name}{SUFFIX}"


def locate(state_dir: Path, name_or_path: str) -> Path:
    """The file a ``restore`` argument names: a path as given, else a saved snapshot's."""
    if "/" in name_or_path or name_or_path.endswith(SUFFIX):
        return Path(name_or_path)
    return path_of(state_dir, name_or_path)


def write(path: Path, data: bytes) -> None:
    """Write a snapshot 0600 (its directory 0700 when it is ours), whole or not at all."""
    try:
        private_directory(path.parent)
        write_private(path, data)
    except OSError as error:
        raise SnapshotError(f"cannot write snapshot {path}: {error}") from error


@dataclasses.dataclass(frozen=True)
class Listed:
    """A saved snapshot as ``snapshot ls`` shows it."""

    name: str
    path: Path
    size: int
    #: Its permission bits: anything beyond 0600 on a snapshot with secrets is worth a warning.
    mode: int
    header: Header | None
    problem: str = ""


def listing(state_dir: Path) -> list[Listed]:
    """Every saved snapshot, by name; one that cannot be read says why."""
    found = []
    for path in sorted(StateDir(state_dir).snapshots.glob(f"*{SUFFIX}")):
        info = path.stat()
        try:
            header, problem = read_header(path), ""
        except SnapshotError as error:
            header, problem = None, str(error)
        found.append(Listed(path.name.removesuffix(SUFFIX), path, info.st_size,
                            stat.S_IMODE(info.st_mode), header, problem))
    return found


def remove(state_dir: Path, name: str) -> Path:
    path = path_of(state_dir, name)
    try:
        path.unlink()
    except FileNotFoundError:
        raise SnapshotError(f"no snapshot named {name!r} in {path.parent}: 'fakefleet snapshot "
                            f"ls' lists them") from None
    return path
