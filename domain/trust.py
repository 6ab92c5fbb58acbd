"""Trusted senders (CONTRACT §13): who triggered a forge delivery, and whether the webhook trusts them.

A github or gitea webhook may list trusted sender logins (case-insensitive, at most 256) and
trusted author associations (OWNER, MEMBER, COLLABORATOR, CONTRIBUTOR). A delivery's actor is
`payload.sender.login`; its association is the `author_association` of the first object present
among `payload.comment`, `payload.review`, `payload.pull_request`, `payload.issue` — the first
present, not the first that has one: a comment without an association must not borrow the
issue author's. With neither list set every verified delivery is trusted, as before.

Pure: the policy is a value the Webhook aggregate carries; the ingest path asks it once per
delivery.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.errors import InvalidArgument

TRUST_SOURCES = ("github", "gitea")  # the sources whose payloads name a sender
ASSOCIATIONS = ("OWNER", "MEMBER", "COLLABORATOR", "CONTRIBUTOR")
MAX_TRUSTED_SENDERS = 256
LOGIN_MAX_CHARS = 100
ASSOCIATION_CARRIERS = ("comment", "review", "pull_request", "issue")  # in the contract's order

# GitHub logins are [A-Za-z0-9-] (apps add "[bot]"); Gitea's also allow "_" and "."
_LOGIN = re.compile(r"[A-Za-z0-9_.-]+(?:\[bot\])?")


@dataclass(frozen=True)
class Actor:
    """Who triggered a delivery (None where the payload does not say) and whether it is trusted."""

    sender: str | None
    association: str | None
    trusted: bool

    def to_json(self) -> dict[str, Any]:
        """The envelope's `actor`: {sender, association, trusted}."""
        return {"sender": self.sender, "association": self.association, "trusted": self.trusted}

    def named(self) -> dict[str, Any]:
        """The untrusted trace's `actor`: {sender, association}."""
        return {"sender": self.sender, "association": self.association}


@dataclass(frozen=True)
class TrustPolicy:
    """A webhook's trusted logins (lower-cased) and associations; empty lists trust everyone."""

    senders: tuple[str, ...] = ()
    associations: tuple[str, ...] = ()
    _logins: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_logins", frozenset(self.senders))  # one lookup, however many are listed

    @property
    def active(self) -> bool:
        """Whether the webhook restricts who may create work at all."""
        return bool(self.senders or self.associations)

    def admits(self, sender: str | None, association: str | None) -> bool:
        """A listed login or a listed association is trusted; with no lists, everyone is."""
        if not self.active:
            return True
        if sender is not None and sender.lower() in self._logins:
            return True
        return association is not None and association.upper() in self.associations

    def actor(self, source: str, payload: Any, *, verified: bool) -> Actor:
        """The delivery's actor and the verdict: trusted when verified and admitted."""
        sender, association = sender_of(source, payload)
        return Actor(sender, association, verified and self.admits(sender, association))

    def holds(self, actor: Actor) -> bool:
        """An untrusted delivery is held only where the webhook has a policy to break."""
        return self.active and not actor.trusted

    def to_json(self) -> dict[str, list[str]]:
        return {"trusted_senders": list(self.senders), "trusted_associations": list(self.associations)}


NO_POLICY = TrustPolicy()


def sender_of(source: str, payload: Any) -> tuple[str | None, str | None]:
    """(login, author association) of a forge payload; (None, None) for other sources."""
    if source not in TRUST_SOURCES or not isinstance(payload, Mapping):
        return None, None
    sender = payload.get("sender")
    login = sender.get("login") if isinstance(sender, Mapping) else None
    association = None
    for key in ASSOCIATION_CARRIERS:
        carrier = payload.get(key)
        if isinstance(carrier, Mapping):
            value = carrier.get("author_association")
            association = value if isinstance(value, str) and value else None
            break
    return (login if isinstance(login, str) and login else None), association


def check_trusted_senders(logins: Iterable[Any] | None) -> tuple[str, ...]:
    """At most 256 logins of [A-Za-z0-9_.-] (and a bot's "[bot]"), lower-cased, first of each kept."""
    if logins is None:
        return ()
    if isinstance(logins, str | bytes) or not isinstance(logins, Iterable):
        raise InvalidArgument("trusted_senders must be a list of logins")
    checked: dict[str, None] = {}
    for login in logins:
        if not isinstance(login, str) or len(login) > LOGIN_MAX_CHARS or not _LOGIN.fullmatch(login):
            raise InvalidArgument(f"invalid login {login!r}: 1-{LOGIN_MAX_CHARS} of [A-Za-z0-9_.-]")
        checked[login.lower()] = None
    if len(checked) > MAX_TRUSTED_SENDERS:
        raise InvalidArgument(f"{len(checked)} trusted senders: at most {MAX_TRUSTED_SENDERS}")
    return tuple(checked)


def check_trusted_associations(values: Iterable[Any] | None) -> tuple[str, ...]:
    """Any of OWNER, MEMBER, COLLABORATOR, CONTRIBUTOR (case-insensitive), in that order."""
    if values is None:
        return ()
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidArgument("trusted_associations must be a list")
    wanted: set[str] = set()
    for value in values:
        if not isinstance(value, str) or value.upper() not in ASSOCIATIONS:
            raise InvalidArgument(f"invalid association {value!r}: any of {', '.join(ASSOCIATIONS)}")
        wanted.add(value.upper())
    return tuple(a for a in ASSOCIATIONS if a in wanted)
