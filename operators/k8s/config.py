"""How to reach an API server, from any kubeconfig: :class:`ClusterAccess`.

The kubeconfig is read by the Kubernetes project's own Python loader
(``kubernetes.config.kube_config.KubeConfigLoader``), so what ``kubectl`` accepts works here:
certificates and keys as data or as files (relative paths resolve against the kubeconfig's
directory), ``token`` and ``tokenFile``, exec credential plugins (EKS, GKE, AKS, OIDC helpers)
and auth providers, refreshed when they expire. The result serves both the engine's raw client
(:mod:`operators.k8s.transport`) and kopf's connection info (built in the handlers).

A kubeconfig that arrives in a Secret comes from a tenant of the host cluster: it may not make
the operator read local files or run commands (:func:`check_untrusted`), and what its server
answers is read within bounds (:attr:`ClusterAccess.untrusted`). Its server URL is reached from
the operator, on the operator's network: whoever may create a FakeCluster with ``backend:
external`` and a Secret may make the operator connect to any address it can reach.

In a pod, :func:`load_in_cluster` reads the service account instead, as client-go's
``rest.InClusterConfig`` does: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the
CA in ``ca.crt``, the bearer token in ``token``. The kubelet rewrites a projected token before
it expires, so the token file is read again once a minute (client-go's period), and the access
says when the token it read expires (kopf logs in again by then). :class:`HostConfig` names
either source; the processes that reach the host cluster (operator, engines) take one.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import datetime
import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import Configuration
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.kube_config import KubeConfigLoader

from operators.k8s.errors import ConfigError

#: Where the kubelet mounts a pod's service account (token, ca.crt, namespace).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: How long a service-account token read from its file is used before the file is read again.
TOKEN_REREAD = 60.0

#: Kubeconfig fields that name a local file or a command, per section.
_LOCAL_FIELDS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile", "exec", "auth-provider"),
}


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    """Everything needed to talk to one API server, credentials held in memory."""

    server: str
    ca: bytes | None = None
    """PEM of the certificate authorities to trust (None: the system's)."""
    insecure: bool = False
    client_cert: bytes | None = None
    client_key: bytes | None = None
    tls_server_name: str | None = None
    credentials: Callable[[], str | None] | None = None
    """The current Authorization header value (refreshing an expired token first)."""
    expires: datetime.datetime | None = None
    """When the credentials expire (kopf logs in again then)."""
    forget: Callable[[], None] | None = None
    """Drop what ``credentials`` cached (after a 401): a rotated token file is read again."""
    untrusted: bool = False
    """It came from a tenant (a Secret): its server's answers are capped in size
    (:data:`operators.k8s.transport.UNTRUSTED_MAX_BODY`)."""

    def authorization(self) -> str | None:
        return self.credentials() if self.credentials is not None else None

    def bearer_token(self) -> str | None:
        header = self.authorization()
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        return token if scheme.lower() == "bearer" else None

    def tls(self) -> ssl.SSLContext:
        """Trusts the kubeconfig's CA alone when it names one, as kubectl does, and the
        system's CAs only when it does not. (Loading the system bundle takes tens of
        milliseconds; the operator makes clients often enough that this was its largest
        cost.)"""
        if self.insecure:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca is not None:
            context = ssl.create_default_context(cadata=self.ca.decode())
        else:
            context = ssl.create_default_context()
        if self.client_cert is not None and self.client_key is not None:
            with _private_file(self.client_cert + b"\n" + self.client_key) as path:
                context.load_cert_chain(path)
        return context


def load_kubeconfig(text: str, *, base_dir: Path | None = None, context: str | None = None,
                    untrusted: bool = False, source: str = "the kubeconfig") -> ClusterAccess:
    """Parse a kubeconfig; ``base_dir`` resolves relative file paths; ``untrusted`` refuses
    files and commands (see :func:`check_untrusted`); ``source`` names it in errors."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{source} is not valid YAML: {error}") from error
    if not isinstance(config, dict):
        raise ConfigError(f"{source} is not a kubeconfig (expected a mapping with clusters, "
                          f"users and contexts)")
    if untrusted:
        check_untrusted(config, source=source)
    if any("proxy-url" in (entry.get("cluster") or {})
           for entry in config.get("clusters") or [] if isinstance(entry, dict)):
        raise ConfigError(f"{source} sets proxy-url, which fakefleet does not support: reach "
                          f"the API server directly")
    access = _load(config, base_dir=base_dir, context=context, source=source)
    return dataclasses.replace(access, untrusted=True) if untrusted else access


def load_kubeconfig_file(path: Path, *, context: str | None = None) -> ClusterAccess:
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the kubeconfig {path}: {error.strerror}") from error
    return load_kubeconfig(text, base_dir=path.resolve().parent, context=context,
                           source=f"the kubeconfig {path}")


def in_cluster(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs in a pod (the kubelet sets both variables in every one)."""
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"))


def load_in_cluster(*, service_account_dir: Path = SERVICE_ACCOUNT_DIR,
                    environ: Mapping[str, str] | None = None,
                    clock: Callable[[], float] = time.monotonic) -> ClusterAccess:
    """The API server of the pod's own cluster, as its service account reaches it."""
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError("no in-cluster configuration: KUBERNETES_SERVICE_HOST and "
                          "KUBERNETES_SERVICE_PORT are not set (not in a pod?); pass "
                          "--kubeconfig instead")
    ca_path = service_account_dir / "ca.crt"
    try:
        ca = ca_path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read the service account's CA {ca_path}: {error.strerror} "
                          f"(is a service account token mounted into the pod? "
                          f"automountServiceAccountToken must not be false)") from error
    token = ServiceAccountToken(service_account_dir / "token", clock=clock)
    first = token.read()
    server_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return ClusterAccess(server=f"https://{server_host}:{port}", ca=ca, credentials=token,
                         expires=token_expiry(first), forget=token.forget)


