"""The PKI is what the components need: loopback SANs, system:masters admin, per-cluster CA;
it is complete or rebuilt."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from operators.controlplane import pki as pki_module
from operators.controlplane.errors import StateError
from operators.controlplane.pki import (
    MAX_COMMON_NAME,
    common_name,
    ensure_addon_pki,
    ensure_client_pki,
    ensure_etcd_pki,
    ensure_pki,
)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_serving_cert_covers_loopback_and_service_names(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, "a")
    cert = _cert(pki.serving_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default.svc" in sans.get_values_for_type(x509.DNSName)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    cert.verify_directly_issued_by(_cert(pki.ca_cert))


def test_admin_is_in_system_masters(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path, "a")
    subject = _cert(pki.client_cert("admin")).subject
    orgs = [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]
    scheduler = _cert(pki.client_cert("kube-scheduler")).subject
    assert scheduler.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:kube-scheduler"


def test_pki_is_reused_not_regenerated(tmp_path: Path) -> None:
    first = ensure_pki(tmp_path, "a").ca_cert.read_bytes()
    assert ensure_pki(tmp_path, "a").ca_cert.read_bytes() == first


def test_each_cluster_has_its_own_ca(tmp_path: Path) -> None:
    a = ensure_pki(tmp_path / "a", "a")
    b = ensure_pki(tmp_path / "b", "b")
    assert a.ca_cert.read_bytes() != b.ca_cert.read_bytes()
    assert (a.ca_key.stat().st_mode & 0o777) == 0o600


def test_a_missing_file_is_refused_not_replaced_under_clients_that_trust_the_ca(
        tmp_path: Path) -> None:
    first = ensure_pki(tmp_path / "pki", "a")
    ca = first.ca_cert.read_bytes()
    first.service_account_key.unlink()
    with pytest.raises(StateError) as refused:
        ensure_pki(tmp_path / "pki", "a")
    message = str(refused.value)
    assert f"{first.service_account_key} is missing" in message
    assert "Restore the file" in message
    assert f"delete {tmp_path / 'pki'}" in message
    assert first.ca_cert.read_bytes() == ca, "nothing is replaced"


def test_a_torn_key_is_refused_with_its_name(tmp_path: Path) -> None:
    first = ensure_pki(tmp_path / "pki", "a")
    ca = first.ca_cert.read_bytes()
    first.client_key("admin").write_bytes(b"")  # e.g. truncated by a crash or a full disk
    with pytest.raises(StateError, match=r"admin\.key is empty or torn"):
        ensure_pki(tmp_path / "pki", "a")
    assert first.ca_cert.read_bytes() == ca


def test_an_empty_directory_gets_a_new_pki(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    pki = ensure_pki(tmp_path / "pki", "a")
    assert all(path.stat().st_size > 0 for path in pki.files())


def test_a_torn_add_on_pki_is_made_anew_from_the_member_ca(tmp_path: Path) -> None:
    cluster = ensure_pki(tmp_path / "cluster", "a")
    addon = ensure_addon_pki(tmp_path / "addon", cluster, "fakefleet:thing", ca_name="thing-ca",
                             serving_name="thing", hosts=("127.0.0.1",))
    addon.serving_key.write_bytes(b"")
    again = ensure_addon_pki(tmp_path / "addon", cluster, "fakefleet:thing",
                             ca_name="thing-ca", serving_name="thing", hosts=("127.0.0.1",))
    assert again.serving_key.stat().st_size > 0
    _cert(again.client_cert).verify_directly_issued_by(_cert(cluster.ca_cert))


def test_an_add_on_client_identity_is_issued_by_the_member_ca_and_follows_a_new_one(
        tmp_path: Path) -> None:
    cluster = ensure_pki(tmp_path / "cluster", "a")
    client = ensure_client_pki(tmp_path / "client", cluster, "fakefleet:prometheus")
    assert sorted(p.name for p in (tmp_path / "client").iterdir()) == ["client.crt",
                                                                        "client.key"]
    cert = _cert(client.client_cert)
    cert.verify_directly_issued_by(_cert(cluster.ca_cert))
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "fakefleet:prometheus"
    first = client.client_cert.read_bytes()
    assert ensure_client_pki(tmp_path / "client", cluster, "fakefleet:prometheus") \
        .client_cert.read_bytes() == first, "reused"
    anew = ensure_pki(tmp_path / "cluster2", "a")
    again = ensure_client_pki(tmp_path / "client", anew, "fakefleet:prometheus")
    _cert(again.client_cert).verify_directly_issued_by(_cert(anew.ca_cert))


def test_interrupted_generation_leaves_no_pki_that_counts_as_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = 0
    real_issue = pki_module._issue

    def issue_then_fail(*args: Any, **kwargs: Any) -> None:
        nonlocal issued
        issued += 1
        if issued == 3:
            raise KeyboardInterrupt
        real_issue(*args, **kwargs)

    monkeypatch.setattr(pki_module, "_issue", issue_then_fail)
    with pytest.raises(KeyboardInterrupt):
        ensure_pki(tmp_path / "pki", "a")
    assert list(tmp_path.iterdir()) == [], "neither a half PKI nor its staging directory"

    monkeypatch.setattr(pki_module, "_issue", real_issue)
    pki = ensure_pki(tmp_path / "pki", "a")
    assert all(path.exists() for path in pki.files())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pki"]


def test_staging_left_by_a_killed_run_is_started_over(tmp_path: Path) -> None:
    leftover = tmp_path / ".pki.staging"
    leftover.mkdir()
    (leftover / "ca.crt").write_text("half")
    pki = ensure_pki(tmp_path / "pki", "a")
    assert all(path.exists() for path in pki.files())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pki"]


#: The longest cluster key: a 63-character namespace, a dot, a 63-character name.
LONGEST_KEY = "n" * 63 + "." + "c" * 63


def _common_name(path: Path) -> str:
    value = _cert(path).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert isinstance(value, str)
    return value


def test_every_common_name_fits_for_the_longest_cluster_key(tmp_path: Path) -> None:
    assert len(LONGEST_KEY) == 127
    pki = ensure_pki(tmp_path, LONGEST_KEY)
    for path in pki.files():
        if path.suffix == ".crt":
            assert len(_common_name(path)) <= MAX_COMMON_NAME, path.name
    assert _common_name(pki.ca_cert).startswith("fakefleet-nnnn")
    assert _common_name(pki.ca_cert).endswith("-ca")


def test_common_names_are_readable_when_short_and_distinct_when_long() -> None:
    assert common_name("fakefleet-default.west", "-ca") == "fakefleet-default.west-ca"
    assert common_name("x" * 61, "-ca") == "x" * 61 + "-ca"
    long_a = common_name("fakefleet-" + LONGEST_KEY, "-ca")
    long_b = common_name("fakefleet-" + LONGEST_KEY[:-1] + "d", "-ca")
    assert len(long_a) == len(long_b) == MAX_COMMON_NAME
    assert long_a != long_b


def test_etcd_has_its_own_ca_and_serves_loopback(tmp_path: Path) -> None:
    etcd = ensure_etcd_pki(tmp_path / "etcd")
    cluster = ensure_pki(tmp_path / "cluster", "a")
    assert etcd.ca_cert.read_bytes() != cluster.ca_cert.read_bytes()
    serving = _cert(etcd.serving_cert)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # etcd's JSON gateway presents the serving certificate to etcd itself as a client.
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    for cert in (etcd.serving_cert, etcd.peer_cert, etcd.apiserver_client_cert,
                 etcd.fakefleet_client_cert):
        _cert(cert).verify_directly_issued_by(_cert(etcd.ca_cert))
        assert len(_common_name(cert)) <= MAX_COMMON_NAME
    for client in (etcd.apiserver_client_cert, etcd.fakefleet_client_cert):
        usage = _cert(client).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_etcd_pki_is_reused_when_complete_and_refused_when_not(tmp_path: Path) -> None:
    first = ensure_etcd_pki(tmp_path / "etcd")
    ca = first.ca_cert.read_bytes()
    assert ensure_etcd_pki(tmp_path / "etcd").ca_cert.read_bytes() == ca
    first.fakefleet_client_key.unlink()
    with pytest.raises(StateError, match=r"fakefleet-client\.key is missing"):
        ensure_etcd_pki(tmp_path / "etcd")
    assert first.ca_cert.read_bytes() == ca


def test_the_front_proxy_has_a_ca_of_its_own_beside_the_cluster_s(tmp_path: Path) -> None:
    cluster = ensure_pki(tmp_path / "pki", "west")
    proxy = pki_module.ensure_front_proxy_pki(tmp_path / "front-proxy")
    client = _cert(proxy.client_cert)
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        pki_module.FRONT_PROXY_CLIENT
    client.verify_directly_issued_by(_cert(proxy.ca_cert))
    assert _cert(proxy.ca_cert).subject != _cert(cluster.ca_cert).subject
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    again = pki_module.ensure_front_proxy_pki(tmp_path / "front-proxy")
    assert again.ca_cert.read_bytes() == proxy.ca_cert.read_bytes(), "reused"


def test_an_add_on_serves_the_names_it_is_given_and_acts_as_its_user(tmp_path: Path) -> None:
    cluster = ensure_pki(tmp_path / "pki", "west")
    addon = pki_module.ensure_addon_pki(
        tmp_path / "ms", cluster, "fakefleet:metrics-server", ca_name="ms-ca",
        serving_name="metrics-server.kube-system.svc",
        hosts=("metrics-server.kube-system.svc", "127.0.0.1"))
    names = _cert(addon.serving_cert).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["metrics-server.kube-system.svc"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    _cert(addon.serving_cert).verify_directly_issued_by(_cert(addon.ca_cert))
    _cert(addon.client_cert).verify_directly_issued_by(_cert(cluster.ca_cert))


def test_the_engine_is_one_identity_of_the_nodes_group_outside_the_node_names(
        tmp_path: Path) -> None:
    """The Node authorizer abstains for a name outside system:node:, RBAC decides; the nodes'
    FlowSchemas match the group; system:monitoring has the API server honour its traces."""
    pki = ensure_pki(tmp_path, "a")
    cert = _cert(pki.client_cert(pki_module.ENGINE))
    subject = cert.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "fakefleet-engine"
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:nodes", "system:monitoring"]
    cert.verify_directly_issued_by(_cert(pki.ca_cert))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_a_pki_of_an_earlier_version_gains_the_engine_identity_from_its_own_ca(
        tmp_path: Path) -> None:
    """Defect: a PKI made before the engine had an identity lacked its files, and was made
    anew as a whole: a new CA under every client that trusted the old one."""
    first = ensure_pki(tmp_path / "pki", "a")
    ca, admin = first.ca_cert.read_bytes(), first.client_cert("admin").read_bytes()
    first.client_cert(pki_module.ENGINE).unlink()
    first.client_key(pki_module.ENGINE).unlink()
    again = ensure_pki(tmp_path / "pki", "a")
    assert again.ca_cert.read_bytes() == ca, "the same CA"
    assert again.client_cert("admin").read_bytes() == admin, "the others as they were"
    _cert(again.client_cert(pki_module.ENGINE)).verify_directly_issued_by(_cert(again.ca_cert))
    assert (again.client_key(pki_module.ENGINE).stat().st_mode & 0o777) == 0o600


def test_an_engine_key_without_its_certificate_is_issued_again(tmp_path: Path) -> None:
    first = ensure_pki(tmp_path / "pki", "a")
    ca = first.ca_cert.read_bytes()
    first.client_cert(pki_module.ENGINE).unlink()  # stopped between key and certificate
    again = ensure_pki(tmp_path / "pki", "a")
    assert again.ca_cert.read_bytes() == ca
    assert all(path.exists() for path in again.files())


def test_kubelets_have_a_ca_of_their_own_and_the_api_server_a_client_cert_from_it(
        tmp_path: Path) -> None:
    """Nothing the member's CA issued opens a kubelet, and the API server's kubelet client
    certificate opens nothing but kubelets."""
    cluster = ensure_pki(tmp_path / "pki", "west")
    kubelet = pki_module.ensure_kubelet_pki(tmp_path / "kubelet", "west")
    ca = _cert(kubelet.ca_cert)
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "fakefleet-west-kubelet-ca"
    assert ca.subject != _cert(cluster.ca_cert).subject
    client = _cert(kubelet.client_cert)
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "kube-apiserver-kubelet-client"
    client.verify_directly_issued_by(ca)
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki_module.ensure_kubelet_pki(tmp_path / "kubelet", "west").ca_cert.read_bytes() \
        == kubelet.ca_cert.read_bytes(), "reused"
    kubelet.client_key.unlink()
    with pytest.raises(StateError, match=r"apiserver-client\.key is missing"):
        pki_module.ensure_kubelet_pki(tmp_path / "kubelet", "west")


def test_a_node_s_serving_certificate_names_the_node_and_its_address(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    kubelet = pki_module.ensure_kubelet_pki(tmp_path / "kubelet", "west")
    authority = pki_module.load_authority(kubelet)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = x509.load_pem_x509_certificate(pki_module.node_serving_certificate(
        authority, key, "gpu-3", "127.64.0.4"))
    cert.verify_directly_issued_by(_cert(kubelet.ca_cert))
    subject = cert.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:gpu-3"
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "system:nodes"]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.64.0.4")]
    assert sans.get_values_for_type(x509.DNSName) == ["gpu-3"]
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.public_key() == key.public_key()
