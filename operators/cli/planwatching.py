"""Following FaultPlans in the host cluster and printing what became of them: a log line per
change of a plan's status, waiting for a deleted plan to recover its faults, and each plan's
conclusion (its expectations as a table, its summary, its trace), as text or as JSON.

It reads plans and deletes one when asked to wait for that; it never creates or changes a plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from operators.cli.planreading import PlanTarget, plans_path
from operators.cli.terminal import console, default_state_dir, run_k8s, stdout
from operators.controlplane.errors import StateError
from operators.faults import progress
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound, transient

#: Seconds between two looks at a watched plan.
PLAN_POLL_INTERVAL = 1.0
#: What ``tone`` a progress line has, as a colour on a terminal (none in a log).
_TONES = {"": "", "good": "green", "bad": "red"}


async def wait_deleted(client: Client, namespace: str, name: str, *, timeout: float,
                       delete: bool = False, log: Console = stdout) -> None:
    """Wait until the plan is gone, showing its injections as they recover (on ``log``)."""
    path = plans_path(namespace, name)
    if delete:
        with contextlib.suppress(NotFound):
            await client.delete(path)
    deadline = time.monotonic() + timeout
    shown: list[progress.Line] | None = None
    while True:
        try:
            found = await client.get(path)
        except NotFound:
            return
        if shown is None:
            shown = []
            console.print(f"waiting for FaultPlan {namespace}/{name} to recover its faults "
                          f"(a finalizer holds it until then)", highlight=False, soft_wrap=True)
        status = found.get("status") or {}
        lines = [line for line in progress.render(status) if line.key != "plan"]
        _show(progress.changes(shown, lines), log=log)
        shown = lines
        if time.monotonic() >= deadline:
            held = [f"{injection.get('step')}#{injection.get('occurrence', 0)}"
                    for injection in status.get("injections") or []
                    if injection.get("state") == "Injected"]
            raise StateError(
                f"FaultPlan {namespace}/{name} is still there after {timeout:.0f}s "
                f"(finalizers {found['metadata'].get('finalizers', [])}"
                f"{'; faults in place: ' + ', '.join(held) if held else ''}): is the operator "
                f"running ('fakefleet status')? kubectl describe fp {name} -n {namespace}")
        await asyncio.sleep(PLAN_POLL_INTERVAL)


def _show(lines: list[progress.Line], *, prefix: str = "", log: Console = stdout) -> None:
    """Print progress lines as a log: a time, then the line, coloured only on a terminal."""
    stamp = time.strftime("%H:%M:%S")
    for line in lines:
        text = Text(f"{stamp} ", style="dim")
        text.append(prefix + line.text, style=_TONES[line.tone])
        log.print(text, soft_wrap=True, highlight=False)


PlanKey = tuple[str, str]


async def watch_plans(client: Client, keys: list[PlanKey], *, timeout: float,
                      log: Console = stdout) -> dict[PlanKey, dict[str, Any]]:
    """Poll the plans until each has finished or the timeout passed, printing what changed
    (on ``log``); their last statuses."""
    deadline = time.monotonic() + timeout
    statuses: dict[PlanKey, dict[str, Any]] = {}
    shown: dict[PlanKey, list[progress.Line]] = {}
    uids: dict[PlanKey, str] = {}
    trouble = ""
    while True:
        for key in keys:
            if key in statuses and progress.finished(statuses[key]):
                continue
            namespace, name = key
            try:
                found = await client.get(plans_path(namespace, name))
            except NotFound:
                raise StateError(f"FaultPlan {namespace}/{name} does not exist (or was deleted "
                                 f"while watched): kubectl get fp -n {namespace}") from None
            except K8sError as error:
                if not transient(error):
                    raise
                if str(error) != trouble:
                    trouble = str(error)
                    _show([progress.Line("", f"the host API server did not answer ({error}); "
                                             f"trying again", "bad")], log=log)
                continue
            if trouble:
                trouble = ""
                _show([progress.Line("", "the host API server answers again")], log=log)
            uid = str(found["metadata"].get("uid", ""))
            if uids.setdefault(key, uid) != uid:
                raise StateError(f"FaultPlan {namespace}/{name} was deleted and created again "
                                 f"while watched: watch the new one with 'fakefleet plan watch "
                                 f"{name}'")
            statuses[key] = found.get("status") or {}
            lines = progress.render(statuses[key])
            _show(progress.changes(shown.get(key, []), lines),
                  prefix=f"{name}: " if len(keys) > 1 else "", log=log)
            shown[key] = lines
        done = all(key in statuses and progress.finished(statuses[key]) for key in keys)
        if done or time.monotonic() >= deadline:
            return statuses
        await asyncio.sleep(PLAN_POLL_INTERVAL)


def watch_and_conclude(target: PlanTarget, keys: list[PlanKey], *, timeout: float,
                       output: str = "text") -> int:
    """Watch the plans, print each one's results, ending with its trace; the exit code of the
    worst. ``output`` json: the results as JSON on stdout, everything else on stderr."""
    log = console if output == "json" else stdout

    async def watch() -> dict[PlanKey, dict[str, Any]]:
        async with target.client() as client:
            return await watch_plans(client, keys, timeout=timeout, log=log)

    try:
        statuses = run_k8s(watch())
    except KeyboardInterrupt:
        for namespace, name in keys:
            console.print(f"stopped watching; FaultPlan {namespace}/{name} goes on ('fakefleet "
                          f"plan delete {name}{target.flags(namespace)}' stops it and recovers "
                          f"its faults)", highlight=False, soft_wrap=True)
        return 130
    codes = []
    concluded = []
    for namespace, name in keys:
        status = statuses.get((namespace, name), {})
        flags = target.flags(namespace)
        if not progress.finished(status):
            console.print(f"[red]timed out[/] after {timeout:.0f}s: FaultPlan {namespace}/"
                          f"{name} has not ended; it goes on ('fakefleet plan watch {name}"
                          f"{flags}' follows it, 'fakefleet plan delete {name}{flags}' stops "
                          f"it)", highlight=False, soft_wrap=True)
        elif status.get("phase") not in progress.FINAL_PHASES:
            console.print(f"FaultPlan {namespace}/{name} failed; it goes on with its remaining "
                          f"steps and recoveries until it ends or 'fakefleet plan delete {name}"
                          f"{flags}'", highlight=False, soft_wrap=True)
        code = progress.exit_code(status)
        codes.append(code)
        if output == "json":
            concluded.append(_conclusion(namespace, name, status, code, target))
            continue
        _print_results(namespace, name, status)
        stdout.print(Text(f"{namespace}/{name}: {progress.summary(status)}",
                          style=_TONES["good" if code == progress.EXIT_PASSED else "bad"]),
                     soft_wrap=True, highlight=False)
        _print_trace(status, target)
    if output == "json":
        click.echo(json.dumps(concluded, indent=2))
    return max(codes)


def _trace_command(trace_id: str, target: PlanTarget) -> str:
    """The command that shows a plan's trace: the collector of the same state directory."""
    flags = ""
    if target.host_kubeconfig is None and \
            target.state_dir.resolve() != default_state_dir().resolve():
        flags = f" --state-dir {target.state_dir}"
    return f"fakefleet trace show {trace_id}{flags}"


