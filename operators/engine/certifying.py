"""Each fake node's kubelet serving certificate, and the TLS context that presents it.

The member's API server dials a node's kubelet at its InternalIP and verifies the certificate
for that address against the kubelets' CA (``--kubelet-certificate-authority``). The engine
holds that CA (the member's kubelet PKI, :class:`~operators.controlplane.pki.KubeletPKI`) and
issues a node's certificate the first time the node is asked for (CN ``system:node:<name>``, O
``system:nodes``, its address and name as SANs: what a kubelet's CSR gets), one ECDSA signature
of about a millisecond; nothing is issued ahead, since nodes come and go (Karpenter's get their
address when they are taken over). All of them share one key, made when the engine starts and
never written anywhere.

A node's context requires a client certificate from the same CA (the API server's,
``kube-apiserver-kubelet-client``; the member's own CA is not trusted, so no admin or component
certificate opens a kubelet) and speaks HTTP/1.1 only (client-go offers h2 too). The contexts of
the nodes used last are kept (:data:`CONTEXTS`); one of a node whose address changed is not
reused.
"""

from __future__ import annotations

import collections
import contextlib
import os
import ssl
from collections.abc import Callable, Iterator

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from operators.controlplane.pki import KubeletPKI, load_authority, node_serving_certificate

#: Node contexts kept: about 25 KiB each, and about 4 ms of CPU to make one (the signature,
#: and OpenSSL checking the key against the certificate), so the nodes the API server talks to
#: now are kept, not every node.
CONTEXTS = 1024


class NodeCertificates:
    """The TLS context of each node, by the address a connection arrived on."""

    def __init__(self, pki: KubeletPKI, node_at: Callable[[str], str | None], *,
                 size: int = CONTEXTS) -> None:
        """``node_at``: the node whose InternalIP an address is (None: no node's)."""
        self._authority = load_authority(pki)
        self._ca = pki.ca_cert.read_text()
        self._node_at = node_at
        self._size = size
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._key_pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption())
        self._contexts: collections.OrderedDict[tuple[str, str], ssl.SSLContext] = \
            collections.OrderedDict()

    def context_for(self, address: str) -> ssl.SSLContext | None:
        """The context of the node at ``address`` (None: no node is there)."""
        node = self._node_at(address)
        if node is None:
            return None
        key = (node, address)
        context = self._contexts.get(key)
        if context is not None:
            self._contexts.move_to_end(key)
            return context
        context = self._context(node, address)
        self._contexts[key] = context
        if len(self._contexts) > self._size:
            self._contexts.popitem(last=False)
        return context

    def _context(self, node: str, address: str) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=self._ca)
        certificate = node_serving_certificate(self._authority, self._key, node, address)
        with _memory_file(certificate + self._key_pem) as path:
            context.load_cert_chain(path)
        return context


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path that reads ``data`` while the block runs, held in memory only (the key must
    not touch a disk; ``load_cert_chain`` reads paths only)."""
    descriptor = os.memfd_create("kubelet-serving", os.MFD_CLOEXEC)
    try:
        os.write(descriptor, data)
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)
