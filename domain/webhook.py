"""The Webhook aggregate: an ingest URL an endpoint owns, its signing secret, rules and routes.

The ingest token and the signing secret are minted by the caller; the webhook keeps only the
token's SHA-256 and the secret's ciphertext (encrypted with the service's secret key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.errors import Conflict, Forbidden, InvalidArgument
from domain.events import Aggregate, DomainEvent
from domain.names import format_id
from domain.trust import NO_POLICY, TRUST_SOURCES, TrustPolicy, check_trusted_associations, check_trusted_senders

WEBHOOK_PREFIX = "wh_"


@dataclass(frozen=True, kw_only=True)
class WebhookCreated(DomainEvent):
    endpoint_id: str
    source_type: str
    target_queue: str
    trust_mode: str
    token_sha256: str
    secret_ciphertext: str | None


@dataclass(frozen=True, kw_only=True)
class WebhookRotated(DomainEvent):
    token_sha256: str
    secret_ciphertext: str | None


@dataclass(frozen=True, kw_only=True)
class WebhookDeleted(DomainEvent):
    pass


@dataclass(frozen=True, kw_only=True)
class WebhookRulesSet(DomainEvent):
    rules: list[dict[str, Any]]
    default_action: dict[str, Any] | None
    params: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class WebhookRouteAdded(DomainEvent):
    target_endpoint_id: str


@dataclass(frozen=True, kw_only=True)
class WebhookRouteRemoved(DomainEvent):
    target_endpoint_id: str


@dataclass(frozen=True, kw_only=True)
class WebhookSecretResealed(DomainEvent):
    secret_ciphertext: str


@dataclass(frozen=True, kw_only=True)
class WebhookTrustSet(DomainEvent):
    """An operator set who may create work through the webhook (both lists empty: everyone)."""

    trusted_senders: list[str]
    trusted_associations: list[str]


WEBHOOK_EVENTS = (
    WebhookCreated, WebhookRotated, WebhookDeleted, WebhookRulesSet, WebhookRouteAdded, WebhookRouteRemoved,
    WebhookSecretResealed, WebhookTrustSet,
)


class Webhook(Aggregate):
    """Deliveries fan out to the owner first, then to each route, in the order routes were added."""

    @classmethod
    def create(
        cls, *, id: UUID, now: datetime, actor: str, endpoint_id: str, source_type: str,
        target_queue: str, trust_mode: str, token_sha256: str, secret_ciphertext: str | None,
    ) -> Webhook:
        """Creates a webhook; the owner endpoint has already admitted it under its ceiling."""
        webhook = cls()
        webhook.id = id
        webhook._record(
            WebhookCreated, timestamp=now, actor=actor, cause="create_webhook", endpoint_id=endpoint_id,
            source_type=source_type, target_queue=target_queue, trust_mode=trust_mode,
            token_sha256=token_sha256, secret_ciphertext=secret_ciphertext,
        )
        return webhook

    @property
    def webhook_id(self) -> str:
        return format_id(WEBHOOK_PREFIX, self.id)

    @property
    def targets(self) -> tuple[str, ...]:
        """The owner endpoint, then the routed endpoints."""
        return (self.endpoint_id, *(target for target, _ in self.routes))

    def rotate(self, *, now: datetime, actor: str, token_sha256: str, secret_ciphertext: str | None) -> None:
        """A new URL (and secret): the old ones stop working at once."""
        self._check_live()
        self._record(
            WebhookRotated, timestamp=now, actor=actor, cause="rotate_webhook",
            token_sha256=token_sha256, secret_ciphertext=secret_ciphertext,
        )

    def reseal_secret(self, *, now: datetime, actor: str, secret_ciphertext: str) -> None:
        """The same signing secret sealed under another key (a key rotation): URL and secret unchanged."""
        self._check_live()
        if self.secret_ciphertext is None:
            raise Conflict(f"webhook {self.webhook_id} has no signing secret")
        self._record(WebhookSecretResealed, timestamp=now, actor=actor, cause="reseal_secret",
                     secret_ciphertext=secret_ciphertext)

    def delete(self, *, now: datetime, actor: str) -> None:
        self._check_live()
        self._record(WebhookDeleted, timestamp=now, actor=actor, cause="delete_webhook")

    def set_rules(self, *, now: datetime, actor: str, rules: list[dict[str, Any]],
                  default_action: dict[str, Any] | None, params: dict[str, Any]) -> None:
        """Replaces the rules (validated by the caller against the grant and recent deliveries)."""
        self._check_live()
        self._record(
            WebhookRulesSet, timestamp=now, actor=actor, cause="set_webhook_rules", rules=rules,
            default_action=default_action, params=params,
        )

    def add_route(self, *, now: datetime, actor: str, target_endpoint_id: str) -> bool:
        """Routes deliveries to another endpoint too; idempotent. False when already routed."""
        self._check_live()
        if target_endpoint_id == self.endpoint_id:
            raise Forbidden("a webhook already delivers to its owner endpoint")
        if any(target == target_endpoint_id for target, _ in self.routes):
            return False
        self._record(WebhookRouteAdded, timestamp=now, actor=actor, cause="add_webhook_route",
                     target_endpoint_id=target_endpoint_id)
        return True

    def remove_route(self, *, now: datetime, actor: str, target_endpoint_id: str) -> bool:
        """Idempotent. False when there was no such route."""
        self._check_live()
        if not any(target == target_endpoint_id for target, _ in self.routes):
            return False
        self._record(WebhookRouteRemoved, timestamp=now, actor=actor, cause="remove_webhook_route",
                     target_endpoint_id=target_endpoint_id)
        return True

    def set_trust(self, *, now: datetime, actor: str, senders: list[str] | None,
                  associations: list[str] | None) -> TrustPolicy:
        """Replaces the trusted logins and associations (github and gitea only); empty lists clear them.
        The lists it already has (as checked: lower-cased logins, upper-cased associations) record
        nothing, as an unchanged `queue set` does."""
        self._check_live()
        if self.source_type not in TRUST_SOURCES:
            raise InvalidArgument(f"trusted senders apply to github and gitea webhooks, not {self.source_type}")
        policy = TrustPolicy(check_trusted_senders(senders), check_trusted_associations(associations))
        if policy == self.trust:
            return policy
        self._record(WebhookTrustSet, timestamp=now, actor=actor, cause="set_webhook_trust",
                     **{k: list(v) for k, v in policy.to_json().items()})
        return policy

    def _check_live(self) -> None:
        if self.deleted:
            raise Conflict(f"webhook {self.webhook_id} is deleted")

    def _mutate(self, event: DomainEvent) -> None:
        match event:
            case WebhookCreated():
                self.endpoint_id = event.endpoint_id
                self.source_type = event.source_type
                self.target_queue = event.target_queue
                self.trust_mode = event.trust_mode
                self.token_sha256 = event.token_sha256
                self.secret_ciphertext = event.secret_ciphertext
                self.created_at = event.timestamp
                self.deleted = False
                self.routes: tuple[tuple[str, datetime], ...] = ()
                self.rules: list[dict[str, Any]] = []
                self.default_action: dict[str, Any] | None = None
                self.params: dict[str, Any] = {}
                self.trust = NO_POLICY
            case WebhookRotated():
                self.token_sha256 = event.token_sha256
                self.secret_ciphertext = event.secret_ciphertext
            case WebhookSecretResealed():
                self.secret_ciphertext = event.secret_ciphertext
            case WebhookDeleted():
                self.deleted = True
            case WebhookRulesSet():
                self.rules = event.rules
                self.default_action = event.default_action
                self.params = event.params
            case WebhookRouteAdded():
                self.routes = (*self.routes, (event.target_endpoint_id, event.timestamp))
            case WebhookRouteRemoved():
                self.routes = tuple(r for r in self.routes if r[0] != event.target_endpoint_id)
            case WebhookTrustSet():
                self.trust = TrustPolicy(tuple(event.trusted_senders), tuple(event.trusted_associations))
            case _:  # pragma: no cover
                raise TypeError(f"Webhook cannot apply {type(event).__name__}")
