"""How things look to every interface (CLI, HTTP, MCP, board): plain JSON-ready dicts.

The one place answers are shaped: handlers return domain objects or small result values, and
the facades (application/service.py, application/webhooks.py) present them with these.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from domain.delivery import Delivery, delivery_id_of
from domain.endpoint import Endpoint
from domain.names import QUARANTINE, REDACTED
from domain.attempts import PRIOR_ATTEMPTS_SHOWN, Attempt
from domain.todo import MAX_ATTEMPTS, Todo
from domain.webhook import Webhook

if TYPE_CHECKING:
    from application.ingest import Handshake, Ingested

# Event fields never shown by history or audit export (they stay in the log).
REDACTED_FIELDS = ("password_hash",)


def iso(moment: datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z."""
    if moment is None:
        return None
    return moment.isoformat().replace("+00:00", "Z")


def claimable_from(queue: str, available_at: datetime | None) -> str | None:
    """When a todo is or becomes claimable, as shown: none while it is held in quarantine (no agent
    may claim it until an operator releases it, whatever time its claimable queue row holds)."""
    return None if queue == QUARANTINE else iso(available_at)


def row(*, todo_id: str, queue: str, source: str, kind: str | None, title: str, state: str, trust_mode: str,
        owner: str | None, attempt: int, lease_expires_at: datetime | None, next_retry_at: datetime | None,
        dead_letter: bool, created_at: datetime | None, payload_size: int | None,
        available_at: datetime | None) -> dict[str, Any]:
    """A todo's row (everything but the payload), from a Todo or from the read model's columns."""
    return {
        "id": todo_id, "queue": queue, "source": source, "kind": kind, "title": title, "state": state,
        "trust_mode": trust_mode, "owner": owner, "attempt": attempt, "max_attempts": MAX_ATTEMPTS,
        "lease_expires_at": iso(lease_expires_at), "next_retry_at": iso(next_retry_at),
        "dead_letter": dead_letter, "created_at": iso(created_at), "payload_size": payload_size,
        "available_at": claimable_from(queue, available_at),
    }


def todo_row(todo: Todo) -> dict[str, Any]:
    """A row: everything but the payload."""
    return row(
        todo_id=todo.todo_id, queue=todo.queue, source=todo.source, kind=todo.kind, title=todo.title,
        state=todo.state, trust_mode=todo.trust_mode, owner=todo.holder, attempt=todo.attempt,
        lease_expires_at=todo.lease_expires_at, next_retry_at=todo.next_retry_at, dead_letter=todo.dead_letter,
        created_at=todo.created_at, payload_size=todo.payload_size, available_at=todo.available_at,
    )


def attempt_view(todo: Todo, attempt: Attempt) -> dict[str, Any]:
    """One attempt as CONTRACT §18 shows it: `summary` and `checkpoint` only when it has them."""
    view = {"n": attempt.seq, "claimant": attempt.claimant, "claimed_at": iso(attempt.claimed_at),
            "ended_at": iso(attempt.ended_at), "outcome": attempt.told}
    if attempt.summary is not None:
        view["summary"] = attempt.summary
    if attempt.checkpoint is not None:
        view["checkpoint"] = attempt.checkpoint
    return view | {"traceparent": todo.traceparent_of(attempt)}


def todo_full(todo: Todo, *, payload: Any = None, result: Any = None, lease_token: str | None = None) -> dict[str, Any]:
    """The row plus payload, routing, result, the newest closed attempts and every attempt, the
    checkpoint a claim resumes from and the open attempt's `traceparent` (the payload and result
    as read from the store by application/payloads.py)."""
    closed = [a for a in todo.attempts if a.outcome is not None][-PRIOR_ATTEMPTS_SHOWN:]
    current = todo.attempts[-1] if todo.attempts and todo.attempts[-1].outcome is None else None
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
        "attempts": [attempt_view(todo, a) for a in todo.attempts],
        "resume_from": todo.resume_from,
        "traceparent": todo.traceparent_of(current) if current is not None else None,
    }
    if lease_token is not None:
        full["lease_token"] = lease_token
    return full


def claimed(taken: Sequence[dict[str, Any]], *, batch: bool, why: dict[str, Any] | None = None) -> dict[str, Any]:
    """claim_next's answer from the full todos taken: `{empty, todo?}`, or with `max`, `{empty, todos}`;
    an empty one says why when queue controls hold work back (`why`: reason, retry_after_seconds?)."""
    if batch:
        return {"empty": not taken, "todos": list(taken), **(why or {})}
    if not taken:
        return {"empty": True, **(why or {})}
    return {"empty": False, "todo": taken[0]}


