"""A client of the engine's kubelet API, as the member's API server is: TLS verified against
the kubelets' CA for the node's address, its client certificate, HTTP/1.1 with chunked
answers."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from operators.controlplane.pki import KubeletPKI

SPDY = (b"POST /exec/default/web/main?command=ls&output=1 HTTP/1.1\r\nHost: x\r\n"
        b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")


def client_context(kubelet: KubeletPKI, cert: Path | None = None,
                   key: Path | None = None) -> ssl.SSLContext:
    """A client as the API server is: verifies the node's address against the kubelet CA."""
    context = ssl.create_default_context(cafile=str(kubelet.ca_cert))
    if cert is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


def api_server_context(kubelet: KubeletPKI) -> ssl.SSLContext:
    return client_context(kubelet, kubelet.client_cert, kubelet.client_key)


async def connect(port: int, address: str, context: ssl.SSLContext
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection(
        address, port, ssl=context, server_hostname=address), 5)


async def get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
              path: str, *, headers: str = "") -> tuple[int, dict[str, str], bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    await writer.drain()
    return await response(reader)


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
    lines = head.split("\r\n")
    fields = {name.lower(): value.strip() for name, _, value in
              (line.partition(":") for line in lines[1:] if line)}
    status = int(lines[0].split()[1])
    if fields.get("transfer-encoding") == "chunked":
        body = b""
        while chunk := await read_chunk(reader):
            body += chunk
        return status, fields, body
    return status, fields, await reader.readexactly(int(fields.get("content-length", "0")))


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), 5)).strip(), 16)
    data = await reader.readexactly(size + 2)
    return data[:-2]
