"""Kubernetes' name rules as Python checks, and the words that tell a user what is accepted.

The CRDs check names in the API server with Kubernetes' own CEL format library
(:mod:`operators.api.names` builds those rules from the lengths and words here); the hub checks
what arrives on the wire with the predicates here. Both say the same thing in the same words.

Patterns end in ``\\Z``, not ``$``: ``$`` also matches before a final newline (``"west\\n"``).
"""

from __future__ import annotations

import re

#: Label values, and so every name that becomes one, hold at most 63 characters; so do DNS
#: labels and the name part of a qualified name.
LABEL_VALUE_MAX_LENGTH = 63
DNS_LABEL_MAX_LENGTH = 63
DNS_SUBDOMAIN_MAX_LENGTH = 253
#: A qualified name: an optional DNS-subdomain prefix (≤ 253) and '/', then a name (≤ 63).
QUALIFIED_NAME_MAX_LENGTH = DNS_SUBDOMAIN_MAX_LENGTH + 1 + LABEL_VALUE_MAX_LENGTH

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")

LABEL_VALUE_SYNTAX = (
    f"at most {LABEL_VALUE_MAX_LENGTH} characters (letters, digits, '-', '_' or '.'), "
    "alphanumeric at both ends, or empty"
)
QUALIFIED_NAME_SYNTAX = (
    "such as example.com/role: an optional DNS-subdomain prefix (at most 253 characters) and "
    "'/', then a name of at most 63 characters (letters, digits, '-', '_' or '.'), alphanumeric "
    "at both ends"
)
DNS_LABEL_SYNTAX = (
    "a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit, "
    f"at most {DNS_LABEL_MAX_LENGTH} characters"
)


def is_dns_label(value: str) -> bool:
    """A DNS label (RFC 1123): what a Namespace's or a cluster's name must be."""
    return bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str) -> bool:
    """A DNS subdomain: what most objects' names must be."""
    return len(value) <= DNS_SUBDOMAIN_MAX_LENGTH and bool(_DNS_SUBDOMAIN.match(value))


def is_label_value(value: str) -> bool:
    """A label value: empty, or a name of at most 63 characters."""
    return not value or bool(_NAME.match(value))


def is_qualified_name(value: str) -> bool:
    """A label, annotation or taint key: ``[prefix/]name``."""
    prefix, slash, name = value.rpartition("/")
    if slash and not (prefix and is_dns_subdomain(prefix)):
        return False
    return bool(_NAME.match(name))


# -- a member's name in the fleet ---------------------------------------------------------------

#: The namespace a member name without one means (a member registered before names had one,
#: or by a host that sends none, is in it).
DEFAULT_NAMESPACE = "default"
#: A FakeCluster's name: a DNS subdomain (dots allowed) of at most 63 characters, since it is
#: also a label value (the CRD says so too).
CLUSTER_NAME_MAX_LENGTH = LABEL_VALUE_MAX_LENGTH
CLUSTER_NAME_SYNTAX = (
    "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at "
    f"most {CLUSTER_NAME_MAX_LENGTH} characters"
)
MEMBER_NAME_SYNTAX = (
    f"[namespace/]name: the FakeCluster's namespace ({DNS_LABEL_SYNTAX}; namespace "
    f"{DEFAULT_NAMESPACE} may be left out) and its name ({CLUSTER_NAME_SYNTAX})"
)


def is_cluster_name(value: str) -> bool:
    """What a FakeCluster's name may be."""
    return len(value) <= CLUSTER_NAME_MAX_LENGTH and is_dns_subdomain(value)


def member_name(namespace: str, name: str) -> str:
    """A member's name in the fleet: ``namespace/name``, or ``name`` alone in namespace
    default. So FakeClusters of one name in two namespaces are two members, and the fleet's
    names (tokens, command ids, state) from before namespaces counted are those of default."""
    return name if namespace in ("", DEFAULT_NAMESPACE) else f"{namespace}/{name}"


def split_member_name(value: str) -> tuple[str, str]:
    """(namespace, name) of a member name."""
    namespace, _, name = value.rpartition("/")
    return namespace or DEFAULT_NAMESPACE, name


def canonical_member_name(value: str) -> str:
    """``value`` as the fleet spells it: ``default/west`` is ``west``."""
    return member_name(*split_member_name(value))


def is_member_name(value: str) -> bool:
    namespace, slash, name = value.partition("/")
    if not slash:
        namespace, name = DEFAULT_NAMESPACE, value
    return is_dns_label(namespace) and is_cluster_name(name)
