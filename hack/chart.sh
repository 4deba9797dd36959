#!/usr/bin/env bash
# Lint and render charts/fakefleet, then let a real kube-apiserver validate what it renders:
# server-side dry-run of the chart (as installed by default, serving every namespace, with the
# hub and without persistence) and of the GitOps example's fleet (examples/gitops, built by
# kubectl's kustomize as Argo CD and Flux build it). Exits 0 when all of it passed.
#
#   hack/chart.sh              a fresh host control plane (fakefleet up in a temporary state
#                              directory, stopped afterwards)
#   hack/chart.sh KUBECONFIG   an existing host cluster with fakefleet's CRDs (the e2e tests')
#
# Needs fakefleet on PATH (make chart runs it from .venv); builds Helm if it is not cached.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build progress goes to stderr, the binary's path to stdout.
helm="$(python -c 'import sys; from operators.controlplane import helm
print(helm.ensure(progress=lambda line: print(line, file=sys.stderr, flush=True)))')"
work="$(mktemp -d -t fakefleet-chart.XXXXXX)"
state=""
cleanup() {
  if [ -n "$state" ]; then
    fakefleet down --state-dir "$state" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

step() { printf '\n== %s\n' "$*"; }

step "helm lint"
"$helm" lint --strict charts/fakefleet

namespace=fakefleet
step "helm template (default, all namespaces with the hub, without persistence)"
"$helm" template fakefleet charts/fakefleet --namespace "$namespace" --include-crds \
  --set 'watch.namespaces={fakefleet-extra}' >"$work/default.yaml"
"$helm" template fakefleet charts/fakefleet --namespace "$namespace" \
  --set watch.allNamespaces=true --set hub.enabled=true \
  --set tracing.endpoint=http://tempo.observability:4317 >"$work/cluster-wide.yaml"
"$helm" template fakefleet charts/fakefleet --namespace "$namespace" \
  --set persistence.enabled=false --set etcd.fsync=false \
  --set controlPlane.profile=load >"$work/ephemeral.yaml"
kubectl kustomize examples/gitops >"$work/gitops.yaml"
grep -c '^kind:' "$work"/*.yaml | sed 's/^/  objects: /'

if [ $# -ge 1 ]; then
  kubeconfig="$1"
else
  step "fakefleet up (a fresh host control plane)"
  state="$work/state"
  fakefleet up --state-dir "$state" --no-hub --no-collector --unsafe-no-fsync >/dev/null
  kubeconfig="$state/clusters/host/kubeconfig"
fi
k() { kubectl --kubeconfig "$kubeconfig" "$@"; }

step "namespaces the manifests name"
for ns in "$namespace" fakefleet-extra; do
  k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
done

for manifest in default cluster-wide ephemeral gitops; do
  step "server-side dry-run: $manifest"
  k apply --server-side --dry-run=server --field-manager=fakefleet-chart \
    --force-conflicts -f "$work/$manifest.yaml"
done
printf '\nchart: lint, render and server-side dry-run passed\n'
