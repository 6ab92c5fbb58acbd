"""Deliveries: the stored webhook deliveries newest first (by webhook, paged), and one delivery."""

from __future__ import annotations

from urllib.parse import urlencode

from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery

from interfaces.http.auth import caller_of
from interfaces.http.board.forms import blank
from interfaces.http.board.pages import Board

EVENTS_SHOWN = 50


class DeliveryPages(Controller):
    @get("/events", sync_to_thread=True)
    def events(self, request: Request, board: NamedDependency[Board], webhook: FromQuery[str | None] = None,
               cursor: FromQuery[str | None] = None) -> Response:
        caller = caller_of(request)
        webhook = blank(webhook)
        page = board.webhooks.list_events(caller=caller, webhook_id=webhook, limit=EVENTS_SHOWN, cursor=blank(cursor))
        hooks = board.webhooks.list(caller=caller)["webhooks"]
        older = None
        if page.get("next_cursor"):
            older = "/events?" + urlencode(
                {k: v for k, v in (("webhook", webhook), ("cursor", page["next_cursor"])) if v})
        newest = "/events" + (f"?{urlencode({'webhook': webhook})}" if webhook else "") if cursor else None
        return board.render(request, "events.html", section="events", rows=page["events"], hooks=hooks,
                            webhook=webhook, older=older, newest=newest)

    @get("/events/{event_id:str}", sync_to_thread=True)
    def event_page(self, request: Request, board: NamedDependency[Board], event_id: FromPath[str]) -> Response:
        event = board.webhooks.get_event(event_id, caller=caller_of(request))
        return board.render(request, "event.html", section="events", event=event)
