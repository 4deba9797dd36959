"""Prometheus as an add-on of member clusters, the half of the custom-metrics path that scrapes:
its binary (built from the Go module proxy into the per-user cache), the pure rendering of what
a member's Prometheus needs (command line, scrape configuration, RBAC), its pure planning, and
how it is set up in a member (``running``). The other half, which serves what it scraped to
HorizontalPodAutoscalers, is :mod:`operators.addons.custommetrics`.

``github.com/prometheus/prometheus/cmd/prometheus@v0.316.0`` (Prometheus 3.16.0) builds as it
is: its go.mod has no replaces. Built with the tags ``remove_all_sd,enable_kubernetes_sd``,
it keeps only the Kubernetes, file and HTTP service discovery, about a fifth fewer packages to
compile than every cloud's. The module carries no web UI assets (upstream's release builds them
with npm and the tag ``builtinassets``), so this Prometheus has no web UI: its HTTP API, its
own ``/metrics`` and its health endpoints answer. ``$FAKEFLEET_PROMETHEUS`` names a binary to
use instead.
"""

from operators.controlplane.tools import GoTool

PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_VERSION = "v0.316.0"
#: The release that module version is (its VERSION file), as Prometheus names itself.
PROMETHEUS_RELEASE = "3.16.0"
_STAMP = "github.com/prometheus/common/version"
#: Prometheus, built with ``go install`` into the per-user cache, stamped as upstream's
#: ``.promu.yml`` stamps a release (without the build date, so builds are alike).
TOOL = GoTool(name="prometheus", title="Prometheus",
              package=f"{PROMETHEUS_MODULE}/cmd/prometheus", version=PROMETHEUS_VERSION,
              override="FAKEFLEET_PROMETHEUS", tags="remove_all_sd,enable_kubernetes_sd",
              ldflags=f"-X {_STAMP}.Version={PROMETHEUS_RELEASE} "
                      f"-X {_STAMP}.Revision={PROMETHEUS_VERSION} -X {_STAMP}.Branch=HEAD "
                      f"-X {_STAMP}.BuildUser=fakefleet",
              hint="a cold build takes about 16 minutes on 2 cores")
