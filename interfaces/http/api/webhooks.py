"""The operator API's webhooks: listing and creating them, rotating a URL and secret, deleting
one, and whom a github or gitea webhook trusts (its rules: interfaces/http/api/rules.py)."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, get, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED

from application.webhooks import Webhooks
from domain.names import SOURCE_TYPES
from interfaces.http.api.shared import run
from interfaces.http.auth import caller_of


class WebhookBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    endpoint: str
    source_type: Annotated[str, msgspec.Meta(
        description=f"the sender, one of {', '.join(SOURCE_TYPES)} (and allowed for the endpoint)")]
    target_queue: str


class TrustBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Who may create work through a github or gitea webhook; absent or empty lists trust everyone."""

    trusted_senders: list[str] = msgspec.field(default_factory=list)
    trusted_associations: list[str] = msgspec.field(default_factory=list)


def webhook_routes(webhooks: Webhooks) -> list[HTTPRouteHandler]:
    """`/webhooks` and a webhook's rotate, delete and trust."""

    @get("/webhooks", summary="List webhooks")
    async def list_webhooks(request: Request, endpoint: FromQuery[str | None] = None) -> dict[str, Any]:
        return await run(webhooks.list, caller=caller_of(request), endpoint=endpoint)

    @post("/webhooks", status_code=HTTP_201_CREATED, summary="Create a webhook",
          description="The ingest URL and signing secret appear in this answer only.")
    async def create_webhook(request: Request, data: JSONBody[WebhookBody]) -> dict[str, Any]:
        return await run(webhooks.create, caller=caller_of(request), endpoint=data.endpoint,
                         source_type=data.source_type, target_queue=data.target_queue)

    @post("/webhooks/{webhook_id:str}/rotate", status_code=HTTP_200_OK, summary="Rotate a webhook's URL and secret")
    async def rotate_webhook(request: Request, webhook_id: FromPath[str]) -> dict[str, Any]:
        return await run(webhooks.rotate, webhook_id, caller=caller_of(request))

    @post("/webhooks/{webhook_id:str}/delete", status_code=HTTP_200_OK, summary="Delete a webhook")
    async def delete_webhook(request: Request, webhook_id: FromPath[str]) -> dict[str, Any]:
        return await run(webhooks.delete, webhook_id, caller=caller_of(request))

    @put("/webhooks/{webhook_id:str}/trust", summary="Set a webhook's trusted senders and associations",
         description="Replaces both lists (github and gitea webhooks); a delivery from anyone else is held in "
                     "the owner's quarantine. Empty lists trust every sender.")
    async def put_trust(request: Request, webhook_id: FromPath[str], data: JSONBody[TrustBody]) -> dict[str, Any]:
        return await run(webhooks.set_trust, webhook_id, caller=caller_of(request), senders=data.trusted_senders,
                         associations=data.trusted_associations)

    return [list_webhooks, create_webhook, rotate_webhook, delete_webhook, put_trust]
