"""Retention: the stored payloads of finished work older than a cutoff are removed; the events stay.

A prune removes the bytes of delivery bodies, todo payloads and results that only finished work
still names (a done or dead-lettered todo, a dropped delivery, a delivery whose todos are all
finished) and that nothing has named since the cutoff. The events keep their `{sha256, size}`
references, so the audit chain still verifies (docs/adr/0027-payloads-stored-once.md). Each
prune is one `PayloadsPruned` event on the store's one retention stream, with its range and
counts; the digests it removed travel with it to the store (carried), which empties those rows
in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from domain.endpoint import parse_lifetime
from domain.errors import InvalidArgument
from domain.events import Aggregate, DomainEvent
from domain.payloads import carried

RETENTION_ID = UUID("5b1e7e2d-0000-4000-8000-7265746e7469")  # the one retention stream
MAX_AGE = timedelta(days=36500)


def parse_age(text: str) -> timedelta:
    """`<n>s|m|h|d` (e.g. `30d`, as an endpoint's lifetime is written), at most 100 years."""
    try:
        seconds = parse_lifetime(str(text)) if str(text).strip() != "never" else None
    except InvalidArgument:
        seconds = None
    if seconds is None:
        raise InvalidArgument(f"older-than must be a whole number above zero with its unit, like 30d, 12h, 90m or 3600s, not {text!r}")
    if seconds > MAX_AGE.total_seconds():
        raise InvalidArgument("older-than is at most 36500d")
    return timedelta(seconds=seconds)


@dataclass(frozen=True, kw_only=True)
class PayloadsPruned(DomainEvent):
    """The stored payloads of finished work named last before `cutoff` were removed."""

    older_than_seconds: int
    cutoff: datetime
    through_position: int
    deliveries: int
    todos: int
    payloads: int
    bytes: int
    digests: tuple[str, ...] = carried(())
    rewrites: tuple[str, ...] = carried(())  # old events holding these payloads inline: `<id hex>:<version>`


RETENTION_EVENTS = (PayloadsPruned,)


class Retention(Aggregate):
    """The history of prunes of one store."""

    @classmethod
    def start(cls) -> Retention:
        retention = cls()
        retention.id = RETENTION_ID
        return retention

    def prune(self, *, now: datetime, actor: str, older_than: timedelta, through_position: int,
              digests: tuple[str, ...], sizes: int, deliveries: int, todos: int,
              rewrites: tuple[str, ...] = ()) -> None:
        """Records a prune of these payloads (the caller found them finished and old)."""
        if not digests:
            raise InvalidArgument("nothing to prune")
        self._record(
            PayloadsPruned, timestamp=now, actor=actor, cause="retention",
            older_than_seconds=int(older_than.total_seconds()), cutoff=now - older_than,
            through_position=through_position, deliveries=deliveries, todos=todos,
            payloads=len(digests), bytes=sizes, digests=digests, rewrites=rewrites,
        )

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case PayloadsPruned():
                self.last_pruned_at = event.timestamp
            case _:  # pragma: no cover
                raise TypeError(f"Retention cannot apply {type(event).__name__}")