def _print_trace(status: dict[str, Any], target: PlanTarget) -> None:
    """The plan's trace id, and how to see it (nothing when the operator recorded none)."""
    trace_id = str(status.get("traceId") or "")
    if trace_id:
        stdout.print(f"trace {trace_id}: {_trace_command(trace_id, target)}",
                     soft_wrap=True, highlight=False)


def _conclusion(namespace: str, name: str, status: dict[str, Any], code: int,
                target: PlanTarget) -> dict[str, Any]:
    """A plan's outcome as ``-o json`` gives it."""
    trace_id = str(status.get("traceId") or "")
    return {
        "namespace": namespace, "name": name,
        "phase": status.get("phase") or "Pending", "verdict": status.get("verdict") or "",
        "stepsDone": status.get("stepsDone") or "", "summary": progress.summary(status),
        "exitCode": code, "traceId": trace_id,
        "traceCommand": _trace_command(trace_id, target) if trace_id else "",
        "expectations": [dataclasses.asdict(result) for result in progress.results(status)],
    }


def _print_results(namespace: str, name: str, status: dict[str, Any]) -> None:
    """The plan's expectations as a table, if it has any judged."""
    found = progress.results(status)
    if not found:
        return
    table = Table(title=f"FaultPlan {namespace}/{name}")
    for column in ("step", "occurrence", "expectation", "outcome", "latency", "message"):
        table.add_column(column, justify="right" if column in ("occurrence", "latency")
                         else "left")
    for result in found:
        table.add_row(result.step, str(result.occurrence), result.name,
                      Text(result.outcome, style=_TONES[progress.outcome_tone(result.outcome)]),
                      "" if result.latency is None else progress.seconds(result.latency),
                      result.message)
    stdout.print(table, soft_wrap=True)
