"""Kueue as an add-on of member clusters: its binary (built from the Go module proxy into the
per-user cache), its manifests (read from the module source, never committed), and the pure
rendering of what a member's Kueue needs (Configuration, webhooks pointed at loopback, RBAC,
command line)."""

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.17.0"
