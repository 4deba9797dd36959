"""The API boundary: error translation and kubeconfig loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operators.controlplane import kubeconfigs
from operators.controlplane.pki import ensure_pki
from operators.k8s import errors
from operators.k8s.config import load_kubeconfig


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
    assert access.token is None


def test_broken_kubeconfig_is_a_clear_error() -> None:
    with pytest.raises(errors.K8sError, match="incomplete or malformed"):
        load_kubeconfig("apiVersion: v1\nkind: Config\n")
