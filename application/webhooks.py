"""The webhook side's facade for the interfaces: webhooks, routes, rules, ingest, deliveries.

It only delegates and presents, like application/service.py:

- application/hooks.py    create, rotate, delete, routes, sealed signing secrets
- application/rules.py    read, save (after a dry run), test and replay routing rules
- application/ingest.py   one delivery: verified, routed, recorded in one append
- application/queries.py  webhook and delivery listings (shared with `Switchboard`)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from application import presenters as present
from application.access import Caller
from application.hooks import Hooks, Minted
from application.ingest import Handshake, Ingest, Ingested
from application.payloads import delivery_payload, pruned_note
from application.ports import RuleEngine, SecretBox
from application.rules import DEFAULT_REPLAY_LAST, REPLAY_MAX, Rules
from application.service import Switchboard
from domain.errors import Conflict
from domain.webhook import Webhook

__all__ = ["DEFAULT_REPLAY_LAST", "REPLAY_MAX", "Webhooks"]


class Webhooks:
    """The webhook side of the application; shares the store, views, clock and access of `Switchboard`."""

    def __init__(self, app: Switchboard, engine: RuleEngine, box: SecretBox) -> None:
        self.app = app
        self.store = app.store
        self.views = app.views
        self.clock = app.clock
        self.engine = engine
        self.box = box
        self.hooks = Hooks(app.store, app.clock, app.access, box)
        self.rulebook = Rules(app.views, app.access, self.hooks, engine)
        self.intake = Ingest(app.store, app.views, app.clock, engine, box)
        self.queries = app.queries

    def _minted(self, minted: Minted) -> dict[str, Any]:
        webhook, token, secret = minted
        return present.minted(webhook, f"{self.app.base_url}/webhooks/w/{token}", secret)

    # -- lifecycle -----------------------------------------------------------------------

    def create(self, *, caller: Caller, endpoint: str, source_type: str, target_queue: str) -> dict[str, Any]:
        return self._minted(self.hooks.create(caller=caller, endpoint=endpoint, source_type=source_type,
                                              target_queue=target_queue))

    def rotate(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        return self._minted(self.hooks.rotate(webhook_id, caller=caller))

    def delete(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        return {"webhook_id": self.hooks.delete(webhook_id, caller=caller).webhook_id, "deleted": True}

    def list(self, *, caller: Caller, endpoint: str | None = None) -> dict[str, Any]:
        return self.queries.webhooks(caller=caller, endpoint=endpoint)

    def sealed_webhooks(self) -> list[Webhook]:
        return self.hooks.sealed_webhooks()

    def check_secrets_open(self, sealed: Sequence[Webhook]) -> None:
        self.hooks.check_secrets_open(sealed)

    def reseal(self, old_box: SecretBox, *, caller: Caller) -> dict[str, Any]:
        return self.hooks.reseal(old_box, caller=caller)

    def set_trust(self, webhook_id: str, *, caller: Caller, senders: Sequence[str] | None,
                  associations: Sequence[str] | None) -> dict[str, Any]:
        webhook, policy = self.hooks.set_trust(webhook_id, caller=caller, senders=senders, associations=associations)
        return {"webhook_id": webhook.webhook_id, **policy.to_json()}

    # -- routes --------------------------------------------------------------------------

    def add_route(self, webhook_id: str, target_endpoint_id: str, *, caller: Caller) -> dict[str, Any]:
        target = self.hooks.add_route(webhook_id, target_endpoint_id, caller=caller)
        return {"webhook_id": webhook_id, "target_endpoint_id": target.endpoint_id, "routed": True}

    def remove_route(self, webhook_id: str, target_endpoint_id: str, *, caller: Caller) -> dict[str, Any]:
        target_id = self.hooks.remove_route(webhook_id, target_endpoint_id, caller=caller)
        return {"webhook_id": webhook_id, "target_endpoint_id": target_id, "removed": True}

    def routes(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        webhook, _ = self.app.access.webhook(webhook_id, caller)
        return present.routes_view(webhook)

    # -- rules ---------------------------------------------------------------------------

    def rules(self, webhook_id: str, *, caller: Caller) -> dict[str, Any]:
        webhook, rule_set = self.rulebook.rules(webhook_id, caller=caller)
        return {"webhook_id": webhook.webhook_id, **rule_set.to_json()}

    def set_rules(self, webhook_id: str, document: Mapping[str, Any], *, caller: Caller) -> dict[str, Any]:
        webhook, rule_set = self.rulebook.set_rules(webhook_id, document, caller=caller)
        return {"webhook_id": webhook.webhook_id, **rule_set.to_json()}

    def test_rules(self, webhook_id: str, *, caller: Caller, **dry_run: Any) -> dict[str, Any]:
        return self.rulebook.test_rules(webhook_id, caller=caller, **dry_run)

    def replay(self, webhook_id: str, candidate: Mapping[str, Any], *, caller: Caller,
               last: int | None = None) -> dict[str, Any]:
        return self.rulebook.replay(webhook_id, candidate, caller=caller, last=last)

    # -- ingest --------------------------------------------------------------------------

    def ingest(self, token: str, headers: Mapping[str, str], body: bytes, *,
               remote_addr: str | None = None) -> dict[str, Any]:
        """Verifies, routes and records one delivery; returns the 202 body (for a sender's handshake,
        only `{"challenge"}`: nothing was routed or stored)."""
        return _answer(self.intake.ingest(token, headers, body, remote_addr=remote_addr))

    async def ingest_async(self, token: str, headers: Mapping[str, str], body: bytes, *,
                           remote_addr: str | None = None,
                           offload: Callable[[Callable[[], Any]], Awaitable[Any]]) -> dict[str, Any]:
        """`ingest` on an event loop: the blocking steps go through `offload`, the commit is awaited."""
        return _answer(await self.intake.ingest_async(token, headers, body, remote_addr=remote_addr,
                                                      offload=offload))

    # -- deliveries ----------------------------------------------------------------------

    def list_events(self, *, caller: Caller, webhook_id: str | None = None, limit: int | None = None,
                    cursor: str | None = None, max_limit: int = 200) -> dict[str, Any]:
        return self.queries.deliveries(caller=caller, webhook_id=webhook_id, limit=limit, cursor=cursor,
                                       max_limit=max_limit)

    def get_event(self, event_id: str, *, caller: Caller, raw_body: bool = False) -> dict[str, Any]:
        delivery = self.queries.delivery(event_id, caller=caller)
        body, payload, pruned = delivery_payload(self.queries.store, delivery)
        return present.delivery_view(delivery, body=body, payload=payload, pruned=pruned_note(pruned),
                                     raw_body=raw_body)

    def event_body(self, event_id: str, *, caller: Caller) -> tuple[bytes, str | None]:
        """A delivery's raw body exactly as received, and its content type."""
        delivery = self.queries.delivery(event_id, caller=caller)
        body, _, pruned = delivery_payload(self.queries.store, delivery)
        if body is None:
            raise Conflict(f"event {event_id}: {pruned_note(pruned)['text']}")
        return body, delivery.content_type


def _answer(result: Ingested | Handshake) -> dict[str, Any]:
    return present.handshaken(result) if isinstance(result, Handshake) else present.accepted(result)
