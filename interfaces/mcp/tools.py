"""The MCP verbs (CONTRACT §7): one argument Struct and one thin adapter per verb.

Each Struct is both the wire parser (`msgspec.convert`, strict, unknown fields refused) and the
source of the tool's JSON Schema. Ranges are documented in the schema (`extra_json_schema`) but
enforced by the application layer only, so a rule never lives in two adapters. An adapter
parses nothing and decides nothing: it calls the application as the endpoint's scoped `Caller`
and shapes the answer into one JSON object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from application.service import Caller, Switchboard
from application.webhooks import Webhooks
from domain.endpoint import SOURCE_TYPES
from domain.todo import STATES


class Args(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every verb's arguments."""


def _doc(text: str, **schema: Any) -> Meta:
    return Meta(description=text, extra_json_schema=schema or None)


TodoId = Annotated[str, _doc("todo id (td_…)")]
WebhookId = Annotated[str, _doc("webhook id (wh_…)")]
Queue = Annotated[str | None, _doc("a queue of this endpoint's scope")]
LeaseTtl = Annotated[float | None, _doc(
    "lease length in seconds; absent or <= 0 uses the endpoint's default lease, above 86400 is clamped")]
Claimant = Annotated[str | None, _doc("free-text label of who works on it (cut at 128 bytes)")]
RequireFence = Annotated[bool, _doc("when true, the answer carries a lease_token that later calls must pass")]
LeaseToken = Annotated[str | None, _doc("the lease_token of a fenced claim")]
Summary = Annotated[str | None, _doc("what happened, for the history (cut at 2048 bytes)")]
Result = Annotated[Any, _doc("any JSON value, at most 64 KiB encoded")]
Limit200 = Annotated[int | None, _doc("how many, 1..200 (default 50)", minimum=1, maximum=200)]


class ListTodos(Args):
    queue: Queue = None
    state: Annotated[str | None, _doc("only todos in this state", enum=list(STATES))] = None
    limit: Limit200 = None
    cursor: Annotated[str | None, _doc("next_cursor of the previous page")] = None


class GetTodo(Args):
    id: TodoId


class Claim(Args):
    id: TodoId
    lease_ttl_seconds: LeaseTtl = None
    claimant: Claimant = None
    require_fence: RequireFence = False


class ClaimNext(Args):
    queue: Queue = None
    lease_ttl_seconds: LeaseTtl = None
    claimant: Claimant = None
    require_fence: RequireFence = False
    max: Annotated[int | None, _doc(
        "claim up to this many at once (1..100), oldest first, one lease each; the answer is then"
        " {empty, todos: [...]}", minimum=1, maximum=100)] = None


class Heartbeat(Args):
    id: TodoId
    lease_ttl_seconds: LeaseTtl = None
    lease_token: LeaseToken = None
    checkpoint: Annotated[Any, _doc(
        "where you are (any JSON, at most 64 KiB encoded): the next claim of this todo returns the latest as"
        " resume_from")] = None


class Finish(Args):
    id: TodoId
    result: Result = None
    summary: Summary = None
    lease_token: LeaseToken = None


class Release(Args):
    id: TodoId
    summary: Summary = None
    lease_token: LeaseToken = None
    delay_seconds: Annotated[float | None, _doc(
        "snooze: not claimable (nor rung) for this many seconds, 0..86400; the attempt stays counted",
        minimum=0, maximum=86400)] = None


class CreateWebhook(Args):
    source_type: Annotated[str, _doc("sender type (must be allowed for this endpoint)", enum=list(SOURCE_TYPES))]
    target_queue: Annotated[str, _doc("one of this endpoint's webhook queues")]


class NoArgs(Args):
    pass


class WebhookRef(Args):
    webhook_id: WebhookId


class Route(Args):
    webhook_id: WebhookId
    target_endpoint_id: Annotated[str, _doc("an endpoint (ep_… id or slug) of the same operator")]


RulesList = Annotated[list[dict[str, Any]], _doc("ordered rules {id?, name?, expr, action}; first match wins")]
Action = Annotated[dict[str, Any] | None, _doc('{"queue": Q}, {"queue": Q, "endpoints": [...]} or {"drop": true}')]
# Any JSON here, so that params which are not an object reach the application and are refused with
# `invalid_params` (as on every surface), not with the parser's `invalid_argument`.
Params = Annotated[Any, _doc("JSON object visible to rules as $params (≤ 16 KiB)", type=["object", "null"])]


