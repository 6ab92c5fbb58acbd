"""Retention (CONTRACT §14): removes the stored payloads of finished work older than a cutoff.

`prune` asks the `payload_holders` read model which payloads only finished work names (a done or
dead-lettered todo, a dropped delivery, a delivery whose todos are all finished), records ONE
`PayloadsPruned` event with the range and counts, and the store empties those rows in the same
transaction (nothing named since the cutoff is emptied). Then the space is given back (VACUUM).
The events keep their references: `audit verify` and `projections rebuild --verify` still pass.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any, Protocol

from application.ports import Clock, EventStore, UnitOfWork
from application.presenters import iso
from application.service import Caller
from domain.delivery import DELIVERY_PREFIX
from domain.errors import Forbidden
from domain.retention import RETENTION_ID, Retention, parse_age

log = logging.getLogger("switchboard.retention")
DAILY = timedelta(days=1)
FIRST_RUN_AFTER = timedelta(minutes=1)  # serve's first daily prune, once it has settled


class RetentionViews(Protocol):
    def catch_up(self) -> None: ...

    def prunable(self, cutoff: Any) -> list[tuple[str, int, str]]: ...

    def inline_events(self, digests: list[str]) -> list[str]: ...

    def payload_store_size(self) -> int: ...

    def give_space_back(self, *, rewritten: bool = False, reclaim: bool = False) -> dict[str, Any]: ...


class RetentionService:
    """Prunes on request (`retention prune`) and, in `serve`, daily."""

    def __init__(self, store: EventStore, views: RetentionViews, clock: Clock) -> None:
        self.store = store
        self.views = views
        self.clock = clock

    def prune(self, older_than: str | timedelta, *, caller: Caller, dry_run: bool = False,
              reclaim: bool = False) -> dict[str, Any]:
        """Removes the payloads only finished work older than `older_than` names (`30d`, `12h`…), then
        VACUUMs what it freed (`reclaim`: on PostgreSQL a VACUUM FULL of the payload store, even when
        nothing new was pruned, which gives the free space back to the system under an exclusive lock)."""
        if caller.kind != "operator":
            raise Forbidden("retention is for operators")
        age = older_than if isinstance(older_than, timedelta) else parse_age(older_than)
        now = self.clock.now()
        cutoff = now - age
        self.views.catch_up()
        through = self.store.max_position()
        rows = self.views.prunable(cutoff)
        sizes = {digest: size for digest, size, _ in rows}
        holders = {holder for _, _, holder in rows}
        deliveries = sum(1 for h in holders if h.startswith(DELIVERY_PREFIX))
        answer: dict[str, Any] = {
            "older_than_seconds": int(age.total_seconds()), "cutoff": iso(cutoff), "through_position": through,
            "deliveries": deliveries, "todos": len(holders) - deliveries, "payloads": len(sizes),
            "bytes": sum(sizes.values()), "dry_run": dry_run,
        }
        if dry_run:
            return answer
        if not sizes:
            if reclaim:
                size_before = self.views.payload_store_size()
                answer.update(self.views.give_space_back(reclaim=True), store_bytes_before=size_before,
                              store_bytes_after=self.views.payload_store_size())
            return answer
        digests = tuple(sorted(sizes))
        rewrites = tuple(self.views.inline_events(list(digests)))
        size_before = self.views.payload_store_size()

        def handler(uow: UnitOfWork) -> int:
            retention = uow.get(Retention, RETENTION_ID) or Retention.start()
            retention.prune(now=uow.now, actor=caller.label, older_than=age, through_position=through,
                            digests=digests, sizes=answer["bytes"], deliveries=deliveries,
                            todos=answer["todos"], rewrites=rewrites)
            uow.add(retention)
            return retention.version

        self.store.run(handler)
        try:
            answer.update(self.views.give_space_back(rewritten=bool(rewrites), reclaim=reclaim))
        except Exception as error:  # a busy database keeps its free pages until the next VACUUM
            log.warning("retention: VACUUM skipped (%s)", error)
            answer.update(vacuumed=[], space=None)
        answer.update(store_bytes_before=size_before, store_bytes_after=self.views.payload_store_size())
        return answer

    def run_daily(self, days: int, stop: threading.Event) -> None:
        """`serve`'s daily prune of what finished more than `days` days ago."""
        wait = FIRST_RUN_AFTER
        while not stop.wait(wait.total_seconds()):
            wait = DAILY
            try:
                done = self.prune(timedelta(days=days), caller=Caller("operator", "retention", superuser=True))
                if done["payloads"]:
                    log.info("retention: pruned %d payloads (%d bytes) of work finished before %s",
                             done["payloads"], done["bytes"], done["cutoff"])
            except Exception:  # the next day tries again
                log.exception("retention: the daily prune failed")
