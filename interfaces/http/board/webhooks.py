"""Webhooks: the list and the mint form, one webhook's page (routes, deliveries, trusted senders,
rules), rotating its secret, deleting it, setting who it trusts, and testing, replaying and saving
a candidate rule set."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect

from application.service import Caller
from application.webhooks import DEFAULT_REPLAY_LAST  # the replay's default N, the CLI's too
from domain.endpoint import SOURCE_TYPES
from domain.errors import InvalidArgument, NotFound
from domain.trust import ASSOCIATIONS
from interfaces.http.auth import caller_of
from interfaces.http.board import forms
from interfaces.http.board.events import EVENTS_SHOWN
from interfaces.http.board.pages import Board

# a rules step: given the caller, the parsed candidate and the page's context, fill the context
# (test, replay) or answer itself (save: a redirect)
RulesStep = Callable[[Caller, dict[str, Any], dict[str, Any]], Response | None]


def webhooks_page(board: Board, request: Request, *, status: int = 200, error: str | None = None,
                  form: forms.Form = None) -> Response:
    """The list and the mint form, offering the endpoints active now (by the application's clock)."""
    caller = caller_of(request)
    endpoints = board.app.endpoints_now(caller=caller)
    active = [e for e in endpoints if e["status"] == "active"]
    return board.render(
        request, "webhooks.html", status=status, section="webhooks", error=error, form=form or {},
        rows=board.webhooks.list(caller=caller)["webhooks"], slugs={e["endpoint_id"]: e["slug"] for e in endpoints},
        active=active, source_types=SOURCE_TYPES,
        webhook_queues=sorted({q for e in active for q in e["webhook_queues"]}),
    )


def webhook_context(board: Board, caller: Caller, webhook_id: str, *, rules_text: str | None = None) -> dict[str, Any]:
    rules = board.webhooks.rules(webhook_id, caller=caller)  # not_found for a foreign or deleted one
    webhook = next((w for w in board.webhooks.list(caller=caller)["webhooks"]
                    if w["webhook_id"] == rules["webhook_id"]), None)
    if webhook is None:
        raise NotFound(f"webhook {webhook_id} not found")
    endpoints = {e["endpoint_id"]: e for e in board.app.list_endpoints(caller=caller)}
    document = {k: rules[k] for k in ("rules", "default_action", "params")}
    return {
        "webhook": webhook, "owner": endpoints.get(webhook["endpoint_id"]),
        "routes": board.webhooks.routes(webhook_id, caller=caller)["routes"], "slugs": {
            k: e["slug"] for k, e in endpoints.items()},
        "deliveries": board.webhooks.list_events(caller=caller, webhook_id=webhook["webhook_id"],
                                                 limit=EVENTS_SHOWN)["events"],
        "rules_text": rules_text if rules_text is not None else json.dumps(document, indent=2, ensure_ascii=False),
        "saved_rules": len(rules["rules"]), "last": DEFAULT_REPLAY_LAST, "event_id": None,
        "test": None, "replay": None, "section": "webhooks", "associations": ASSOCIATIONS, "trust_form": {},
    }


def rules_form(board: Board, request: Request, webhook_id: str, data: forms.Form, step: RulesStep) -> Response:
    """Runs a rules step on the textarea's candidate; the page keeps the candidate text either way."""
    caller = caller_of(request)
    text = str((data or {}).get("rules") or "")
    context = webhook_context(board, caller, webhook_id, rules_text=text)  # not_found: a 404 page
    context["event_id"] = forms.text(data, "event_id") or None

    def act() -> Response:
        last = forms.whole_number(data, "last", "last N")
        context["last"] = last if last is not None else DEFAULT_REPLAY_LAST
        try:
            candidate = json.loads(text)
        except ValueError as error:
            raise InvalidArgument(f"the rules are not valid JSON: {error}") from None
        if not isinstance(candidate, dict):
            raise InvalidArgument("the rules must be a JSON object {rules, default_action?, params?}")
        answer = step(caller, candidate, context)
        return answer if isinstance(answer, Response) else board.render(request, "webhook.html", **context)

    return board.form(act, lambda status, error: board.render(
        request, "webhook.html", status=status, **(context | {"error": error})))


class WebhookPages(Controller):
    @get("/webhooks", sync_to_thread=True)
    def webhooks_list(self, request: Request, board: NamedDependency[Board]) -> Response:
        return webhooks_page(board, request)

    @post("/webhooks", sync_to_thread=True)
    def webhook_create(self, request: Request, board: NamedDependency[Board],
                       data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def act() -> Response:
            minted = board.webhooks.create(
                caller=caller_of(request), endpoint=forms.text(data, "endpoint"),
                source_type=forms.text(data, "source_type"), target_queue=forms.text(data, "target_queue"))
            return board.render(request, "webhook_minted.html", section="webhooks", minted=minted, rotated=False)

        return board.form(act, lambda **refused: webhooks_page(board, request, form=data or {}, **refused))

    @get("/webhooks/{webhook_id:str}", sync_to_thread=True)
    def webhook_page(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str]) -> Response:
        return board.render(request, "webhook.html", **webhook_context(board, caller_of(request), webhook_id))

    @post("/webhooks/{webhook_id:str}/rotate", sync_to_thread=True)
    def webhook_rotate(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str]) -> Response:
        minted = board.webhooks.rotate(webhook_id, caller=caller_of(request))
        return board.render(request, "webhook_minted.html", section="webhooks", minted=minted, rotated=True)

    @post("/webhooks/{webhook_id:str}/delete", sync_to_thread=True)
    def webhook_delete(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str]) -> Response:
        board.webhooks.delete(webhook_id, caller=caller_of(request))
        return Redirect("/webhooks?done=webhook_deleted", status_code=303)

    @post("/webhooks/{webhook_id:str}/trust", sync_to_thread=True)
    def webhook_trust(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str],
                      data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        """Replaces the trusted logins and associations; "Trust everyone" (`clear`) empties both."""
        caller = caller_of(request)
        clear = bool(forms.text(data, "clear"))
        senders = [] if clear else forms.names(forms.text(data, "senders"))
        associations = [] if clear else forms.every(data, "associations")

        def act() -> Response:
            saved = board.webhooks.set_trust(webhook_id, caller=caller, senders=senders, associations=associations)
            return Redirect(f"/webhooks/{quote(saved['webhook_id'])}?done=trust_saved", status_code=303)

        def refused(status: int, error: str) -> Response:
            context = webhook_context(board, caller, webhook_id)  # not_found: a 404 page
            context.update(error=error, trust_form={"senders": forms.text(data, "senders"),
                                                    "associations": associations})
            return board.render(request, "webhook.html", status=status, **context)

        return board.form(act, refused, subject=True)

    @post("/webhooks/{webhook_id:str}/rules/test", sync_to_thread=True)
    def rules_test(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str],
                   data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def step(caller: Caller, candidate: dict[str, Any], context: dict[str, Any]) -> None:
            if not context["event_id"]:
                raise InvalidArgument("choose a stored delivery to test the rules against")
            context["test"] = board.webhooks.test_rules(webhook_id, caller=caller, event_id=context["event_id"],
                                                        candidate=candidate)

        return rules_form(board, request, webhook_id, data, step)

    @post("/webhooks/{webhook_id:str}/rules/replay", sync_to_thread=True)
    def rules_replay(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str],
                     data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def step(caller: Caller, candidate: dict[str, Any], context: dict[str, Any]) -> None:
            context["replay"] = board.webhooks.replay(webhook_id, candidate, caller=caller, last=context["last"])

        return rules_form(board, request, webhook_id, data, step)

    @post("/webhooks/{webhook_id:str}/rules", sync_to_thread=True)
    def rules_save(self, request: Request, board: NamedDependency[Board], webhook_id: FromPath[str],
                   data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def step(caller: Caller, candidate: dict[str, Any], context: dict[str, Any]) -> Response:
            saved = board.webhooks.set_rules(webhook_id, candidate, caller=caller)
            return Redirect(f"/webhooks/{quote(saved['webhook_id'])}?done=rules_saved", status_code=303)

        return rules_form(board, request, webhook_id, data, step)
