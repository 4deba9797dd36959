"""Certificates and keys for the local control planes, generated in Python with ``cryptography``.

Each cluster gets its own CA, so the credentials of one simulated cluster never open another; the
shared etcd gets a CA of its own too, so no cluster credential opens etcd. Keys are ECDSA P-256:
fast to generate (a PKI takes milliseconds) and accepted by every component.

A PKI is complete or absent: it is generated into a staging directory that is renamed into
place only once every file is written (each flushed to disk, the directories too), so an
interrupted first run can never leave a PKI whose service-account key is missing. A complete
PKI is reused, so a restarted cluster keeps its kubeconfigs valid. One that exists with a file
missing or torn (a disk that filled, a hand that slipped) is refused with the file's name and
the two ways out, never replaced behind the back of the clients that trust its CA; only an
add-on's PKI, which no one but fakefleet's own objects trusts, is made anew.

Private keys are written 0600 from their creation (:mod:`~primitives.files`).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import ipaddress
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from operators.controlplane.errors import StateError
from primitives.files import Directory, Named, private_directory, sync_directory, write_private

VALIDITY = datetime.timedelta(days=3650)
#: X.509's upper bound on a common name (RFC 5280, ``ub-common-name``).
MAX_COMMON_NAME = 64
#: Hex digits of the digest that keeps cut-short common names distinct (40 bits).
_DIGEST_LENGTH = 10
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
_ETCD_SANS: tuple[x509.GeneralName, ...] = (
    x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
)

#: The engine's client identity in a member: the kubelets' group, so that the API server's
#: priority and fairness serves it as it serves kubelets (upstream's FlowSchemas
#: ``system-node-high`` for Lease and node writes, ``system-nodes`` for the rest), and a name
#: outside ``system:node:``, so that the Node authorizer abstains and RBAC decides (the engine
#: writes for every node: :mod:`operators.engine.authorizing` binds exactly what it writes).
#: One identity for all nodes: a certificate (and a TLS connection) per node would be thousands.
#: ``system:monitoring`` too: the API server honours an incoming trace context only from that
#: group or ``system:masters``, and a fault's writes join the plan's trace; it matches no
#: FlowSchema and its RBAC reads only health and metrics endpoints.
ENGINE = "engine"
ENGINE_USER = "fakefleet-engine"

#: Client identities: file stem → (common name, organisations). RBAC's bootstrap policy binds
#: the scheduler's and controller-manager's user names; admins are in ``system:masters``.
CLIENTS = {
    "admin": ("fakefleet-admin", ("system:masters",)),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    ENGINE: (ENGINE_USER, ("system:nodes", "system:monitoring")),
}


def _pair(stem: str) -> tuple[Named, Named]:
    """A certificate and its key: ``<stem>.crt`` and ``<stem>.key``."""
    return Named(f"{stem}.crt"), Named(f"{stem}.key")


@dataclasses.dataclass(frozen=True)
class _Files(Directory):
    """The paths of one PKI: its CA and the files its class names."""

    ca_cert, ca_key = _pair("ca")

    def files(self) -> Iterator[Path]:
        """Every file of a complete PKI."""
        return self.declared()


@dataclasses.dataclass(frozen=True)
class ClusterPKI(_Files):
    """Paths of one cluster's certificates and keys."""

    serving_cert, serving_key = _pair("apiserver")
    service_account_key = Named("sa.key")
    service_account_pub = Named("sa.pub")

    def client_cert(self, client: str) -> Path:
        return self.directory / f"{client}.crt"

    def client_key(self, client: str) -> Path:
        return self.directory / f"{client}.key"

    def files(self) -> Iterator[Path]:
        yield from super().files()
        for client in CLIENTS:
            yield from (self.client_cert(client), self.client_key(client))


