"""The operator API's live feed `/stream`: Server-Sent Events of this operator's todo transitions,
from a log position or the present, with keepalives that carry the position read up to."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator

import anyio.to_thread
from litestar import Request, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromQuery
from litestar.response import ServerSentEvent, ServerSentEventMessage

from application.access import visible_owner
from application.feed import TransitionFeed
from domain.errors import InvalidArgument
from interfaces.http.auth import caller_of

KEEPALIVE_SECONDS = 15.0
RETRY_MILLISECONDS = 1000
_POSITION = re.compile(r"\d{1,18}")


def stream_routes(feed: TransitionFeed) -> list[HTTPRouteHandler]:
    """`/stream`."""

    @get("/stream", summary="Server-Sent Events: this operator's todo transitions",
         description="Each event is `event: todo`, `id: <log position>`, data: position, todo_id, type, state, "
                     "dead_letter, queue, endpoint_id, time, actor. Send `Last-Event-ID` to resume after a "
                     "position, or `?after=<position>` (e.g. the one a page was rendered at); with neither "
                     "the stream starts at the present. Keepalive comments carry the id of the position "
                     "read up to.")
    async def stream(request: Request, after: FromQuery[str | None] = None) -> ServerSentEvent:
        caller = caller_of(request)
        owner = visible_owner(caller)
        last = request.headers.get("last-event-id")
        if last is not None and not _POSITION.fullmatch(last.strip()):
            raise InvalidArgument("Last-Event-ID must be a log position")
        if after is not None and not _POSITION.fullmatch(after.strip()):
            raise InvalidArgument("after must be a log position")
        # the present is taken before the 200 goes out (the body starts after the headers), so
        # what the client commits once it has the answer is sent; a store that is down: 503 now
        present = await anyio.to_thread.run_sync(feed.present)
        # Last-Event-ID (what a reconnecting EventSource sends) is later than the URL's `after`
        start = int(last) if last is not None else min(int(after), present) if after is not None else present
        session = request.scope["state"].get("session")  # None with a bearer token
        ends_at = session.issued_at + request.app.state.sessions.max_age if session is not None else None
        return ServerSentEvent(_transitions(feed, owner, start, ends_at))

    return [stream]


async def _transitions(feed: TransitionFeed, owner: str | None, after: int,
                       ends_at: float | None) -> AsyncIterator[ServerSentEventMessage]:
    """Every transition after a log position for this owner, then each new one as it commits,
    until the server stops or the board session that opened the stream expires."""
    loop = asyncio.get_running_loop()
    changed = asyncio.Event()

    def listener() -> None:
        loop.call_soon_threadsafe(changed.set)

    follower = await anyio.to_thread.run_sync(feed.follow, after)
    feed.add_listener(listener)
    try:
        yield ServerSentEventMessage(data=None, comment="switchboard todo transitions", retry=RETRY_MILLISECONDS)
        while not feed.closed and (ends_at is None or time.time() < ends_at):
            changed.clear()
            found, after, more = await anyio.to_thread.run_sync(feed.since, after, owner)
            for data in found:
                yield ServerSentEventMessage(event="todo", id=data["position"], data=json.dumps(data))
            if more:  # resuming from far back: the next pages at once
                continue
            try:
                await asyncio.wait_for(changed.wait(), KEEPALIVE_SECONDS)
            except TimeoutError:  # with the position read up to: a reconnect resumes there, not
                # at the page's `?after=` (an id without data moves the client's Last-Event-ID only)
                yield ServerSentEventMessage(data=None, comment="keepalive", id=after)
    finally:
        feed.remove_listener(listener)
        follower.close()
