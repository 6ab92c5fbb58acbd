"""The check an append makes of the streams a command decided on without reading them just before.

Ingest keeps, per webhook, the copies of the webhook and its endpoints it last read, and decides a
delivery on them without a read of its own; `DeliveryAccepted.decided_on` names those streams and
versions (domain/delivery.py). In the append's transaction, under the events table's lock (so
against every commit before it, docs/adr/0001), one statement looks whether any of them moved;
if one did it inserts into `sb_stale_reads`, whose CHECK refuses every row: the transaction
fails as a lost race does (an integrity error), nothing of it is written, and the writer runs
the batch again on fresh state (docs/adr/0031). The table is never written.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from domain.events import DomainEvent
from projections.base import Op

STALE_READS_DDL = ("CREATE TABLE IF NOT EXISTS sb_stale_reads (stale INTEGER NOT NULL CHECK (stale = 0))",)

_ANY_MOVED = (  # PostgreSQL: every stream of the batch in one statement
    "INSERT INTO sb_stale_reads (stale) SELECT 1 FROM unnest(%s::uuid[], %s::bigint[]) AS d(id, version)"
    " WHERE COALESCE((SELECT max(e.originator_version) FROM stored_events e WHERE e.originator_id = d.id), 0)"
    " <> d.version LIMIT 1"
)
_MOVED = (  # SQLite: one statement per stream
    "INSERT INTO sb_stale_reads (stale) SELECT 1 WHERE"
    " COALESCE((SELECT max(originator_version) FROM stored_events WHERE originator_id = %s), 0) <> %s"
)


def decided_on(events: Sequence[DomainEvent]) -> dict[UUID, int]:
    """The streams these events were decided on, each with the version it must still have."""
    streams: dict[UUID, int] = {}
    for event in events:
        streams.update(getattr(event, "decided_on", ()))
    return streams


def check_ops(events: Sequence[DomainEvent], *, sqlite: bool) -> list[Op]:
    """The statements that fail the append if a stream its events were decided on has moved."""
    streams = decided_on(events)
    if not streams:
        return []
    if sqlite:
        return [(_MOVED, (aggregate_id.hex, version)) for aggregate_id, version in streams.items()]
    return [(_ANY_MOVED, (list(streams), list(streams.values())))]
