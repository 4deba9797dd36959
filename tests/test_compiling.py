"""Every go build says what it does at least every 15 s: the tracker and the runner, over a
fake process on a fake clock; the Go tools (Kueue, Helm) through the cache and ``go mod download``
with a fake ``go``."""

from __future__ import annotations

import itertools
import os
import stat
import textwrap
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from operators.controlplane import building, compiling, helm, modules, wrapping
from operators.controlplane.errors import BinaryError, BuildError
from operators.controlplane.tools import GoTool


class Clock:
    """Time that moves only when told to (or by ``step`` at each reading)."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class FakeProcess:
    """A ``go`` that prints ``lines``; each line costs ``seconds_per_line`` of fake time."""

    def __init__(self, lines: Sequence[str], clock: Clock, *, seconds_per_line: float = 0.0,
                 code: int = 0, release: threading.Event | None = None) -> None:
        self._lines = lines
        self._clock = clock
        self._per_line = seconds_per_line
        self._release = release
        self.returncode: int | None = None
        self._code = code
        self.argv: Sequence[str] = ()
        self.env: Mapping[str, str] | None = None

    @property
    def stderr(self) -> Iterator[str]:
        for line in self._lines:
            self._clock.advance(self._per_line)
            yield line + "\n"
        if self._release is not None:
            self._release.wait(timeout=10)
        self.returncode = self._code

    def wait(self, timeout: float | None = None) -> int:
        self.returncode = self._code
        return self._code


def spawner(process: FakeProcess) -> compiling.Spawn:
    def spawn(argv: Sequence[str], env: Mapping[str, str] | None,
              cwd: Path | None) -> FakeProcess:
        process.argv, process.env = argv, env
        return process
    return spawn


def test_tracker_counts_packages_and_downloads_and_speaks_every_interval() -> None:
    tracker = compiling.Tracker("building kube-apiserver (1/4)", started=100.0,
                                hint="the first build takes minutes")
    for line in ("k8s.io/api/core/v1", "go: downloading k8s.io/api v0.36.3",
                 "k8s.io/kubernetes/cmd/kube-apiserver", "", "# some/pkg",
                 "pkg/x.go:3:1: undefined: y", "go: finding module"):
        tracker.line(line)
    assert (tracker.packages, tracker.downloads) == (2, 1)
    assert tracker.tick(110.0) is None
    assert tracker.tick(115.0) == ("building kube-apiserver (1/4): 15s, 2 packages compiled, "
                                   "1 modules downloaded (the first build takes minutes)")
    assert tracker.tick(129.0) is None
    assert tracker.tick(130.5) is not None
    assert tracker.done(160.0) == ("building kube-apiserver (1/4): done in 60s "
                                   "(2 packages compiled, 1 modules downloaded)")


def test_a_busy_build_reports_at_least_every_interval() -> None:
    clock = Clock()
    process = FakeProcess([f"example.com/p{i}" for i in range(20)], clock, seconds_per_line=4)
    said: list[str] = []
    tracker = compiling.run_go(["go", "build", "-v", "./..."], what="building x",
                               progress=said.append, clock=clock, spawn=spawner(process))
    assert tracker.packages == 20
    # 80 s of fake time: a line at 16, 32, 48, 64 and 80 s, each with the count so far.
    assert said == [f"building x: {seconds}s, {seconds // 4} packages compiled"
                    for seconds in (16, 32, 48, 64, 80)]


def test_a_silent_build_still_reports_elapsed_time() -> None:
    """``go`` links for minutes without a line: the watch loop speaks on its own."""
    clock = Clock(step=1.0)  # a second passes at every look at the clock
    release = threading.Event()
    said: list[str] = []

    def progress(line: str) -> None:
        said.append(line)
        if len(said) == 3:
            release.set()

    process = FakeProcess(["example.com/only"], clock, release=release)
    compiling.run_go(["go", "build", "-v", "."], what="linking", progress=progress,
                     clock=clock, spawn=spawner(process), poll=0.001)
    assert len(said) >= 3
    assert all(line.startswith("linking: ") and "1 packages compiled" in line
               for line in said[:3])
    elapsed = [int(line.split(": ")[1].split("s,")[0]) for line in said[:3]]
    assert all(later - earlier >= 15 for earlier, later in itertools.pairwise(elapsed))


def test_a_failed_command_names_it_and_shows_its_last_lines(tmp_path: Path) -> None:
    clock = Clock()
    lines = [f"noise {i}" for i in range(30)] + ["go: k8s.io/x@v1: no such host"]
    process = FakeProcess(lines, clock, code=1)
    log = tmp_path / "build.log"
    with pytest.raises(BuildError) as raised:
        compiling.run_go(["/usr/bin/go", "install", "k8s.io/x@v1"], what="building X",
                         progress=lambda _: None, clock=clock, spawn=spawner(process),
                         log_path=log)
    message = str(raised.value)
    assert message.startswith(f"building X failed (go install k8s.io/x@v1 exited with code 1; "
                              f"full log: {log}):\n")
    assert message.endswith("go: k8s.io/x@v1: no such host")
    assert "noise 10" not in message  # only the last 20 lines
    assert "noise 29" in log.read_text()
    assert "noise 0" in log.read_text()


def test_the_kubernetes_build_names_every_package_it_compiles() -> None:
    argv = building.build_argv("go", "kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver",
                               "-s -w", Path("/out"))
    assert argv[:3] == ["go", "build", "-v"]
    assert argv[-3:] == ["-o", "/out/kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"]


def test_helm_is_stamped_as_upstream_stamps_its_release() -> None:
    gomod = "module helm.sh/helm/v3\n\nrequire (\n\tk8s.io/api v0.37.0\n" \
            "\tk8s.io/client-go v0.37.0\n)\n"
    flags = helm.release_ldflags("v3.22.0", gomod)
    assert "-X helm.sh/helm/v3/internal/version.version=v3.22.0" in flags
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1" in flags
    assert "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37" in flags
    assert "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37" in flags
    with pytest.raises(BuildError, match=r"requires no k8s\.io/client-go"):
        helm.release_ldflags("v3.22.0", "module helm.sh/helm/v3\n")


# -- the cache, with a fake go on PATH ----------------------------------------------------------

TOOL = GoTool(name="thing", title="Thing", package="example.com/thing/cmd/thing",
              version="v1.2.3", override="FAKEFLEET_THING", ldflags="-s -w")


def fake_go(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = bin_dir / "go"
    go.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    go.chmod(go.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def go_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv(TOOL.override, raising=False)
    return tmp_path / "bin"


def test_a_tool_is_installed_into_the_cache_through_staging(tmp_path: Path,
                                                           go_path: Path) -> None:
    fake_go(go_path, """
        echo "$@" > "$GOBIN/../argv"
        for p in a/b c/d e/f; do echo "$p" >&2; done
        printf '#!/bin/sh\\n' > "$GOBIN/thing"; chmod +x "$GOBIN/thing"
    """)
    said: list[str] = []
    ticks = iter(float(t) for t in range(0, 1000, 20))
    path = TOOL.ensure(root=tmp_path / "cache", progress=said.append, clock=lambda: next(ticks))
    assert path == tmp_path / "cache" / "thing" / "v1.2.3" / "thing"
    assert path.is_file()
    assert not (path.parent / ".partial").exists()
    assert (path.parent / "argv").read_text().split() == [
        "install", "-v", "-trimpath", "-ldflags", "-s", "-w", "example.com/thing/cmd/thing@v1.2.3"]
    assert said[0] == "building Thing v1.2.3 with go install (from the Go module proxy)"
    assert said[-1].startswith("building Thing v1.2.3: done in ")
    assert "(3 packages compiled)" in said[-1]
    # A second call finds it and builds nothing.
    assert TOOL.ensure(root=tmp_path / "cache", progress=said.append) == path


def test_a_failed_install_leaves_no_entry(tmp_path: Path, go_path: Path) -> None:
    fake_go(go_path, """
        echo "go: example.com/thing@v1.2.3: no such host" >&2
        exit 1
    """)
    with pytest.raises(BuildError, match=r"building Thing v1.2.3 failed \(go install -v "
                                         r"-trimpath .*exited with code 1.*\):\n"
                                         r"go: .*no such host"):
        TOOL.ensure(root=tmp_path / "cache")
    assert TOOL.find(root=tmp_path / "cache") is None


def test_the_override_must_be_an_executable(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOL.override, str(tmp_path / "missing"))
    with pytest.raises(BinaryError, match=r"FAKEFLEET_THING=.* does not name an executable"):
        TOOL.find()


# -- go mod download, with a fake go ------------------------------------------------------------

def test_a_module_is_found_where_go_mod_download_says(tmp_path: Path, go_path: Path) -> None:
    fake_go(go_path, """
        echo "$@" > "$PWD/argv"
        echo '{"Path": "example.com/thing", "Version": "v1.2.3", "Dir": "/cache/thing@v1.2.3",'
        echo ' "GoMod": "/cache/download/thing/@v/v1.2.3.mod", "Sum": "h1:t=",'
        echo ' "GoModSum": "h1:m="}'
    """)
    found = modules.download(modules.find_go("unused"), "example.com/thing", "v1.2.3",
                             cwd=tmp_path, failed=lambda reason: reason)
    assert found == modules.Module(source=Path("/cache/thing@v1.2.3"),
                                   gomod=Path("/cache/download/thing/@v/v1.2.3.mod"),
                                   sum="h1:t=", gomod_sum="h1:m=")
    assert (tmp_path / "argv").read_text().split() == [
        "mod", "download", "-json", "example.com/thing@v1.2.3"]


@pytest.mark.parametrize(("script", "reason"), [
    ("""echo '{"Path": "example.com/thing", "Error": "unknown revision v9"}'; exit 1""",
     "unknown revision v9"),
    ("""echo 'go: no such host' >&2; exit 1""", "go: no such host"),
    ("exit 1", "no answer"),
])
def test_a_module_that_cannot_be_fetched_says_why(go_path: Path, script: str,
                                                  reason: str) -> None:
    fake_go(go_path, script)
    with pytest.raises(BuildError) as raised:
        modules.download(modules.find_go("unused"), "example.com/thing", "v9", failed=lambda
                         why: f"cannot fetch example.com/thing@v9 ({why})")
    assert str(raised.value) == f"cannot fetch example.com/thing@v9 ({reason})"


def test_no_go_on_path_says_what_needs_it(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError) as raised:
        modules.find_go("reading Thing needs Go")
    assert str(raised.value) == "reading Thing needs Go"


# -- a wrapper module: a main package with files of ours ---------------------------------------

UPSTREAM_GOMOD = ("module github.com/ray-project/kuberay/ray-operator\n\ngo 1.24.0\n\n"
                  "require (\n\tk8s.io/api v0.34.1\n)\n")


def test_the_wrapper_s_go_mod_is_upstream_s_under_another_path_requiring_upstream() -> None:
    gomod = wrapping.render_gomod(UPSTREAM_GOMOD, version="v1.5.0",
                                  module="github.com/ray-project/kuberay/ray-operator")
    assert gomod.splitlines()[0] == f"module {wrapping.WRAPPER_MODULE}"
    assert "\tk8s.io/api v0.34.1" in gomod
    assert gomod.endswith("\nrequire github.com/ray-project/kuberay/ray-operator v1.5.0\n")
    gosum = wrapping.render_gosum("k8s.io/api v0.34.1 h1:a=\n", module="m", version="v1",
                                  sums=("h1:tree=", "h1:mod="))
    assert gosum == "k8s.io/api v0.34.1 h1:a=\nm v1 h1:tree=\nm v1/go.mod h1:mod=\n"


@pytest.mark.parametrize(("gomod", "problem"), [
    (UPSTREAM_GOMOD + "replace k8s.io/api => ./staging/api\n", "has a replace directive"),
    (UPSTREAM_GOMOD + "exclude k8s.io/api v0.1.0\n", "has a exclude directive"),
    ("go 1.24.0\n", "has no module directive"),
])
def test_a_go_mod_a_wrapper_cannot_carry_is_refused(gomod: str, problem: str) -> None:
    with pytest.raises(BuildError, match=problem):
        wrapping.render_gomod(gomod, module="m", version="v1")
