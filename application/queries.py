"""The queries: todos (one, its history, listings, counts, fault traces), webhooks and their
deliveries (the audit export is application/audit.py's). Whom each shows what is application/access.py's to say."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from application.access import Access, Caller
from application.explain import explain
from application.payloads import HIDDEN, OMITTED, history_payloads
from application.ports import EventStore, Recorded, Views
from application.presenters import ceiling, shown
from domain.delivery import DELIVERY_PREFIX, Delivery
from domain.endpoint import Endpoint, endpoint_uuid_of
from domain.errors import Forbidden, InvalidArgument, NotFound
from domain.names import QUARANTINE, check_queue_name, parse_id
from domain.payloads import PAYLOAD_FIELDS
from domain.queue import NO_CONTROLS, Refusal, admission
from domain.todo import PENDING, STATES, Todo

_TODO_CURSOR = re.compile(r"(\d{1,19})\.(td_[0-9a-f]{32})")


def _todo_cursor(cursor: object) -> tuple[int, str]:
    """The (created_at, todo_id) a `next_cursor` of `page_todos` names."""
    match = _TODO_CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if match is None or int(match.group(1)) >= 2**63:
        raise InvalidArgument("bad cursor: give the next_cursor of the previous page")
    return int(match.group(1)), match.group(2)


def _position_cursor(cursor: object) -> int:
    """The log position a `next_cursor` of `deliveries` names."""
    if not re.fullmatch(r"\d{1,19}", str(cursor)) or int(cursor) >= 2**63:
        raise InvalidArgument("bad cursor: give the next_cursor of the previous page")
    return int(cursor)


def check_limit(limit: object, default: int, maximum: int) -> int:
    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise InvalidArgument(f"limit must be within 1..{maximum}")
    return limit


def _for_operators(caller: Caller, what: str) -> None:
    if caller.kind != "operator":
        raise Forbidden(f"{what} are for operators")


class Queries:
    def __init__(self, store: EventStore, views: Views, access: Access) -> None:
        self.store = store
        self.views = views
        self.access = access

    # -- todos ---------------------------------------------------------------------------

    def todo(self, todo_id: str, *, caller: Caller) -> Todo:
        return self.access.todo(todo_id, caller)

    def history(self, todo_id: str, *, caller: Caller, payloads: bool = True) -> dict[str, Any]:
        """Every event of a todo in order, with position, version, time, type, actor, cause and data.

        With `payloads=False` an event's `payload` is left out of its data (named in `omitted`), and
        never converted: a reader that shows the payload elsewhere does not pay for it twice. An
        event whose payload or result is stored by reference names it in `digests` (`{sha256,
        size}` of the stored bytes, as the audit export does), pruned or not."""
        todo = self.access.todo(todo_id, caller)
        stream = self.store.stream(todo.id)
        fields = iter(history_payloads(self.store, [r.event for r in stream], payloads=payloads))
        events = []
        for recorded in stream:
            event, omitted = recorded.event, []
            data = self.store.event_data(event)
            time, actor, cause = data.pop("timestamp"), data.pop("actor"), data.pop("cause")
            for name, value in next(fields).items():  # payloads as before they were stored once
                if value is OMITTED or value is HIDDEN:
                    data.pop(name, None)
                    if value is OMITTED:
                        omitted.append(name)
                else:
                    data[name] = value
            digests = {inline: {"sha256": ref["sha256"], "size": ref["size"]}
                       for inline, reference, _ in PAYLOAD_FIELDS.get(type(event).__name__, ())
                       if (ref := getattr(event, reference)) is not None}
            events.append({
                "position": recorded.position, "version": recorded.event.originator_version,
                "time": time, "type": type(recorded.event).__name__, "actor": actor, "cause": cause,
                "data": shown(data), **({"omitted": omitted} if omitted else {}),
                **({"digests": digests} if digests else {}),
            })
        return {"todo_id": todo.todo_id, "events": events}

    def explain(self, todo_id: str, *, caller: Caller, now: datetime) -> dict[str, Any]:
        """`{state, because, story}`: the todo's story in sentences, from its events, the delivery that
        opened it and its endpoint's; whoever may read the todo may read its story (foreign ≡ unknown)."""
        todo = self.access.todo(todo_id, caller)
        delivery = parse_id(DELIVERY_PREFIX, todo.delivery_id)
        endpoint_stream = self.store.stream(endpoint_uuid_of(todo.endpoint_id))
        return explain(self.store.stream(todo.id), now=now,
                       delivery=self.store.stream(delivery) if delivery is not None else (),
                       endpoint_stream=endpoint_stream, held=self._held_now(todo, endpoint_stream, now))

    def _held_now(self, todo: Todo, endpoint_stream: Sequence[Recorded], now: datetime) -> Refusal | None:
        """What its queue's limits refuse now, for a pending todo claimable but for them: admission's
        rule on the queue's controls (the endpoint's, as its claims read them) and committed load (one
        read, only for a queue with a limit). A pause is told from the events; None: nothing holds it."""
        if todo.state != PENDING or not todo.is_claimable(now):
            return None
        endpoint = Endpoint.replay([r.event for r in endpoint_stream])
        controls = endpoint.controls_of(todo.queue) if endpoint is not None else NO_CONTROLS
        if controls.paused or not controls.controlled:  # a pause is told from the events
            return None
        load = self.views.queue_load(todo.endpoint_id, todo.queue, now)
        return admission(controls, in_flight=load.in_flight, recent_claims=load.recent_claims, now=now)

    def page_todos(
        self, *, caller: Caller, endpoint: str | None = None, state: str | None = None,
        queue: str | None = None, limit: int | None = None, max_limit: int = 1000,
        dead_letter: bool | None = None, cursor: str | None = None,
    ) -> dict[str, Any]:
        """`{todos, next_cursor?}`: one page of rows newest first; `next_cursor` (present only when
        more rows follow) continues after this page's last row, so a listing never stops silently.
        Agents never see quarantine; `dead_letter` keeps only (or no) dead letters."""
        limit = check_limit(limit, 50, max_limit)
        after = _todo_cursor(cursor) if cursor is not None else None
        if state is not None and state not in STATES:
            raise InvalidArgument(f"state must be one of {', '.join(STATES)}")
        if queue is not None:
            check_queue_name(queue, allow_quarantine=True)
        hide: tuple[str, ...] = ()
        if caller.kind == "endpoint":
            own = self.access.endpoint(caller.name, caller)
            if queue is not None and queue not in own.queues:
                raise Forbidden(f"queue {queue} is not in this endpoint's scope")
            hide = (QUARANTINE,)
        endpoint_ids = self.access.visible_endpoint_ids(caller, endpoint)
        self.views.catch_up()
        rows, last = self.views.page_todos(endpoint_ids=endpoint_ids, state=state, queue=queue, limit=limit,
                                           hide_queues=hide, dead_letter=dead_letter, after=after)
        answer: dict[str, Any] = {"todos": rows}
        if last is not None:
            answer["next_cursor"] = f"{last[0]}.{last[1]}"
        return answer

    def queue_waiting(self, queue: str, *, caller: Caller, now: datetime, limit: int = 10) -> dict[str, Any]:
        """`{queue, pending, oldest}`: how many todos of one of the agent's queues are claimable now,
        and the oldest `limit` ({id, title, created_at}), claim_next's order (the queue's MCP
        resource). A queue outside its scope is `not_found`, like one that does not exist."""
        if caller.kind != "endpoint":
            raise Forbidden("queue resources are for agents")
        own = self.access.endpoint(caller.name, caller)
        if queue not in own.queues or queue == QUARANTINE:
            raise NotFound(f"queue {queue} not found")
        pending, oldest = self.views.waiting(own.endpoint_id, queue, now, limit)
        return {"queue": queue, "pending": pending, "oldest": oldest}

    def todo_counts(self, *, caller: Caller, endpoint: str | None = None) -> list[dict[str, Any]]:
        """How many todos per queue and state (dead letters apart) an operator has, with the oldest pending."""
        _for_operators(caller, "counts")
        endpoint_ids = self.access.visible_endpoint_ids(caller, endpoint)
        self.views.catch_up()
        return self.views.queue_counts(endpoint_ids)

    def fault_traces(self, todo_ids: Sequence[str], *, caller: Caller) -> dict[str, dict[str, Any]]:
        """Why each of these quarantined todos was held (its fault trace), for an operator's own todos."""
        _for_operators(caller, "fault traces")
        self.views.catch_up()
        return self.views.fault_traces(list(todo_ids), self.access.visible_endpoint_ids(caller))

    # -- webhooks and deliveries ---------------------------------------------------------

    def webhooks(self, *, caller: Caller, endpoint: str | None = None) -> dict[str, Any]:
        """Webhooks (never secrets or URLs); for an endpoint, also its ceiling."""
        self.views.catch_up()
        scope: Endpoint | None = None
        if caller.kind == "endpoint" or endpoint is not None:
            scope = self.access.endpoint(caller.name if caller.kind == "endpoint" else endpoint, caller)
        endpoint_ids = [scope.endpoint_id] if scope is not None else self.access.visible_endpoint_ids(caller)
        answer: dict[str, Any] = {"webhooks": self.views.list_webhooks(endpoint_ids=endpoint_ids)}
        if scope is not None:
            answer["ceiling"] = ceiling(scope)
        return answer

    def deliveries(self, *, caller: Caller, webhook_id: str | None = None, limit: int | None = None,
                   cursor: str | None = None, max_limit: int = 200) -> dict[str, Any]:
        """Stored deliveries newest first (no payload, no headers), paged by cursor."""
        limit = check_limit(limit, 50, max_limit)
        before = _position_cursor(cursor) if cursor is not None else None
        self.views.catch_up()
        if webhook_id is not None:
            webhook, _ = self.access.webhook(webhook_id, caller, live=False)
            endpoint_ids, webhook_filter = None, webhook.webhook_id
        else:
            endpoint_ids, webhook_filter = self.access.visible_endpoint_ids(caller), None
        rows, next_position = self.views.list_deliveries(
            webhook_id=webhook_filter, endpoint_ids=endpoint_ids, limit=limit, before=before)
        answer: dict[str, Any] = {"events": rows}
        if next_position is not None:
            answer["next_cursor"] = str(next_position)
        return answer

    def delivery(self, event_id: str, *, caller: Caller) -> Delivery:
        return self.access.delivery(event_id, caller)
