"""Every requirement of a checklist, in order: a check run within its deadline, or a status
fakefleet states (with why); then the extra checks. One check failing, erring or running out
of time fails alone, and what it created in the member is deleted after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from operators.conformance.checking import Context, Evidence, Unmet
from operators.conformance.checklists import Checklist
from operators.conformance.checks import CHECKS, EXTRA, Check
from operators.conformance.checks.stated import STATED
from operators.conformance.results import Result
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from primitives.clocks import Clock

#: How long deleting what one check created may take (the member deletes in the background).
CLEANUP = 30.0


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
        status, notes = unmet.status, str(unmet)
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
