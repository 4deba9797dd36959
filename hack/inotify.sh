#!/usr/bin/env bash
# make test runs two fleets at once, up to about twenty member control planes between them, and
# each kube-apiserver, kube-controller-manager, Kueue and metrics-server holds inotify instances
# (operators/controlplane/limits.py): Linux's default of 128 per user is not enough. Raise the
# limit when this user may (CI runs as root), else say how and stop before any test runs.
set -euo pipefail
want=${1:-1024}
setting=/proc/sys/fs/inotify/max_user_instances
[ -r "$setting" ] || exit 0
have=$(cat "$setting")
[ "$have" -ge "$want" ] && exit 0
if [ -w "$setting" ]; then
  echo "raising fs.inotify.max_user_instances from $have to $want for the tests' control planes"
  echo "$want" >"$setting"
  exit 0
fi
echo "fs.inotify.max_user_instances is $have; the tests' control planes need $want:" >&2
echo "  sudo sysctl -w fs.inotify.max_user_instances=$want" >&2
exit 1
