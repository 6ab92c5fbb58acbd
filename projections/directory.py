"""The directory: endpoints, operators and the credential index (SHA-256 hashes only)."""

from __future__ import annotations

from domain.endpoint import DefaultLeaseSet, EndpointRevoked, EndpointVended
from domain.events import DomainEvent
from domain.names import ENDPOINT_PREFIX, OPERATOR_PREFIX, format_id
from domain.operator import ApiTokenMinted, OperatorCreated
from domain.todo import TODO_EVENTS
from domain.webhook import (
    WEBHOOK_PREFIX, WebhookCreated, WebhookDeleted, WebhookRotated, WebhookRouteAdded, WebhookRouteRemoved,
    WebhookTrustSet,
)
from projections.base import Op, as_json, micros


class Directory:
    name = "directory"
    inline = False
    tables = ("sb_endpoints", "sb_operators", "sb_credentials", "sb_webhooks", "sb_webhook_routes", "sb_webhook_trust")
    ignores = TODO_EVENTS
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_endpoints (endpoint_id TEXT PRIMARY KEY, slug TEXT NOT NULL UNIQUE,"
        " agent TEXT NOT NULL, owner TEXT NOT NULL, queues TEXT NOT NULL, verbs TEXT NOT NULL,"
        " webhook_max INTEGER NOT NULL, source_types TEXT NOT NULL, webhook_queues TEXT NOT NULL,"
        " default_lease_seconds INTEGER, expires_at BIGINT, revoked_at BIGINT, created_at BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS sb_operators (name TEXT PRIMARY KEY, operator_id TEXT NOT NULL,"
        " created_at BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS sb_credentials (sha256 TEXT PRIMARY KEY, kind TEXT NOT NULL,"
        " subject_id TEXT NOT NULL, created_at BIGINT NOT NULL)",
        "CREATE INDEX IF NOT EXISTS sb_credentials_subject ON sb_credentials (subject_id)",
        "CREATE TABLE IF NOT EXISTS sb_webhooks (webhook_id TEXT PRIMARY KEY, endpoint_id TEXT NOT NULL,"
        " source_type TEXT NOT NULL, target_queue TEXT NOT NULL, trust_mode TEXT NOT NULL,"
        " created_at BIGINT NOT NULL, rotated_at BIGINT, deleted_at BIGINT)",
        "CREATE INDEX IF NOT EXISTS sb_webhooks_endpoint ON sb_webhooks (endpoint_id, created_at)",
        "CREATE TABLE IF NOT EXISTS sb_webhook_routes (webhook_id TEXT NOT NULL, target_endpoint_id TEXT NOT NULL,"
        " granted_at BIGINT NOT NULL, PRIMARY KEY (webhook_id, target_endpoint_id))",
        # a table of its own (not columns of sb_webhooks), so an existing store needs no migration
        "CREATE TABLE IF NOT EXISTS sb_webhook_trust (webhook_id TEXT PRIMARY KEY, trusted_senders TEXT NOT NULL,"
        " trusted_associations TEXT NOT NULL, set_at BIGINT NOT NULL, set_by TEXT NOT NULL)",
    )

    def ops(self, event: DomainEvent, position: int | None) -> list[Op]:
        at = micros(event.timestamp)
        match event:
            case EndpointVended():
                endpoint_id = format_id(ENDPOINT_PREFIX, event.originator_id)
                return [
                    (
                        "INSERT INTO sb_endpoints (endpoint_id, slug, agent, owner, queues, verbs, webhook_max,"
                        " source_types, webhook_queues, default_lease_seconds, expires_at, revoked_at, created_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, %s)",
                        (endpoint_id, event.slug, event.agent, event.owner, as_json(list(event.queues)),
                         as_json(list(event.verbs)), event.webhook_max, as_json(list(event.source_types)),
                         as_json(list(event.webhook_queues)), event.default_lease_seconds,
                         micros(event.expires_at), at),
                    ),
                    (
                        "INSERT INTO sb_credentials (sha256, kind, subject_id, created_at) VALUES (%s, 'endpoint', %s, %s)",
                        (event.credential_sha256, endpoint_id, at),
                    ),
                ]
            case DefaultLeaseSet():
                return [(
                    "UPDATE sb_endpoints SET default_lease_seconds = %s WHERE endpoint_id = %s",
                    (event.default_lease_seconds, format_id(ENDPOINT_PREFIX, event.originator_id)),
                )]
            case EndpointRevoked():
                return [(
                    "UPDATE sb_endpoints SET revoked_at = %s WHERE endpoint_id = %s",
                    (at, format_id(ENDPOINT_PREFIX, event.originator_id)),
                )]
            case OperatorCreated():
                return [(
                    "INSERT INTO sb_operators (name, operator_id, created_at) VALUES (%s, %s, %s)",
                    (event.name, format_id(OPERATOR_PREFIX, event.originator_id), at),
                )]
            case WebhookCreated():
                webhook_id = format_id(WEBHOOK_PREFIX, event.originator_id)
                return [
                    (
                        "INSERT INTO sb_webhooks (webhook_id, endpoint_id, source_type, target_queue, trust_mode,"
                        " created_at, rotated_at, deleted_at) VALUES (%s, %s, %s, %s, %s, %s, NULL, NULL)",
                        (webhook_id, event.endpoint_id, event.source_type, event.target_queue, event.trust_mode, at),
                    ),
                    (
                        "INSERT INTO sb_credentials (sha256, kind, subject_id, created_at) VALUES (%s, 'webhook', %s, %s)",
                        (event.token_sha256, webhook_id, at),
                    ),
                ]
            case WebhookRotated():
                webhook_id = format_id(WEBHOOK_PREFIX, event.originator_id)
                return [
                    ("DELETE FROM sb_credentials WHERE kind = 'webhook' AND subject_id = %s", (webhook_id,)),
                    (
                        "INSERT INTO sb_credentials (sha256, kind, subject_id, created_at) VALUES (%s, 'webhook', %s, %s)",
                        (event.token_sha256, webhook_id, at),
                    ),
                    ("UPDATE sb_webhooks SET rotated_at = %s WHERE webhook_id = %s", (at, webhook_id)),
                ]
            case WebhookDeleted():
                webhook_id = format_id(WEBHOOK_PREFIX, event.originator_id)
                return [
                    ("DELETE FROM sb_credentials WHERE kind = 'webhook' AND subject_id = %s", (webhook_id,)),
                    ("DELETE FROM sb_webhook_routes WHERE webhook_id = %s", (webhook_id,)),
                    ("UPDATE sb_webhooks SET deleted_at = %s WHERE webhook_id = %s", (at, webhook_id)),
                ]
            case WebhookRouteAdded():
                return [(
                    "INSERT INTO sb_webhook_routes (webhook_id, target_endpoint_id, granted_at) VALUES (%s, %s, %s)",
                    (format_id(WEBHOOK_PREFIX, event.originator_id), event.target_endpoint_id, at),
                )]
            case WebhookRouteRemoved():
                return [(
                    "DELETE FROM sb_webhook_routes WHERE webhook_id = %s AND target_endpoint_id = %s",
                    (format_id(WEBHOOK_PREFIX, event.originator_id), event.target_endpoint_id),
                )]
            case WebhookTrustSet():
                webhook_id = format_id(WEBHOOK_PREFIX, event.originator_id)
                return [
                    ("DELETE FROM sb_webhook_trust WHERE webhook_id = %s", (webhook_id,)),
                    ("INSERT INTO sb_webhook_trust (webhook_id, trusted_senders, trusted_associations, set_at, set_by)"
                     " VALUES (%s, %s, %s, %s, %s)",
                     (webhook_id, as_json(event.trusted_senders), as_json(event.trusted_associations), at, event.actor)),
                ]
            case ApiTokenMinted():
                return [(
                    "INSERT INTO sb_credentials (sha256, kind, subject_id, created_at) VALUES (%s, 'operator', %s, %s)",
                    (event.token_sha256, format_id(OPERATOR_PREFIX, event.originator_id), at),
                )]
        return []
