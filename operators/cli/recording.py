"""``fakefleet record`` and ``fakefleet convert``: recordings of clusters, and KWOK's format.

``record`` lists and watches the resources asked of each cluster named by a kubeconfig, for the
time asked, into one trace on one clock (:mod:`operators.recording`); ``convert`` turns a trace
into KWOK's recording format and a KWOK recording into a trace. docs/recording.md holds the
model and the file.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import click

from operators.api.base import API_VERSION
from operators.api.durations import parse_duration
from operators.cli.terminal import (
    console,
    host_client,
    member_kubeconfig,
    run_k8s,
    state_dir_option,
)
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess, load_kubeconfig, load_kubeconfig_file
from operators.k8s.errors import K8sError
from operators.recording import files, kwok, loading, sanitizing, watching
from operators.recording.files import Summary, TraceError
from operators.recording.sanitizing import Rules
from primitives.clocks import SYSTEM_CLOCK
from primitives.files import write_private
from primitives.names import is_dns_label

#: The longest recording (a week): its changes are streamed to disk, but each live object's
#: last state is held.
LONGEST = 7 * 86400.0


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None
    if not 0 < seconds <= LONGEST:
        raise click.BadParameter(f"{value!r} is not between 0 and a week: give one such as "
                                 f"'10m'")
    return seconds


def _clusters(kubeconfigs: tuple[str, ...]) -> list[tuple[str, ClusterAccess]]:
    """``[NAME=]PATH`` as (name, access): a name defaults to the file's name up to its first
    dot (``west.kubeconfig`` is ``west``)."""
    named = []
    for given in kubeconfigs:
        name, _, path = given.rpartition("=")
        name = name or Path(path).name.split(".")[0].lower()
        if not is_dns_label(name):
            raise TraceError(f"--kubeconfig {given!r}: the cluster name {name!r} is no DNS "
                             f"label: name it, as NAME=PATH")
        try:
            named.append((name, load_kubeconfig_file(Path(path))))
        except K8sError as error:
            raise TraceError(f"cluster {name}: {error}") from error
    return named


async def _fleet(state_dir: Path) -> list[tuple[str, ClusterAccess]]:
    """Every FakeCluster of the ``fakefleet up`` in ``state_dir``, by its name."""
    async with host_client(state_dir) as host:
        items = (await host.get(f"/apis/{API_VERSION}/fakeclusters")).get("items") or []
        found = []
        for item in sorted(items, key=lambda i: (i["metadata"]["namespace"],
                                                 i["metadata"]["name"])):
            metadata = item["metadata"]
            text = await member_kubeconfig(host, item)
            found.append((str(metadata["name"]), load_kubeconfig(
                text, source=f"FakeCluster {metadata['namespace']}/{metadata['name']}'s "
                             f"kubeconfig")))
    if not found:
        raise TraceError(f"--fleet: the fakefleet in {state_dir} has no FakeCluster: create "
                         f"one, or name clusters with --kubeconfig")
    return found


@contextlib.asynccontextmanager
async def _sources(clusters: list[tuple[str, ClusterAccess]]) -> AsyncIterator[
        list[watching.Source]]:
    names = [name for name, _ in clusters]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TraceError(f"two clusters are named {', '.join(twice)}: name each, as "
                         f"--kubeconfig NAME=PATH")
    clients = [(name, Client.connect(access)) for name, access in clusters]
    try:
        yield [watching.Source(name, client) for name, client in clients]
    finally:
        for _, client in clients:
            await client.close()


@click.command()
@click.option("--kubeconfig", "kubeconfigs", multiple=True, metavar="[NAME=]PATH",
              help="A cluster to record; repeat for a fleet trace on one clock. NAME is its "
                   "name in the trace (default: the file's name up to its first dot).")
@click.option("--fleet", is_flag=True,
              help="Record every FakeCluster of the 'fakefleet up' in --state-dir too, each by "
                   "its name.")
@state_dir_option
@click.option("--for", "duration", default="10m", show_default=True, callback=_duration,
              help="How long to record (90s, 10m, 2h).")
@click.option("--resources", default=",".join(watching.DEFAULT_RESOURCES), show_default=True,
              help="Comma-separated resources as kubectl names them (pods, deployments.apps, "
                   "widgets.example.com/v1).")
@click.option("--sanitize", type=click.Choice(["drop", "hash"]), default="drop",
              show_default=True,
              help="What becomes of Secrets' data, and of the env values and annotations that "
                   "--redact-env and --redact-annotation match: dropped, or hashed (sha256:).")
@click.option("--redact-env", multiple=True, metavar="REGEX",
              help="Env variables (by name) whose values are sanitised; repeat for more. "
                   f"Default: {sanitizing.DEFAULT_ENV[0]}.")
@click.option("--redact-annotation", multiple=True, metavar="REGEX",
              help="Annotations (by key) that are sanitised; repeat for more. Default: "
                   "kubectl's last-applied-configuration.")
@click.option("--keep-secret-data", is_flag=True,
              help="Record Secrets' data as it is (it is sanitised by default).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The trace file to write (0600).")
def record(kubeconfigs: tuple[str, ...], fleet: bool, state_dir: Path, duration: float,
           resources: str, sanitize: str, redact_env: tuple[str, ...],
           redact_annotation: tuple[str, ...], keep_secret_data: bool, output: Path) -> None:
    """Record what happens in clusters (objects at the start, every change, pods' lives) into
    a trace that 'fakefleet replay' plays into FakeClusters."""
    if not kubeconfigs and not fleet:
        raise TraceError("name the clusters to record: --kubeconfig [NAME=]PATH (repeat it), "
                         "or --fleet for every FakeCluster")
    clusters = _clusters(kubeconfigs)
    try:
        rules = Rules(
            mode="hash" if sanitize == "hash" else "drop", keep_secret_data=keep_secret_data,
            env=sanitizing.compile_patterns(redact_env or sanitizing.DEFAULT_ENV,
                                            flag="--redact-env"),
            annotations=sanitizing.compile_patterns(
                redact_annotation or sanitizing.DEFAULT_ANNOTATIONS,
                flag="--redact-annotation"))
    except ValueError as error:
        raise TraceError(str(error)) from None
    names = [name.strip() for name in resources.split(",") if name.strip()]
    if not names:
        raise TraceError("--resources names none: give some, such as 'pods,deployments.apps'")
    if not output.parent.is_dir():
        raise TraceError(f"-o {output}: there is no directory {output.parent}: create it first")

    async def work() -> Summary:
        everything = clusters + (await _fleet(state_dir.resolve()) if fleet else [])
        async with _sources(everything) as sources:
            resolved = {}
            for source in sources:
                try:
                    resolved[source.cluster] = await watching.resolve(source, names)
                except K8sError as error:
                    raise TraceError(f"cluster {source.cluster} did not answer its discovery "
                                     f"({error}): check its kubeconfig and that its API server "
                                     f"is up") from error
            started = time.monotonic()

            def progress(initial: int, changes: int) -> None:
                status.update(f"recording {', '.join(s.cluster for s in sources)}: {initial} "
                              f"objects at the start, {changes} changes, "
                              f"{time.monotonic() - started:.0f}/{duration:.0f}s")

            def listed() -> None:
                console.print(f"listed every resource at the start after "
                              f"{time.monotonic() - started:.1f}s; recording changes",
                              highlight=False)

            return await watching.record(sources, resolved, output=output, duration=duration,
                                         rules=rules, clock=SYSTEM_CLOCK, progress=progress,
                                         on_listed=listed)

    with console.status("connecting") as status:
        summary = run_k8s(work())
    console.print(f"recorded {', '.join(summary.clusters)} for "
                  f"{summary.duration / 1e9:.1f}s into {output}: {summary.initial} objects at "
                  f"the start, {summary.changes} changes, {summary.pods} pod lives",
                  highlight=False)
    for note in summary.notes:
        console.print(f"[dim]note: {note}[/]", highlight=False)


@click.command()
@click.argument("source", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--to", "target", type=click.Choice(["kwok", "trace"]), required=True,
              help="kwok: KWOK's recording format (YAML); trace: fakefleet's trace file.")
@click.option("--cluster", default="",
              help="With --to kwok: the cluster of a fleet trace to write (KWOK's format holds "
                   "one). With --to trace: the name a KWOK recording's cluster gets (default: "
                   f"{loading.KWOK_CLUSTER}).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The file to write.")
def convert(source: Path, target: str, cluster: str, output: Path) -> None:
    """Convert a recording between fakefleet's trace file and KWOK's recording format
    ('kwokctl snapshot record'); SOURCE may be either."""
    if cluster and not is_dns_label(cluster):
        raise TraceError(f"--cluster {cluster!r} is no DNS label: give a cluster's name")
    trace = loading.load(source, cluster=cluster or loading.KWOK_CLUSTER)
    if target == "trace":
        files.write(output, trace)
        console.print(f"wrote {output}: {len(trace.initial)} objects at the start, "
                      f"{len(trace.changes)} changes", highlight=False)
        return
    chosen = cluster or (trace.clusters[0] if len(trace.clusters) == 1 else "")
    if not chosen:
        raise TraceError(f"{source} holds clusters {', '.join(trace.clusters)} and KWOK's "
                         f"format holds one: name it with --cluster")
    text = kwok.write(trace, cluster=chosen)
    try:
        write_private(output, text.encode())
    except OSError as error:
        raise TraceError(f"cannot write {output}: {error}") from error
    console.print(f"wrote cluster {chosen} of {source} to {output} in KWOK's format",
                  highlight=False)
    for lost in kwok.losses(trace, chosen):
        console.print(f"[yellow]left out:[/] {lost}", highlight=False)
