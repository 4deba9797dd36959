"""The API boundary: error translation and kubeconfig loading."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest
import yaml

from operators.controlplane import kubeconfigs
from operators.controlplane.pki import ensure_pki
from operators.k8s import errors
from operators.k8s.config import load_kubeconfig, load_kubeconfig_file


def status_body(reason: str, message: str) -> str:
    return json.dumps({"kind": "Status", "reason": reason, "message": message})


@pytest.mark.parametrize(("code", "kind"), [
    (400, errors.BadRequest), (403, errors.Unauthorized), (404, errors.NotFound),
    (409, errors.Conflict), (410, errors.Gone), (422, errors.Invalid),
    (500, errors.ServerError), (503, errors.ServerError),
])
def test_statuses_map_to_one_class_each(code: int, kind: type[errors.ApiError]) -> None:
    error = errors.api_error(code, status_body("Why", "what"), {})
    assert type(error) is kind
    assert error.message == "what"


def test_already_exists_is_a_conflict_that_says_so() -> None:
    error = errors.api_error(409, status_body("AlreadyExists", "x exists"), {})
    assert isinstance(error, errors.Conflict)
    assert error.already_exists


def test_throttling_carries_retry_after() -> None:
    error = errors.api_error(429, "slow down", {"Retry-After": "3"})
    assert isinstance(error, errors.TooManyRequests)
    assert error.retry_after == 3.0


def test_our_kubeconfigs_load(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, "a")
    text = kubeconfigs.render(cluster="a", server="https://127.0.0.1:6443/",
                              ca_cert=pki.ca_cert, client_cert=pki.client_cert("admin"),
                              client_key=pki.client_key("admin"))
    access = load_kubeconfig(text)
    assert access.server == "https://127.0.0.1:6443"
    assert access.authorization() is None
    assert access.client_cert == pki.client_cert("admin").read_bytes()


def test_broken_kubeconfig_is_a_clear_error() -> None:
    with pytest.raises(errors.ConfigError, match="cannot be used"):
        load_kubeconfig("apiVersion: v1\nkind: Config\n")
    with pytest.raises(errors.ConfigError, match="not a kubeconfig"):
        load_kubeconfig("just text")


def _files_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that names its certificates and token by paths relative to itself."""
    pki = ensure_pki(tmp_path / "pki", "a")
    (tmp_path / "token").write_text("s3cret\n")
    config = tmp_path / "conf" / "kubeconfig"
    config.parent.mkdir()
    config.write_text(f"""
apiVersion: v1
kind: Config
current-context: c
contexts: [{{name: c, context: {{cluster: k, user: u}}}}]
clusters: [{{name: k, cluster: {{server: "https://127.0.0.1:6443",
             certificate-authority: ../pki/{pki.ca_cert.name}}}}}]
users: [{{name: u, user: {{client-certificate: ../pki/admin.crt, client-key: ../pki/admin.key,
          tokenFile: ../token}}}}]
""")
    return config


def test_paths_resolve_against_the_kubeconfig_and_token_files_are_read(tmp_path: Path) -> None:
    config = _files_kubeconfig(tmp_path)
    access = load_kubeconfig_file(config)
    assert access.ca == (tmp_path / "pki" / "ca.crt").read_bytes()
    assert access.client_key == (tmp_path / "pki" / "admin.key").read_bytes()
    assert access.bearer_token() == "s3cret"
    context = access.tls()  # the certificate and key load into a TLS context
    # The kubeconfig's CA alone is trusted, as kubectl trusts it: not the system's CAs too.
    assert [ca["subject"] for ca in context.get_ca_certs()] == [
        ca["subject"] for ca in _ca_context(access.ca).get_ca_certs()]
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def _ca_context(ca: bytes | None) -> ssl.SSLContext:
    assert ca is not None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=ca.decode())
    return context


def test_an_insecure_kubeconfig_verifies_nothing_and_loads_no_ca() -> None:
    access = load_kubeconfig("""
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
""")
    context = access.tls()
    assert context.verify_mode == ssl.CERT_NONE
    assert not context.check_hostname
    assert context.get_ca_certs() == []


def test_exec_plugin_supplies_the_token(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.sh"
    plugin.write_text('#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1", '
                      '"kind": "ExecCredential", "status": {"token": "from-exec", '
                      '"expirationTimestamp": "2099-01-01T00:00:00Z"}}\'\n')
    plugin.chmod(0o755)
    text = """
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://eks.example:443",
            insecure-skip-tls-verify: true}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1,
        command: ./plugin.sh, interactiveMode: Never}}}]
"""
    access = load_kubeconfig(text, base_dir=tmp_path)
    assert access.bearer_token() == "from-exec"
    assert access.expires is not None
    assert access.expires.year == 2099
    assert access.insecure


def test_failing_exec_plugin_says_why(tmp_path: Path) -> None:
    text = """
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://eks.example:443"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1,
        command: sh, args: ["-c", "echo no credentials for you >&2; exit 3"]}}}]
"""
    with pytest.raises(errors.ConfigError, match="no credentials for you"):
        load_kubeconfig(text, base_dir=tmp_path)


@pytest.mark.parametrize(("section", "field"), [
    ("users", "client-key"), ("users", "tokenFile"), ("users", "exec"),
    ("clusters", "certificate-authority"),
])
def test_a_kubeconfig_from_a_secret_may_not_name_files_or_commands(
        tmp_path: Path, section: str, field: str) -> None:
    config = yaml.safe_load(_files_kubeconfig(tmp_path).read_text())
    config["clusters"][0]["cluster"] = {"server": "https://x:443"}
    config["users"][0]["user"] = {"token": "t"}
    body = config[section][0]["user" if section == "users" else "cluster"]
    body[field] = {"command": "cat"} if field == "exec" else "/etc/passwd"
    with pytest.raises(errors.ConfigError, match=rf"{section}\[0\]\.\w+\.{field}.*must embed"):
        load_kubeconfig(yaml.safe_dump(config), untrusted=True, source="Secret ns/creds")
