#!/usr/bin/env bash
# MultiKueue on a simulated fleet: real, unmodified Kueue v0.17.0 runs against a manager cluster
# and two GPU worker clusters (spec.addons.kueue); Jobs submitted to the manager are dispatched
# to the workers, run on fake H100 nodes, and the demo ends once Kueue reports every Workload on
# the manager Finished (exit 0), or says what is missing after $DEMO_TIMEOUT seconds (exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_TIMEOUT=${DEMO_TIMEOUT:-600}
state_dir=$(mktemp -d -t fakefleet-multikueue.XXXXXX)
export FAKEFLEET_STATE_DIR=$state_dir
cleanup() { fakefleet down >/dev/null 2>&1 || true; rm -rf "$state_dir"; }
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }

step "fakefleet up"
fakefleet up
host=$state_dir/host.kubeconfig
fakefleet kubeconfig >"$host"
k() { kubectl --kubeconfig "$host" "$@"; }

step "kubectl apply -f examples/multikueue/clusters.yaml (a manager, two H100 workers, Kueue on each)"
k apply -f examples/multikueue/clusters.yaml
# Ready includes KueueReady: Kueue built (from the cache), started, its webhooks in place.
fakefleet wait --timeout 900
k get fc -o custom-columns='NAME:.metadata.name,PHASE:.status.phase,NODES:.status.nodes,KUEUE:.status.conditions[?(@.type=="KueueReady")].message'

for cluster in mk-manager mk-worker-a mk-worker-b; do
  fakefleet kubeconfig "$cluster" >"$state_dir/$cluster.kubeconfig"
done
manager=$state_dir/mk-manager.kubeconfig
m() { kubectl --kubeconfig "$manager" "$@"; }

step "the queues: ClusterQueue 'gpu' with the MultiKueue admission check on the manager, the same-named queues on each worker"
m apply -f examples/multikueue/manager-queues.yaml
for worker in mk-worker-a mk-worker-b; do
  kubectl --kubeconfig "$state_dir/$worker.kubeconfig" apply -f examples/multikueue/worker-queues.yaml
done
m get multikueueclusters,multikueueconfigs
say "waiting for the operator's MultiKueueClusters, then for both workers to be Active"
for _ in $(seq 120); do
  m get multikueuecluster mk-worker-a mk-worker-b >/dev/null 2>&1 && break
  sleep 1
done
m wait --for=condition=Active multikueuecluster/mk-worker-a multikueuecluster/mk-worker-b --timeout=120s
m wait --for=condition=Active admissioncheck/multikueue --timeout=60s

# ---- submit_jobs: the one place that submits the workload (to the manager) ------------------
# Through the federation hub: it generates the 8 Jobs (examples/workloads/multikueue.yaml) and
# the manager's hub link creates them in its LocalQueue 'gpu'; Kueue does the placing. The hub
# follows them to the end and prints its report (which worker ran each, p50/p99 times).
submit_jobs() {
  fakefleet fleet submit examples/workloads/multikueue.yaml --watch --timeout "$DEMO_TIMEOUT"
}
# -------------------------------------------------------------------------------------------

step "submit 8 Jobs (2 pods x 8 H100 each) to the manager, through the hub"
submit_jobs
total=$(m get jobs -n default -l kueue.x-k8s.io/queue-name=gpu -o name | wc -l)

step "follow the manager's Workloads until Kueue reports every one Finished"
deadline=$((SECONDS + DEMO_TIMEOUT))
while true; do
  rows=$(m get workloads -n default -o jsonpath='{range .items[*]}{.status.clusterName}{" "}{.status.conditions[?(@.type=="Finished")].status}{"\n"}{end}')
  finished=$(grep -c ' True$' <<<"$rows" || true)
  on_a=$(grep -c '^mk-worker-a' <<<"$rows" || true)
  on_b=$(grep -c '^mk-worker-b' <<<"$rows" || true)
  say "Workloads: $finished/$total Finished; dispatched to mk-worker-a: $on_a, mk-worker-b: $on_b"
  if [ "$finished" -eq "$total" ]; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "error: after ${DEMO_TIMEOUT}s only $finished of $total Workloads on the manager are Finished:" >&2
    m get workloads -n default -o wide >&2 || true
    k get fc >&2 || true
    exit 1
  fi
  sleep 5
done

step "every Workload Finished on the manager, each run on a worker"
m get workloads -n default -o custom-columns='WORKLOAD:.metadata.name,WORKER:.status.clusterName,FINISHED:.status.conditions[?(@.type=="Finished")].status'
say "the manager's Jobs (spec.managedBy: kueue.x-k8s.io/multikueue) mirror the workers' status;"
say "MultiKueue removed the workers' copies once they finished"
m get jobs -n default -o custom-columns='JOB:.metadata.name,MANAGED-BY:.spec.managedBy,SUCCEEDED:.status.succeeded'

step "fakefleet down"
fakefleet down
