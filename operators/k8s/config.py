"""How to reach an API server, from any kubeconfig: :class:`ClusterAccess`.

The kubeconfig is read by the Kubernetes project's own Python loader
(``kubernetes.config.kube_config.KubeConfigLoader``), so what ``kubectl`` accepts works here:
certificates and keys as data or as files (relative paths resolve against the kubeconfig's
directory), ``token`` and ``tokenFile``, exec credential plugins (EKS, GKE, AKS, OIDC helpers)
and auth providers, refreshed when they expire. The result serves both the engine's raw client
(:mod:`operators.k8s.transport`) and kopf's connection info (built in the handlers).

A kubeconfig that arrives in a Secret comes from a tenant of the host cluster: it may not make
the operator read local files or run commands (:func:`check_untrusted`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import shutil
import ssl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client import Configuration
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.exec_provider import ExecProvider
from kubernetes.config.kube_config import KubeConfigLoader

from operators.k8s.errors import ConfigError

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

    def authorization(self) -> str | None:
        return self.credentials() if self.credentials is not None else None

    def bearer_token(self) -> str | None:
        header = self.authorization()
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        return token if scheme.lower() == "bearer" else None

    def tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca is not None:
            context.load_verify_locations(cadata=self.ca.decode())
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
    return _load(config, base_dir=base_dir, context=context, source=source)


def load_kubeconfig_file(path: Path, *, context: str | None = None) -> ClusterAccess:
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read the kubeconfig {path}: {error.strerror}") from error
    return load_kubeconfig(text, base_dir=path.resolve().parent, context=context,
                           source=f"the kubeconfig {path}")


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
