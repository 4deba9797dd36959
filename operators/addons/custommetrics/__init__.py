"""fakefleet's custom-metrics adapter as an add-on of member clusters, the half of the
custom-metrics path that serves HorizontalPodAutoscalers: its binary (fakefleet's own Go
program, built from its source into the per-user cache), the pure rendering of what a member's
adapter needs (command line, RBAC, the aggregation layer's Service and APIServices pointed at
loopback), its pure planning, and how it is set up and hooked into a member (``running``). It
answers from what the member's Prometheus (:mod:`operators.addons.prometheus`) scraped.

Why an adapter of our own: prometheus-adapter, what a platform team runs for this, is refused
by the Go module proxy; KEDA serves external metrics only, which no HPA of type Pods reads. So
the adapter is prometheus-adapter's core on the library it is built on,
``sigs.k8s.io/custom-metrics-apiserver`` v1.37.0: a Go module in ``adapter/`` (go.mod and
go.sum committed, its shared modules at Prometheus' versions, so that the build after
Prometheus' reuses their compiled packages), under 400 lines. ``$FAKEFLEET_CUSTOM_METRICS_ADAPTER``
names a binary to use instead.
"""

from pathlib import Path

from operators.controlplane.tools import GoSourceTool

#: The library it is built on, as its go.mod requires it.
LIBRARY = "sigs.k8s.io/custom-metrics-apiserver"
LIBRARY_VERSION = "v1.37.0"
#: The adapter's Go module, shipped with fakefleet.
SOURCE = Path(__file__).parent / "adapter"
#: The adapter, built with ``go build`` from its source into the per-user cache.
TOOL = GoSourceTool(name="custom-metrics-adapter", title="the custom-metrics adapter",
                    source=SOURCE, override="FAKEFLEET_CUSTOM_METRICS_ADAPTER",
                    hint="a cold build takes about 14 minutes after Prometheus' on 2 cores")
