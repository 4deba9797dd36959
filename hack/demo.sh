#!/usr/bin/env bash
# The main job on the embedded default: a real control plane up, used by kubectl, torn down.
set -euo pipefail
state_dir=$(mktemp -d -t fakefleet-demo.XXXXXX)
export FAKEFLEET_STATE_DIR=$state_dir
cleanup() { fakefleet down >/dev/null 2>&1 || true; rm -rf "$state_dir"; }
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "fakefleet up: etcd, kube-apiserver, kube-scheduler, kube-controller-manager"
fakefleet up
kubeconfig=$state_dir/host.kubeconfig
fakefleet kubeconfig >"$kubeconfig"
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

step "fakefleet status"
fakefleet status

step "the API server answers"
k version
k get --raw /readyz?verbose | tail -n 3

step "a namespace and a Deployment"
k create namespace demo
k -n demo create deployment web --image=registry.k8s.io/pause:3.10 --replicas=3
k -n demo rollout status deployment/web --timeout=2s >/dev/null 2>&1 || true
for _ in $(seq 50); do
  [ "$(k -n demo get pods --no-headers 2>/dev/null | wc -l)" -ge 3 ] && break
  sleep 0.2
done
k -n demo get deployment,replicaset,pods -o wide
echo "(the pods stay Pending: this cluster has no nodes yet; fake nodes come with FakeNodePool)"

step "fakefleet down"
fakefleet down
