"""Delivery ids: the sender's id of each stored delivery (`X-GitHub-Delivery`, `X-Gitea-Delivery`,
a cairn `event_id`, `X-Delivery-Id`, `Webhook-Id`, else `sha256:<body hash>`), so that `events list`
can be matched with the sender's "recent deliveries".

A table of its own rather than a column of `sb_deliveries`: a projection added later is built
from the log on the next start (its tracking row starts at 0), with no schema migration.
"""

from __future__ import annotations

from domain.delivery import DELIVERY_PREFIX, DeliveryAccepted, delivery_id_of
from domain.events import DomainEvent
from domain.names import format_id
from domain.todo import TODO_EVENTS
from projections.base import Op


class DeliveryIds:
    name = "delivery_ids"
    inline = False
    tables = ("sb_delivery_ids",)
    ignores = TODO_EVENTS
    ddl = ("CREATE TABLE IF NOT EXISTS sb_delivery_ids (event_id TEXT PRIMARY KEY, delivery_id TEXT NOT NULL)",)

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        match event:
            case DeliveryAccepted():
                return [("INSERT INTO sb_delivery_ids (event_id, delivery_id) VALUES (%s, %s)",
                         (format_id(DELIVERY_PREFIX, event.originator_id), delivery_id_of(event.delivery_key)))]
        return []

