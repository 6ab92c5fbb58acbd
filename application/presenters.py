"""How todos and endpoints look to every interface (CLI, HTTP, MCP): plain JSON-ready dicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from domain.endpoint import Endpoint
from domain.todo import MAX_ATTEMPTS, PRIOR_ATTEMPTS_SHOWN, Todo


def iso(moment: datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z."""
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")


def todo_row(todo: Todo) -> dict[str, Any]:
    """A row: everything but the payload."""
    return {
        "id": todo.todo_id,
        "queue": todo.queue,
        "source": todo.source,
        "kind": todo.kind,
        "title": todo.title,
        "state": todo.state,
        "trust_mode": todo.trust_mode,
        "owner": todo.holder,
        "attempt": todo.attempt,
        "max_attempts": MAX_ATTEMPTS,
        "lease_expires_at": iso(todo.lease_expires_at),
        "next_retry_at": iso(todo.next_retry_at),
        "dead_letter": todo.dead_letter,
        "created_at": iso(todo.created_at),
        "payload_size": todo.payload_size,
    }


def todo_full(todo: Todo, *, payload: Any = None, result: Any = None, lease_token: str | None = None) -> dict[str, Any]:
    """The row plus payload, routing, result and the newest closed attempts (the payload and
    result as read from the store by application/payloads.py)."""
    closed = [a for a in todo.attempts if a.outcome is not None][-PRIOR_ATTEMPTS_SHOWN:]
    full = todo_row(todo) | {
        "endpoint_id": todo.endpoint_id,
        "payload": payload,
        "routing": todo.routing,
        "result": result,
        "attempt_seq": todo.attempt_seq,
        "claimant": todo.claimant,
        "prior_attempts": [
            {
                "seq": a.seq, "claimant": a.claimant, "claimed_at": iso(a.claimed_at),
                "ended_at": iso(a.ended_at), "outcome": a.outcome, "summary": a.summary,
            }
            for a in reversed(closed)
        ],
    }
    if lease_token is not None:
        full["lease_token"] = lease_token
    return full


def endpoint_view(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "endpoint_id": endpoint.endpoint_id,
        "slug": endpoint.slug,
        "agent": endpoint.agent,
        "owner": endpoint.owner,
        "queues": list(endpoint.queues),
        "verbs": list(endpoint.verbs),
        "webhook_max": endpoint.webhook_max,
        "source_types": list(endpoint.source_types),
        "webhook_queues": list(endpoint.webhook_queues),
        "default_lease_ttl_seconds": endpoint.default_lease_seconds,
        "expires_at": iso(endpoint.expires_at),
        "revoked": endpoint.revoked,
        "created_at": iso(endpoint.created_at),
    }
