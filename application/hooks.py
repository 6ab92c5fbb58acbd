"""Webhooks' lifecycle: create, rotate, delete, routes, and their sealed signing secrets.

Commands return the Webhook they changed (with the token and secret they minted);
application/presenters.py shapes the answers.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID, uuid4

from application.access import Access, Caller, may_touch, webhook_uuid
from application.errors import ConfigurationError
from application.ports import Clock, EventStore, SecretBox, UnitOfWork
from domain.endpoint import SOURCE_TYPES, Endpoint, endpoint_uuid_of
from domain.errors import Forbidden, InvalidArgument, NotFound
from domain.signatures import SIGNED_SOURCES, new_signing_secret, trust_of
from domain.names import ENDPOINT_PREFIX, check_queue_name, format_id
from domain.trust import TrustPolicy
from domain.webhook import Webhook, WebhookCreated

LOAD_PAGE = 500

Minted = tuple[Webhook, str, "str | None"]  # a webhook, its new URL token, and its new signing secret


def _opens(box: SecretBox, ciphertext: str) -> bool:
    try:
        box.decrypt(ciphertext)
    except ValueError:
        return False
    return True


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Hooks:
    def __init__(self, store: EventStore, clock: Clock, access: Access, box: SecretBox) -> None:
        self.store = store
        self.clock = clock
        self.access = access
        self.box = box

    def _mint(self, source_type: str) -> tuple[str, str | None]:
        token = secrets.token_hex(16)
        signed = source_type in SIGNED_SOURCES  # Standard Webhooks' secret is base64, the others hex
        secret = new_signing_secret(secrets.token_bytes(32), source_type) if signed else None
        return token, secret

    def _seal(self, secret: str | None) -> str | None:
        return self.box.encrypt(secret) if secret else None

    def create(self, *, caller: Caller, endpoint: str, source_type: str, target_queue: str) -> Minted:
        """A new ingest URL for an endpoint, within its ceiling, source types and webhook queues."""
        if not source_type or not target_queue:
            raise InvalidArgument("source_type and target_queue are required")
        if source_type not in SOURCE_TYPES:
            raise InvalidArgument(f"unknown source type {source_type!r}")
        check_queue_name(target_queue)
        token, secret = self._mint(source_type)
        trust_mode, _ = trust_of(source_type)
        new_id = uuid4()
        endpoint_id = endpoint_uuid_of(endpoint)

        def handler(uow: UnitOfWork) -> Webhook:
            owner = uow.get(Endpoint, endpoint_id)
            if owner is None or not may_touch(caller, owner):
                raise NotFound(f"endpoint {endpoint} not found")
            webhook = Webhook.create(
                id=new_id, now=uow.now, actor=caller.label, endpoint_id=owner.endpoint_id,
                source_type=source_type, target_queue=target_queue, trust_mode=trust_mode,
                token_sha256=_token_hash(token), secret_ciphertext=self._seal(secret),
            )
            owner.attach_webhook(now=uow.now, actor=caller.label, webhook_id=webhook.webhook_id,
                                 source_type=source_type, target_queue=target_queue)
            uow.add(webhook)
            return webhook

        return self.store.run(handler), token, secret

    def change(self, webhook_id: str, caller: Caller, change: Callable[[Webhook, UnitOfWork], Any]) -> Any:
        """Applies one command to a live webhook the caller may see."""
        parsed = webhook_uuid(webhook_id)
        self.access.webhook(webhook_id, caller)

        def handler(uow: UnitOfWork) -> Any:
            webhook = uow.get(Webhook, parsed)
            if webhook is None or webhook.deleted:
                raise NotFound(f"webhook {webhook_id} not found")
            return change(webhook, uow)

        return self.store.run(handler)

    def rotate(self, webhook_id: str, *, caller: Caller) -> Minted:
        """A new URL (and signing secret for signed sources); the old ones answer 404/401 at once."""
        def change(webhook: Webhook, uow: UnitOfWork) -> Minted:
            token, secret = self._mint(webhook.source_type)
            webhook.rotate(now=uow.now, actor=caller.label, token_sha256=_token_hash(token),
                           secret_ciphertext=self._seal(secret))
            return webhook, token, secret

        return self.change(webhook_id, caller, change)

    def delete(self, webhook_id: str, *, caller: Caller) -> Webhook:
        def change(webhook: Webhook, uow: UnitOfWork) -> Webhook:
            webhook.delete(now=uow.now, actor=caller.label)
            owner = uow.get(Endpoint, endpoint_uuid_of(webhook.endpoint_id))
            if owner is not None:
                owner.detach_webhook(now=uow.now, actor=caller.label, webhook_id=webhook.webhook_id)
            return webhook

        return self.change(webhook_id, caller, change)

    # -- trusted senders -----------------------------------------------------------------

    def set_trust(self, webhook_id: str, *, caller: Caller, senders: Sequence[str] | None,
                  associations: Sequence[str] | None) -> tuple[Webhook, TrustPolicy]:
        """Operators replace who may create work through a github or gitea webhook (CONTRACT §13)."""
        if caller.kind != "operator":
            raise Forbidden("only an operator can set a webhook's trusted senders")
        return self.change(webhook_id, caller, lambda w, uow: (w, w.set_trust(
            now=uow.now, actor=caller.label, senders=list(senders or ()), associations=list(associations or ()))))

    # -- routes --------------------------------------------------------------------------

    def _route_target(self, target_endpoint_id: str, owner: Endpoint) -> Endpoint:
        target = self.store.load(Endpoint, endpoint_uuid_of(target_endpoint_id)) if target_endpoint_id else None
        if target is None or not target.is_active(self.clock.now()) or target.owner != owner.owner:
            raise Forbidden("target endpoint is unknown, revoked or not yours")
        return target

    def add_route(self, webhook_id: str, target_endpoint_id: str, *, caller: Caller) -> Endpoint:
        """Routes a webhook to another endpoint of the same operator; returns that endpoint."""
        _, owner = self.access.webhook(webhook_id, caller)
        target = self._route_target(target_endpoint_id, owner)
        self.change(webhook_id, caller, lambda w, uow: w.add_route(
            now=uow.now, actor=caller.label, target_endpoint_id=target.endpoint_id))
        return target

    def remove_route(self, webhook_id: str, target_endpoint_id: str, *, caller: Caller) -> str:
        """Ends a route; returns the target's endpoint id."""
        self.access.webhook(webhook_id, caller)
        target_id = format_id(ENDPOINT_PREFIX, endpoint_uuid_of(target_endpoint_id))
        self.change(webhook_id, caller, lambda w, uow: w.remove_route(
            now=uow.now, actor=caller.label, target_endpoint_id=target_id))
        return target_id

    # -- the secret key ------------------------------------------------------------------

    def sealed_webhooks(self) -> list[Webhook]:
        """Every live webhook with a sealed signing secret, read from the log (not a read model)."""
        ids: list[UUID] = []
        after = 0
        while batch := self.store.read_log(after, 1000, types=(WebhookCreated,)):
            ids.extend(r.event.originator_id for r in batch)
            after = batch[-1].position
        webhooks: list[Webhook] = []
        for start in range(0, len(ids), LOAD_PAGE):
            loaded = self.store.load_many([(Webhook, i) for i in ids[start:start + LOAD_PAGE]])
            webhooks.extend(w for w in loaded.values() if w is not None and not w.deleted and w.secret_ciphertext)
        return webhooks

    def check_secrets_open(self, sealed: Sequence[Webhook]) -> None:
        """Raises ConfigurationError when the current key cannot open a sealed signing secret."""
        shut = [w.webhook_id for w in sealed if not _opens(self.box, w.secret_ciphertext)]
        if shut:
            raise ConfigurationError(
                f"the secret key cannot open the signing secrets of {len(shut)} of {len(sealed)} webhook(s)"
                f" (first {shut[0]}): they were sealed with another SWITCHBOARD_SECRET_KEY; start with that key,"
                " or run `switchboard secrets reseal` with the old key in SWITCHBOARD_SECRET_KEY_OLD")

    def reseal(self, old_box: SecretBox, *, caller: Caller) -> dict[str, Any]:
        """Re-seals, under the current key, every signing secret the old key opens (an event per
        webhook, all in one append); refused, changing nothing, when one opens under neither key."""
        ids = [w.id for w in self.sealed_webhooks()]

        def handler(uow: UnitOfWork) -> dict[str, Any]:
            resealed, current = [], 0
            for webhook_id in ids:
                webhook = uow.get(Webhook, webhook_id, fresh=True)
                if webhook is None or webhook.deleted or not webhook.secret_ciphertext:
                    continue
                if _opens(self.box, webhook.secret_ciphertext):
                    current += 1
                    continue
                try:
                    secret = old_box.decrypt(webhook.secret_ciphertext)
                except ValueError:
                    raise ConfigurationError(
                        f"neither SWITCHBOARD_SECRET_KEY nor SWITCHBOARD_SECRET_KEY_OLD opens the signing secret"
                        f" of webhook {webhook.webhook_id}; nothing was re-sealed") from None
                webhook.reseal_secret(now=uow.now, actor=caller.label, secret_ciphertext=self.box.encrypt(secret))
                resealed.append(webhook.webhook_id)
            return {"resealed": len(resealed), "already_current": current, "webhooks": resealed}

        return self.store.run(handler)