def in_cluster_namespace(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> str | None:
    """The pod's namespace, as the kubelet wrote it beside the token (None: not there)."""
    try:
        return (service_account_dir / "namespace").read_text().strip() or None
    except OSError:
        return None


class ServiceAccountToken:
    """The Authorization header of a token file, read again once it is TOKEN_REREAD old; a
    rotation that leaves the file briefly unreadable keeps the token read last."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._token = ""
        self._read_at = 0.0

    def read(self) -> str:
        try:
            token = self.path.read_text().strip()
        except OSError as error:
            if self._token:
                return self._token
            raise ConfigError(f"cannot read the service account token {self.path}: "
                              f"{error.strerror}") from error
        if not token:
            if self._token:
                return self._token
            raise ConfigError(f"the service account token {self.path} is empty")
        self._token, self._read_at = token, self._clock()
        return token

    def __call__(self) -> str:
        if not self._token or self._clock() - self._read_at >= TOKEN_REREAD:
            self.read()
        return f"Bearer {self._token}"

    def forget(self) -> None:
        """The API server refused the token: read the file at the next request (as client-go
        resets its cached token on a 401)."""
        self._read_at = -TOKEN_REREAD


def token_expiry(token: str) -> datetime.datetime | None:
    """When a JWT says it expires (its ``exp`` claim; unverified: the API server verifies it),
    or None for a token that is not a JWT or does not say."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        expires = float(claims["exp"])
    except (binascii.Error, ValueError, KeyError, TypeError):
        return None
    return datetime.datetime.fromtimestamp(expires, tz=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class HostConfig:
    """Where a process finds the host cluster: a kubeconfig file, or (``kubeconfig`` None) the
    service account of the pod it runs in. Loaded again at every login (credentials rotate)."""

    kubeconfig: Path | None = None
    service_account_dir: Path = SERVICE_ACCOUNT_DIR

    def load(self) -> ClusterAccess:
        if self.kubeconfig is not None:
            return load_kubeconfig_file(self.kubeconfig)
        return load_in_cluster(service_account_dir=self.service_account_dir)

    def describe(self) -> str:
        if self.kubeconfig is not None:
            return f"the kubeconfig {self.kubeconfig}"
        return f"the pod's service account ({self.service_account_dir})"


def check_untrusted(config: dict[str, Any], *, source: str) -> None:
    """Refuse a kubeconfig that names local files or commands: it came from a tenant."""
    for section, fields in _LOCAL_FIELDS.items():
        for index, entry in enumerate(config.get(f"{section}s") or []):
            body = entry.get(section) if isinstance(entry, dict) else None
            for field in fields:
                if isinstance(body, dict) and field in body:
                    raise ConfigError(
                        f"{source} sets {section}s[{index}].{section}.{field}, which would make "
                        f"fakefleet read a local file or run a command: a kubeconfig from a "
                        f"Secret must embed its credentials (certificate-authority-data, "
                        f"client-certificate-data and client-key-data, or token)")


def _load(config: dict[str, Any], *, base_dir: Path | None, context: str | None,
          source: str) -> ClusterAccess:
    # The loader writes certificate data to temporary files for its own client; ours holds
    # them in memory, so they live in a private directory only while we read them back.
    scratch = tempfile.mkdtemp(prefix="fakefleet-kubeconfig-")
    try:
        loader = KubeConfigLoader(config, active_context=context,
                                  config_base_path=str(base_dir) if base_dir else "",
                                  temp_file_path=scratch)
        configuration = Configuration()
        loader.load_and_set(configuration)
        access = ClusterAccess(
            server=str(configuration.host).rstrip("/"),
            ca=_read(configuration.ssl_ca_cert),
            insecure=not configuration.verify_ssl,
            client_cert=_read(configuration.cert_file),
            client_key=_read(configuration.key_file),
            tls_server_name=configuration.tls_server_name or None,
            credentials=_credentials(configuration),
            expires=_expiry(loader),
        )
    except (ConfigException, KeyError, TypeError, ValueError, OSError) as error:
        raise ConfigError(f"{source} cannot be used: {error}") from error
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    location = urllib.parse.urlsplit(access.server)
    if location.username is not None or location.password is not None:
        raise ConfigError(f"{source}: the cluster's server URL carries a user name or password "
                          f"({location.scheme}://***@{location.hostname}): give the URL alone, "
                          f"and the credentials in the kubeconfig's user")
    user = _current_user(config, context)
    if "exec" in user and access.credentials is None and access.client_cert is None:
        raise ConfigError(f"{source}: the exec plugin {user['exec'].get('command')!r} gave no "
                          f"credentials: {_exec_failure(user, base_dir)}")
    return access


def _credentials(configuration: Configuration) -> Callable[[], str | None] | None:
    if configuration.get_api_key_with_prefix("BearerToken") is None:
        return None
    hook = configuration.refresh_api_key_hook

    def current() -> str | None:
        if hook is not None:
            hook(configuration)  # reloads the token (exec, tokenFile) only when it expired
        header: str | None = configuration.get_api_key_with_prefix("BearerToken")
        # Token files usually end with a newline, which client-go trims and this loader keeps.
        return header.strip() if header else None

    return current


def _expiry(loader: KubeConfigLoader) -> datetime.datetime | None:
    expiry = getattr(loader, "expiry", None)
    return expiry if isinstance(expiry, datetime.datetime) else None


def _current_user(config: dict[str, Any], context: str | None) -> dict[str, Any]:
    name = context or config.get("current-context")
    for entry in config.get("contexts") or []:
        if entry.get("name") == name:
            user_name = (entry.get("context") or {}).get("user")
            for user in config.get("users") or []:
                if user.get("name") == user_name:
                    found: dict[str, Any] = user.get("user") or {}
                    return found
    return {}


def _exec_failure(user: dict[str, Any], base_dir: Path | None) -> str:
    """The loader only logs an exec plugin's failure: run it once more to say why."""
    try:
        ExecProvider(_Node(user["exec"]), str(base_dir) if base_dir else None).run()
    except Exception as error:  # whatever the plugin did, the user needs its message
        return str(error)
    return "its output had neither a token nor a client certificate"


class _Node(dict[str, Any]):
    """The minimal ConfigNode interface ExecProvider reads (``safe_get``)."""

    def safe_get(self, key: str) -> Any:
        return self.get(key)


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


@contextlib.contextmanager
def _private_file(content: bytes) -> Iterator[str]:
    # ssl only loads client certificates from files: a private temporary file, gone at once.
    fd, path = tempfile.mkstemp(prefix="fakefleet-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        yield path
    finally:
        os.unlink(path)
