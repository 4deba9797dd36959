"""A recording from a file, whichever tool wrote it: a fakefleet trace (by its magic line) or
KWOK's YAML recording. What replay and ``fakefleet convert`` read through."""

from __future__ import annotations

from pathlib import Path

from operators.recording import files, kwok
from operators.recording.files import TraceError
from operators.recording.trace import Trace

#: The cluster a KWOK recording's objects are put in (KWOK's format names none).
KWOK_CLUSTER = "kwok"


def load(path: Path, *, cluster: str = KWOK_CLUSTER) -> Trace:
    """The trace in ``path``; a KWOK recording's objects and changes go to ``cluster``."""
    try:
        with path.open("rb") as handle:
            start = handle.read(4096)
    except FileNotFoundError:
        raise TraceError(f"no trace at {path}: give the file that 'fakefleet record -o' or "
                         f"'kwokctl snapshot record' wrote") from None
    except OSError as error:
        raise TraceError(f"cannot read trace {path}: {error}") from error
    if not kwok.looks_like(start):
        return files.read(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"{path} is neither a fakefleet trace nor KWOK's YAML recording "
                         f"({error}): give a file that 'fakefleet record' or 'kwokctl snapshot "
                         f"record' wrote") from error
    return kwok.read(text, source=str(path), cluster=cluster)
