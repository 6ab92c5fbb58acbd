"""The operator API `/api/v1` (CONTRACT §9) and its SSE `/stream` of todo transitions.

Thin adapters: each route authenticates (`api_guard`: a bearer `sbo_` token, or the board
session plus its CSRF header), calls one application method as that operator in a worker thread,
and answers JSON. Errors go through the one error table (interfaces/http/errors.py); another
operator's ids answer 404 exactly like unknown ones, because the application says `not_found`.
A JSON body is read with JSON's own types (`check_body`): the string "3" is no number there.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio.to_thread
import msgspec
from litestar import Request, Response, Router, get, post, put
from litestar.datastructures import URL, CacheControlHeader
from litestar.enums import RequestEncodingType
from litestar.exceptions import ValidationException
from litestar.openapi import ResponseSpec
from litestar.openapi.spec import SecurityRequirement
from litestar.params import BodyKwarg, FromPath, FromQuery, JSONBody, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED

from application.access import visible_owner
from application.audit import AuditLog
from application.feed import TransitionFeed
from application.service import Switchboard
from application.webhooks import Webhooks
from domain.errors import InvalidArgument
from interfaces.http.auth import api_guard, caller_of
from interfaces.http.errors import error_response
from interfaces.json_depth import TOO_DEEP, json_too_deep

KEEPALIVE_SECONDS = 15.0
RETRY_MILLISECONDS = 1000
_POSITION = re.compile(r"\d{1,18}")
Json = Any  # any JSON value
SECURITY: list[SecurityRequirement] = [{"operatorToken": []}, {"boardSession": []}]


class ErrorBody(msgspec.Struct):
    """Every error answer (CONTRACT §3); `code` is the error table's (interfaces/http/errors.py)."""

    error: str
    code: str


# Documented on every route, replacing Litestar's default 400 schema (`{status_code, detail}`),
# which is not what the error handlers send.
ERROR_RESPONSES = {
    status: ResponseSpec(data_container=ErrorBody, description=description, generate_examples=False)
    for status, description in (
        (400, "Invalid input"), (401, "No valid operator token or board session"),
        (403, "Forbidden, or the board session's X-CSRF-Token header is missing or wrong"),
        (404, "Not found (another operator's ids too)"), (409, "Conflict with the current state"),
        (413, "Request body too large"), (422, "The request does not fit the schema (fields named)"),
    )
}


# -- request bodies (their JSON Schemas are in the OpenAPI document)


class LeaseBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    lease_ttl_seconds: float | None = None


class OutcomeBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    result: Json = None
    summary: str | None = None


class ReleaseBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    summary: str | None = None
    delay_seconds: float | None = None  # a snooze, 0..86400


class DiscardBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    summary: str | None = None


class QueueControlsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The controls to change; a field left out stays as it is, null removes a limit."""

    paused: bool | msgspec.UnsetType = msgspec.UNSET
    max_in_flight: int | None | msgspec.UnsetType = msgspec.UNSET
    max_claims_per_minute: int | None | msgspec.UnsetType = msgspec.UNSET


class BulkRetryBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    endpoint: str
    dead_letters: bool
    queue: str | None = None
    dry_run: bool = False


class MoveBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    queue: str


class VendBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent: str
    queues: list[str]
    verbs: list[str] | None = None
    webhook_max: int | None = None
    source_types: list[str] | None = None
    webhook_queues: list[str] | None = None
    ttl_seconds: int | None = None
    default_lease_ttl_seconds: int | None = None


class PushBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: str
    queue: str | None = None
    payload: Json = None
    key: str | None = None
    not_before: str | None = None  # RFC 3339: pending but not claimable (nor rung) until then


class WebhookBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    endpoint: str
    source_type: str
    target_queue: str


class TrustBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who may create work through a github or gitea webhook; absent or empty lists trust everyone."""

    trusted_senders: list[str] = msgspec.field(default_factory=list)
    trusted_associations: list[str] = msgspec.field(default_factory=list)


class RulesBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rule set, as `rules set --file` reads it: `{rules, default_action?, params?}`."""

    rules: list[dict[str, Any]]
    webhook_id: str | None = None  # what GET answers may be PUT back as it is; ignored
    default_action: dict[str, Any] | None = None
    params: Json = None  # any JSON, so that a non-object is refused as invalid_params, not 422


class RulesTestBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A dry run: the candidate (if any) at the top level, as in replay and `rules set --file`.
    The older nested form `{"rules": {rules, default_action?, params?}}` is still read."""

    payload: Json = msgspec.UNSET
    headers: dict[str, str] | None = None
    event_id: str | None = None
    rules: list[dict[str, Any]] | RulesBody | msgspec.UnsetType = msgspec.UNSET
    default_action: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    params: Json = msgspec.UNSET


class ReplayBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A replay: the candidate at the top level (`{rules, default_action?, params?, last?}`);
    the older nested form `{"rules": {rules, …}, "last"}` is still read."""

    rules: list[dict[str, Any]] | RulesBody
    default_action: dict[str, Any] | None = None
    params: Json = None
    webhook_id: str | None = None  # a GET /rules answer may be sent as the candidate; ignored
    last: int | None = None


def _rules_document(body: RulesBody) -> dict[str, Any]:
    document: dict[str, Any] = {"rules": body.rules}
    if body.default_action is not None:
        document["default_action"] = body.default_action
    if body.params is not None:
        document["params"] = body.params
    return document


def _candidate(body: RulesTestBody | ReplayBody) -> dict[str, Any] | None:
    """The candidate rule set of a dry run or replay, whichever form it came in (None: none given)."""
    if isinstance(body.rules, RulesBody):
        return _rules_document(body.rules)
    given = {name: getattr(body, name) for name in ("rules", "default_action", "params")}
    document = {name: value for name, value in given.items() if value is not msgspec.UNSET}
    if not document:
        return None
    return {name: value for name, value in document.items() if value is not None or name == "rules"}


async def _run(fn, *args, **kwargs):
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))


def api_router(app: Switchboard, webhooks: Webhooks, feed: TransitionFeed, audit: AuditLog) -> Router:
    """Every `/api/v1` route, guarded by `api_guard`."""

    # -- todos

    @get("/todos", summary="List todos",
         description="Rows newest first (no payload); `next_cursor` when more follow, `?cursor=` continues.")
    async def list_todos(
        request: Request, endpoint: FromQuery[str | None] = None,
        state_filter: Annotated[str | None, QueryParameter(name="state")] = None,  # `state` is reserved by Litestar
        queue: FromQuery[str | None] = None, limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        return await _run(app.page_todos, caller=caller_of(request), endpoint=endpoint, state=state_filter,
                          queue=queue, limit=limit, cursor=cursor)

    @get("/todos/{todo_id:str}", summary="Get a todo")
    async def get_todo(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await _run(app.get_todo, todo_id, caller=caller_of(request))

    @get("/todos/{todo_id:str}/history", summary="A todo's event history")
    async def todo_history(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await _run(app.history, todo_id, caller=caller_of(request))

    @get("/todos/{todo_id:str}/explain", summary="A todo's story in sentences and why it is in its state")
    async def todo_explain(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await _run(app.explain, todo_id, caller=caller_of(request))

    @post("/todos/{todo_id:str}/claim", status_code=HTTP_200_OK, summary="Claim a todo as this operator")
    async def claim(request: Request, todo_id: FromPath[str], data: JSONBody[LeaseBody | None] = None) -> dict[str, Any]:
        ttl = data.lease_ttl_seconds if data else None
        return await _run(app.claim, todo_id, caller=caller_of(request), lease_ttl_seconds=ttl)

    @post("/todos/{todo_id:str}/extend", status_code=HTTP_200_OK, summary="Extend this operator's lease")
    async def extend(request: Request, todo_id: FromPath[str], data: JSONBody[LeaseBody | None] = None) -> dict[str, Any]:
        ttl = data.lease_ttl_seconds if data else None
        return await _run(app.heartbeat, todo_id, caller=caller_of(request), lease_ttl_seconds=ttl)

    @post("/todos/{todo_id:str}/complete", status_code=HTTP_200_OK, summary="Complete a claimed todo")
    async def complete(request: Request, todo_id: FromPath[str], data: JSONBody[OutcomeBody | None] = None) -> dict[str, Any]:
        data = data or OutcomeBody()
        return await _run(app.complete, todo_id, caller=caller_of(request), result=data.result, summary=data.summary)

    @post("/todos/{todo_id:str}/fail", status_code=HTTP_200_OK, summary="Fail a claimed todo")
    async def fail(request: Request, todo_id: FromPath[str], data: JSONBody[OutcomeBody | None] = None) -> dict[str, Any]:
        data = data or OutcomeBody()
        return await _run(app.fail, todo_id, caller=caller_of(request), result=data.result, summary=data.summary)

    @post("/todos/{todo_id:str}/release", status_code=HTTP_200_OK, summary="Release a claimed todo")
    async def release(request: Request, todo_id: FromPath[str], data: JSONBody[ReleaseBody | None] = None) -> dict[str, Any]:
        data = data or ReleaseBody()
        return await _run(app.release, todo_id, caller=caller_of(request), summary=data.summary,
                          delay_seconds=data.delay_seconds)

    @post("/todos/retry", status_code=HTTP_200_OK, summary="Retry every dead letter of an endpoint (or queue) now",
          description="One event per todo, all with the same bulk-action id as cause: {retried: n, bulk_action_id};"
                      " with dry_run, {would_retry: n} and nothing changes.")
    async def bulk_retry(request: Request, data: JSONBody[BulkRetryBody]) -> dict[str, Any]:
        return await _run(app.bulk_retry, data.endpoint, caller=caller_of(request), dead_letters=data.dead_letters,
                          queue=data.queue, dry_run=data.dry_run)

    @post("/todos/{todo_id:str}/retry", status_code=HTTP_200_OK, summary="Retry a failed todo now")
    async def retry(request: Request, todo_id: FromPath[str]) -> dict[str, Any]:
        return await _run(app.retry, todo_id, caller=caller_of(request))

    @post("/todos/{todo_id:str}/move", status_code=HTTP_200_OK,
          summary="Release a quarantined todo to a queue of its endpoint")
    async def move(request: Request, todo_id: FromPath[str], data: JSONBody[MoveBody]) -> dict[str, Any]:
        return await _run(app.release_quarantined, todo_id, data.queue, caller=caller_of(request))

    @post("/todos/{todo_id:str}/discard", status_code=HTTP_200_OK, summary="Discard a quarantined todo")
    async def discard(request: Request, todo_id: FromPath[str], data: JSONBody[DiscardBody | None] = None) -> dict[str, Any]:
        return await _run(app.discard_quarantined, todo_id, caller=caller_of(request),
                          summary=data.summary if data else None)

    # -- endpoints

    @post("/endpoints", status_code=HTTP_201_CREATED, summary="Vend an endpoint",
          description="The credential and mcp_json appear in this answer only.")
    async def vend(request: Request, data: JSONBody[VendBody]) -> dict[str, Any]:
        return await _run(
            app.vend, data.agent, queues=data.queues, caller=caller_of(request), verbs=data.verbs,
            webhook_max=data.webhook_max, source_types=data.source_types, webhook_queues=data.webhook_queues,
            ttl_seconds=data.ttl_seconds, default_lease_seconds=data.default_lease_ttl_seconds,
        )

    @get("/endpoints", summary="List this operator's endpoints")
    async def list_endpoints(request: Request) -> dict[str, Any]:
        return {"endpoints": await _run(app.list_endpoints, caller=caller_of(request))}

    @post("/endpoints/{ref:str}/revoke", status_code=HTTP_200_OK, summary="Revoke an endpoint")
    async def revoke(request: Request, ref: FromPath[str]) -> dict[str, Any]:
        return await _run(app.revoke, ref, caller=caller_of(request))

    @post("/endpoints/{ref:str}/todos", summary="Push an operator-authored todo",
          description="201 with the new todo; 200 with the live todo a repeated key maps to.",
          responses={HTTP_200_OK: ResponseSpec(data_container=dict[str, Any], generate_examples=False,
                                               description="The live todo a repeated key maps to")})
    async def push(request: Request, ref: FromPath[str], data: JSONBody[PushBody]) -> Response[dict[str, Any]]:
        answer = await _run(app.push, ref, data.title, caller=caller_of(request), queue=data.queue,
                            payload=data.payload, key=data.key, not_before=data.not_before)
        return Response(answer, status_code=HTTP_201_CREATED if answer["created"] else HTTP_200_OK)

    @get("/endpoints/{ref:str}/queues", summary="An endpoint's queues with their controls and load")
    async def list_queues(request: Request, ref: FromPath[str]) -> dict[str, Any]:
        return await _run(app.queue_controls, ref, caller=caller_of(request))

    @put("/endpoints/{ref:str}/queues/{queue:str}", summary="Pause, resume or limit one of an endpoint's queues",
         description="Fields left out stay as they are; null removes a limit. Answers the queue as now set.")
    async def set_queue(request: Request, ref: FromPath[str], queue: FromPath[str],
                        data: JSONBody[QueueControlsBody]) -> dict[str, Any]:
        changes = {name: getattr(data, name) for name in ("paused", "max_in_flight", "max_claims_per_minute")
                   if getattr(data, name) is not msgspec.UNSET}
        return await _run(app.set_queue_controls, ref, queue, caller=caller_of(request), **changes)

    # -- webhooks and rules

    @get("/webhooks", summary="List webhooks")
    async def list_webhooks(request: Request, endpoint: FromQuery[str | None] = None) -> dict[str, Any]:
        return await _run(webhooks.list, caller=caller_of(request), endpoint=endpoint)

    @post("/webhooks", status_code=HTTP_201_CREATED, summary="Create a webhook",
          description="The ingest URL and signing secret appear in this answer only.")
    async def create_webhook(request: Request, data: JSONBody[WebhookBody]) -> dict[str, Any]:
        return await _run(webhooks.create, caller=caller_of(request), endpoint=data.endpoint,
                          source_type=data.source_type, target_queue=data.target_queue)

    @post("/webhooks/{webhook_id:str}/rotate", status_code=HTTP_200_OK, summary="Rotate a webhook's URL and secret")
    async def rotate_webhook(request: Request, webhook_id: FromPath[str]) -> dict[str, Any]:
        return await _run(webhooks.rotate, webhook_id, caller=caller_of(request))

    @post("/webhooks/{webhook_id:str}/delete", status_code=HTTP_200_OK, summary="Delete a webhook")
    async def delete_webhook(request: Request, webhook_id: FromPath[str]) -> dict[str, Any]:
        return await _run(webhooks.delete, webhook_id, caller=caller_of(request))

    @put("/webhooks/{webhook_id:str}/trust", summary="Set a webhook's trusted senders and associations",
         description="Replaces both lists (github and gitea webhooks); a delivery from anyone else is held in "
                     "the owner's quarantine. Empty lists trust every sender.")
    async def put_trust(request: Request, webhook_id: FromPath[str], data: JSONBody[TrustBody]) -> dict[str, Any]:
        return await _run(webhooks.set_trust, webhook_id, caller=caller_of(request), senders=data.trusted_senders,
                          associations=data.trusted_associations)

    @get("/webhooks/{webhook_id:str}/rules", summary="A webhook's saved rules")
    async def get_rules(request: Request, webhook_id: FromPath[str]) -> dict[str, Any]:
        return await _run(webhooks.rules, webhook_id, caller=caller_of(request))

    @put("/webhooks/{webhook_id:str}/rules", summary="Save a webhook's rules",
         description="Validated, then dry-run over the 50 latest deliveries; any fault refuses the save.")
    async def put_rules(request: Request, webhook_id: FromPath[str], data: JSONBody[RulesBody]) -> dict[str, Any]:
        return await _run(webhooks.set_rules, webhook_id, _rules_document(data), caller=caller_of(request))

    @post("/webhooks/{webhook_id:str}/rules/test", status_code=HTTP_200_OK,
          summary="Dry-run saved or candidate rules on a payload or a stored delivery",
          description="Exactly one of payload (+ headers) or event_id; the candidate, if any, as top-level "
                      "rules, default_action, params (the object `rules set --file` reads).")
    async def test_rules(request: Request, webhook_id: FromPath[str], data: JSONBody[RulesTestBody]) -> dict[str, Any]:
        has_payload = data.payload is not msgspec.UNSET
        return await _run(
            webhooks.test_rules, webhook_id, caller=caller_of(request),
            payload=data.payload if has_payload else None, has_payload=has_payload, headers=data.headers,
            event_id=data.event_id, candidate=_candidate(data),
        )

    @post("/webhooks/{webhook_id:str}/rules/replay", status_code=HTTP_200_OK,
          summary="Replay candidate rules over the last N stored deliveries",
          description="The candidate as top-level rules, default_action, params (as in the dry run); "
                      "`last` defaults to 100. Each changed delivery is named by event_id, kind and title.")
    async def replay_rules(request: Request, webhook_id: FromPath[str], data: JSONBody[ReplayBody]) -> dict[str, Any]:
        return await _run(webhooks.replay, webhook_id, _candidate(data), caller=caller_of(request),
                          last=data.last)

    # -- deliveries

    @get("/events", summary="Stored deliveries, newest first")
    async def list_events(
        request: Request, webhook: FromQuery[str | None] = None, limit: FromQuery[int | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> dict[str, Any]:
        return await _run(webhooks.list_events, caller=caller_of(request), webhook_id=webhook, limit=limit,
                          cursor=cursor)

    @get("/events/{event_id:str}", summary="One stored delivery with redacted headers")
    async def get_event(request: Request, event_id: FromPath[str]) -> dict[str, Any]:
        return await _run(webhooks.get_event, event_id, caller=caller_of(request))

    # -- the audit log

    @get("/audit/head", summary="The last sealed link of the audit hash chain",
         description="`{position, hash, time}`: the last log position sealed into the chain (docs/audit.md), its "
                     "hash and its event's time; compare it with an export's last `hash`.")
    async def audit_head(request: Request) -> dict[str, Any]:
        caller_of(request)
        return await _run(audit.head)

    # -- the live feed

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

    handlers = [
        list_todos, get_todo, todo_history, todo_explain, claim, extend, complete, fail, release, bulk_retry, retry, move, discard,
        vend, list_endpoints, revoke, push, list_queues, set_queue, list_webhooks, create_webhook, rotate_webhook,
        delete_webhook, put_trust, get_rules, put_rules, test_rules, replay_rules, list_events, get_event, audit_head, stream,
    ]
    for handler in handlers:
        handler.responses = {**ERROR_RESPONSES, **(handler.responses or {})}
    return Router(
        path="/api/v1", guards=[api_guard], security=SECURITY, tags=["operator"], before_request=check_body,
        cache_control=CacheControlHeader(no_store=True),  # answers carry credentials and payloads
        route_handlers=handlers,
    )


async def check_body(request: Request) -> Response | None:
    """After the guard, before Litestar parses the body: JSON nested too deep is a 400, never a
    500; then the body is decoded against the route's declared type with JSON's own types, so a
    value of the wrong type ("3" for a number, "true" or 1 for a boolean, "null" for null) is 422
    `validation_failed` (docs/reference.md). Litestar converts every parameter with msgspec's lax
    rules, which query strings need (`?limit=10`) and a JSON body must not get; a body that passes
    here passes those too. Malformed JSON is left to Litestar's 400."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return None
    body = await request.body()
    if json_too_deep(body):
        return error_response(TOO_DEEP, "invalid_argument")
    data = request.route_handler.parsed_fn_signature.parameters.get("data")
    if data is None or not isinstance(data.kwarg_definition, BodyKwarg) or (
            data.kwarg_definition.media_type is not RequestEncodingType.JSON):
        return None
    try:
        _strict_decoder(data.annotation).decode(body or b"null")  # an empty body is null, as Litestar reads it
    except msgspec.ValidationError as error:
        raise _misfit(request, error) from None
    except msgspec.DecodeError:
        pass  # malformed JSON: Litestar's own 400 invalid_argument when it parses the body
    return None


@functools.cache
def _strict_decoder(annotation: Any) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(annotation, strict=True)


def _misfit(request: Request, error: msgspec.ValidationError) -> ValidationException:
    """The 422 Litestar makes of a body that does not fit, naming the field as it does: msgspec's
    "… - at `$.max_in_flight`" is key `max_in_flight`, a misfit of the whole body key `data`."""
    message, _, at = str(error).partition(" - at `$")
    url = URL.from_components(path=request.url.path, query=request.url.query)
    return ValidationException(detail=f"Validation failed for {request.method} {url}", extra=[
        {"message": message, "key": at.rstrip("`").removeprefix(".") or "data", "source": "body"}])


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
