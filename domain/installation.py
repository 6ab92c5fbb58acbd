"""The Installation aggregate: facts about the running service as a whole, kept in the store so
every process (and the CLI) reads the same ones — for now its base URL."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from domain.errors import InvalidArgument
from domain.events import Aggregate, DomainEvent

INSTALLATION_ID = UUID("0b6c4c8e-1f0a-4d7e-9a3b-5e2f7c9d1a40")  # one per store


@dataclass(frozen=True, kw_only=True)
class BaseUrlRecorded(DomainEvent):
    base_url: str


INSTALLATION_EVENTS = (BaseUrlRecorded,)


def check_base_url(base_url: object) -> str:
    """A base URL is an absolute http(s) URL; kept without a trailing slash."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")) or any(
        c.isspace() for c in base_url
    ) or len(base_url) > 2048:
        raise InvalidArgument(f"base URL {base_url!r} must be an http:// or https:// URL")
    return base_url.rstrip("/")


class Installation(Aggregate):
    """The base URL `serve` minted links with last; recorded only when it changes."""

    @classmethod
    def new(cls) -> Installation:
        installation = cls()
        installation.id = INSTALLATION_ID
        installation.base_url = None
        return installation

    def record_base_url(self, *, base_url: str, now: datetime, actor: str) -> bool:
        """Records the base URL; False (no event) when it is the one already recorded."""
        base_url = check_base_url(base_url)
        if base_url == self.base_url:
            return False
        self._record(BaseUrlRecorded, timestamp=now, actor=actor, cause="serve_start", base_url=base_url)
        return True

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case BaseUrlRecorded():
                self.base_url = event.base_url
            case _:  # pragma: no cover
                raise TypeError(f"Installation cannot apply {type(event).__name__}")
