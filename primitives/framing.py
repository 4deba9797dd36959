"""The framing of fakefleet's portable files (snapshots, traces): versioned, checksummed,
compressed, readable by any later fakefleet.

Such a file is one anyone can copy::

    fakefleet-<kind>\\n                 the magic line
    {"format": 1, ...}\\n               the header (JSON, one line): what the file holds, the
                                        fakefleet that wrote it, the payload's size and SHA-256
    <gzip>                              the payload

A reader checks the magic, the header's format (a later format is refused with the version
that wrote it; each earlier one is read as it was written), the payload's length (a truncated
copy) and its checksum (a corrupted one) before it decodes anything, and every error names the
file and what to do. Only the header is read to list files. What the header and the payload
mean is the caller's: this module frames bytes and does no I/O but on the one file it is given.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import secrets
import zlib
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from primitives.files import PRIVATE_FILE, sync_directory

#: A header longer than this is not one of ours (the clusters' names make it grow).
MAX_HEADER = 1 << 20
#: How much of a payload is copied or hashed at once.
CHUNK = 1 << 20
#: Every header has these, whatever the kind; the caller's fields come beside them.
FRAMING_FIELDS = ("format", "writtenBy", "payloadBytes", "sha256")


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of file: how it starts, what its errors call it and how they say to fix it."""

    #: The magic line, ``b"fakefleet-snapshot\\n"``.
    magic: bytes
    #: What the file is called in messages: ``"snapshot"``, ``"trace"``.
    noun: str
    #: The format written, and the latest read.
    format: int
    #: What writes such a file, for "give a file that ... wrote".
    writer: str
    #: What to do when the file is not there.
    when_missing: str
    #: What to do with a file from a later fakefleet ("restore it", "replay it").
    use: str
    #: The error raised, with the whole message.
    error: type[Exception]


def version() -> str:
    """The fakefleet that writes (``writtenBy``)."""
    try:
        return metadata.version("fakefleet")
    except metadata.PackageNotFoundError:
        return "unknown"


def compress(data: bytes) -> bytes:
    """A payload's bytes, as every framed file holds them (no time stamp: the same content
    gives the same file)."""
    packed = io.BytesIO()
    with _gzip(packed) as out:
        out.write(data)
    return packed.getvalue()


def _gzip(raw: IO[bytes]) -> gzip.GzipFile:
    """One way to compress for every writer (gzip.compress writes another OS byte than
    GzipFile): the same content, the same file, streamed or not."""
    return gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0)


def encode(kind: Kind, header: Mapping[str, Any], payload: bytes) -> bytes:
    """The file's bytes: ``header`` (the caller's fields) framed around the compressed
    ``payload``."""
    packed = compress(payload)
    return _head(kind, header, len(packed), hashlib.sha256(packed).hexdigest()) + packed


def _head(kind: Kind, header: Mapping[str, Any], size: int, digest: str) -> bytes:
    whole = {"format": kind.format, **header, "writtenBy": version(), "payloadBytes": size,
             "sha256": digest}
    return kind.magic + json.dumps(whole).encode() + b"\n"


def write_streamed(kind: Kind, path: Path, header: Mapping[str, Any],
                   chunks: Iterable[bytes]) -> int:
    """Write a file of ``kind`` at ``path`` whose payload is ``chunks``, without holding the
    payload in memory: it is compressed into a private file beside ``path``, then framed into
    another that replaces ``path`` (0600, fsynced), so ``path`` is whole or untouched. Returns
    the file's size. OSError as it comes."""
    directory = path.parent
    packed = directory / f".{path.name}.{secrets.token_hex(4)}.payload"
    framed = directory / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        digest = hashlib.sha256()
        with _private(packed) as raw:
            with _gzip(raw) as out:
                for chunk in chunks:
                    out.write(chunk)
            raw.flush()
        size = packed.stat().st_size
        with packed.open("rb") as source:
            while block := source.read(CHUNK):
                digest.update(block)
        with _private(framed) as target, packed.open("rb") as source:
            target.write(_head(kind, header, size, digest.hexdigest()))
            while block := source.read(CHUNK):
                target.write(block)
            target.flush()
            os.fsync(target.fileno())
            total = target.tell()
        framed.replace(path)
    finally:
        packed.unlink(missing_ok=True)
        framed.unlink(missing_ok=True)
    sync_directory(directory)
    return total


