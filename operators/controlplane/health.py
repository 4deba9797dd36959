"""Health probes of the local components over loopback, and waiting for them.

These are process-level probes (``/health`` of etcd, ``/readyz`` and ``/healthz`` of the
Kubernetes components), not Kubernetes API calls: those live in :mod:`operators.k8s`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from pathlib import Path

import aiohttp

from operators.controlplane.errors import StartupError
from operators.controlplane.supervising import Supervised, tail

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2)
#: How long an adopted process gets to answer its health probe (s): it runs already.
ADOPTED_TIMEOUT = 10.0


def client_tls(ca_cert: Path, client_cert: Path, client_key: Path) -> ssl.SSLContext:
    """TLS that verifies a server (an apiserver, etcd) against its CA and presents a client
    certificate."""
    context = ssl.create_default_context(cafile=str(ca_cert))
    context.load_cert_chain(str(client_cert), str(client_key))
    return context


def insecure_tls() -> ssl.SSLContext:
    """For the self-signed health endpoints of the scheduler and controller-manager: it
    verifies nothing, so it loads no CA (the system's bundle costs tens of milliseconds)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


async def probe(url: str, tls: ssl.SSLContext | None = None) -> tuple[bool, str]:
    """GET ``url``; healthy is HTTP 200. Returns (healthy, body or error)."""
    try:
        async with aiohttp.ClientSession(timeout=PROBE_TIMEOUT) as session, session.get(
            url, ssl=tls if tls is not None else False
        ) as response:
            body = (await response.text()).strip()
            return response.status == 200, body
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        return False, f"{type(error).__name__}: {error}"


async def wait_healthy(
    process: Supervised,
    url: str,
    tls: ssl.SSLContext | None = None,
    *,
    timeout: float,
    interval: float = 0.2,
) -> None:
    """Wait until ``url`` answers 200; fail fast if the process dies while we wait."""
    deadline = time.monotonic() + timeout
    restarts = process.restarts
    last = "no answer yet"
    while True:
        if process.restarts != restarts or not process.running:
            raise StartupError(process.name, "exited during start-up", tail(process.log_path))
        healthy, last = await probe(url, tls)
        if healthy:
            return
        if time.monotonic() > deadline:
            raise StartupError(
                process.name,
                f"was not healthy after {timeout:.0f}s ({url}: {last[:200]})",
                tail(process.log_path),
            )
        await asyncio.sleep(interval)


async def adopt(process: Supervised, url: str, tls: ssl.SSLContext | None = None, *,
                timeout: float = ADOPTED_TIMEOUT) -> bool:
    """Adopt the running process recorded for ``process`` (:meth:`Supervised.adopt`) if it
    answers at ``url`` within ``timeout``; one that does not is stopped, to be started anew.
    Whether it was adopted."""
    if not await process.adopt():
        return False
    try:
        await wait_healthy(process, url, tls, timeout=timeout)
    except StartupError as error:
        logger.warning("%s: its adopted process does not answer; starting it anew: %s",
                       process.name, error)
        await process.stop()
        return False
    return True
