"""The wrapper module is derived from upstream's go.mod, not typed by hand."""

from __future__ import annotations

import pytest

from operators.controlplane import building
from operators.controlplane.errors import BuildError

UPSTREAM = """\
// This is a generated file. Do not edit directly.
module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
	go.etcd.io/etcd/client/v3 v3.6.8
	k8s.io/api v0.0.0
)

require (
	go.etcd.io/etcd/server/v3 v3.6.8 // indirect
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	k8s.io/cri-streaming => ./staging/src/k8s.io/cri-streaming
)
"""


def test_parse_upstream_reads_staging_godebug_and_etcd() -> None:
    upstream = building.parse_upstream_gomod("v1.36.3", UPSTREAM)
    assert upstream.go_version == "1.26.0"
    assert upstream.godebug == ("godebug default=go1.26",)
    assert upstream.staging == ("k8s.io/api", "k8s.io/client-go", "k8s.io/cri-streaming")
    assert upstream.etcd_version == "v3.6.8"


def test_wrapper_replaces_every_staging_module_with_its_v0_twin() -> None:
    text = building.render_wrapper_gomod(building.parse_upstream_gomod("v1.36.3", UPSTREAM))
    assert "\tk8s.io/kubernetes v1.36.3" in text
    assert "\tgo.etcd.io/etcd/server/v3 v3.6.8" in text
    assert "\tk8s.io/client-go => k8s.io/client-go v0.36.3" in text
    assert "\tk8s.io/cri-streaming => k8s.io/cri-streaming v0.36.3" in text
    assert "godebug default=go1.26" in text
    assert "go 1.26.0" in text


def test_not_a_kubernetes_gomod_is_rejected() -> None:
    with pytest.raises(BuildError, match="does not look like a Kubernetes release"):
        building.parse_upstream_gomod("v1.36.3", "module example.com/x\n\ngo 1.22\n")


@pytest.mark.parametrize("version", ["1.36.3", "v1.36", "v2.0.0", "latest", "v1.36.3-rc.0"])
def test_malformed_versions_name_the_accepted_form(version: str) -> None:
    with pytest.raises(BuildError, match=r"v1\.MINOR\.PATCH"):
        building.parse_version(version)


def test_ldflags_stamp_both_version_packages() -> None:
    flags = building.version_ldflags("v1.35.2")
    for package in building.VERSION_PACKAGES:
        assert f"-X {package}.gitVersion=v1.35.2" in flags
        assert f"-X {package}.gitMinor=35" in flags
        assert f"-X {package}.gitMajor=1" in flags


def test_tools_file_imports_every_command() -> None:
    text = building.render_tools_go()
    assert text.startswith("//go:build tools")
    for name in building.KUBERNETES_COMMANDS:
        assert f'"k8s.io/kubernetes/cmd/{name}"' in text
    assert '"go.etcd.io/etcd/server/v3"' in text
