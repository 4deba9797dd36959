"""The fleet commands reach the hub over TLS with its CA, or in plaintext only when told
``--insecure``: never plaintext for want of a CA, which would send the fleet token in the
clear."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from federation.hub.server import Tls
from operators.cli import main
from operators.controlplane.pki import ensure_hub_pki
from operators.controlplane.state import StateDir
from tests.federation.hubs import running_hub

COMMANDS = [["fleet", "ls"], ["fleet", "runs"], ["fleet", "workloads"]]


def fleet(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_hub_named_without_its_ca_is_refused_before_the_token_leaves(
        command: list[str], tmp_path: Path) -> None:
    token = tmp_path / "fleet.token"
    token.write_text("secret\n")
    result = fleet(*command, "--hub", "127.0.0.1:9", "--token-file", str(token),
                   "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert ("no CA to check the hub at 127.0.0.1:9 with: give --hub-ca with the hub's CA "
            "certificate (PEM), or --insecure to send the fleet token in plaintext") \
        in result.output


def test_insecure_and_a_ca_are_two_answers_to_one_question(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    result = fleet("fleet", "ls", "--hub", "127.0.0.1:9", "--hub-ca", str(ca), "--insecure",
                   "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "--insecure and --hub-ca: give --hub-ca for TLS, or --insecure for plaintext" \
        in result.output


async def test_the_local_hub_is_reached_in_plaintext_only_when_told(tmp_path: Path) -> None:
    async with running_hub(StateDir(tmp_path).hub):
        refused = await asyncio.to_thread(fleet, "fleet", "ls", "--state-dir", str(tmp_path))
        listed = await asyncio.to_thread(fleet, "fleet", "ls", "-o", "json", "--insecure",
                                         "--state-dir", str(tmp_path))
    assert refused.exit_code == 2
    assert "no CA to check the hub at 127.0.0.1:" in refused.output
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output) == []


async def test_insecure_is_refused_for_a_local_hub_that_serves_tls(tmp_path: Path) -> None:
    pki = ensure_hub_pki(tmp_path / "pki")
    tls = Tls(cert=pki.serving_cert, key=pki.serving_key, ca=pki.ca_cert)
    async with running_hub(StateDir(tmp_path).hub, tls=tls):
        refused = await asyncio.to_thread(fleet, "fleet", "ls", "--insecure",
                                          "--state-dir", str(tmp_path))
        listed = await asyncio.to_thread(fleet, "fleet", "ls", "-o", "json",
                                         "--state-dir", str(tmp_path))
    assert refused.exit_code == 2
    assert f"serves TLS (its CA is {pki.ca_cert}): leave out --insecure" in refused.output
    assert listed.exit_code == 0, listed.output
