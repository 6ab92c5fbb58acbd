"""The operator API's rules of a webhook: the saved set, saving one, a dry run on a payload or a
stored delivery, and a replay over the latest deliveries; a candidate set comes in either form."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, get, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody
from litestar.status_codes import HTTP_200_OK

from application.webhooks import Webhooks
from interfaces.http.api.shared import Json, run
from interfaces.http.auth import caller_of


class RulesBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rule set, as `rules set --file` reads it: `{rules, default_action?, params?}`."""

    rules: list[dict[str, Any]]
    webhook_id: str | None = None  # what GET answers may be PUT back as it is; ignored
    default_action: dict[str, Any] | None = None
    params: Json = None  # any JSON, so that a non-object is refused as invalid_params, not 422


class RulesTestBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A dry run: the candidate (if any) at the top level, as in replay and `rules set --file`.
    The older nested form `{"rules": {rules, default_action?, params?}}` is still read."""

    payload: Json = msgspec.UNSET
    headers: dict[str, str] | None = None
    event_id: str | None = None
    rules: list[dict[str, Any]] | RulesBody | msgspec.UnsetType = msgspec.UNSET
    default_action: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    params: Json = msgspec.UNSET


class ReplayBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A replay: the candidate at the top level (`{rules, default_action?, params?, last?}`);
    the older nested form `{"rules": {rules, …}, "last"}` is still read."""

    rules: list[dict[str, Any]] | RulesBody
    default_action: dict[str, Any] | None = None
    params: Json = None
    webhook_id: str | None = None  # a GET /rules answer may be sent as the candidate; ignored
    last: int | None = None


def _rules_document(body: RulesBody) -> dict[str, Any]:
    document: dict[str, Any] = {"rules": body.rules}
    if body.default_action is not None:
        document["default_action"] = body.default_action
    if body.params is not None:
        document["params"] = body.params
    return document


def _candidate(body: RulesTestBody | ReplayBody) -> dict[str, Any] | None:
    """The candidate rule set of a dry run or replay, whichever form it came in (None: none given)."""
    if isinstance(body.rules, RulesBody):
        return _rules_document(body.rules)
    given = {name: getattr(body, name) for name in ("rules", "default_action", "params")}
    document = {name: value for name, value in given.items() if value is not msgspec.UNSET}
    if not document:
        return None
    return {name: value for name, value in document.items() if value is not None or name == "rules"}


def rule_routes(webhooks: Webhooks) -> list[HTTPRouteHandler]:
    """`/webhooks/{webhook_id}/rules`, its dry run and its replay."""

    @get("/webhooks/{webhook_id:str}/rules", summary="A webhook's saved rules")
    async def get_rules(request: Request, webhook_id: FromPath[str]) -> dict[str, Any]:
        return await run(webhooks.rules, webhook_id, caller=caller_of(request))

    @put("/webhooks/{webhook_id:str}/rules", summary="Save a webhook's rules",
         description="Validated, then dry-run over the 50 latest deliveries; any fault refuses the save.")
    async def put_rules(request: Request, webhook_id: FromPath[str], data: JSONBody[RulesBody]) -> dict[str, Any]:
        return await run(webhooks.set_rules, webhook_id, _rules_document(data), caller=caller_of(request))

    @post("/webhooks/{webhook_id:str}/rules/test", status_code=HTTP_200_OK,
          summary="Dry-run saved or candidate rules on a payload or a stored delivery",
          description="Exactly one of payload (+ headers) or event_id; the candidate, if any, as top-level "
                      "rules, default_action, params (the object `rules set --file` reads).")
    async def test_rules(request: Request, webhook_id: FromPath[str], data: JSONBody[RulesTestBody]) -> dict[str, Any]:
        has_payload = data.payload is not msgspec.UNSET
        return await run(
            webhooks.test_rules, webhook_id, caller=caller_of(request),
            payload=data.payload if has_payload else None, has_payload=has_payload, headers=data.headers,
            event_id=data.event_id, candidate=_candidate(data),
        )

    @post("/webhooks/{webhook_id:str}/rules/replay", status_code=HTTP_200_OK,
          summary="Replay candidate rules over the last N stored deliveries",
          description="The candidate as top-level rules, default_action, params (as in the dry run); "
                      "`last` defaults to 100. Each changed delivery is named by event_id, kind and title.")
    async def replay_rules(request: Request, webhook_id: FromPath[str], data: JSONBody[ReplayBody]) -> dict[str, Any]:
        return await run(webhooks.replay, webhook_id, _candidate(data), caller=caller_of(request),
                         last=data.last)

    return [get_rules, put_rules, test_rules, replay_rules]
