"""Queues: one endpoint's queues with their controls and load (pause, resume, limits), and the
dead-letter view's "Retry all" (CONTRACT §13). Thin: parse the form, call the application."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, URLEncodedBody
from litestar.response import Redirect

from domain.queue import check_max_claims_per_minute, check_max_in_flight
from interfaces.http.auth import caller_of
from interfaces.http.board import forms
from interfaces.http.board.pages import Board


MAX_IN_FLIGHT, RATE = "max in flight", "claims per minute"
"""The controls form's limit fields, as its labels say them; their refusals say them the same way."""


def _max_in_flight(form: forms.Form) -> int | None:
    """The form's max in flight: a whole number in the domain's range, refused in the form's words (not
    the API's `max_in_flight`); the application checks it again, as for every caller."""
    return check_max_in_flight(forms.whole_number(form, "max_in_flight", MAX_IN_FLIGHT), name=MAX_IN_FLIGHT)


def _rate(form: forms.Form) -> int | None:
    """The form's claims per minute, likewise (not `max_claims_per_minute`)."""
    return check_max_claims_per_minute(forms.whole_number(form, "max_claims_per_minute", RATE), name=RATE)


def queues_page(board: Board, request: Request, ref: str, *, status: int = 200, error: str | None = None) -> Response:
    listed = board.app.queue_controls(ref, caller=caller_of(request))
    return board.render(request, "queues.html", status=status, section="endpoints", error=error, **listed)


class QueuePages(Controller):
    @get("/endpoints/{ref:str}/queues", sync_to_thread=True)
    def queues(self, request: Request, board: NamedDependency[Board], ref: FromPath[str]) -> Response:
        return queues_page(board, request, ref)

    @post("/endpoints/{ref:str}/queues/{queue:str}", sync_to_thread=True)
    def set_queue(self, request: Request, board: NamedDependency[Board], ref: FromPath[str], queue: FromPath[str],
                  data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def act() -> Response:
            board.app.set_queue_controls(
                ref, queue, caller=caller_of(request), paused=forms.text(data, "paused") == "1",
                max_in_flight=_max_in_flight(data), max_claims_per_minute=_rate(data))
            return Redirect(f"/endpoints/{quote(ref)}/queues?done=queue_set", status_code=303)

        return board.form(act, lambda **refused: queues_page(board, request, ref, **refused), subject=True)

    @post("/dead-letters/retry", sync_to_thread=True)
    def retry_all(self, request: Request, board: NamedDependency[Board],
                  data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        endpoint, queue = forms.text(data, "endpoint"), forms.text(data, "queue") or None
        back = {"state": "dead", "endpoint": endpoint, **({"queue": queue} if queue else {})}

        answer = board.app.bulk_retry(endpoint, caller=caller_of(request), dead_letters=True, queue=queue)  # a refusal: its page
        done = {"done": "bulk_retried", "retried": answer["retried"], "bulk": answer["bulk_action_id"]}
        return Redirect(f"/todos?{urlencode(back | done)}", status_code=303)
