"""``fakefleet conformance run``: rehearse the Kubernetes AI Conformance checks on a FakeCluster
and write DIR/PRODUCT.yaml, DIR/junit.xml and DIR/evidence/.

It only verifies what each requirement needs (an add-on that is off is reported, with the
field that turns it on); it changes nothing of the FakeCluster. Exit 0 when every automatable
MUST is Implemented, 1 when one is not, 2 when the run could not start (an unknown checklist
version, a cluster that does not exist or has no kubeconfig yet).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import sys
import time
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import click
import yaml
from rich.table import Table

from operators.api.base import API_VERSION
from operators.api.clusters import KUBECONFIG_KEY
from operators.cli.terminal import console, host_client, state_dir_option, stdout
from operators.conformance import checklists, reporting, running, validating
from operators.conformance.checks import AUTOMATABLE_MUSTS, EXTRA
from operators.conformance.results import BANNER, Result
from operators.controlplane.errors import StateError
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig
from operators.k8s.errors import K8sError, NotFound
from primitives.clocks import SYSTEM_CLOCK


class ConformanceError(click.ClickException):
    """The run could not start: one line, exit code 2 (1 is a run that found a MUST unmet)."""

    exit_code = 2


@click.group()
def conformance() -> None:
    """Rehearse the Kubernetes AI Conformance checks on simulated GPU clusters."""


@conformance.command("run")
@state_dir_option
@click.option("--cluster", required=True, help="The FakeCluster, [NAMESPACE/]NAME.")
@click.option("--version", "checklist_version", default=checklists.DEFAULT_VERSION,
              show_default=True, help="The checklist version.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Where PRODUCT.yaml, junit.xml and evidence/ go.")
@click.option("--metadata", "metadata_file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A YAML mapping of PRODUCT.yaml metadata fields.")
@click.option("--set", "settings", multiple=True, metavar="FIELD=VALUE",
              help="One metadata field (over --metadata), e.g. --set vendorName=Example.")
@click.option("--metrics-endpoint", default="",
              help="The DCGM metrics URL to read [default: the FakeCluster's "
                   "status.dcgmEndpoint].")
@click.option("--only", default="", help="Comma-separated requirement ids to check; the "
                                         "others are reported as not checked.")
@click.option("--under-faults", is_flag=True,
              help="Then run the checks that held again under a FaultPlan each (an Xid 79 "
                   "under the gangs, a node lost under the RayCluster): junit.xml and "
                   "evidence only.")
def run(state_dir: Path, cluster: str, checklist_version: str, output: Path,
        metadata_file: Path | None, settings: tuple[str, ...], metrics_endpoint: str,
        only: str, under_faults: bool) -> None:
    """Check CLUSTER against the AI-conformance checklist and write the results to OUTPUT."""
    try:
        checklist = checklists.load(checklist_version)
    except checklists.UnknownVersion as error:
        raise ConformanceError(str(error)) from None
    chosen = {id.strip() for id in only.split(",") if id.strip()}
    known = set(checklist.ids) | set(EXTRA)
    if chosen - known:
        raise ConformanceError(f"--only names {', '.join(sorted(chosen - known))}, which "
                               f"checklist {checklist.version} does not have: give any of "
                               f"{', '.join(sorted(known))}")
    given = _given(metadata_file, settings)
    namespace, _, name = cluster.rpartition("/")
    console.print(f"[bold]{BANNER}[/]", highlight=False)
    started = time.monotonic()
    try:
        results, found = asyncio.run(_run(state_dir, namespace or "default", name, checklist,
                                          output, metrics_endpoint, chosen, under_faults))
    except StateError as error:
        raise ConformanceError(str(error)) from None
    except K8sError as error:
        raise ConformanceError(f"the host cluster did not answer as expected: {error}") \
            from error
    try:
        meta = reporting.metadata(given, kubernetes_version=(found.get("status") or {}).get(
            "kubernetesVersion") or found["spec"].get("kubernetesVersion", ""),
                                  platform_version=installed_version("fakefleet"))
    except ValueError as error:
        raise ConformanceError(str(error)) from None
    document = reporting.product(checklist, meta, {r.id: r for r in results if not r.extra})
    by_design = validating.by_design(document, checklist)
    reporting.write(output, reporting.product_yaml(document, checklist, by_design),
                    reporting.junit(checklist, results))
    _table(checklist, results, time.monotonic() - started)
    problems = validating.validate(document, checklist, output)
    for problem in problems:
        console.print(f"[red]offline validation:[/] {problem}", highlight=False)
    console.print("upstream's validator fails this file by design:", highlight=False)
    for rule in by_design:
        console.print(f"  - {rule}", highlight=False)
    console.print(f"wrote {output / 'PRODUCT.yaml'}, {output / 'junit.xml'} and "
                  f"{output / 'evidence'}", highlight=False)
    for result in results:
        if "-under-" in result.id:
            console.print(f"{result.id}: {'holds' if result.passed else 'does not hold'} "
                          f"({result.notes})", highlight=False, soft_wrap=True)
    passed = {r.id for r in results if r.passed and not r.extra}
    unmet = [id for id in AUTOMATABLE_MUSTS if id in checklist.ids and id not in passed]
    if problems:
        sys.exit(2)
    if unmet:
        console.print(f"[red]automatable MUSTs not Implemented:[/] {', '.join(unmet)}",
                      highlight=False)
        sys.exit(1)
    console.print("[green]every automatable MUST is Implemented[/]")


def _given(metadata_file: Path | None, settings: tuple[str, ...]) -> dict[str, str]:
    given: dict[str, str] = {}
    if metadata_file is not None:
        try:
            loaded = yaml.safe_load(metadata_file.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise ConformanceError(f"--metadata {metadata_file}: {error}") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
            raise ConformanceError(f"--metadata {metadata_file} must be a YAML mapping of "
                                   f"field names to strings")
        given.update(loaded)
    for setting in settings:
        field, equals, value = setting.partition("=")
        if not equals:
            raise ConformanceError(f"--set {setting!r}: give FIELD=VALUE, e.g. "
                                   f"--set vendorName=Example")
        given[field] = value
    refusal = reporting.unknown_fields(given)
    if refusal:  # said before the run, not after minutes of checks
        raise ConformanceError(refusal)
    return given


async def _run(state_dir: Path, namespace: str, name: str, checklist: checklists.Checklist,
               output: Path, metrics_endpoint: str, only: set[str],
               under_faults: bool) -> tuple[list[Result], dict[str, Any]]:
    async with host_client(state_dir) as host:
        try:
            found: dict[str, Any] = await host.get(
                f"/apis/{API_VERSION}/namespaces/{namespace}/fakeclusters/{name}")
        except NotFound:
            raise ConformanceError(f"FakeCluster {namespace}/{name} does not exist: see "
                                   f"'fakefleet get'") from None
        secret_name = (found.get("status") or {}).get("kubeconfigSecret")
        if not secret_name:
            raise ConformanceError(
                f"FakeCluster {namespace}/{name} has no kubeconfig yet (phase "
                f"{(found.get('status') or {}).get('phase', 'Pending')}): wait for it with "
                f"'fakefleet wait'")
        secret = await host.get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}")
        key = (found["spec"].get("controlPlane") or {}).get(
            "kubeconfigSecretRef", {}).get("key", KUBECONFIG_KEY)
        access = load_kubeconfig(base64.b64decode(secret["data"][key]).decode())
        pools = [p for p in (await host.get(
            f"/apis/{API_VERSION}/namespaces/{namespace}/fakenodepools"))["items"]
            if p["spec"].get("clusterRef") == name]
        async with Client.connect(access) as member:
            target = running.Target(member=member, host=host, cluster=found, pools=pools,
                                    output=output, run=secrets.token_hex(2),
                                    metrics_endpoint=metrics_endpoint)

            def say(id: str, line: str) -> None:
                console.print(f"[dim]{id}:[/] {line}", highlight=False, soft_wrap=True)
            results = await running.run(checklist, target, clock=SYSTEM_CLOCK, only=only,
                                        say=say)
            if under_faults:
                results += await running.under_faults(target, results, clock=SYSTEM_CLOCK,
                                                      say=say)
    return results, found


def _table(checklist: checklists.Checklist, results: list[Result], seconds: float) -> None:
    table = Table(title=f"AI conformance {checklist.version} rehearsal ({seconds:.0f}s): "
                        f"simulated hardware, not a certification")
    for column in ("requirement", "level", "status", "time", "deadline passed"):
        table.add_column(column, justify="right" if column == "time" else "left")
    colours = {"Implemented": "green", "Partially Implemented": "yellow", "N/A": "dim"}
    for row in reporting.table(checklist, results):
        colour = colours.get(row.status, "red")
        table.add_row(row.requirement, row.level, f"[{colour}]{row.status}[/]",
                      f"{row.seconds:.1f}s" if row.automated else "-", row.deadline)
    stdout.print(table, soft_wrap=True)