@dataclasses.dataclass(frozen=True)
class EtcdPKI(_Files):
    """Paths of the shared etcd's CA, its serving and peer certificates, and its two clients:
    the kube-apiservers, and fakefleet itself (the JSON gateway calls and health probes)."""

    serving_cert, serving_key = _pair("server")
    peer_cert, peer_key = _pair("peer")
    apiserver_client_cert, apiserver_client_key = _pair("apiserver-client")
    fakefleet_client_cert, fakefleet_client_key = _pair("fakefleet-client")


@dataclasses.dataclass(frozen=True)
class HubPKI(_Files):
    """The federation hub's CA and serving certificate (loopback names and addresses)."""

    serving_cert, serving_key = _pair("hub")


@dataclasses.dataclass(frozen=True)
class AddonPKI(_Files):
    """A member's add-on (Kueue, metrics-server): its serving certificate under a CA of its own
    (the ``caBundle`` the member's API server verifies it with; ``tls.crt``/``tls.key``, the
    names Kueue's webhook server reads from its certDir), and its client identity, issued by
    the member's CA."""

    serving_cert, serving_key = _pair("tls")
    client_cert, client_key = _pair("client")


@dataclasses.dataclass(frozen=True)
class ClientPKI(Directory):
    """A member's add-on that only calls the member's API server (Prometheus' discovery): its
    client identity, issued by the member's CA."""

    client_cert, client_key = _pair("client")

    def files(self) -> Iterator[Path]:
        return self.declared()


@dataclasses.dataclass(frozen=True)
class FrontProxyPKI(_Files):
    """A member's aggregation layer: the front-proxy CA its API server trusts for the
    requestheader identities it forwards, and the client certificate it forwards them with to
    aggregated API servers (metrics-server)."""

    client_cert, client_key = _pair("front-proxy-client")


#: The name aggregated API servers accept forwarded identities from (the front-proxy client's
#: common name, ``--requestheader-allowed-names``).
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclasses.dataclass(frozen=True)
class KubeletPKI(_Files):
    """A member's kubelets: the CA that the member's API server verifies kubelets' serving
    certificates with (``--kubelet-certificate-authority``) and the engine verifies the API
    server's client certificate with, and that client certificate
    (``--kubelet-client-certificate``), which nothing but a kubelet trusts: the member's API
    server does not trust this CA, and the engine trusts no other. The engine holds the CA key
    and issues each node's serving certificate itself (:func:`node_serving_certificate`), which
    makes it no more than it is anyway: every kubelet of the member."""

    client_cert, client_key = _pair("apiserver-client")


#: The API server's name when it calls kubelets (kubeadm's, and what the engine accepts).
KUBELET_CLIENT = "kube-apiserver-kubelet-client"
#: How long a node's serving certificate is valid; the engine issues them anew when it starts.
NODE_VALIDITY = datetime.timedelta(days=365)


def common_name(name: str, suffix: str = "") -> str:
    """``name + suffix`` when it fits in a common name; otherwise ``name`` cut short and followed
    by a digest of all of it, so that long names that share a beginning stay distinct."""
    if len(name) + len(suffix) <= MAX_COMMON_NAME:
        return name + suffix
    digest = hashlib.sha256(name.encode()).hexdigest()[:_DIGEST_LENGTH]
    keep = MAX_COMMON_NAME - len(suffix) - len(digest) - 1
    return f"{name[:keep]}-{digest}{suffix}"


def ensure_pki(directory: Path, cluster: str) -> ClusterPKI:
    """The PKI of ``cluster`` in ``directory``: reused if complete, else generated anew. A
    client identity whose certificate a PKI otherwise complete lacks (one of an earlier
    version has no engine identity) is issued by the PKI's own CA, so every kubeconfig made
    from it stays valid."""
    pki = ClusterPKI(directory)
    _add_clients(pki)
    _ensure(directory, lambda at: ClusterPKI(at).files(),
            lambda staging: _generate_cluster(ClusterPKI(staging), cluster))
    return pki


