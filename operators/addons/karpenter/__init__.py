"""Karpenter's KWOK cloud provider as an add-on of member clusters: its binary (built from the
Go module proxy into the per-user cache), its CRDs (read from the module source, never
committed), the pure rendering of what a member's Karpenter needs (instance types from
fakefleet's GPU presets, a NodePool and KWOKNodeClass per provisioner pool, its environment),
its pure planning, and how it is set up in a member (``running``).

The provider is the main package ``sigs.k8s.io/karpenter/kwok``, and the module's go.mod has no
replaces, so ``go install`` builds it as it is: a
:class:`~operators.controlplane.tools.GoTool`; ``$FAKEFLEET_KARPENTER`` names a binary to use
instead. The nodes it makes are played by fakefleet's engine, not by KWOK's controller
(:mod:`operators.engine.nodes`).
"""

from operators.controlplane.tools import GoTool

KARPENTER_MODULE = "sigs.k8s.io/karpenter"
#: v1.15.0's go.mod asks for Go 1.26.9 and the toolchain fakefleet builds with is 1.26.8;
#: v1.14.1 asks for 1.26.6.
KARPENTER_VERSION = "v1.14.1"
#: Karpenter with its KWOK cloud provider, built with ``go install`` into the per-user cache.
TOOL = GoTool(name="karpenter", title="Karpenter", package=f"{KARPENTER_MODULE}/kwok",
              version=KARPENTER_VERSION, override="FAKEFLEET_KARPENTER", installs="kwok",
              hint="a cold build takes about 17 minutes on 2 cores")
