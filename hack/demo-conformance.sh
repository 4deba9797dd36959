#!/usr/bin/env bash
# AI-conformance rehearsal on a fresh GPU FakeCluster: Kueue, Karpenter, KubeRay and custom
# metrics (Prometheus and the adapter) on, a static H100 node, a pool Karpenter makes H100
# nodes for, and a node offering its GPUs through DRA; then
# 'fakefleet conformance run' checks it against the Kubernetes AI Conformance checklist v1.36,
# writes PRODUCT.yaml, junit.xml and evidence/ to $DEMO_OUTPUT (default: a temporary directory,
# kept) and prints the table: requirement, level, status, time. Exits as the run does: 0 when
# every automatable MUST is Implemented, 1 when one is not.
# A rehearsal on simulated hardware, not a certification.
set -euo pipefail
cd "$(dirname "$0")/.."
state_dir=$(mktemp -d -t fakefleet-conformance.XXXXXX)
output=${DEMO_OUTPUT:-$(mktemp -d -t fakefleet-conformance-results.XXXXXX)}
export FAKEFLEET_STATE_DIR=$state_dir
cleanup() { fakefleet down >/dev/null 2>&1 || true; rm -rf "$state_dir"; }
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "fakefleet up"
fakefleet up
host=$state_dir/host.kubeconfig
fakefleet kubeconfig >"$host"
k() { kubectl --kubeconfig "$host" "$@"; }

step "kubectl apply -f examples/conformance/cluster.yaml (FakeCluster 'rehearsal': Kueue, Karpenter, KubeRay, custom metrics, three GPU pools)"
k apply -f examples/conformance/cluster.yaml
fakefleet wait --timeout 900
k wait --for=condition=KueueReady fc/rehearsal --timeout=300s
k wait --for=condition=KarpenterReady fc/rehearsal --timeout=300s
k wait --for=condition=KubeRayReady fc/rehearsal --timeout=300s
k wait --for=condition=CustomMetricsReady fc/rehearsal --timeout=300s

step "fakefleet conformance run --cluster rehearsal -o $output"
code=0
fakefleet conformance run --cluster rehearsal -o "$output" || code=$?
step "results in $output"
ls "$output" "$output/evidence"
exit "$code"