def _add_clients(pki: ClusterPKI) -> None:
    missing = [stem for stem in CLIENTS if not pki.client_cert(stem).exists()]
    issued = {path for stem in missing
              for path in (pki.client_cert(stem), pki.client_key(stem))}
    if not missing or not all(_parses(path) for path in pki.files() if path not in issued):
        return  # none missing, or a new or broken PKI: generated as a whole
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey), "our CAs are ECDSA"
    for stem in missing:
        name, organisations = CLIENTS[stem]
        # The key first, then the certificate: stopped between the two, the certificate is
        # still missing, and both are issued again.
        _issue(pki.client_cert(stem), pki.client_key(stem), name, organisations, ca_cert,
               ca_key, _now(), usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), sans=[])


def ensure_etcd_pki(directory: Path) -> EtcdPKI:
    """The shared etcd's PKI in ``directory``: reused if complete, else generated anew."""
    _ensure(directory, lambda at: EtcdPKI(at).files(),
            lambda staging: _generate_etcd(EtcdPKI(staging)))
    return EtcdPKI(directory)


def ensure_hub_pki(directory: Path) -> HubPKI:
    """The hub's PKI in ``directory``: reused if complete, else generated anew."""
    _ensure(directory, lambda at: HubPKI(at).files(),
            lambda staging: _generate_hub(HubPKI(staging)))
    return HubPKI(directory)


def ensure_addon_pki(directory: Path, cluster: ClusterPKI, user: str, *, ca_name: str,
                     serving_name: str, hosts: tuple[str, ...]) -> AddonPKI:
    """A member's add-on PKI, serving ``hosts`` (DNS names and IP addresses): reused if complete
    and its client certificate was issued by the member's current CA (a member whose PKI was
    made anew gets a new one), else generated."""
    pki = AddonPKI(directory)
    if not _issued_by(pki.client_cert, cluster.ca_cert):
        shutil.rmtree(directory, ignore_errors=True)
    _ensure(directory, lambda at: AddonPKI(at).files(),
            lambda staging: _generate_addon(AddonPKI(staging), cluster, user, ca_name,
                                            serving_name, hosts), derived=True)
    return pki


def ensure_client_pki(directory: Path, cluster: ClusterPKI, user: str) -> ClientPKI:
    """A member's add-on client identity ``user``: reused if complete and issued by the
    member's current CA, else generated."""
    pki = ClientPKI(directory)
    if not _issued_by(pki.client_cert, cluster.ca_cert):
        shutil.rmtree(directory, ignore_errors=True)
    _ensure(directory, lambda at: ClientPKI(at).files(),
            lambda staging: _issue_client(ClientPKI(staging), cluster, user, _now()),
            derived=True)
    return pki


def ensure_front_proxy_pki(directory: Path) -> FrontProxyPKI:
    """A member's front-proxy PKI in ``directory``: reused if complete, else generated anew
    (apart from the cluster's PKI, so an older cluster gains one without a new CA)."""
    _ensure(directory, lambda at: FrontProxyPKI(at).files(),
            lambda staging: _generate_front_proxy(FrontProxyPKI(staging)))
    return FrontProxyPKI(directory)


def ensure_kubelet_pki(directory: Path, cluster: str) -> KubeletPKI:
    """A member's kubelet PKI in ``directory``: reused if complete, else generated anew (apart
    from the cluster's PKI, so an older member gains one without a new CA); a torn one is
    refused, as the cluster's is: the running API server trusts its CA."""
    _ensure(directory, lambda at: KubeletPKI(at).files(),
            lambda staging: _generate_kubelet(KubeletPKI(staging), cluster))
    return KubeletPKI(directory)


