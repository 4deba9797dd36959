"""``fakefleet plan run|watch|delete``: FaultPlans created in the host cluster, followed to
their verdict, and deleted once their faults recovered.

The commands and the writes they make (creating a plan, replacing or deleting one); reading
plan files is :mod:`operators.cli.planreading`, following and printing plans is
:mod:`operators.cli.planwatching`. Every error of these commands exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape

from operators.cli.planreading import PlanDocument, PlanTarget, plans_path, read_plans, same_spec
from operators.cli.planwatching import wait_deleted, watch_and_conclude
from operators.cli.terminal import WAIT, console, run_k8s, state_dir_option, stdout
from operators.controlplane.errors import ControlPlaneError, StateError
from operators.faults import progress
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, Invalid, NotFound


class PlanGroup(click.Group):
    """Errors of the plan commands exit 2, so that none is mistaken for a Failed verdict (1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ControlPlaneError as error:
            console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False,
                          soft_wrap=True)
            sys.exit(progress.EXIT_ERROR)


Command = Callable[..., None]


def _plan_options(namespace_default: str) -> Callable[[Command], Command]:
    """--state-dir or --kubeconfig, -n and --timeout."""
    def decorate(command: Command) -> Command:
        for option in (
            click.option("--timeout", type=WAIT, default=3600.0,
                         show_default=True, help="Seconds to wait for the plan to end (and "
                                                 "for a deleted plan to be gone)."),
            click.option("-n", "--namespace", default=None,
                         help=f"Namespace of the plan and of the FakeClusters it targets  "
                              f"[default: {namespace_default}]"),
            click.option("--kubeconfig", "host_kubeconfig", default=None,
                         type=click.Path(dir_okay=False, exists=True, path_type=Path),
                         help="Kubeconfig of the host cluster, in place of --state-dir (a "
                              "host fakefleet up did not start)."),
            state_dir_option,
        ):
            command = option(command)
        return command

    return decorate


def _plan_target(state_dir: Path, host_kubeconfig: Path | None) -> PlanTarget:
    source = click.get_current_context().get_parameter_source("state_dir")
    if host_kubeconfig is not None and source is ParameterSource.COMMANDLINE:
        raise StateError("give --state-dir or --kubeconfig, not both: --kubeconfig names the "
                         "host cluster directly, --state-dir finds its kubeconfig")
    return PlanTarget(state_dir, host_kubeconfig)


@click.group(cls=PlanGroup)
def plan() -> None:
    """Run FaultPlans: faults injected into the fleet on a schedule, and verdicts on how the
    system under test reacted.

    \b
    Exit codes of every plan command:
      0  the plan ended with verdict Passed (run/watch), or the command did its job
      1  the plan's verdict is Failed: an expectation did not hold in time
      2  anything else: a timeout, a plan that ended without a verdict, an error
    """


plan_output_option = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="json: the outcome as JSON on standard output (verdict, expectations, trace id), the "
         "progress log on standard error.")


@plan.command("run")
@click.argument("file", type=click.File("r"))
@click.option("--watch", is_flag=True,
              help="Follow the plan until it ends and exit with its verdict.")
@click.option("--replace", is_flag=True,
              help="If a plan of the same name exists, delete it (waiting until its faults "
                   "recovered) and create it again: the plan runs anew.")
@_plan_options("the file's metadata.namespace, else default")
@plan_output_option
def plan_run(file: TextIO, watch: bool, replace: bool, state_dir: Path,
             host_kubeconfig: Path | None, namespace: str | None, timeout: float,
             output: str) -> None:
    """Create the FaultPlans of FILE ('-': standard input); --watch follows them to the end.

    A plan's spec cannot change once created. A plan that already exists with the same spec is
    left as it is (and --watch follows it); one with another spec is refused: delete it first
    (fakefleet plan delete NAME) or give --replace, which also re-runs an unchanged plan.

    Workloads a plan acts on (Jobs, Deployments) go to the member cluster with kubectl, not in
    FILE. Without --watch, the command prints how to follow the plan. With --watch, each
    change of the plan is printed as a line (a log, no terminal needed), and the exit code is
    the verdict's: 0 Passed, 1 Failed, 2 still running after --timeout, ended without a
    verdict, or an error (130: interrupted; the plan goes on). It ends with each plan's trace
    id and the command that shows the trace.
    """
    target = _plan_target(state_dir, host_kubeconfig)
    plans = read_plans(file, namespace)
    log = console if output == "json" else stdout
    outcomes: list[dict[str, str]] = []

    async def apply() -> None:
        async with target.client() as client:
            for found in plans:
                outcome = await _apply_plan(client, found, replace=replace, timeout=timeout,
                                            target=target, log=log)
                console.print(f"faultplan {found.namespace}/{found.name} {outcome}",
                              highlight=False, soft_wrap=True)
                outcomes.append({"namespace": found.namespace, "name": found.name,
                                 "outcome": outcome})

    run_k8s(apply())
    keys = [(found.namespace, found.name) for found in plans]
    if watch:
        sys.exit(watch_and_conclude(target, keys, timeout=timeout, output=output))
    if output == "json":
        click.echo(json.dumps(outcomes, indent=2))
        return
    for namespace_, name in keys:
        console.print(
            f"  watch: fakefleet plan watch {name}{target.flags(namespace_)}\n"
            f"         kubectl --kubeconfig {target.kubeconfig_path()} get fp {name}"
            f"{f' -n {namespace_}' if namespace_ != 'default' else ''} -w",
            highlight=False, soft_wrap=True)