class SetRules(Args):
    webhook_id: WebhookId
    rules: RulesList
    default_action: Action = None
    params: Params = None


class TestRules(Args):
    webhook_id: WebhookId
    payload: Annotated[Any | UnsetType, _doc("a payload to route (give this or event_id)")] = UNSET
    headers: Annotated[dict[str, str] | None, _doc("headers sent with the payload")] = None
    event_id: Annotated[str | None, _doc("a stored delivery to route again (give this or payload)")] = None
    rules: Annotated[list[dict[str, Any]] | UnsetType, _doc("candidate rules (each with an id)")] = UNSET
    default_action: Annotated[dict[str, Any] | None | UnsetType, _doc("candidate default action")] = UNSET
    params: Annotated[Any | UnsetType, _doc("candidate params (a JSON object ≤ 16 KiB)", type=["object", "null"])] = UNSET


class ListEvents(Args):
    webhook_id: Annotated[str | None, _doc("only this webhook's deliveries")] = None
    limit: Limit200 = None
    cursor: Annotated[str | None, _doc("next_cursor of the previous page")] = None


class EventRef(Args):
    id: Annotated[str, _doc("delivery id (ev_…)")]


class SetDefaultLease(Args):
    default_lease_ttl_seconds: Annotated[int | None, _doc(
        "seconds, 60..86400, or null for the 300 s default", minimum=60, maximum=86400)]


@dataclass(frozen=True)
class Services:
    """What the adapters call: the two application facades."""

    app: Switchboard
    webhooks: Webhooks


Adapter = Callable[[Services, Caller, Any], dict[str, Any]]


@dataclass(frozen=True)
class Verb:
    name: str
    description: str
    args: type[Args]
    run: Adapter


def _candidate(a: TestRules) -> dict[str, Any] | None:
    given = {k: getattr(a, k) for k in ("rules", "default_action", "params") if getattr(a, k) is not UNSET}
    return given or None


def _get_default_lease(s: Services, c: Caller, a: NoArgs) -> dict[str, Any]:
    return s.app.default_lease_view(s.app.endpoint(c.name, caller=c))


