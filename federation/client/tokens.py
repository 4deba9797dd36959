"""Hub tokens: who may speak to the hub, as whom.

A hub has one secret key (32 random bytes in its state directory). From it come

- the **fleet token**, for users and the CLI: ``ff1.<mac>``;
- one **member token** per member: ``fm1.<member>.<mac>``, bound to the member's name in the
  fleet (``namespace/name``, ``name`` alone in namespace default:
  :func:`primitives.names.member_name`): the mac covers it, so a member holding it can
  register as, and act for, that FakeCluster only, and not for one of the same name in
  another namespace.

The hub checks a token by computing its mac again (no token table to keep in sync); whoever
holds the key (the hub, and the operator on the hub's own host) can mint tokens. Changing the
key revokes every token at once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path

from primitives.files import write_private
from primitives.names import canonical_member_name

KEY_BYTES = 32
FLEET_PREFIX = "ff1"
MEMBER_PREFIX = "fm1"


class TokenError(ValueError):
    """A token that is malformed or was not made with this hub's key."""


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def load_or_create_key(path: Path) -> bytes:
    """The key at ``path``, made (readable by its owner only, on disk before it is used) if
    there is none. A file that is not a key (torn, empty) is a :class:`TokenError` naming it
    and the way out."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = new_key()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            write_private(path, key, replace=False)
        except FileExistsError:  # another process made one meanwhile: that one is the key
            key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise TokenError(f"{path} does not hold a hub key ({len(key)} bytes, not {KEY_BYTES}): "
                         f"remove it to make a new one (every token made so far stops working)")
    return key


def _mac(key: bytes, subject: str) -> str:
    digest = hmac.new(key, subject.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def fleet_token(key: bytes) -> str:
    return f"{FLEET_PREFIX}.{_mac(key, 'fleet')}"


def member_token(key: bytes, member: str) -> str:
    """The token of ``member`` (its name in the fleet: ``namespace/name``)."""
    member = canonical_member_name(member)
    return f"{MEMBER_PREFIX}.{member}.{_mac(key, 'member:' + member)}"


def check_fleet(key: bytes, token: str) -> None:
    if not hmac.compare_digest(token.encode(), fleet_token(key).encode()):
        raise TokenError("not this hub's fleet token")


def check_member(key: bytes, token: str) -> str:
    """The member ``token`` speaks for (its name in the fleet, as the fleet spells it)."""
    prefix, _, rest = token.partition(".")
    cluster, _, mac = rest.rpartition(".")
    if prefix != MEMBER_PREFIX or not cluster or not mac:
        raise TokenError(f"not a member token (expected {MEMBER_PREFIX}.<member>.<mac>)")
    if not hmac.compare_digest(mac.encode(), _mac(key, "member:" + cluster).encode()):
        # The name is the caller's: only its start goes back (a long one would make the
        # hub's answer too large for the caller to read).
        raise TokenError(f"the token for cluster {cluster[:80]!r} was not made with this "
                         f"hub's key")
    return canonical_member_name(cluster)
