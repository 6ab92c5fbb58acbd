"""Endpoints: the operator's endpoints with their status now, vending one, revoking one."""

from __future__ import annotations

import json
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect

from domain.endpoint import ALL_VERBS, DEFAULT_WEBHOOK_MAX, SOURCE_TYPES, check_default_lease
from domain.names import DEFAULT_SOURCE_TYPES
from domain.errors import InvalidArgument
from interfaces.http.auth import caller_of
from interfaces.http.board import forms
from interfaces.http.board.pages import Board


DEFAULT_LEASE = "default lease seconds"
"""The vend form's lease field, as its label says it; its refusals say it the same way."""


def _default_lease(form: forms.Form) -> int | None:
    """The vend form's default lease: a whole number in the domain's range, refused in the form's
    words (not the API's `default lease`); the application checks it again, as for every caller."""
    return check_default_lease(forms.whole_number(form, "default_lease", DEFAULT_LEASE), name=DEFAULT_LEASE)


def endpoints_page(board: Board, request: Request, *, status: int = 200, error: str | None = None,
                   form: forms.Form = None) -> Response:
    """The list (each row's `status` by the application's clock) and the vend form, re-shown after a
    refusal with what was ticked."""
    given = bool(forms.text(form, "scope"))
    return board.render(
        request, "endpoints.html", status=status, section="endpoints", error=error,
        rows=board.app.endpoints_now(caller=caller_of(request)), all_verbs=ALL_VERBS, source_types=SOURCE_TYPES,
        form=form or {}, chosen_verbs=set(forms.every(form, "verbs")) if given else set(ALL_VERBS),
        chosen_sources=set(forms.every(form, "source_types")) if given else set(DEFAULT_SOURCE_TYPES),
        default_webhook_max=DEFAULT_WEBHOOK_MAX,
    )


class EndpointPages(Controller):
    @get("/endpoints", sync_to_thread=True)
    def endpoints(self, request: Request, board: NamedDependency[Board]) -> Response:
        return endpoints_page(board, request)

    @post("/endpoints", sync_to_thread=True)
    def vend(self, request: Request, board: NamedDependency[Board],
             data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def act() -> Response:
            webhook_max = forms.whole_number(data, "webhook_max", "webhook ceiling")
            verbs, source_types = None, None
            if forms.text(data, "scope"):  # the form's checkboxes were shown: what is ticked is the choice
                verbs, source_types = forms.every(data, "verbs"), forms.every(data, "source_types")
                if not verbs:
                    raise InvalidArgument("choose at least one verb")
            vended = board.app.vend(
                forms.text(data, "agent"), queues=forms.names(forms.text(data, "queues")), caller=caller_of(request),
                verbs=verbs, source_types=source_types,
                webhook_max=DEFAULT_WEBHOOK_MAX if webhook_max is None else webhook_max,
                webhook_queues=forms.names(forms.text(data, "webhook_queues")) or None,
                ttl_seconds=forms.lifetime(forms.text(data, "ttl")),
                default_lease_seconds=_default_lease(data),
            )
            return board.render(request, "vended.html", section="endpoints", vended=vended,
                                mcp_json=json.dumps(vended["mcp_json"], indent=2))

        return board.form(act, lambda **refused: endpoints_page(board, request, form=data or {}, **refused))

    @post("/endpoints/{ref:str}/revoke", sync_to_thread=True)
    def revoke(self, request: Request, board: NamedDependency[Board], ref: FromPath[str]) -> Response:
        def act() -> Response:
            board.app.revoke(ref, caller=caller_of(request))
            return Redirect("/endpoints?done=revoked", status_code=303)

        return board.form(act, lambda **refused: endpoints_page(board, request, **refused), subject=True)
