"""Identifiers and names: their formats and the rules they obey."""

from __future__ import annotations

import re
import unicodedata
from uuid import UUID, SafeUUID

from domain.errors import InvalidArgument

QUARANTINE = "quarantine"
SOURCE_TYPES = ("github", "gitea", "cairn", "generic", "standard", "stripe", "slack")  # who may send a webhook
DEFAULT_SOURCE_TYPES = ("github", "gitea", "cairn", "generic")  # what an endpoint may create unless vended with more
REDACTED = "«redacted»"  # what a secret shown to a person reads as
_QUEUE = re.compile(r"[a-z0-9._-]{1,64}")

TODO_PREFIX = "td_"
ENDPOINT_PREFIX = "ep_"
OPERATOR_PREFIX = "op_"


def check_queue_name(name: object, *, allow_quarantine: bool = False) -> str:
    """A queue name is 1-64 of [a-z0-9._-]; `quarantine` is reserved for faulted deliveries."""
    if not isinstance(name, str) or not _QUEUE.fullmatch(name):
        raise InvalidArgument(f"invalid queue name {name!r}: 1-64 of [a-z0-9._-]")
    if name == QUARANTINE and not allow_quarantine:
        raise InvalidArgument("queue name 'quarantine' is reserved")
    return name


def format_id(prefix: str, value: UUID) -> str:
    return prefix + value.hex


_HEX32 = re.compile(r"[0-9a-f]{32}")


def parse_id(prefix: str, text: object) -> UUID | None:
    """The UUID inside `<prefix><32 hex>`, or None when the text is not such an id."""
    if not isinstance(text, str) or not text.startswith(prefix):
        return None
    rest = text[len(prefix):]
    if len(rest) != 32 or not _HEX32.fullmatch(rest):
        return None
    return uuid_of_hex(rest)


_new, _set, _UNKNOWN = object.__new__, object.__setattr__, SafeUUID.unknown


def uuid_of_hex(digits: str | bytes) -> UUID:
    """`UUID(hex=digits)` for 32 hex digits already checked (or read back from our own tables), in
    under half its time: `UUID.__init__` normalises its text first. The store reads 64 candidate
    ids per claim batch and the caller of every todo command parses one (docs/adr/0004)."""
    value = _new(UUID)
    _set(value, "int", int(digits, 16))
    _set(value, "is_safe", _UNKNOWN)
    return value


def slugify(agent: str) -> str:
    """Lower-case ASCII words joined by '-', at most 40 chars; 'agent' when nothing is left."""
    text = unicodedata.normalize("NFKD", agent).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (text[:40].strip("-")) or "agent"
