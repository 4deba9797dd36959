"""Reading the YAML files users hand the command line: the documents, or one error that names
the file and what is wrong with it.

Every reader of a file (``plan run``, ``fleet run``, ``fleet submit``) goes through here, so no
file can reach a reader's code as anything but mappings where mappings belong: not YAML, not
UTF-8 text, a list or a word where an object was meant all end here, in
:class:`DocumentError`, which each command shows as its own one-line error.
"""

from __future__ import annotations

from typing import Any, TextIO

import yaml


class DocumentError(ValueError):
    """A file that holds no usable document; the message names the file and the fix."""


def read(file: TextIO) -> list[Any]:
    """The documents of ``file`` (YAML; several separated by ``---``), empty ones left out."""
    try:
        return [document for document in yaml.safe_load_all(file) if document is not None]
    except yaml.YAMLError as error:
        raise DocumentError(f"{file.name} is not YAML: {error}") from None
    except UnicodeDecodeError as error:
        raise DocumentError(f"{file.name} is not UTF-8 text ({error.reason} at byte "
                            f"{error.start}): save it as UTF-8 YAML") from None


def single(file: TextIO, what: str) -> dict[str, Any]:
    """The one document of ``file``, a mapping; ``what`` (e.g. "one FaultPlan") says what the
    command takes, for the message when the file holds none or several."""
    found = read(file)
    if len(found) != 1:
        raise DocumentError(f"{file.name} holds {len(found)} documents: give {what}")
    return mapping(found[0], file.name)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` when it is a mapping (None counts as an empty one), else an error naming
    ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DocumentError(f"{where} is {_kind(value)}, not a mapping of fields")
    return value


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return f"{type(value).__name__} {value!r}"[:60]
