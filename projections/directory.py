"""The directory: endpoints, operators and the credential index (SHA-256 hashes only)."""

from __future__ import annotations

from domain.endpoint import DefaultLeaseSet, EndpointRevoked, EndpointVended
from domain.events import DomainEvent
from domain.names import ENDPOINT_PREFIX, OPERATOR_PREFIX, format_id
from domain.operator import ApiTokenMinted, OperatorCreated
from projections.base import Op, as_json, micros


class Directory:
    name = "directory"
    inline = False
    tables = ("sb_endpoints", "sb_operators", "sb_credentials")
    ddl = (
        "CREATE TABLE IF NOT EXISTS sb_endpoints (endpoint_id TEXT PRIMARY KEY, slug TEXT NOT NULL UNIQUE,"
        " agent TEXT NOT NULL, owner TEXT NOT NULL, queues TEXT NOT NULL, verbs TEXT NOT NULL,"
        " webhook_max INTEGER NOT NULL, source_types TEXT NOT NULL, webhook_queues TEXT NOT NULL,"
        " default_lease_seconds INTEGER, expires_at BIGINT, revoked_at BIGINT, created_at BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS sb_operators (name TEXT PRIMARY KEY, operator_id TEXT NOT NULL,"
        " created_at BIGINT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS sb_credentials (sha256 TEXT PRIMARY KEY, kind TEXT NOT NULL,"
        " subject_id TEXT NOT NULL, created_at BIGINT NOT NULL)",
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
            case ApiTokenMinted():
                return [(
                    "INSERT INTO sb_credentials (sha256, kind, subject_id, created_at) VALUES (%s, 'operator', %s, %s)",
                    (event.token_sha256, format_id(OPERATOR_PREFIX, event.originator_id), at),
                )]
        return []
