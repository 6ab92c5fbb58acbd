"""The operator API's queues of an endpoint: their controls and load, and pausing, resuming or
limiting one."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, get, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody

from application.service import Switchboard
from interfaces.http.api.shared import run
from interfaces.http.auth import caller_of


class QueueControlsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The controls to change; a field left out stays as it is, null removes a limit."""

    paused: bool | msgspec.UnsetType = msgspec.UNSET
    max_in_flight: int | None | msgspec.UnsetType = msgspec.UNSET
    max_claims_per_minute: int | None | msgspec.UnsetType = msgspec.UNSET


def queue_routes(app: Switchboard) -> list[HTTPRouteHandler]:
    """`/endpoints/{ref}/queues` and one queue's controls."""

    @get("/endpoints/{ref:str}/queues", summary="An endpoint's queues with their controls and load")
    async def list_queues(request: Request, ref: FromPath[str]) -> dict[str, Any]:
        return await run(app.queue_controls, ref, caller=caller_of(request))

    @put("/endpoints/{ref:str}/queues/{queue:str}", summary="Pause, resume or limit one of an endpoint's queues",
         description="Fields left out stay as they are; null removes a limit. Answers the queue as now set.")
    async def set_queue(request: Request, ref: FromPath[str], queue: FromPath[str],
                        data: JSONBody[QueueControlsBody]) -> dict[str, Any]:
        changes = {name: getattr(data, name) for name in ("paused", "max_in_flight", "max_claims_per_minute")
                   if getattr(data, name) is not msgspec.UNSET}
        return await run(app.set_queue_controls, ref, queue, caller=caller_of(request), **changes)

    return [list_queues, set_queue]
