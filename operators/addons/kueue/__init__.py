"""Kueue as an add-on of member clusters: its binary (built from the Go module proxy into the
per-user cache), its manifests (read from the module source, never committed), the pure
rendering of what a member's Kueue needs (Configuration, webhooks pointed at loopback, RBAC,
command line), its pure planning (MultiKueue included), and how it is set up and hooked into a
member (``running``).

``sigs.k8s.io/kueue/cmd/kueue@vX`` builds as it is (its go.mod needs no replaces), so it is a
:class:`~operators.controlplane.tools.GoTool`; ``$FAKEFLEET_KUEUE`` names a binary to use
instead.
"""

from operators.controlplane.tools import GoTool

KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.17.0"
#: Kueue's manager binary, built with ``go install`` into the per-user cache.
TOOL = GoTool(name="kueue", title="Kueue", package=f"{KUEUE_MODULE}/cmd/kueue",
              version=KUEUE_VERSION, override="FAKEFLEET_KUEUE")
