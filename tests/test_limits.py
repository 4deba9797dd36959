"""inotify instances: counted as the kernel charges them, and a start that would run out is
refused with the limit's name and how to raise it."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from operators.controlplane import limits
from operators.controlplane.errors import LimitError


def fake_proc(root: Path, fds: dict[int, list[str]]) -> Path:
    for pid, targets in fds.items():
        directory = root / str(pid) / "fd"
        directory.mkdir(parents=True)
        for number, target in enumerate(targets):
            os.symlink(target, directory / str(number))
    (root / "self").mkdir()  # not a pid: not counted twice
    return root


def test_instances_are_counted_over_every_process(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {
        10: ["anon_inode:inotify", "socket:[1]", "anon_inode:inotify"],
        11: ["/dev/null"],
        12: ["anon_inode:[eventpoll]", "anon_inode:inotify"],
    })
    assert limits.inotify_instances(proc) == 3
    assert limits.inotify_instances(proc, user=os.geteuid() + 1) == 0, "another user's"


def test_an_instance_opened_here_is_counted() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    before = limits.inotify_instances()
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert limits.inotify_instances() >= before + 1
    finally:
        os.close(fd)


@pytest.mark.parametrize(("in_use", "limit", "refused"), [
    (100, 128, False), (117, 128, False), (118, 128, True), (0, None, False)])
def test_a_member_is_refused_only_when_its_instances_would_exceed_the_limit(
        in_use: int, limit: int | None, refused: bool) -> None:
    found = limits.inotify_refusal("the control plane of cluster 'west'", 11, in_use, limit)
    assert (found is not None) == refused
    if found:
        assert "fs.inotify.max_user_instances" in found
        assert "sudo sysctl -w fs.inotify.max_user_instances=1024" in found
        assert "'west'" in found
        assert f"{in_use} of this user's {limit}" in found


def test_check_refuses_a_start_beyond_the_limit_and_lets_others_pass(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", {1: ["anon_inode:inotify"] * 120})
    setting = tmp_path / "max_user_instances"
    setting.write_text("128\n")
    with pytest.raises(LimitError, match="cluster 'west' needs 11 inotify"):
        limits.check_inotify("the control plane of cluster 'west'",
                             ["kube-apiserver", "kube-scheduler", "kube-controller-manager"],
                             limit_path=setting, proc=proc)
    limits.check_inotify("metrics-server on default.west", ["metrics-server"],
                         limit_path=setting, proc=proc)
    limits.check_inotify("anything", ["kube-apiserver"], limit_path=tmp_path / "missing",
                         proc=proc)
