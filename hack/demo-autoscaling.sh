#!/usr/bin/env bash
# Cluster autoscaling on a simulated GPU cluster: real, unmodified Karpenter v1.14.1 (its KWOK
# cloud provider, spec.addons.karpenter) makes H100 nodes for 200 pending pods of one GPU each
# (a Job, examples/karpenter/job.yaml); fakefleet's engine plays every node it makes, the pods
# run for a minute and complete, and Karpenter's consolidation removes the empty nodes. Prints
# the times and counts, and exits 0 once the Job is complete and every node Karpenter made is
# gone, or says what is missing after $DEMO_TIMEOUT seconds (exit 1). Times are as seen by a poll
# every few seconds (each poll is a handful of kubectl calls).
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_TIMEOUT=${DEMO_TIMEOUT:-900}
state_dir=$(mktemp -d -t fakefleet-autoscaling.XXXXXX)
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

step "kubectl apply -f examples/karpenter/cluster.yaml (FakeCluster 'autoscaled' with Karpenter, pool 'h100' with provisioner: karpenter)"
k apply -f examples/karpenter/cluster.yaml
fakefleet wait --timeout 900
say "waiting for Karpenter (built into the cache by 'make setup') and its NodePool"
k wait --for=condition=KarpenterReady fc/autoscaled --timeout=300s
k get fc autoscaled -o jsonpath='{.status.conditions[?(@.type=="KarpenterReady")].message}{"\n"}'
k get fnp h100

member=$state_dir/autoscaled.kubeconfig
fakefleet kubeconfig autoscaled >"$member"
m() { kubectl --kubeconfig "$member" "$@"; }
for _ in $(seq 60); do  # pods need the namespace's ServiceAccount, made by the controller-manager
  m get serviceaccount default >/dev/null 2>&1 && break
  sleep 1
done
m get nodepools,kwoknodeclasses
say "nodes before: $(m get nodes -o name | wc -l)"

count() { grep -c "$1" <<<"$2" || true; }

step "kubectl apply -f examples/karpenter/job.yaml (200 pods of 1 H100 each, 60 s of run time)"
m apply -f examples/karpenter/job.yaml
started=$SECONDS
deadline=$((SECONDS + DEMO_TIMEOUT))
most_nodes=0 claims_seen=0
t_first="" t_nodes="" t_running="" t_complete="" t_removed=""
since() { echo "$((SECONDS - started))s"; }
while true; do
  phases=$(m get pods -l job-name=gpu-burst -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')
  pending=$(count '^Pending$' "$phases")
  running=$(count '^Running$' "$phases")
  succeeded=$(count '^Succeeded$' "$phases")
  claims=$(m get nodeclaims -o name | wc -l)
  ready=$(m get nodes -l karpenter.sh/nodepool=h100 -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
  nodes=$(m get nodes -l karpenter.sh/nodepool=h100 -o name | wc -l)
  complete=$(m get job gpu-burst -o jsonpath='{.status.conditions[?(@.type=="Complete")].status}')
  [ "$nodes" -gt "$most_nodes" ] && most_nodes=$nodes
  [ "$claims" -gt "$claims_seen" ] && claims_seen=$claims
  [ -z "$t_first" ] && [ "$ready" -gt 0 ] && t_first=$(since)
  if [ -z "$t_nodes" ] && [ "$ready" -gt 0 ] && [ "$ready" -eq "$claims" ] && [ "$pending" -eq 0 ]; then
    t_nodes=$(since)
  fi
  [ -z "$t_running" ] && [ "$running" -eq 200 ] && t_running=$(since)
  [ -z "$t_complete" ] && [ "$complete" = "True" ] && t_complete=$(since)
  if [ -n "$t_complete" ] && [ -z "$t_removed" ] && [ "$nodes" -eq 0 ] && [ "$claims" -eq 0 ]; then
    t_removed=$(since)
  fi
  say "+$(since) pods: $pending pending, $running running, $succeeded succeeded; NodeClaims: $claims; nodes: $nodes ($ready Ready)"
  if [ -n "$t_removed" ]; then
    break
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "error: after ${DEMO_TIMEOUT}s the Job is ${complete:-not} complete and $nodes of Karpenter's nodes are left:" >&2
    m get nodeclaims,nodes >&2 || true
    k get fc autoscaled -o yaml >&2 || true
    exit 1
  fi
  sleep 5
done

step "done: Karpenter scaled the cluster up for the pods and back down to none"
printf '%-58s %s\n' \
  "pods (1 GPU each)" 200 \
  "NodeClaims Karpenter made (h100-sxm5-80gb-8gpu)" "$claims_seen" \
  "most nodes at once" "$most_nodes" \
  "submitted -> first of Karpenter's nodes Ready" "$t_first" \
  "submitted -> every node Ready, no pod pending" "${t_nodes:-not seen between polls}" \
  "submitted -> all 200 pods Running" "${t_running:-not seen between polls}" \
  "submitted -> Job complete" "$t_complete" \
  "submitted -> every node removed by consolidation" "$t_removed"
say "the engine let every node go: Leases left in kube-node-lease: $(m get leases -n kube-node-lease -o name | wc -l)"

step "fakefleet down"
fakefleet down
