"""The operator API's todos: listing and reading them, working a claimed one (claim, extend,
complete, fail, release), and taking one back from the dead letters or quarantine."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from litestar.status_codes import HTTP_200_OK

from application.service import Switchboard
from interfaces.http.api.shared import Json, run
from interfaces.http.auth import caller_of


class LeaseBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lease_ttl_seconds: float | None = None


class ExtendBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lease_ttl_seconds: float | None = None
    checkpoint: Json = None  # any JSON <= 64 KiB: the next claim's resume_from


class OutcomeBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    result: Json = None
    summary: str | None = None


class ReleaseBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    summary: str | None = None
    delay_seconds: float | None = None  # a snooze, 0..86400


class DiscardBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    summary: str | None = None


class BulkRetryBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    endpoint: str
    dead_letters: bool
    queue: str | None = None
    dry_run: bool = False


class MoveBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    queue: str


def todo_routes(app: Switchboard) -> list[HTTPRouteHandler]:
    """Every `/todos` route, in the order the OpenAPI document lists them."""
    return [*_reads(app), *_work(app), *_recovery(app)]


def _reads(app: Switchboard) -> list[HTTPRouteHandler]:
    @get("/todos", summary="List todos",
         description="Rows newest first (no payload); `next_cursor` when more follow, `?cursor=` continues.")
    async def list_todos(
        request: Request, endpoint: FromQuery[str | None] = None,
        state_filter: Annotated[str | None, QueryParameter(name="state")] = None,  # `state` is reserved by Litestar
        queue: FromQuery[str | None] = None, limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        return await run(app.page_todos, caller=caller_of(request), endpoint=endpoint, state=state_filter,
                         queue=queue, limit=limit, cursor=cursor)

    @get("/todos/{todo_id:str}", summary="Get a todo")
    async def get_todo(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await run(app.get_todo, todo_id, caller=caller_of(request))

    @get("/todos/{todo_id:str}/history", summary="A todo's event history")
    async def todo_history(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await run(app.history, todo_id, caller=caller_of(request))

    @get("/todos/{todo_id:str}/explain", summary="A todo's story in sentences and why it is in its state")
    async def todo_explain(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await run(app.explain, todo_id, caller=caller_of(request))

    return [list_todos, get_todo, todo_history, todo_explain]


def _work(app: Switchboard) -> list[HTTPRouteHandler]:
    @post("/todos/{todo_id:str}/claim", status_code=HTTP_200_OK, summary="Claim a todo as this operator")
    async def claim(request: Request, todo_id: FromPath[str], data: JSONBody[LeaseBody | None] = None) -> dict[str, Any]:
        ttl = data.lease_ttl_seconds if data else None
        return await run(app.claim, todo_id, caller=caller_of(request), lease_ttl_seconds=ttl)

    @post("/todos/{todo_id:str}/extend", status_code=HTTP_200_OK, summary="Extend this operator's lease")
    async def extend(request: Request, todo_id: FromPath[str], data: JSONBody[ExtendBody | None] = None) -> dict[str, Any]:
        data = data or ExtendBody()
        return await run(app.heartbeat, todo_id, caller=caller_of(request), lease_ttl_seconds=data.lease_ttl_seconds,
                         checkpoint=data.checkpoint)

    @post("/todos/{todo_id:str}/complete", status_code=HTTP_200_OK, summary="Complete a claimed todo")
    async def complete(request: Request, todo_id: FromPath[str], data: JSONBody[OutcomeBody | None] = None) -> dict[str, Any]:
        data = data or OutcomeBody()
        return await run(app.complete, todo_id, caller=caller_of(request), result=data.result, summary=data.summary)

    @post("/todos/{todo_id:str}/fail", status_code=HTTP_200_OK, summary="Fail a claimed todo")
    async def fail(request: Request, todo_id: FromPath[str], data: JSONBody[OutcomeBody | None] = None) -> dict[str, Any]:
        data = data or OutcomeBody()
        return await run(app.fail, todo_id, caller=caller_of(request), result=data.result, summary=data.summary)

    @post("/todos/{todo_id:str}/release", status_code=HTTP_200_OK, summary="Release a claimed todo")
    async def release(request: Request, todo_id: FromPath[str], data: JSONBody[ReleaseBody | None] = None) -> dict[str, Any]:
        data = data or ReleaseBody()
        return await run(app.release, todo_id, caller=caller_of(request), summary=data.summary,
                         delay_seconds=data.delay_seconds)

    return [claim, extend, complete, fail, release]


def _recovery(app: Switchboard) -> list[HTTPRouteHandler]:
    @post("/todos/retry", status_code=HTTP_200_OK, summary="Retry every dead letter of an endpoint (or queue) now",
          description="One event per todo, all with the same bulk-action id as cause: {retried: n, bulk_action_id};"
                      " with dry_run, {would_retry: n} and nothing changes.")
    async def bulk_retry(request: Request, data: JSONBody[BulkRetryBody]) -> dict[str, Any]:
        return await run(app.bulk_retry, data.endpoint, caller=caller_of(request), dead_letters=data.dead_letters,
                         queue=data.queue, dry_run=data.dry_run)

    @post("/todos/{todo_id:str}/retry", status_code=HTTP_200_OK, summary="Retry a failed todo now")
    async def retry(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await run(app.retry, todo_id, caller=caller_of(request))

    @post("/todos/{todo_id:str}/move", status_code=HTTP_200_OK,
          summary="Release a quarantined todo to a queue of its endpoint")
    async def move(request: Request, todo_id: FromPath[str], data: JSONBody[MoveBody]) -> dict[str, Any]:
        return await run(app.release_quarantined, todo_id, data.queue, caller=caller_of(request))

    @post("/todos/{todo_id:str}/discard", status_code=HTTP_200_OK, summary="Discard a quarantined todo")
    async def discard(request: Request, todo_id: FromPath[str], data: JSONBody[DiscardBody | None] = None) -> dict[str, Any]:
        return await run(app.discard_quarantined, todo_id, caller=caller_of(request),
                         summary=data.summary if data else None)

    return [bulk_retry, retry, move, discard]
