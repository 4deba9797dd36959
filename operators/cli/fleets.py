"""``fakefleet fleet ...``: the fleet as the federation hub sees it, and fleet-wide runs.

``ls`` lists the members with their state (Ready, Unreachable), ``watch`` follows membership
and health as they change, ``run PLAN`` fans a FaultPlan out to the selected members with a
common start time and follows it to its verdict (exit 0 passed, 1 failed, 2 error or timeout,
as ``fakefleet plan run``), ``runs``/``get``/``cancel`` look after runs.

The hub is the one ``fakefleet up`` started (found through the state directory), or the one
``--hub``/``--hub-ca``/``--token-file`` name.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import sys
from pathlib import Path
from typing import TextIO

import click
from pydantic import ValidationError
from rich.live import Live
from rich.table import Table
from rich.text import Text

from federation.api import common_pb2, fleet_pb2
from federation.client.fleet import FleetClient
from federation.client.selectors import parse
from operators.api.base import API_VERSION
from operators.api.faultplans import FaultPlan
from operators.cli import documents
from operators.cli.connecting import (
    Command,
    FleetError,
    age,
    connect,
    hub_options,
    output_option,
    print_json,
    run_hub,
)
from operators.cli.terminal import WAIT, console, stdout
from operators.faults import progress
from primitives import names
from primitives.selectors import SelectorError

STATES = {common_pb2.MEMBER_STATE_READY: "Ready", common_pb2.MEMBER_STATE_UNREACHABLE:
          "Unreachable", common_pb2.MEMBER_STATE_UNSPECIFIED: "?"}
PARTS = {value: name.removeprefix("MEMBER_RUN_STATE_").title()
         for name, value in fleet_pb2.MemberRunState.items()}
PHASES = {value: name.removeprefix("RUN_PHASE_").title()
          for name, value in fleet_pb2.RunPhase.items()}
EVENTS = {value: name.removeprefix("EVENT_TYPE_") for name, value in fleet_pb2.EventType.items()}


def _selector(selector: str, clusters: str) -> common_pb2.ClusterSelector:
    try:
        return parse(selector, [name for name in clusters.split(",") if name])
    except SelectorError as error:
        raise FleetError(f"--selector: {error}") from None


selector_options = (
    click.option("--selector", "-l", default="", help="label selector over the members' "
                 "labels, e.g. 'region=eu,gpu in (h100,b200)'"),
    click.option("--clusters", default="", help="comma-separated member names "
                 "(namespace/name, or name for namespace default)"),
)


def with_selector(command: Command) -> Command:
    for option in reversed(selector_options):
        command = option(command)
    return command


@click.group()
def fleet() -> None:
    """The federation hub's fleet: members, their health, fleet-wide fault plans."""


# -- members -----------------------------------------------------------------------------------


def member_name(member: common_pb2.Member) -> str:
    """Its name in the fleet: ``namespace/name``, ``name`` alone in namespace default."""
    return names.member_name(member.cluster.namespace, member.cluster.name)


def members_table(members: list[common_pb2.Member], title: str) -> Table:
    table = Table(title=title)
    for column in ("cluster", "state", "reason", "nodes", "gpus", "pods", "labels",
                   "heartbeat", "since"):
        table.add_column(column)
    for member in members:
        state = STATES.get(member.state, "?")
        inventory = member.inventory
        pods = ", ".join(f"{phase} {count}" for phase, count
                         in sorted(inventory.pods_by_phase.items()) if count) or "-"
        table.add_row(
            member_name(member), Text(state, style="green" if state == "Ready" else "red"),
            member.reason, f"{inventory.nodes_ready}/{inventory.nodes_total}",
            inventory.allocatable.get("nvidia.com/gpu", "-"), pods,
            ",".join(f"{k}={v}" for k, v in sorted(member.cluster.labels.items())) or "-",
            age(member.last_heartbeat), age(member.state_since))
    return table


@fleet.command("ls")
@hub_options
@with_selector
@output_option
def ls(state_dir: Path, hub: str | None, hub_ca: Path | None, token_file: Path | None,
       insecure: bool, selector: str, clusters: str, output: str) -> None:
    """List the members of the fleet with their state (Ready, Unreachable)."""
    async def work() -> list[common_pb2.Member]:
        async with connect(state_dir, hub, hub_ca, token_file, insecure=insecure) as client:
            return await client.list_clusters(_selector(selector, clusters))

    members = run_hub(work())
    if output == "json":
        print_json(list(members))
        return
    stdout.print(members_table(members, f"fleet: {len(members)} members"))


