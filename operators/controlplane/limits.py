"""Kernel limits that the processes of a fleet run into, checked before starting more of them.

inotify instances: each kube-apiserver and kube-controller-manager watches its certificate
files through inotify (6 and 5 instances at v1.36), Kueue 3, metrics-server 1, KubeRay 1 (its
webhook's certificate watcher), and Linux allows
each user 128 by default (``fs.inotify.max_user_instances``). Ten members on one machine use
them up; past that, a new component fails at start-up with Go's bare "too many open files" (a
Kueue crash-looping for minutes until another cluster went away is how it showed). Starting a
component with too few left is refused instead, naming the limit and how to raise it.
"""

from __future__ import annotations

import os
from pathlib import Path

from operators.controlplane.errors import LimitError

MAX_USER_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
#: What the components of this Kubernetes version, Kueue, metrics-server and KubeRay each hold
#: (counted in /proc of running ones: anonymous inodes named inotify).
INOTIFY_INSTANCES = {
    "kube-apiserver": 6,
    "kube-controller-manager": 5,
    "kube-scheduler": 0,
    "kueue": 3,
    "metrics-server": 1,
    "kuberay": 1,
}
#: What a member control plane, with its add-ons, holds: the limit's suggested value gives
#: room for about sixty of them.
PER_MEMBER = sum(INOTIFY_INSTANCES.values())
SUGGESTED = 1024


def inotify_instances(proc: Path = Path("/proc"), *, user: int | None = None) -> int:
    """How many inotify instances the processes of ``user`` (default: this one's effective
    user, whom the kernel charges) hold."""
    user = os.geteuid() if user is None else user
    count = 0
    for fds in proc.glob("[0-9]*/fd"):
        try:
            if fds.parent.stat().st_uid != user:  # /proc/PID belongs to its effective user
                continue
            for fd in os.scandir(fds):
                try:
                    if os.readlink(fd.path) == "anon_inode:inotify":
                        count += 1
                except OSError:  # closed meanwhile
                    continue
        except OSError:  # another user's process, or gone
            continue
    return count


def inotify_limit(path: Path = MAX_USER_INSTANCES) -> int | None:
    """The per-user limit, or None where the kernel does not say (no limit known)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def inotify_refusal(what: str, needed: int, in_use: int, limit: int | None) -> str | None:
    """Why ``what`` must not start now (None: it may)."""
    if limit is None or in_use + needed <= limit:
        return None
    return (f"starting {what} needs {needed} inotify instances and {in_use} of this user's "
            f"{limit} are in use (fs.inotify.max_user_instances; a member cluster takes about "
            f"{PER_MEMBER}): raise the limit with 'sudo sysctl -w "
            f"fs.inotify.max_user_instances={max(SUGGESTED, 2 * limit)}' (and in "
            f"/etc/sysctl.d/ to keep it), or delete clusters you no longer need")


def check_inotify(what: str, components: list[str], *, limit_path: Path = MAX_USER_INSTANCES,
                  proc: Path = Path("/proc")) -> None:
    """Refuse to start ``components`` (names in :data:`INOTIFY_INSTANCES`) for ``what`` when
    the user's inotify instances would run out."""
    needed = sum(INOTIFY_INSTANCES.get(component, 0) for component in components)
    limit = inotify_limit(limit_path)
    if needed == 0 or limit is None:
        return
    refusal = inotify_refusal(what, needed, inotify_instances(proc), limit)
    if refusal is not None:
        raise LimitError(refusal)