@plan.command("watch")
@click.argument("name")
@_plan_options("default")
@plan_output_option
def plan_watch(name: str, state_dir: Path, host_kubeconfig: Path | None,
               namespace: str | None, timeout: float, output: str) -> None:
    """Follow an existing FaultPlan to its end, a line per change; exit with its verdict.

    Exit codes: 0 Passed, 1 Failed, 2 still running after --timeout, ended without a verdict,
    or an error (130: interrupted; the plan goes on).
    """
    target = _plan_target(state_dir, host_kubeconfig)
    sys.exit(watch_and_conclude(target, [(namespace or "default", name)], timeout=timeout,
                                output=output))


@plan.command("delete")
@click.argument("name")
@_plan_options("default")
def plan_delete(name: str, state_dir: Path, host_kubeconfig: Path | None,
                namespace: str | None, timeout: float) -> None:
    """Delete a FaultPlan and wait until it is gone. The operator first recovers every fault
    the plan still holds in place (a finalizer keeps the plan until then), so the fleet is
    whole again when this returns."""
    target = _plan_target(state_dir, host_kubeconfig)
    namespace = namespace or "default"

    async def delete() -> None:
        async with target.client() as client:
            try:
                await client.delete(plans_path(namespace, name))
            except NotFound:
                raise StateError(f"FaultPlan {namespace}/{name} does not exist: "
                                 f"kubectl get fp -n {namespace} lists the plans") from None
            await wait_deleted(client, namespace, name, timeout=timeout)

    run_k8s(delete())
    console.print(f"faultplan {namespace}/{name} deleted, its faults recovered",
                  highlight=False, soft_wrap=True)


async def _apply_plan(client: Client, found: PlanDocument, *, replace: bool, timeout: float,
                      target: PlanTarget, log: Console) -> str:
    """Create the plan; what happened: created, unchanged or replaced."""
    described = f"FaultPlan {found.namespace}/{found.name}"
    if await _create_plan(client, found):
        return "created"
    existing = await client.get(plans_path(found.namespace, found.name))
    if not replace:
        if same_spec(existing, found.spec):
            return "unchanged"
        raise StateError(
            f"{described} already exists with another spec, and a plan's spec cannot change: "
            f"give --replace to delete it (its faults recover) and create it again, or delete "
            f"it first: fakefleet plan delete {found.name}{target.flags(found.namespace)}")
    console.print(f"faultplan {found.namespace}/{found.name} exists: deleting it first",
                  highlight=False, soft_wrap=True)
    await wait_deleted(client, found.namespace, found.name, timeout=timeout, delete=True,
                       log=log)
    if not await _create_plan(client, found):
        raise StateError(f"{described} was created again by someone else meanwhile")
    return "replaced"


async def _create_plan(client: Client, found: PlanDocument) -> bool:
    """Create the plan; False if one of that name exists."""
    try:
        await client.create(plans_path(found.namespace), found.body)
    except Conflict as error:
        if error.already_exists:
            return False
        raise
    except Invalid as error:
        raise StateError(f"the host API server refused FaultPlan {found.namespace}/"
                         f"{found.name}: {error.message}") from error
    except NotFound as error:
        raise StateError(f"cannot create FaultPlan {found.namespace}/{found.name}: "
                         f"{error.message}; does namespace {found.namespace} exist, and is "
                         f"the FaultPlan CRD installed ('fakefleet up' installs it)?") from error
    return True
