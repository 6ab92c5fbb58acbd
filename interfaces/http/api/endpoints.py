"""The operator API's endpoints: vending, listing and revoking them, and pushing an
operator-authored todo into one."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_200_OK, HTTP_201_CREATED

from application.service import Switchboard
from interfaces.http.api.shared import Json, run
from interfaces.http.auth import caller_of


class VendBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agent: str
    queues: list[str]
    verbs: list[str] | None = None
    webhook_max: int | None = None
    source_types: list[str] | None = None
    webhook_queues: list[str] | None = None
    ttl_seconds: int | None = None
    default_lease_ttl_seconds: int | None = None


class PushBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    title: str
    queue: str | None = None
    payload: Json = None
    key: str | None = None
    not_before: str | None = None  # RFC 3339: pending but not claimable (nor rung) until then


def endpoint_routes(app: Switchboard) -> list[HTTPRouteHandler]:
    """`/endpoints` and an endpoint's revoke and push (its queues: interfaces/http/api/queues.py)."""

    @post("/endpoints", status_code=HTTP_201_CREATED, summary="Vend an endpoint",
          description="The credential and mcp_json appear in this answer only.")
    async def vend(request: Request, data: JSONBody[VendBody]) -> dict[str, Any]:
        return await run(
            app.vend, data.agent, queues=data.queues, caller=caller_of(request), verbs=data.verbs,
            webhook_max=data.webhook_max, source_types=data.source_types, webhook_queues=data.webhook_queues,
            ttl_seconds=data.ttl_seconds, default_lease_seconds=data.default_lease_ttl_seconds,
        )

    @get("/endpoints", summary="List this operator's endpoints")
    async def list_endpoints(request: Request) -> dict[str, Any]:
        return {"endpoints": await run(app.list_endpoints, caller=caller_of(request))}

    @post("/endpoints/{ref:str}/revoke", status_code=HTTP_200_OK, summary="Revoke an endpoint")
    async def revoke(request: Request, ref: FromPath[str]) -> dict[str, Any]:
        return await run(app.revoke, ref, caller=caller_of(request))

    @post("/endpoints/{ref:str}/todos", summary="Push an operator-authored todo",
          description="201 with the new todo; 200 with the live todo a repeated key maps to.",
          responses={HTTP_200_OK: ResponseSpec(data_container=dict[str, Any], generate_examples=False,
                                               description="The live todo a repeated key maps to")})
    async def push(request: Request, ref: FromPath[str], data: JSONBody[PushBody]) -> Response[dict[str, Any]]:
        answer = await run(app.push, ref, data.title, caller=caller_of(request), queue=data.queue,
                           payload=data.payload, key=data.key, not_before=data.not_before)
        return Response(answer, status_code=HTTP_201_CREATED if answer["created"] else HTTP_200_OK)

    return [vend, list_endpoints, revoke, push]
