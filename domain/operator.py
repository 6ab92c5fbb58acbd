"""The Operator aggregate: a human who signs in and vends endpoints."""

from __future__ import annotations

import re
from dataclasses import dataclass
from uuid import UUID, uuid5
from datetime import datetime

from domain.errors import InvalidArgument
from domain.events import Aggregate, DomainEvent

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_OPERATOR_NAMESPACE = UUID("6f1b0a52-4d0e-4c55-9d51-2f0e3c7a9b10")


def operator_uuid(name: str) -> UUID:
    """An operator's id is derived from its unique name, so a second create conflicts."""
    return uuid5(_OPERATOR_NAMESPACE, name)


def check_operator_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(f"invalid operator name {name!r}: 1-64 of [A-Za-z0-9._-]")
    return name


@dataclass(frozen=True, kw_only=True)
class OperatorCreated(DomainEvent):
    name: str
    password_hash: str


@dataclass(frozen=True, kw_only=True)
class ApiTokenMinted(DomainEvent):
    token_sha256: str


@dataclass(frozen=True, kw_only=True)
class OperatorPasswordReset(DomainEvent):
    password_hash: str


OPERATOR_EVENTS = (OperatorCreated, ApiTokenMinted, OperatorPasswordReset)


class Operator(Aggregate):
    """Stores only hashes: the password hash and the SHA-256 of each API token."""

    @classmethod
    def create(cls, *, name: str, password_hash: str, now: datetime, actor: str) -> Operator:
        """Creates an operator with a password already hashed by the caller."""
        operator = cls()
        operator.id = operator_uuid(check_operator_name(name))
        operator._record(
            OperatorCreated, timestamp=now, actor=actor, cause="create_operator",
            name=name, password_hash=password_hash,
        )
        return operator

    def mint_token(self, *, token_sha256: str, now: datetime, actor: str) -> None:
        """Records a new API token by its hash; the token itself is shown once by the caller."""
        self._record(ApiTokenMinted, timestamp=now, actor=actor, cause="mint_token", token_sha256=token_sha256)

    def reset_password(self, *, password_hash: str, now: datetime, actor: str) -> None:
        """Replaces the password (hashed by the caller); the old one stops working at once."""
        self._record(OperatorPasswordReset, timestamp=now, actor=actor, cause="reset_password",
                     password_hash=password_hash)

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case OperatorCreated():
                self.name = event.name
                self.password_hash = event.password_hash
                self.token_hashes: tuple[str, ...] = ()
                self.created_at = event.timestamp
            case ApiTokenMinted():
                self.token_hashes = (*self.token_hashes, event.token_sha256)
            case OperatorPasswordReset():
                self.password_hash = event.password_hash
            case _:  # pragma: no cover
                raise TypeError(f"Operator cannot apply {type(event).__name__}")
