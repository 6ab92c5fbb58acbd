"""The aggregate cache: each process's latest committed copy of the aggregates it wrote.

Only aggregates whose every change goes through a version check are kept (`CACHEABLE`): a stale
copy then costs a re-run on fresh state, never a wrong commit. Others are always read fresh,
because a command may rely on them without writing them (an endpoint's revocation).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import TypeVar
from uuid import UUID

from domain.events import Aggregate
from domain.idempotency import IdempotencyKey
from domain.todo import Todo

A = TypeVar("A", bound=Aggregate)

CACHE_SIZE = 50_000  # aggregates kept per process; the least recently written are forgotten
CACHEABLE = (Todo, IdempotencyKey)


def _without_bytes(aggregate: Aggregate) -> Aggregate:
    """What the cache keeps: the payload bytes an aggregate got from its own commands are left
    out, so a later read asks the payload store (which knows when retention removed them, in
    this process or any other) and the cache holds references, not megabytes (docs/adr/0027)."""
    if getattr(aggregate, "payload_bytes", None) is None and getattr(aggregate, "result_bytes", None) is None:
        return aggregate
    slim = aggregate.clone()
    slim.payload_bytes = slim.result_bytes = None
    return slim


class AggregateCache:
    """Committed copies by id, least recently written forgotten first; safe across threads."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._copies: OrderedDict[UUID, Aggregate] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, cls: type[A], aggregate_id: UUID) -> A | None:
        """A private copy of the cached aggregate, or None (not cached, or not of that type)."""
        if cls not in CACHEABLE:
            return None
        with self._lock:
            cached = self._copies.get(aggregate_id)
        if cached is not None and isinstance(cached, cls):
            return cached.clone()  # type: ignore[return-value]
        return None

    def keep(self, aggregates: Mapping[UUID, Aggregate]) -> None:
        """Remembers the cacheable ones of a batch just committed."""
        with self._lock:
            for aggregate_id, aggregate in aggregates.items():
                if isinstance(aggregate, CACHEABLE):
                    self._copies[aggregate_id] = _without_bytes(aggregate)
                    self._copies.move_to_end(aggregate_id)
            while len(self._copies) > self._size:
                self._copies.popitem(last=False)

    def forget(self, aggregate_ids: Iterable[UUID]) -> None:
        """Drops these ids (their batch lost a race or its outcome is unknown)."""
        with self._lock:
            for aggregate_id in aggregate_ids:
                self._copies.pop(aggregate_id, None)
