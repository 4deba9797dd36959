"""Errors of the control-plane substrate, the one tree every caller catches.

    ControlPlaneError
    ├── BinaryError          a binary is missing, not executable, or cannot be built
    │   └── BuildError       the Go toolchain is missing, the version is unknown, a build failed
    ├── AddonError           an add-on (Kueue) cannot be set up on a member
    ├── LimitError           a kernel limit (inotify instances) would be exceeded by a start
    ├── PortInUseError       a requested loopback port is taken
    ├── StartupError         a component did not become healthy in time (carries its log tail)
    └── StateError           a state directory is absent, locked or inconsistent

Every message says what went wrong, with which value, and what to do about it: the CLI prints
``str(error)`` as is.
"""

from __future__ import annotations


class ControlPlaneError(Exception):
    """Base of every error raised by :mod:`operators.controlplane`."""


class BinaryError(ControlPlaneError):
    """A control-plane binary cannot be found or used."""


class BuildError(BinaryError):
    """Building the binaries from Go modules failed."""


class AddonError(ControlPlaneError):
    """An add-on cannot be set up: its manifests, files or certificates are not usable."""


class LimitError(ControlPlaneError):
    """Starting a component now would exceed a limit of the kernel; the message says which and
    how to raise it. It may pass later, once other clusters are gone."""


class PortInUseError(ControlPlaneError):
    """A port that was asked for explicitly is already bound on the loopback interface."""

    def __init__(self, port: int, what: str) -> None:
        super().__init__(
            f"port {port} on 127.0.0.1 is already in use, so {what} cannot listen there: "
            f"free the port or choose another one (or omit the port to get a free one)"
        )
        self.port = port


class StartupError(ControlPlaneError):
    """A component exited or did not report healthy within its deadline."""

    def __init__(self, component: str, reason: str, log_tail: str) -> None:
        lines = [f"{component} {reason}"]
        if log_tail.strip():
            lines.append(f"last lines of its log:\n{log_tail.rstrip()}")
        super().__init__("\n".join(lines))
        self.component = component
        self.log_tail = log_tail


class StateError(ControlPlaneError):
    """The state directory does not describe a usable control plane."""
