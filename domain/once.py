"""The OnceKey aggregate: which todo a subject names on one queue of one endpoint (`once`, CONTRACT §13).

A queue action with `"once": true` opens at most one live todo per subject (`github:o/r#12`,
`cairn:<id>`) per queue on each target. The key's stream id is derived from (endpoint, queue,
subject), so concurrent deliveries for one subject — in one process or several — all write the
same stream, and the event store's optimistic concurrency lets exactly one bind it at each
version: the losers re-run on fresh state and find the winner's todo live (see
docs/adr/0024-trust-and-once.md). Rebinding happens only once the named todo is no longer live.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID, uuid5

from domain.errors import Conflict
from domain.events import Aggregate, DomainEvent

_ONCE_NAMESPACE = UUID("5b0f3a52-8f0e-4d1c-9a3e-2c7d6e1f4b90")


def once_uuid(endpoint_id: str, queue: str, subject: str) -> UUID:
    """The stream id of (endpoint, queue, subject): the same in every process."""
    return uuid5(_ONCE_NAMESPACE, f"{endpoint_id}\x00{queue}\x00{subject}")


@dataclass(frozen=True, kw_only=True)
class OnceKeyBound(DomainEvent):
    endpoint_id: str
    queue: str
    subject: str
    todo_id: str


ONCE_EVENTS = (OnceKeyBound,)


class OnceKey(Aggregate):
    """Names the live todo of a subject on a queue; the caller says whether that todo is still live."""

    @classmethod
    def new(cls, *, endpoint_id: str, queue: str, subject: str) -> OnceKey:
        key = cls()
        key.id = once_uuid(endpoint_id, queue, subject)
        key.endpoint_id, key.queue, key.subject = endpoint_id, queue, subject
        key.todo_id = None
        return key

    def bind(self, *, todo_id: str, now: datetime, actor: str, named_is_live: bool) -> None:
        """Points the subject at a newly opened todo; refused while the one it names is live."""
        if self.todo_id is not None and named_is_live:
            raise Conflict(f"{self.subject} already has live todo {self.todo_id} in queue {self.queue}")
        self._record(OnceKeyBound, timestamp=now, actor=actor, cause="once", endpoint_id=self.endpoint_id,
                     queue=self.queue, subject=self.subject, todo_id=todo_id)

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case OnceKeyBound():
                self.endpoint_id, self.queue, self.subject = event.endpoint_id, event.queue, event.subject
                self.todo_id = event.todo_id
            case _:  # pragma: no cover
                raise TypeError(f"OnceKey cannot apply {type(event).__name__}")