@fleet.command("watch")
@hub_options
@with_selector
@click.option("--timeout", type=WAIT, default=None, help="stop after this many seconds")
def watch(state_dir: Path, hub: str | None, hub_ca: Path | None, token_file: Path | None,
          insecure: bool, selector: str, clusters: str, timeout: float | None) -> None:
    """Follow membership and health as they change (a live table on a terminal, one line per
    change otherwise)."""
    live = sys.stdout.isatty()

    async def work() -> None:
        members: dict[str, common_pb2.Member] = {}
        synced = False
        async with connect(state_dir, hub, hub_ca, token_file, insecure=insecure) as client:
            screen_or_none = Live(console=stdout, auto_refresh=False) if live \
                else contextlib.nullcontext()
            with screen_or_none as screen:
                async for event in client.watch_clusters(_selector(selector, clusters)):
                    if event.type == fleet_pb2.EVENT_TYPE_SYNCED:
                        synced = True
                        if not live:
                            stdout.print(members_table(sorted(
                                members.values(), key=member_name), "fleet"))
                    else:
                        name = member_name(event.member)
                        before = members.get(name)
                        if event.type == fleet_pb2.EVENT_TYPE_DELETED:
                            members.pop(name, None)
                        else:
                            members[name] = event.member
                        if synced and not live:
                            _print_event(event, before)
                    if live and screen is not None:
                        screen.update(members_table(sorted(
                            members.values(), key=member_name),
                            f"fleet: {len(members)} members"), refresh=True)

    try:
        run_hub(asyncio.wait_for(work(), timeout) if timeout else work())
    except TimeoutError:
        pass
    except KeyboardInterrupt:
        pass


def _print_event(event: fleet_pb2.ClusterEvent, before: common_pb2.Member | None) -> None:
    member = event.member
    state = STATES.get(member.state, "?")
    was = STATES.get(before.state, "?") if before else "-"
    change = f"{was} → {state}" if before and before.state != member.state else state
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    stdout.print(f"{stamp}  {EVENTS[event.type]:<8} {member_name(member):<20} {change}  "
                 f"{member.reason}: {member.message}", highlight=False, soft_wrap=True)


# -- runs --------------------------------------------------------------------------------------

