"""The hub's key and fleet token are private and on disk before they are used; a key that is
not one (torn by a crash, emptied) stops the hub with its name and the way out, never a
traceback and never a new key made behind the clients' back."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from federation.client import tokens
from primitives import files


def test_a_new_key_is_written_aside_flushed_and_renamed_privately(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = tmp_path / "hub" / "hub.key"
    key = tokens.load_or_create_key(path)
    assert len(key) == tokens.KEY_BYTES
    assert path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(synced) == 2, "the file, then its directory"
    assert [p.name for p in path.parent.iterdir()] == ["hub.key"]
    assert tokens.load_or_create_key(path) == key, "made once"


def test_a_key_made_meanwhile_by_another_process_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "hub.key"
    theirs = tokens.new_key()
    files.write_private(path, theirs)
    with pytest.raises(FileExistsError):
        files.write_private(path, tokens.new_key(), replace=False)
    assert path.read_bytes() == theirs
    assert [p.name for p in tmp_path.iterdir()] == ["hub.key"]


@pytest.mark.parametrize("content", [b"", b"\x00" * 7])
def test_a_torn_or_empty_key_is_named_with_its_way_out(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "hub.key"
    path.write_bytes(content)
    with pytest.raises(tokens.TokenError, match=f"{path} does not hold a hub key "
                                                f"\\({len(content)} bytes, not 32\\): remove it"):
        tokens.load_or_create_key(path)
    assert path.read_bytes() == content, "never replaced behind the clients' back"


def test_the_hub_stops_on_a_torn_key_with_a_clear_error_and_no_traceback(
        tmp_path: Path) -> None:
    (tmp_path / "hub.key").write_bytes(b"")
    ran = subprocess.run([sys.executable, "-m", "federation.hub", "--state-dir", str(tmp_path),
                          "--insecure"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr
    assert f"{tmp_path / 'hub.key'} does not hold a hub key" in ran.stderr
    assert "remove it to make a new one" in ran.stderr


async def test_the_fleet_token_is_written_the_durable_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from federation.hub import server
    from tests.federation.hubs import running_hub

    written: list[tuple[Path, bool]] = []

    def recording(path: Path, data: bytes, *, durable: bool = True,
                  replace: bool = True) -> None:
        written.append((path, durable))
        files.write_private(path, data, durable=durable, replace=replace)

    monkeypatch.setattr(server, "write_private", recording)
    async with running_hub(tmp_path) as hub:
        token = (tmp_path / "fleet.token").read_text().strip()
        assert token == hub.fleet_token
    assert (tmp_path / "fleet.token", True) in written
    assert stat.S_IMODE((tmp_path / "fleet.token").stat().st_mode) == 0o600
