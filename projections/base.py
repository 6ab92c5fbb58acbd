"""What a projection is: tables, and the SQL each domain event turns into.

A projection never reads the store while it projects: `ops(event, position)` is a pure
function of the event, so the same code builds the read model inline (in the transaction
that appends the event), in a catch-up runner, and in a from-zero rebuild.
SQL uses `%s` placeholders and the subset of SQL that SQLite and PostgreSQL share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from domain.events import DomainEvent

Op = tuple[str, tuple[Any, ...]]


class Projection(Protocol):
    """A read model: `inline` ones are written in the same transaction as the events."""

    name: str
    inline: bool
    tables: tuple[str, ...]
    ddl: tuple[str, ...]
    # The todo events it leaves alone on purpose; every other todo event has its own branch
    # (tests/unit/test_projection_coverage.py holds each projection to that).
    ignores: tuple[type[DomainEvent], ...]

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]: ...


def micros(moment: datetime | None) -> int | None:
    """Times are stored as integer microseconds since the epoch (UTC)."""
    if moment is None:
        return None
    return int(moment.timestamp() * 1_000_000) if moment.tzinfo else int(
        moment.replace(tzinfo=timezone.utc).timestamp() * 1_000_000
    )


def from_micros(value: int | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value / 1_000_000, tz=timezone.utc)


def as_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class Tracking:
    """Each projection's position in the log lives in one row of this table."""

    TABLE = "sb_tracking"
    DDL = (
        "CREATE TABLE IF NOT EXISTS sb_tracking (name TEXT PRIMARY KEY, position BIGINT NOT NULL)",
    )
