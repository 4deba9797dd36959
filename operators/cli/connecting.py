"""How the ``fakefleet fleet ...`` commands reach the federation hub: the options that name it
and the fleet's credentials, the client, the one error they exit with, and the hub's messages
as JSON or ages.

It defines no command and asks the hub nothing of its own: the commands bring their calls.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from federation.client.channels import HubAddress
from federation.client.discovery import HubFiles, HubInfo
from federation.client.fleet import FleetClient
from operators.cli.terminal import state_dir_option
from operators.controlplane.state import StateDir
from operators.faults import progress

T = TypeVar("T")
Command = TypeVar("Command", bound=Callable[..., Any])


class FleetError(click.ClickException):
    """An error of a fleet command: one line, exit code 2 (as the plan commands' errors)."""

    exit_code = progress.EXIT_ERROR


def hub_options(command: Command) -> Command:
    """--state-dir, --hub, --hub-ca, --token-file and --insecure: which hub, how to trust it,
    and the fleet's credentials."""
    for option in reversed((
        state_dir_option,
        click.option("--hub", envvar="FAKEFLEET_HUB", default=None,
                     help="host:port of the hub [default: the one 'fakefleet up' started]"),
        click.option("--hub-ca", type=click.Path(dir_okay=False, path_type=Path),
                     default=None, help="the hub's CA certificate (PEM) [default: from the "
                                        "state directory]"),
        click.option("--token-file", envvar="FAKEFLEET_HUB_TOKEN_FILE",
                     type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="file with the fleet token [default: from the state directory]"),
        click.option("--insecure", is_flag=True,
                     help="reach the hub in plaintext, the fleet token unencrypted (a hub "
                          "that serves --insecure, on loopback) instead of TLS with --hub-ca"),
    )):
        command = option(command)
    return command


def connect(state_dir: Path, hub: str | None, hub_ca: Path | None,
            token_file: Path | None, *, insecure: bool) -> FleetClient:
    """A client of the hub the options name, else of the one ``fakefleet up`` started.

    TLS unless ``insecure``: without a CA it refuses, never falls back to plaintext, which
    would hand the fleet token to anyone on the path."""
    files = HubFiles(StateDir(state_dir.resolve()).hub)
    info = HubInfo.read(files.info)
    if insecure and hub_ca is not None:
        raise FleetError("--insecure and --hub-ca: give --hub-ca for TLS, or --insecure for "
                         "plaintext, not both")
    if hub is None:
        if info is None:
            raise FleetError(f"no hub runs in {state_dir}: start one with 'fakefleet up', or "
                             f"name one with --hub host:port")
        hub = info.address
        if insecure and info.ca:
            raise FleetError(f"the hub in {state_dir} serves TLS (its CA is {info.ca}): leave "
                             f"out --insecure")
        hub_ca = hub_ca or (Path(info.ca) if info.ca else None)
    if hub_ca is None and not insecure:
        raise FleetError(f"no CA to check the hub at {hub} with: give --hub-ca with the hub's "
                         f"CA certificate (PEM), or --insecure to send the fleet token in "
                         f"plaintext (a hub that serves --insecure, on loopback)")
    token_path = token_file or files.fleet_token
    try:
        token = token_path.read_text().strip()
        address = HubAddress.of(hub, hub_ca)
    except OSError as error:
        raise FleetError(f"cannot read {error.filename}: {error.strerror} (--token-file and "
                         f"--hub-ca name the fleet token and the hub's CA)") from error
    return FleetClient(address, token)


def run_hub(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` against the hub; a refusal of the hub is a readable error."""
    try:
        return asyncio.run(work)
    except grpc.aio.AioRpcError as error:
        raise FleetError(f"the hub said {error.code().name}: {error.details()}") from None


output_option = click.option("--output", "-o", type=click.Choice(["table", "json"]),
                             default="table", show_default=True,
                             help="json: the hub's messages as JSON (for scripts and CI)")


def print_json(message: Message | list[Message]) -> None:
    """The hub's message (or messages) as JSON on standard output, as ``-o json`` gives it."""
    data = [MessageToDict(m) for m in message] if isinstance(message, list) \
        else MessageToDict(message)
    click.echo(json.dumps(data, indent=2))


def age(stamp: Any) -> str:
    """How long ago a protobuf Timestamp was, as seconds or minutes ("-" when unset)."""
    if not stamp.seconds:
        return "-"
    seconds = max(0.0, time.time() - stamp.ToNanoseconds() / 1e9)
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"
