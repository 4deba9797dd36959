#!/usr/bin/env bash
# The main job on the embedded default: a host control plane with the operator, a fleet of two
# simulated clusters applied with kubectl, their fake nodes Ready and joined to the federation
# hub, kubectl top on them, a FaultPlan with a verdict, a fleet-wide plan through the hub with
# its verdict, a workload of GPU Jobs spread by the hub with its report, then everything torn
# down.
set -euo pipefail
cd "$(dirname "$0")/.."
state_dir=$(mktemp -d -t fakefleet-demo.XXXXXX)
export FAKEFLEET_STATE_DIR=$state_dir
cleanup() { fakefleet down >/dev/null 2>&1 || true; rm -rf "$state_dir"; }
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "fakefleet up: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, operator, hub"
fakefleet up
host=$state_dir/host.kubeconfig
fakefleet kubeconfig >"$host"
k() { kubectl --kubeconfig "$host" "$@"; }

step "fakefleet status"
fakefleet status

step "kubectl apply -f examples/fleet.yaml (2 clusters: CPU and H100 pools, A100 nodes in east)"
k apply -f examples/fleet.yaml
fakefleet wait --timeout 300

step "the fleet"
fakefleet get
k get fakefleet

step "kubectl get nodes in cluster west, through its own kubeconfig"
west=$state_dir/west.kubeconfig
fakefleet kubeconfig west >"$west"
kubectl --kubeconfig "$west" version | grep Server
kubectl --kubeconfig "$west" get nodes \
  -L topology.kubernetes.io/zone,fakefleet.dev/rack,nvidia.com/gpu.product,nvidia.com/gpu.count

step "fakefleet status: each cluster's control plane, its engine and its metrics-server"
fakefleet status

step "kubectl top nodes in west: the real metrics-server scraping the fake kubelets"
for _ in $(seq 60); do  # its first figures come after two scrapes (15 s apart)
  kubectl --kubeconfig "$west" top nodes >/dev/null 2>&1 && break
  sleep 2
done
kubectl --kubeconfig "$west" top nodes

step "node behaviour is stages: annotate a node NotReady, and heal it"
kubectl --kubeconfig "$west" annotate node west-cpu-0 fakefleet.dev/state=NotReady
kubectl --kubeconfig "$west" wait --for=condition=Ready=false node/west-cpu-0 --timeout=60s
kubectl --kubeconfig "$west" get node west-cpu-0
kubectl --kubeconfig "$west" annotate node west-cpu-0 fakefleet.dev/state-
kubectl --kubeconfig "$west" wait --for=condition=Ready node/west-cpu-0 --timeout=60s

step "a FaultPlan: Xid 79 on one H100 node of west for 10s, with expectations and a verdict"
fakefleet plan run - --watch --timeout 120 <<'PLAN'
apiVersion: fakefleet.dev/v1alpha1
kind: FaultPlan
metadata: {name: demo-xid}
spec:
  seed: 1
  steps:
  - name: xid
    target: {clusters: {names: [west]}, nodes: {pools: [west-h100]}, mode: one}
    fault: {type: GPUXid, xid: 79}
    at: 2s
    duration: 10s
    expectations:
    - name: tainted
      within: 10s
      objects: {kind: Node, victims: true}
      taint: {key: fakefleet.dev/gpu-xid, effect: NoExecute}
    - name: gpu-out
      within: 10s
      objects: {kind: Node, victims: true}
      field: {path: "status.allocatable['nvidia.com/gpu']", equals: "7"}
PLAN
fakefleet plan delete demo-xid

step "the federation hub: every cluster joined it (fakefleet fleet ls)"
fakefleet fleet ls

step "a fleet-wide plan through the hub: Xid 79 on 5 % of the GPU nodes of every cluster, then
west cut off from the hub for 20 s (examples/fleet/xid-then-partition.yaml)"
fakefleet fleet watch --timeout 45 &
watcher=$!
fakefleet fleet run examples/fleet/xid-then-partition.yaml --timeout 180
wait "$watcher" || true
k get fp -l fakefleet.dev/fleet-run
fakefleet fleet ls

step "a workload through the hub: 50 Jobs of 2 GPU pods, Poisson arrivals, spread over the fleet
(examples/workloads/spread.yaml); exits 0 once every Job completed, with the report"
fakefleet fleet submit examples/workloads/spread.yaml --watch --timeout 300
# Read whole, then cut: piped into head, kubectl can be killed by SIGPIPE (and pipefail fails
# the demo) when head closes before the list is written.
jobs=$(kubectl --kubeconfig "$west" get jobs -l fakefleet.dev/workload)
head -5 <<<"$jobs"

step "kubectl scale fnp/west-h100 --replicas=12"
k scale fnp/west-h100 --replicas=12
fakefleet wait --timeout 120
k get fnp

step "fakefleet down"
fakefleet down
