"""Every requirement of a checklist, in order: a check run within its deadline, or a status
fakefleet states (with why); then the extra checks. One check failing, erring or running out
of time fails alone, and what it created in the member is deleted after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from operators.conformance import faulting
from operators.conformance.checking import POLL, Context, Evidence, Unmet
from operators.conformance.checklists import Checklist
from operators.conformance.checks import CHECKS, EXTRA, Check
from operators.conformance.checks.stated import STATED
from operators.conformance.results import Result
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from primitives.clocks import Clock

#: How long deleting what one check created may take (the member deletes in the background).
CLEANUP = 30.0
#: How long a FaultPlan's fault may take to show in the member, and to be gone after it.
FAULT_SHOWN = 60.0
FAULT_GONE = 120.0


@dataclasses.dataclass(frozen=True)
class Target:
    """The cluster a run checks, and where its evidence goes."""

    member: Client
    host: Client
    cluster: dict[str, Any]
    pools: list[dict[str, Any]]
    output: Path
    run: str
    metrics_endpoint: str = ""


async def run(checklist: Checklist, target: Target, *, clock: Clock,
              only: Collection[str] = (), say: Callable[[str, str], None] = lambda _, __: None,
              checks: Mapping[str, Check] = CHECKS,
              extra: Mapping[str, Check] = EXTRA) -> list[Result]:
    """The results of every requirement of ``checklist`` (and of the extra checks), in order.
    ``only``: check just these ids; the others are reported as not checked in this run."""
    results: list[Result] = []
    for requirement in checklist.requirements:
        id = requirement.id
        if only and id not in only:
            results.append(Result(id, "Not Implemented", f"not checked in this run (it checked "
                                  f"only {', '.join(sorted(only))})", automated=False))
        elif id in STATED:
            status, why = STATED[id]
            results.append(Result(id, status, why, automated=False))
        elif id in checks:
            results.append(await _one(id, checks[id], target, clock=clock, say=say))
        else:
            results.append(Result(id, "Not Implemented", f"fakefleet has no check for "
                                  f"{id} of checklist {checklist.version}", automated=False))
    for id, check in extra.items():
        if not only or id in only:
            result = await _one(id, check, target, clock=clock, say=say)
            results.append(dataclasses.replace(result, extra=True))
    return results


async def _one(id: str, check: Check, target: Target, *, clock: Clock,
               say: Callable[[str, str], None]) -> Result:
    evidence = Evidence(target.output, id)
    ctx = Context(member=target.member, host=target.host, cluster=target.cluster,
                  pools=target.pools, evidence=evidence, clock=clock, run=target.run,
                  metrics_endpoint=target.metrics_endpoint, say=lambda line: say(id, line))
    started = clock.now()
    deadline = ""
    try:
        verdict = await asyncio.wait_for(check.run(ctx), check.deadline)
        status, notes = verdict.status, verdict.notes
    except TimeoutError:
        deadline = f"{check.deadline:.0f}s, {ctx.step}"
        status, notes = "Not Implemented", (f"the check's deadline of {check.deadline:.0f}s "
                                            f"passed while {ctx.step}")
    except Unmet as unmet:
        status, notes = "Not Implemented", str(unmet)
    except K8sError as error:
        status, notes = "Not Implemented", f"the member answered unexpectedly while " \
                                           f"{ctx.step}: {error}"
    except Exception as error:  # one broken check fails alone, saying what broke
        status, notes = "Not Implemented", f"the check failed while {ctx.step}: " \
                                           f"{type(error).__name__}: {error}"
    seconds = clock.now() - started
    await _clean(ctx)
    return Result(id, status, notes, tuple(evidence.files), seconds, deadline)


async def _clean(ctx: Context) -> None:
    """Delete what the check created, last first; what is gone already is no error."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CLEANUP):
            for path in reversed(ctx.cleanup):
                try:
                    await ctx.member.delete(path, params={"propagationPolicy": "Background"})
                except NotFound:
                    pass
                except K8sError as error:
                    ctx.say(f"could not delete {path}: {error}")


async def under_faults(target: Target, clean: Sequence[Result], *, clock: Clock,
                       say: Callable[[str, str], None] = lambda _, __: None,
                       checks: Mapping[str, Check] = CHECKS) -> list[Result]:
    """The checks that held in ``clean`` again, each under its fault
    (:data:`faulting.FAULTS`): the FaultPlan applied, the check run once the fault shows, the
    plan deleted and the fault gone before the next. A check that did not hold without the
    fault is not run again. Results are extras, named ``<id>-under-<fault>``."""
    # Names of their own: what the first run made may still be going.
    target = dataclasses.replace(target, run=f"{target.run}f")
    results: list[Result] = []
    for found in clean:
        fault = faulting.FAULTS.get(found.id)
        if fault is None or not found.automated:
            continue
        if not found.passed:
            results.append(Result(f"{found.id}-under-{fault.name}", "N/A",
                                  f"not run under {fault.description}: it does not hold "
                                  f"without it", automated=False, extra=True))
            continue
        results.append(await _under(found.id, fault, target, clock=clock, say=say,
                                    check=checks[found.id]))
    return results


async def _under(id: str, fault: faulting.Fault, target: Target, *, clock: Clock,
                 say: Callable[[str, str], None], check: Check) -> Result:
    name = f"{id}-under-{fault.name}"
    manifest = faulting.plan(target.cluster, target.pools, id, target.run)
    if manifest is None:
        return Result(name, "N/A", f"the cluster has no pool for {fault.description}",
                      automated=False, extra=True)
    meta = manifest["metadata"]
    plans = f"/apis/fakefleet.dev/v1alpha1/namespaces/{meta['namespace']}/faultplans"
    path = f"{plans}/{meta['name']}"
    evidence = Evidence(target.output, name)
    say(name, f"applying FaultPlan {meta['name']}: {fault.description}")
    await target.host.create(plans, manifest)
    try:
        if await _until(clock, FAULT_SHOWN, lambda: _showing(target, fault)):
            result = await _one(name, check, target, clock=clock, say=say)
            result = dataclasses.replace(result, notes=f"under {fault.description}: "
                                                       f"{result.notes}")
        else:
            result = Result(name, "Not Implemented", f"the fault ({fault.description}) did "
                            f"not show in the member within {FAULT_SHOWN:.0f}s",
                            deadline=f"{FAULT_SHOWN:.0f}s, waiting for the fault to show")
        evidence.write("faultplan.yaml", await target.host.get(path))
    finally:
        say(name, "deleting the FaultPlan, waiting for its fault to be recovered")
        with contextlib.suppress(NotFound):
            await target.host.delete(path)
        gone = await _until(clock, FAULT_GONE, lambda: _recovered(target, path, fault))
    if not gone:
        say(name, f"the fault was not gone within {FAULT_GONE:.0f}s: later checks may see it")
    files = tuple(dict.fromkeys((*result.evidence, *evidence.files)))
    return dataclasses.replace(result, evidence=files, extra=True)


async def _until(clock: Clock, seconds: float, probe: Callable[[], Any]) -> bool:
    deadline = clock.now() + seconds
    while clock.now() < deadline:
        if await probe():
            return True
        await clock.sleep(POLL)
    return False


async def _showing(target: Target, fault: faulting.Fault) -> bool:
    return any(fault.visible(n) for n in (await target.member.get("/api/v1/nodes"))["items"])


async def _recovered(target: Target, path: str, fault: faulting.Fault) -> bool:
    try:
        await target.host.get(path)
        return False
    except NotFound:
        return not await _showing(target, fault)
