"""Certificates and keys for one local cluster, generated in Python with ``cryptography``.

Each cluster gets its own CA, so the credentials of one simulated cluster never open another.
Keys are ECDSA P-256: fast to generate (a cluster's PKI takes milliseconds) and accepted by every
Kubernetes component. Files are written once and reused, so a restarted cluster keeps its
kubeconfig valid. Private keys are written 0600 from their creation
(:mod:`~operators.controlplane.files`).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from operators.controlplane.files import private_directory, write_private

VALIDITY = datetime.timedelta(days=3650)
#: The ClusterIP of the ``kubernetes`` Service: the first address of the service range.
KUBERNETES_SERVICE_IP = "10.96.0.1"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/12"
_SERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_SERVER_IPS = ("127.0.0.1", "::1", KUBERNETES_SERVICE_IP)

#: Client identities: file stem → (common name, organisations). RBAC's bootstrap policy binds
#: the scheduler's and controller-manager's user names; admins are in ``system:masters``.
CLIENTS = {
    "admin": ("fakefleet-admin", ("system:masters",)),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
}


@dataclasses.dataclass(frozen=True)
class ClusterPKI:
    """Paths of one cluster's certificates and keys."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    def client_cert(self, client: str) -> Path:
        return self.directory / f"{client}.crt"

    def client_key(self, client: str) -> Path:
        return self.directory / f"{client}.key"


def ensure_pki(directory: Path, cluster: str) -> ClusterPKI:
    """Create the cluster's PKI in ``directory`` unless it is already complete there."""
    pki = ClusterPKI(directory)
    if pki.client_key("kube-controller-manager").exists():
        return pki
    private_directory(directory)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fakefleet-{cluster}-ca")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.ca_key, ca_key)
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in _SERVER_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVER_IPS]
    _issue(pki.serving_cert, pki.serving_key, "kube-apiserver", (), ca_cert, ca_key, now,
           usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)
    for stem, (common_name, organisations) in CLIENTS.items():
        _issue(pki.client_cert(stem), pki.client_key(stem), common_name, organisations,
               ca_cert, ca_key, now, usage=ExtendedKeyUsageOID.CLIENT_AUTH, sans=[])

    sa_key = ec.generate_private_key(ec.SECP256R1())
    pki.service_account_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    _write_key(pki.service_account_key, sa_key)
    return pki


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
    )


def _issue(
    cert_path: Path,
    key_path: Path,
    common_name: str,
    organisations: tuple[str, ...],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    *,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organisations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    builder = (
        _builder(x509.Name(attributes), ca_cert.subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_private(path, key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ))
