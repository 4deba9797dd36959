"""metrics-server as an add-on of member clusters: its binary (built from the Go module proxy
into the per-user cache), its RBAC and APIService (read from the module source, never
committed), and the pure rendering of what a member's metrics-server needs (command line, the
aggregation layer's Service and APIService pointed at loopback)."""

METRICS_SERVER_MODULE = "sigs.k8s.io/metrics-server"
METRICS_SERVER_VERSION = "v0.8.0"
