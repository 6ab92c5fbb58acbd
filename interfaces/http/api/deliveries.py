"""The operator API's stored deliveries (`/events`): a page of them, newest first, and one with
its redacted headers."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery

from application.webhooks import Webhooks
from interfaces.http.api.shared import run
from interfaces.http.auth import caller_of


def delivery_routes(webhooks: Webhooks) -> list[HTTPRouteHandler]:
    """`/events` and `/events/{event_id}`."""

    @get("/events", summary="Stored deliveries, newest first")
    async def list_events(
        request: Request, webhook: FromQuery[str | None] = None, limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        return await run(webhooks.list_events, caller=caller_of(request), webhook_id=webhook, limit=limit,
                         cursor=cursor)

    @get("/events/{event_id:str}", summary="One stored delivery with redacted headers")
    async def get_event(request: Request, event_id: FromPath[str]) -> dict[str, Any]:
        return await run(webhooks.get_event, event_id, caller=caller_of(request))

    return [list_events, get_event]
