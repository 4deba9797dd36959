"""What every ``fakefleet`` command shares: the consoles it writes to and where its state is."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.console import Console

# Messages to a file, a pipe or a test are not wrapped: an error stays one line that scripts
# can search (rich would break it at 80 columns).
console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())
# Tables piped to a file or a test keep their columns instead of wrapping at 80.
stdout = Console() if sys.stdout.isatty() else Console(width=160)


def default_state_dir() -> Path:
    """``$FAKEFLEET_STATE_DIR``, else ``$XDG_STATE_HOME/fakefleet``, else ~/.local/state/."""
    explicit = os.environ.get("FAKEFLEET_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "fakefleet"


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default="$FAKEFLEET_STATE_DIR or ~/.local/state/fakefleet",
    help="Where the control plane keeps its data, certificates and logs.",
)