def _plan_spec(file: TextIO) -> tuple[str, str]:
    """The plan's name and its spec as JSON, checked against the FaultPlan model first."""
    try:
        document = documents.single(file, "one FaultPlan (its spec is run in every selected "
                                          "member)")
    except documents.DocumentError as error:
        raise FleetError(str(error)) from None
    if document.get("kind") != "FaultPlan":
        raise FleetError(f"{file.name} is not a FaultPlan: a fleet run takes one FaultPlan "
                         f"(its spec is run in every selected member)")
    if document.get("apiVersion") != API_VERSION:
        raise FleetError(f"{file.name}: apiVersion {document.get('apiVersion')!r}: a "
                         f"FaultPlan is {API_VERSION}")
    try:
        FaultPlan.model_validate(document)
    except ValidationError as error:
        details = "\n".join(f"  {'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                            for e in error.errors())
        raise FleetError(f"{file.name}: the FaultPlan is not valid:\n{details}") from None
    spec = document.get("spec") or {}  # a mapping: the model took it
    for field in ("startAt", "clusters"):
        if field in spec:
            raise FleetError(f"{file.name}: spec.{field} is set by the hub for each member; "
                             f"remove it")
    name = str((document.get("metadata") or {}).get("name", ""))  # the model took it
    return name, json.dumps(spec)


def run_table(run: fleet_pb2.Run) -> Table:
    table = Table(title=f"run {run.id} {run.name}: {PHASES[run.phase]}"
                        f"{' verdict ' + run.verdict if run.verdict else ''}")
    for column in ("cluster", "state", "steps", "verdict", "object", "message"):
        table.add_column(column)
    for part in run.members:
        state = PARTS[part.state]
        tone = "green" if state == "Succeeded" else "red" if state in (
            "Failed", "Refused") else ""
        table.add_row(part.cluster, Text(state, style=tone), part.steps_done or "-",
                      part.verdict or "-", part.object or "-", part.message[:80])
    return table


def _exit_code(run: fleet_pb2.Run) -> int:
    if run.phase == fleet_pb2.RUN_PHASE_SUCCEEDED and run.verdict != "Failed":
        return progress.EXIT_PASSED
    if run.phase == fleet_pb2.RUN_PHASE_RUNNING:
        return progress.EXIT_ERROR
    return progress.EXIT_FAILED


async def _follow(client: FleetClient, run_id: str, timeout: float) -> fleet_pb2.Run:
    live = sys.stderr.isatty()
    last: fleet_pb2.Run | None = None
    seen: dict[str, tuple[int, str, str]] = {}

    async def follow() -> None:
        nonlocal last
        with Live(console=console, auto_refresh=False, transient=True) if live \
                else contextlib.nullcontext() as screen:
            async for run in client.watch_run(run_id):
                last = run
                if screen is not None:
                    screen.update(run_table(run), refresh=True)
                    continue
                for part in run.members:
                    now = (part.state, part.steps_done, part.verdict)
                    if seen.get(part.cluster) != now:
                        seen[part.cluster] = now
                        console.print(f"{datetime.datetime.now():%H:%M:%S}  {part.cluster:<20}"
                                     f" {PARTS[part.state]:<12} steps {part.steps_done or '-'}"
                                     f"  {part.verdict}  {part.message[:100]}",
                                     highlight=False, soft_wrap=True)

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(follow(), timeout)
    return last if last is not None else await client.get_run(run_id)


@fleet.command("run")
@click.argument("file", type=click.File("r"))
@hub_options
@with_selector
@click.option("--start-delay", type=WAIT, default=2.0, show_default=True,
              help="seconds from now to the plan's common time zero in every member")
@click.option("--watch/--no-watch", default=True, show_default=True,
              help="follow the run to its end and exit with its verdict")
@click.option("--timeout", type=WAIT, default=900.0, show_default=True)
@output_option
def run(file: TextIO, state_dir: Path, hub: str | None, hub_ca: Path | None,
        token_file: Path | None, insecure: bool, selector: str, clusters: str, start_delay: float,
        watch: bool, timeout: float, output: str) -> None:
    """Run the FaultPlan in FILE in every selected member at once (exit 0 when every member's
    plan passed, 1 when one failed, 2 on error or timeout)."""
    name, spec = _plan_spec(file)
    chosen = _selector(selector, clusters)

    async def work() -> fleet_pb2.Run:
        async with connect(state_dir, hub, hub_ca, token_file, insecure=insecure) as client:
            started = await client.run_plan(spec, chosen, start_delay=start_delay, name=name)
            console.print(f"run {started.id}: {len(started.members)} members "
                          f"({', '.join(p.cluster for p in started.members)}), time zero in "
                          f"{start_delay:g}s", highlight=False, soft_wrap=True)
            if not watch:
                return started
            return await _follow(client, started.id, timeout)

    result = run_hub(work())
    if output == "json":
        print_json(result)
    else:
        stdout.print(run_table(result))
    if not watch:
        return
    if result.phase == fleet_pb2.RUN_PHASE_RUNNING:
        console.print(f"[red]timed out[/] after {timeout:.0f}s: run {result.id} goes on "
                      f"('fakefleet fleet get {result.id} --watch' follows it, 'fakefleet fleet "
                      f"cancel {result.id}' stops it)", highlight=False, soft_wrap=True)
    console.print(f"run {result.id}: {PHASES[result.phase]}, verdict "
                  f"{result.verdict or 'none'}", highlight=False)
    sys.exit(_exit_code(result))


@fleet.command("get")
@click.argument("run_id")
@hub_options
@click.option("--watch", is_flag=True, help="follow it to its end and exit with its verdict")
@click.option("--timeout", type=WAIT, default=900.0, show_default=True)
@output_option
def get(run_id: str, state_dir: Path, hub: str | None, hub_ca: Path | None,
        token_file: Path | None, insecure: bool, watch: bool, timeout: float, output: str) -> None:
    """Show a run, member by member."""
    async def work() -> fleet_pb2.Run:
        async with connect(state_dir, hub, hub_ca, token_file, insecure=insecure) as client:
            return await (_follow(client, run_id, timeout) if watch else
                          client.get_run(run_id))

    result = run_hub(work())
    if output == "json":
        print_json(result)
    else:
        stdout.print(run_table(result))
    if watch:
        sys.exit(_exit_code(result))


@fleet.command("runs")
@hub_options
def runs(state_dir: Path, hub: str | None, hub_ca: Path | None,
         token_file: Path | None, insecure: bool) -> None:
    """List the hub's runs."""
    async def work() -> list[fleet_pb2.Run]:
        async with connect(state_dir, hub, hub_ca, token_file, insecure=insecure) as client:
            return await client.list_runs()

    table = Table(title="fleet runs")
    for column in ("run", "name", "phase", "verdict", "members", "created"):
        table.add_column(column)
    for item in run_hub(work()):
        table.add_row(item.id, item.name or "-", PHASES[item.phase], item.verdict or "-",
                      str(len(item.members)), age(item.created_at) + " ago")
    stdout.print(table)


@fleet.command("cancel")
@click.argument("run_id")
@hub_options
def cancel(run_id: str, state_dir: Path, hub: str | None, hub_ca: Path | None,
           token_file: Path | None, insecure: bool) -> None:
    """Stop a run: every member deletes its FaultPlan, which recovers its faults."""
    async def work() -> fleet_pb2.Run:
        async with connect(state_dir, hub, hub_ca, token_file, insecure=insecure) as client:
            return await client.cancel_run(run_id)

    stdout.print(run_table(run_hub(work())))
