"""metrics-server as an add-on of member clusters: its binary (built from the Go module proxy
into the per-user cache), its RBAC and APIService (read from the module source, never
committed), the pure rendering of what a member's metrics-server needs (command line, the
aggregation layer's Service and APIService pointed at loopback), its pure planning, and how it
is set up and hooked into a member (``running``).

``sigs.k8s.io/metrics-server/cmd/metrics-server@vX`` builds as it is (its go.mod has no
replaces), so it is a :class:`~operators.controlplane.tools.GoTool`;
``$FAKEFLEET_METRICS_SERVER`` names a binary to use instead.
"""

from operators.controlplane.tools import GoTool

METRICS_SERVER_MODULE = "sigs.k8s.io/metrics-server"
METRICS_SERVER_VERSION = "v0.8.0"
#: metrics-server, built with ``go install`` into the per-user cache.
TOOL = GoTool(name="metrics-server", title="metrics-server",
              package=f"{METRICS_SERVER_MODULE}/cmd/metrics-server",
              version=METRICS_SERVER_VERSION, override="FAKEFLEET_METRICS_SERVER")
