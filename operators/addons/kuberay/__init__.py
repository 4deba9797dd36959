"""KubeRay's operator as an add-on of member clusters: its binary (built from the Go module
proxy into the per-user cache), its manifests (read from the module source, never committed),
the pure rendering of what a member's KubeRay needs (its webhook pointed at loopback, RBAC,
command line), its pure planning, and how it is set up and hooked into a member (``running``).

The module ``github.com/ray-project/kuberay/ray-operator`` has no replaces, but its webhook
server cannot be told where to listen: controller-runtime's defaults, port 9443 on every
interface, which is the pod's own upstream and would be shared by every member here. So the
main package is built with one file of ours added (``fakefleet_webhook.go``: flags for the
webhook server's address and certificate directory, and a readiness check on it), in a wrapper
module (:mod:`operators.controlplane.wrapping`); upstream's main.go and every package are as
released. ``$FAKEFLEET_KUBERAY`` names a binary to use instead (it needs those flags).
"""

from pathlib import Path

from operators.controlplane.tools import GoTool

KUBERAY_MODULE = "github.com/ray-project/kuberay/ray-operator"
KUBERAY_VERSION = "v1.5.0"
#: KubeRay's operator, its main package built with fakefleet's file into the per-user cache.
TOOL = GoTool(name="kuberay", title="KubeRay", package=KUBERAY_MODULE, module=KUBERAY_MODULE,
              version=KUBERAY_VERSION, override="FAKEFLEET_KUBERAY",
              additions=(Path(__file__).with_name("fakefleet_webhook.go"),),
              hint="a cold build takes 4 to 13 minutes on 2 cores")
