"""The operator in a pod: its service account as the host's credentials, the token read again
as the kubelet rotates it (on a timer, and at once after a 401), and which host a process
picks. The service-account directory is a temporary one (tests cannot write /var/run)."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from operators.__main__ import choose_host
from operators.controlplane.state import StateDir
from operators.handlers.runtime import engine_host_arguments
from operators.k8s import config
from operators.k8s.client import Client
from operators.k8s.config import HostConfig, ServiceAccountToken, load_in_cluster
from operators.k8s.errors import ConfigError, Unauthorized
from operators.k8s.transport import AiohttpTransport

ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
CA = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"


def jwt(**claims: object) -> str:
    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def account(tmp_path: Path) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "ca.crt").write_bytes(CA)
    (directory / "token").write_text("first\n")
    (directory / "namespace").write_text("fleet")
    return directory


def test_in_cluster_access_is_the_service_and_the_account(account: Path) -> None:
    access = load_in_cluster(service_account_dir=account, environ=ENV)
    assert access.server == "https://10.96.0.1:443"
    assert access.ca == CA
    assert access.authorization() == "Bearer first"  # the file's newline trimmed
    assert access.expires is None  # not a JWT: nothing says when it expires
    assert config.in_cluster_namespace(account) == "fleet"


def test_an_ipv6_service_address_is_bracketed(account: Path) -> None:
    access = load_in_cluster(service_account_dir=account,
                             environ={**ENV, "KUBERNETES_SERVICE_HOST": "fd00::1"})
    assert access.server == "https://[fd00::1]:443"


def test_the_token_says_when_it_expires(account: Path) -> None:
    (account / "token").write_text(jwt(exp=1_900_000_000, sub="system:serviceaccount:x:y"))
    access = load_in_cluster(service_account_dir=account, environ=ENV)
    assert access.expires == datetime.datetime.fromtimestamp(1_900_000_000, tz=datetime.UTC)
    assert config.token_expiry("not.a-jwt.at-all") is None
    assert config.token_expiry(jwt(sub="no-exp")) is None


def test_a_rotated_token_is_read_after_a_minute_or_at_once_when_forgotten(
        account: Path) -> None:
    clock = Clock()
    token = ServiceAccountToken(account / "token", clock=clock)
    assert token() == "Bearer first"
    (account / "token").write_text("second")
    clock.now = config.TOKEN_REREAD - 1
    assert token() == "Bearer first", "read at most once a minute"
    clock.now = config.TOKEN_REREAD
    assert token() == "Bearer second"
    (account / "token").write_text("third")
    token.forget()
    assert token() == "Bearer third"


def test_a_token_file_briefly_gone_during_rotation_keeps_the_last_token(account: Path) -> None:
    clock = Clock()
    token = ServiceAccountToken(account / "token", clock=clock)
    assert token() == "Bearer first"
    (account / "token").unlink()
    clock.now = 2 * config.TOKEN_REREAD
    assert token() == "Bearer first"
    (account / "token").write_text("")
    clock.now = 4 * config.TOKEN_REREAD
    assert token() == "Bearer first"


def test_not_in_a_pod_says_what_to_do_instead(account: Path) -> None:
    assert not config.in_cluster({})
    with pytest.raises(ConfigError, match=r"KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
                                          r"are not set .*pass --kubeconfig instead"):
        load_in_cluster(service_account_dir=account, environ={})


def test_no_mounted_account_names_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the service account's CA .*ca\.crt.*"
                                          r"automountServiceAccountToken"):
        load_in_cluster(service_account_dir=tmp_path / "none", environ=ENV)
    (tmp_path / "ca.crt").write_bytes(CA)
    with pytest.raises(ConfigError, match=r"cannot read the service account token .*token"):
        load_in_cluster(service_account_dir=tmp_path, environ=ENV)


def test_engines_reach_the_host_as_the_operator_does(account: Path, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "host.kubeconfig"
    assert engine_host_arguments(HostConfig(kubeconfig=kubeconfig)) == [
        "--host-kubeconfig", str(kubeconfig)]
    assert engine_host_arguments(HostConfig(service_account_dir=account)) == [
        "--host-in-cluster", "--service-account-dir", str(account)]
    assert "service account" in HostConfig(service_account_dir=account).describe()


# -- through the real transport: a 401 makes it read the rotated token --------------------------

@pytest.fixture
async def api_server() -> AsyncIterator[tuple[str, list[str], set[str]]]:
    """An HTTP server on loopback that takes the tokens in its set, and notes each it saw."""
    seen: list[str] = []
    accepted: set[str] = set()

    async def version(request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        seen.append(header)
        if header.removeprefix("Bearer ") not in accepted:
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized",
                                      "message": "Unauthorized"}, status=401)
        return web.json_response({"gitVersion": "v1.36.3"})

    app = web.Application()
    app.router.add_get("/version", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen, accepted
    finally:
        await runner.cleanup()


async def test_a_refused_token_is_read_again_from_the_file(
        account: Path, api_server: tuple[str, list[str], set[str]]) -> None:
    url, seen, accepted = api_server
    access = load_in_cluster(service_account_dir=account, environ=ENV)
    access = dataclasses.replace(access, server=url, ca=None)
    accepted.add("first")
    async with Client(AiohttpTransport(access), server=url) as client:
        assert (await client.get("/version"))["gitVersion"] == "v1.36.3"
        # The kubelet wrote a new token and the old one stopped working before our minute
        # was up: the 401 makes the client read the file again, once.
        (account / "token").write_text("rotated")
        accepted.clear()
        accepted.add("rotated")
        assert (await client.get("/version"))["gitVersion"] == "v1.36.3"
        assert seen == ["Bearer first", "Bearer first", "Bearer rotated"]
        accepted.clear()  # revoked: refused after one more look at the file, not in a loop
        with pytest.raises(Unauthorized):
            await client.get("/version")
        assert seen[3:] == ["Bearer rotated", "Bearer rotated"]


def test_the_operator_picks_its_host_kubeconfig_then_pod_then_state_dir(
        account: Path, tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    given = tmp_path / "host.kubeconfig"
    assert choose_host(given, account, state, ENV) == HostConfig(kubeconfig=given)
    assert choose_host(None, account, state, ENV) == HostConfig(service_account_dir=account)
    assert choose_host(None, account, state, {}) == HostConfig(
        kubeconfig=state.host_kubeconfig)
