"""What an adopted cluster's API server answers is read within bounds and reaches the status
only sanitised: a body past the cap (announced or chunked, or one watch line) is a clear error,
an error page is quoted short, and no password, token or key from a URL or a body lands in the
FakeCluster's status."""

from __future__ import annotations

import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from aiohttp import web

from operators.api.clusters import FakeCluster
from operators.handlers import clusters as handler
from operators.handlers.runtime import Member, Runtime
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig
from operators.k8s.errors import ConfigError, ServerError, api_error, brief
from operators.k8s.transport import UNTRUSTED_MAX_BODY, AiohttpTransport, TooLarge

SECRET_TOKEN = "sekrit-token-0123456789"
PAGE = "<html><body>" + "<p>the proxy says no</p>" * 500 + \
       f"<pre>Authorization: Bearer {SECRET_TOKEN}</pre></body></html>"


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """An API server on loopback that answers too much, or an error page."""

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"{" + b" " * 4096 + b"}", content_type="application/json")

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(8):
            await response.write(b" " * 1024)
        await response.write_eof()
        return response

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b'{"type": "ADDED", "object": {}}\n')
        await response.write(b'{"type": "ADDED", "object": {"x": "' + b"y" * 8192)
        await response.write_eof()
        return response

    async def version(request: web.Request) -> web.Response:
        return web.Response(status=502, text=PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_get("/big", big)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/api/v1/nodes", watch)
    app.router.add_get("/version", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def kubeconfig(server: str) -> str:
    return f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://{server}"}}}}]
users: [{{name: u, user: {{token: {SECRET_TOKEN}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


def test_a_server_url_with_a_password_is_refused_without_repeating_it() -> None:
    with pytest.raises(ConfigError, match=r"server URL carries a user name or password "
                                          r"\(https://\*\*\*@10\.0\.0\.1\)") as refused:
        load_kubeconfig(kubeconfig("127.0.0.1:1").replace(
            "http://127.0.0.1:1", "https://bob:hunter2@10.0.0.1:6443"), untrusted=True)
    assert "hunter2" not in str(refused.value)


def test_a_kubeconfig_from_a_secret_is_read_within_bounds() -> None:
    access = load_kubeconfig(kubeconfig("127.0.0.1:1"), untrusted=True)
    assert access.untrusted
    assert AiohttpTransport(access).max_body == UNTRUSTED_MAX_BODY
    own = load_kubeconfig(kubeconfig("127.0.0.1:1"))
    assert AiohttpTransport(own).max_body is None, "our own servers' answers are not capped"


async def test_answers_past_the_cap_are_a_clear_error(server: str) -> None:
    access = load_kubeconfig(kubeconfig(server), untrusted=True)
    transport = AiohttpTransport(access)
    transport.max_body = 2048
    async with Client(transport, server=access.server) as client:
        with pytest.raises(TooLarge, match="has 4098 bytes, more than the 2048 bytes read from "
                                           "an adopted cluster"):
            await client.get("/big")
        with pytest.raises(TooLarge, match="larger than 2048 bytes, the most read from an adopted"):
            await client.get("/chunked")
        with pytest.raises(TooLarge, match="a watch event larger than"):
            async for _ in client.watch("/api/v1/nodes"):
                pass


def test_an_error_page_is_quoted_short_and_credentials_never_pass_brief() -> None:
    error = api_error(502, PAGE, {})
    assert isinstance(error, ServerError)
    assert len(error.message) < 260
    assert error.message.endswith(f"({len(PAGE)} bytes)")
    said = brief(f"GET http://bob:hunter2@host/version: Authorization: Bearer {SECRET_TOKEN}; "
                 f'{{"token": "{SECRET_TOKEN}", "client-key-data": "LS0tLS1CRUdJTg=="}}\n'
                 + "x" * 2000)
    for secret in ("hunter2", SECRET_TOKEN, "LS0tLS1CRUdJTg"):
        assert secret not in said
    assert "\n" not in said
    assert len(said) <= 512


async def test_an_adopted_server_that_answers_an_error_page_is_said_short_and_clean(
        server: str, tmp_path: Path) -> None:
    access = load_kubeconfig(kubeconfig(server), untrusted=True, source="Secret default/c")
    cluster = FakeCluster.model_validate({
        "metadata": {"name": "adopted", "namespace": "default", "uid": "u"},
        "spec": {"controlPlane": {"backend": "external",
                                  "kubeconfigSecretRef": {"name": "c"}}}})
    runtime = cast(Runtime, types.SimpleNamespace(
        versions={}, external={"default.adopted": Member(access, tmp_path / "kubeconfig")}))
    version, problem = await handler._version(runtime, cluster, "default.adopted")
    assert version == ""
    assert "does not answer: 502 InternalError: <html><body><p>the proxy says no" in problem
    for secret in (SECRET_TOKEN, "the proxy says no</p>" * 20):
        assert secret not in problem
    assert len(problem) <= 512

