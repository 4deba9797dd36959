"""The PKI is what the components need: loopback SANs, system:masters admin, per-cluster CA."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from operators.controlplane.pki import ensure_pki


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