def queue_views(endpoint: Endpoint, queues: Sequence[str], loads: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """Each queue with its controls and its load (`claims_last_minute` only under a rate)."""
    return [
        {"queue": q, **endpoint.controls_of(q).as_dict(), "in_flight": loads[q][0],
         "claims_last_minute": loads[q][1] if endpoint.controls_of(q).max_claims_per_minute else None}
        for q in queues
    ]


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


def with_status(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    """An endpoint row with its `status` now: `revoked`, `expired` (past `expires_at`, which
    `Endpoint.is_active` treats as revoked) or `active`."""
    expired = row["expires_at"] and datetime.fromisoformat(row["expires_at"]) <= now
    return row | {"status": "revoked" if row["revoked"] else "expired" if expired else "active"}


def vended(endpoint: Endpoint, credential: str, base_url: str) -> dict[str, Any]:
    """A vended endpoint with its credential (shown this once) and a ready MCP client config."""
    mcp_url = f"{base_url}/mcp/{endpoint.slug}"
    return {
        "endpoint_id": endpoint.endpoint_id,
        "slug": endpoint.slug,
        "mcp_url": mcp_url,
        "credential": credential,
        "queues": list(endpoint.queues),
        "verbs": list(endpoint.verbs),
        "expires_at": iso(endpoint.expires_at),
        "mcp_json": {"mcpServers": {"switchboard": {
            "type": "http", "url": mcp_url, "headers": {"Authorization": f"Bearer {credential}"},
        }}},
    }


def default_lease_view(endpoint: Endpoint) -> dict[str, Any]:
    return {
        "default_lease_ttl_seconds": endpoint.default_lease_seconds,
        "effective_lease_ttl_seconds": int(endpoint.default_lease.total_seconds()),
    }


def shown(data: dict[str, Any]) -> dict[str, Any]:
    """An event's data with the fields never shown replaced by the redaction mark."""
    for name in REDACTED_FIELDS:
        if name in data:
            data[name] = REDACTED
    return data


def minted(webhook: Webhook, ingest_url: str, secret: str | None) -> dict[str, Any]:
    """A created or rotated webhook: its URL (and signing secret), shown this once."""
    answer = {
        "webhook_id": webhook.webhook_id, "ingest_url": ingest_url,
        "source_type": webhook.source_type, "target_queue": webhook.target_queue,
        "trust_mode": webhook.trust_mode,
    }
    if secret is not None:
        answer["signing_secret"] = secret
    return answer


def routes_view(webhook: Webhook) -> dict[str, Any]:
    return {
        "webhook_id": webhook.webhook_id, "owner_endpoint_id": webhook.endpoint_id,
        "routes": [{"target_endpoint_id": t, "granted_at": iso(at)} for t, at in webhook.routes],
    }


def ceiling(endpoint: Endpoint) -> dict[str, Any]:
    """How many webhooks an endpoint may have and uses, and what they may name."""
    return {
        "max": endpoint.webhook_max, "used": len(endpoint.webhook_ids),
        "allowed_source_types": list(endpoint.source_types), "allowed_queues": list(endpoint.webhook_queues),
    }


def delivery_view(delivery: Delivery, *, body: bytes | None, payload: Any, pruned: dict[str, Any] | None,
                  raw_body: bool = False) -> dict[str, Any]:
    """One delivery with redacted headers and payload, and the sender's delivery id; `body` is the
    body as received when it is not JSON, or always with `raw_body` (both read from the payload
    store; `payload_pruned` once retention removed them)."""
    shown = None if body is None or (payload is not None and not raw_body) else body.decode(errors="replace")
    return {
        "id": delivery.event_id, "delivery_id": delivery_id_of(delivery.delivery_key),
        "webhook_id": delivery.webhook_id, "endpoint_id": delivery.endpoint_id,
        "source": delivery.source, "kind": delivery.kind, "trust_mode": delivery.trust_mode,
        "verified": delivery.verified, "remote_addr": delivery.remote_addr,
        "content_type": delivery.content_type, "size": delivery.size, "headers": delivery.headers,
        "payload": payload, "body": shown, "body_sha256": delivery.body_ref["sha256"],
        "disposition": delivery.disposition, "routing": delivery.routing, "todos": delivery.todos,
        "received_at": iso(delivery.received_at),
        **({"payload_pruned": pruned} if pruned is not None else {}),
    }


def handshaken(handshake: Handshake) -> dict[str, Any]:
    """The answer to a sender's verified handshake (Slack's `url_verification`): its challenge alone."""
    return {"challenge": handshake.challenge}


def accepted(ingested: Ingested) -> dict[str, Any]:
    """The 202 body of an accepted delivery."""
    todos, decision = ingested.todos, ingested.decision
    first = todos[0] if todos else None
    answer: dict[str, Any] = {
        "todos": todos, "created": sum(1 for t in todos if t["created"]),
        "id": first["id"] if first else None, "queue": first["queue"] if first else None,
        "verified": ingested.verified, "trust_mode": ingested.trust_mode, "event_id": ingested.event_id,
    }
    if decision.drop:
        answer["dropped"] = True
    if decision.faulted:
        answer["faulted"] = True
    if decision.held:
        answer["held"] = True
    if ingested.repeat:
        answer["repeat"] = True
    return answer
