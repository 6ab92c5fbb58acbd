"""The operator API's audit log: the last sealed link of its hash chain (docs/audit.md)."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.handlers import HTTPRouteHandler

from application.audit import AuditLog
from interfaces.http.api.shared import run
from interfaces.http.auth import caller_of


def audit_routes(audit: AuditLog) -> list[HTTPRouteHandler]:
    """`/audit/head`."""

    @get("/audit/head", summary="The last sealed link of the audit hash chain",
         description="`{position, hash, time}`: the last log position sealed into the chain (docs/audit.md), its "
                     "hash and its event's time; compare it with an export's last `hash`.")
    async def audit_head(request: Request) -> dict[str, Any]:
        caller_of(request)
        return await run(audit.head)

    return [audit_head]