def _private(path: Path) -> IO[bytes]:
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE), "wb")


def read_header(kind: Kind, path: Path) -> dict[str, Any]:
    """The header of the file at ``path`` (the payload is not read)."""
    with _open(kind, path) as handle:
        return _header(kind, path, handle.read(len(kind.magic) + MAX_HEADER))[0]


def read(kind: Kind, path: Path) -> tuple[dict[str, Any], bytes]:
    """The header and the decompressed payload of the file at ``path``, checked whole before
    it is decompressed."""
    with _open(kind, path) as handle:
        data = handle.read()
    header, start = _header(kind, path, data)
    payload = data[start:]
    if len(payload) != header["payloadBytes"]:
        raise kind.error(
            f"{kind.noun} {path} is truncated: its payload has {len(payload)} of "
            f"{header['payloadBytes']} bytes (an interrupted copy?): copy the whole file again")
    if hashlib.sha256(payload).hexdigest() != header["sha256"]:
        raise kind.error(
            f"{kind.noun} {path} is corrupted: its payload's SHA-256 is not the "
            f"{str(header['sha256'])[:12]}… its header records: copy it again from where it was "
            f"saved")
    try:
        return header, gzip.decompress(payload)
    except (OSError, EOFError, zlib.error) as error:
        raise unreadable(kind, path, error) from error


def unreadable(kind: Kind, path: Path, error: Exception) -> Exception:
    """The error for a payload that passed its checksum but does not decode."""
    return kind.error(f"{kind.noun} {path} passed its checksum but its content cannot be read "
                      f"({error}): it was not written by fakefleet")


def _open(kind: Kind, path: Path) -> IO[bytes]:
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise kind.error(f"no {kind.noun} at {path}: {kind.when_missing}") from None
    except OSError as error:
        raise kind.error(f"cannot read {kind.noun} {path}: {error}") from error


def _header(kind: Kind, path: Path, data: bytes) -> tuple[dict[str, Any], int]:
    """The header and where the payload starts."""
    if not data.startswith(kind.magic):
        raise kind.error(f"{path} is not a fakefleet {kind.noun} (it does not start with "
                         f"{kind.magic.strip().decode()!r}): give a file that {kind.writer} "
                         f"wrote")
    end = data.find(b"\n", len(kind.magic))
    if end < 0:
        raise kind.error(f"{kind.noun} {path} is truncated inside its header: copy the whole "
                         f"file again")
    try:
        raw = json.loads(data[len(kind.magic):end])
        written = int(raw["format"])
    except (ValueError, KeyError, TypeError) as error:
        raise kind.error(f"{kind.noun} {path} has an unreadable header ({error}): copy it "
                         f"again from where it was saved") from error
    if written > kind.format:
        raise kind.error(
            f"{kind.noun} {path} has format {written}, written by fakefleet "
            f"{raw.get('writtenBy', '?')}; this fakefleet ({version()}) reads formats up to "
            f"{kind.format}: {kind.use} with that fakefleet or a later one")
    if written < 1:
        raise kind.error(f"{kind.noun} {path} has format {written}, which no fakefleet wrote: "
                         f"give a file that {kind.writer} wrote")
    missing = [field for field in FRAMING_FIELDS if field not in raw]
    if missing:
        raise kind.error(f"{kind.noun} {path}'s header lacks {', '.join(missing)}: copy it "
                         f"again from where it was saved")
    return raw, end + 1