VERBS: dict[str, Verb] = {v.name: v for v in (
    Verb("list_todos", "This endpoint's todos, newest first (rows, no payload); next_cursor when more follow.",
         ListTodos,
         lambda s, c, a: s.app.page_todos(caller=c, state=a.state, queue=a.queue, limit=a.limit, max_limit=200,
                                          cursor=a.cursor)),
    Verb("get_todo", "One todo in full: payload, routing, result, prior attempts and every attempt.", GetTodo,
         lambda s, c, a: s.app.get_todo(a.id, caller=c)),
    Verb("claim", "Claims this todo under a lease (one attempt); returns it in full, with resume_from (the latest "
                  "checkpoint, or null) and the attempt's traceparent.", Claim,
         lambda s, c, a: s.app.claim(a.id, caller=c, lease_ttl_seconds=a.lease_ttl_seconds, claimant=a.claimant,
                                     require_fence=a.require_fence)),
    Verb("claim_next", "Claims the oldest available todo across your queues (or the one given): "
                       "{empty: false, todo} or {empty: true}; with max, up to that many: {empty, todos}. "
                       "When your queues hold work they cannot hand out now, the empty answer says why for the "
                       "queue that admits again soonest (reason: rate_limited, max_in_flight or paused) and, "
                       "for rate_limited, retry_after_seconds. "
                       "Call this to get work.", ClaimNext,
         lambda s, c, a: s.app.claim_next(caller=c, queue=a.queue, lease_ttl_seconds=a.lease_ttl_seconds,
                                          claimant=a.claimant, require_fence=a.require_fence, max_todos=a.max)),
    Verb("heartbeat", "Extends the lease you hold to now + ttl; with checkpoint, saves where you are (the next "
                      "claim returns it as resume_from).", Heartbeat,
         lambda s, c, a: s.app.heartbeat(a.id, caller=c, lease_ttl_seconds=a.lease_ttl_seconds,
                                         lease_token=a.lease_token, checkpoint=a.checkpoint)),
    Verb("complete", "Marks the todo you hold done, with an optional result and summary.", Finish,
         lambda s, c, a: s.app.complete(a.id, caller=c, result=a.result, summary=a.summary, lease_token=a.lease_token)),
    Verb("fail", "Fails the todo you hold; it is retried later with backoff (dead letter after 5 attempts).", Finish,
         lambda s, c, a: s.app.fail(a.id, caller=c, result=a.result, summary=a.summary, lease_token=a.lease_token)),
    Verb("release", "Gives the todo you hold back to the queue (pending, attempt unchanged); with "
                    "delay_seconds, a snooze: not claimable until then.", Release,
         lambda s, c, a: s.app.release(a.id, caller=c, summary=a.summary, lease_token=a.lease_token,
                                       delay_seconds=a.delay_seconds)),
    Verb("create_webhook", "A new ingest URL feeding one of your queues (signing secret shown once).", CreateWebhook,
         lambda s, c, a: s.webhooks.create(caller=c, endpoint=c.name, source_type=a.source_type,
                                           target_queue=a.target_queue)),
    Verb("list_webhooks", "Your webhooks (never secrets or URLs) and your webhook ceiling.", NoArgs,
         lambda s, c, a: s.webhooks.list(caller=c)),
    Verb("rotate_webhook", "A new ingest URL (and signing secret); the old URL stops working at once.", WebhookRef,
         lambda s, c, a: s.webhooks.rotate(a.webhook_id, caller=c)),
    Verb("delete_webhook", "Deletes a webhook; its URL stops working at once.", WebhookRef,
         lambda s, c, a: s.webhooks.delete(a.webhook_id, caller=c)),
    Verb("add_webhook_route", "Also delivers this webhook's todos to another endpoint of your operator.", Route,
         lambda s, c, a: s.webhooks.add_route(a.webhook_id, a.target_endpoint_id, caller=c)),
    Verb("remove_webhook_route", "Stops delivering this webhook's todos to that endpoint.", Route,
         lambda s, c, a: s.webhooks.remove_route(a.webhook_id, a.target_endpoint_id, caller=c)),
    Verb("list_webhook_routes", "The endpoints this webhook delivers to besides its owner.", WebhookRef,
         lambda s, c, a: s.webhooks.routes(a.webhook_id, caller=c)),
    Verb("list_webhook_rules", "The webhook's routing rules, default action and params.", WebhookRef,
         lambda s, c, a: s.webhooks.rules(a.webhook_id, caller=c)),
    Verb("set_webhook_rules", "Replaces the routing rules (validated, and dry-run over the 50 latest deliveries).",
         SetRules,
         lambda s, c, a: s.webhooks.set_rules(a.webhook_id, {"rules": a.rules, "default_action": a.default_action,
                                                             "params": a.params}, caller=c)),
    Verb("test_webhook_rules", "Dry run of the saved (or candidate) rules on a payload or a stored delivery; "
                               "saves nothing.", TestRules,
         lambda s, c, a: s.webhooks.test_rules(
             a.webhook_id, caller=c, payload=None if a.payload is UNSET else a.payload, headers=a.headers,
             event_id=a.event_id, candidate=_candidate(a), has_payload=a.payload is not UNSET)),
    Verb("list_webhook_events", "Stored deliveries, newest first (no payload, no headers), paged by cursor.",
         ListEvents,
         lambda s, c, a: s.webhooks.list_events(caller=c, webhook_id=a.webhook_id, limit=a.limit, cursor=a.cursor,
                                                max_limit=200)),
    Verb("get_webhook_event", "One stored delivery with redacted headers and its payload.", EventRef,
         lambda s, c, a: s.webhooks.get_event(a.id, caller=c)),
    Verb("get_default_lease", "The lease used when a claim names none.", NoArgs, _get_default_lease),
    Verb("set_default_lease", "Sets the lease used when a claim names none (60..86400 s, or null for 300 s).",
         SetDefaultLease,
         lambda s, c, a: s.app.set_default_lease(c.name, a.default_lease_ttl_seconds, caller=c)),
)}

def _schemas() -> dict[str, dict[str, Any]]:
    _, components = msgspec.json.schema_components(sorted({v.args for v in VERBS.values()}, key=lambda t: t.__name__))
    schemas = {}
    for verb in VERBS.values():
        schema = dict(components[verb.args.__name__])
        schema.pop("title", None)
        schema.setdefault("properties", {})
        schemas[verb.name] = schema
    return schemas


INPUT_SCHEMAS: dict[str, dict[str, Any]] = _schemas()


def parse_arguments(verb: Verb, arguments: dict[str, Any] | None) -> Any:
    """The verb's Struct from the call's arguments; msgspec.ValidationError when they do not fit."""
    return msgspec.convert(arguments or {}, verb.args, strict=True)