def load_authority(pki: KubeletPKI) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The CA of a kubelet PKI, to issue node certificates with."""
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise StateError(f"{pki.ca_key} is not an ECDSA key, as fakefleet's CAs are: delete "
                         f"{pki.directory} and restart the member to make a new one")
    return cert, key


def node_serving_certificate(
    authority: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    key: ec.EllipticCurvePrivateKey, node: str, address: str, *,
    now: datetime.datetime | None = None,
) -> bytes:
    """A kubelet's serving certificate (PEM) for ``node`` at ``address``, as a kubelet's
    CSR gets it signed: CN ``system:node:<node>``, O ``system:nodes``, serverAuth, the node's
    InternalIP and name as SANs (the API server verifies the address it dials)."""
    ca_cert, ca_key = authority
    now = now or _now()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + NODE_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False)
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(address)), x509.DNSName(node)]),
            critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def ensure_serving_pair(cert_path: Path, key_path: Path, name: str) -> None:
    """A self-signed serving certificate for 127.0.0.1 at these paths, unless one parses
    there: for listeners nobody verifies (Kueue's metrics, behind its own authorisation)."""
    if _parses(cert_path) and _parses(key_path):
        return
    cert_path.parent.mkdir(parents=True, exist_ok=True)
    _new_ca(cert_path, key_path, name, _now())  # self-signed: its own issuer


def _issued_by(cert_path: Path, ca_path: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        cert.verify_directly_issued_by(ca)
    except (OSError, ValueError, TypeError, InvalidSignature):
        return False
    return True


def _ensure(directory: Path, files: Callable[[Path], Iterator[Path]],
            generate: Callable[[Path], None], *, derived: bool = False) -> None:
    """Reuse the PKI in ``directory``, or generate one where there is none. A PKI that exists
    but has a file missing or torn is refused (:class:`StateError`, naming the file), not made
    anew: its CA is trusted by clients that would silently stop working (kubeconfigs handed
    out, the API servers started with it). ``derived``: a PKI only fakefleet's own objects
    trust (an add-on's, whose CA the operator writes into the member on every start), which is
    safe to make anew."""
    paths = list(files(directory))
    if all(_parses(path) for path in paths):
        return
    if not derived and directory.exists() and any(directory.iterdir()):
        broken = next(path for path in paths if not _parses(path))
        what = "missing" if not broken.exists() else "empty or torn (it does not parse)"
        raise StateError(
            f"{broken} is {what}: it belongs to the certificates in {directory}, whose CA "
            f"kubeconfigs and running components trust, so fakefleet does not replace them by "
            f"itself. Restore the file from a backup; or, to start this PKI afresh (every "
            f"kubeconfig and certificate made from it stops working), stop fakefleet and "
            f"delete {directory}")
    # A fixed name: only one process generates a given PKI, and a staging directory that an
    # interrupted run left behind is simply started over.
    staging = directory.with_name(f".{directory.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    private_directory(staging)
    try:
        generate(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # A derived PKI that is incomplete: nothing of it is kept, so no stale CA signs a new key.
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    sync_directory(directory.parent)


def _parses(path: Path) -> bool:
    try:
        data = path.read_bytes()
        if path.suffix == ".crt":
            x509.load_pem_x509_certificate(data)
        elif path.suffix == ".key":
            serialization.load_pem_private_key(data, password=None)
        else:
            serialization.load_pem_public_key(data)
    except (OSError, ValueError, TypeError):
        return False
    return True


def _generate_cluster(pki: ClusterPKI, cluster: str) -> None:
    now = _now()
    ca_name = common_name(f"fakefleet-{cluster}", "-ca")
    ca_cert, ca_key = _new_ca(pki.ca_cert, pki.ca_key, ca_name, now)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in _SERVER_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVER_IPS]
    _issue(pki.serving_cert, pki.serving_key, "kube-apiserver", (), ca_cert, ca_key, now,
           usages=(ExtendedKeyUsageOID.SERVER_AUTH,), sans=sans)
    for stem, (name, organisations) in CLIENTS.items():
        _issue(pki.client_cert(stem), pki.client_key(stem), name, organisations,
               ca_cert, ca_key, now, usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), sans=[])

    sa_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(pki.service_account_key, sa_key)
    write_private(pki.service_account_pub, sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def _generate_etcd(pki: EtcdPKI) -> None:
    now = _now()
    ca_cert, ca_key = _new_ca(pki.ca_cert, pki.ca_key, "fakefleet-etcd-ca", now)
    both = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    # The serving certificate is a client certificate too: with --client-cert-auth, etcd's JSON
    # gateway dials etcd's own gRPC server presenting it. Peers are client and server alike.
    _issue(pki.serving_cert, pki.serving_key, "fakefleet-etcd", (), ca_cert, ca_key, now,
           usages=both, sans=list(_ETCD_SANS))
    _issue(pki.peer_cert, pki.peer_key, "fakefleet-etcd-peer", (), ca_cert, ca_key, now,
           usages=both, sans=list(_ETCD_SANS))
    client = (ExtendedKeyUsageOID.CLIENT_AUTH,)
    _issue(pki.apiserver_client_cert, pki.apiserver_client_key, "kube-apiserver-etcd-client",
           (), ca_cert, ca_key, now, usages=client, sans=[])
    _issue(pki.fakefleet_client_cert, pki.fakefleet_client_key, "fakefleet-etcd-client",
           (), ca_cert, ca_key, now, usages=client, sans=[])


def _generate_hub(pki: HubPKI) -> None:
    now = _now()
    ca_cert, ca_key = _new_ca(pki.ca_cert, pki.ca_key, "fakefleet-hub-ca", now)
    sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1")]
    _issue(pki.serving_cert, pki.serving_key, "fakefleet-hub", (), ca_cert, ca_key, now,
           usages=(ExtendedKeyUsageOID.SERVER_AUTH,), sans=sans)


def _generate_front_proxy(pki: FrontProxyPKI) -> None:
    now = _now()
    ca_cert, ca_key = _new_ca(pki.ca_cert, pki.ca_key, "fakefleet-front-proxy-ca", now)
    _issue(pki.client_cert, pki.client_key, FRONT_PROXY_CLIENT, (), ca_cert, ca_key, now,
           usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), sans=[])


def _generate_kubelet(pki: KubeletPKI, cluster: str) -> None:
    now = _now()
    ca_cert, ca_key = _new_ca(pki.ca_cert, pki.ca_key,
                              common_name(f"fakefleet-{cluster}", "-kubelet-ca"), now)
    _issue(pki.client_cert, pki.client_key, KUBELET_CLIENT, (), ca_cert, ca_key, now,
           usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), sans=[])


def _host(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _generate_addon(pki: AddonPKI, cluster: ClusterPKI, user: str, ca_name: str,
                    serving_name: str, hosts: tuple[str, ...]) -> None:
    now = _now()
    ca_cert, ca_key = _new_ca(pki.ca_cert, pki.ca_key, ca_name, now)
    _issue(pki.serving_cert, pki.serving_key, serving_name, (), ca_cert, ca_key, now,
           usages=(ExtendedKeyUsageOID.SERVER_AUTH,), sans=[_host(host) for host in hosts])
    _issue_client(pki, cluster, user, now)


def _issue_client(pki: AddonPKI | ClientPKI, cluster: ClusterPKI, user: str,
                  now: datetime.datetime) -> None:
    """The add-on's client certificate for ``user``, issued by the member's CA."""
    member_ca = x509.load_pem_x509_certificate(cluster.ca_cert.read_bytes())
    member_key = serialization.load_pem_private_key(cluster.ca_key.read_bytes(), password=None)
    assert isinstance(member_key, ec.EllipticCurvePrivateKey), "our CAs are ECDSA"
    _issue(pki.client_cert, pki.client_key, user, (), member_ca, member_key, now,
           usages=(ExtendedKeyUsageOID.CLIENT_AUTH,), sans=[])


def _now() -> datetime.datetime:
    # Back-dated a little, so a clock that is slightly behind still accepts the certificates.
    return datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)


def _new_ca(cert_path: Path, key_path: Path, name: str,
            now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(subject, subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


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
    name: str,
    organisations: tuple[str, ...],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    *,
    usages: tuple[x509.ObjectIdentifier, ...],
    sans: list[x509.GeneralName],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organisations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, name))
    builder = (
        _builder(x509.Name(attributes), ca_cert.subject, key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(key_path, key)
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_private(path, key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ))
