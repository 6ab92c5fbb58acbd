"""The operator API `/api/v1` (CONTRACT §9) and its SSE `/stream` of todo transitions.

Thin adapters, one module per resource: todos, endpoints, queues, webhooks, rules, deliveries
(`/events`), audit and stream. Each route authenticates (`api_guard`: a bearer `sbo_` token, or
the board session plus its CSRF header), calls one application method as that operator in a
worker thread, and answers JSON. Errors go through the one error table
(interfaces/http/errors.py); another operator's ids answer 404 exactly like unknown ones, because
the application says `not_found`. A JSON body is read with JSON's own types (`check_body`,
interfaces/http/api/strict_body.py): the string "3" is no number there.
"""

from __future__ import annotations

from litestar import Router
from litestar.datastructures import CacheControlHeader

from application.audit import AuditLog
from application.feed import TransitionFeed
from application.service import Switchboard
from application.webhooks import Webhooks
from interfaces.http.api.audit import audit_routes
from interfaces.http.api.deliveries import delivery_routes
from interfaces.http.api.endpoints import endpoint_routes
from interfaces.http.api.queues import queue_routes
from interfaces.http.api.rules import rule_routes
from interfaces.http.api.shared import ERROR_RESPONSES, SECURITY
from interfaces.http.api.stream import stream_routes
from interfaces.http.api.strict_body import check_body
from interfaces.http.api.todos import todo_routes
from interfaces.http.api.webhooks import webhook_routes
from interfaces.http.auth import api_guard


def api_router(app: Switchboard, webhooks: Webhooks, feed: TransitionFeed, audit: AuditLog) -> Router:
    """Every `/api/v1` route, guarded by `api_guard`, in the order the OpenAPI document lists them."""
    handlers = [
        *todo_routes(app), *endpoint_routes(app), *queue_routes(app), *webhook_routes(webhooks),
        *rule_routes(webhooks), *delivery_routes(webhooks), *audit_routes(audit), *stream_routes(feed),
    ]
    for handler in handlers:
        handler.responses = {**ERROR_RESPONSES, **(handler.responses or {})}
    return Router(
        path="/api/v1", guards=[api_guard], security=SECURITY, tags=["operator"], before_request=check_body,
        cache_control=CacheControlHeader(no_store=True),  # answers carry credentials and payloads
        route_handlers=handlers,
    )
