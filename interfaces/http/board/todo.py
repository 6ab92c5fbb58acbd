"""One todo's page: its state, why it is in it (the story), history and payload (live region), and the
actions an operator takes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, URLEncodedBody
from litestar.response import Redirect

from application.service import Caller, Switchboard
from domain.errors import NotFound
from domain.names import QUARANTINE
from domain.queue import check_delay_seconds
from interfaces.http.auth import caller_of
from interfaces.http.board import forms
from interfaces.http.board.filters import size
from interfaces.http.board.pages import Board, live_position, wants_partial


def todo_context(board: Board, caller: Caller, todo_id: str) -> dict[str, Any]:
    todo = board.app.todo_now(todo_id, caller=caller)  # `claimable` by the application's clock
    history = board.app.history(todo_id, caller=caller, payloads=False)["events"]
    for event in history:  # the payload is shown once, in its own panel
        if "payload" in event.get("omitted", ()):
            event["data"]["payload"] = f"«{size(todo['payload_size'])}, shown under Payload»"
    endpoint = next((e for e in board.app.list_endpoints(caller=caller)
                     if e["endpoint_id"] == todo["endpoint_id"]), None)
    return {
        "todo": todo, "history": history, "endpoint": endpoint, "claimable": todo["claimable"],
        "explained": board.app.explain(todo_id, caller=caller),  # the story and its because, in sentences
        "quarantined": todo["queue"] == QUARANTINE,
        "release_queues": [q for q in (endpoint["queues"] if endpoint else []) if q != QUARANTINE],
        "live_src": f"/todos/{quote(todo['id'])}",
    }


# an action's command: the application, the todo, the form's fields and the caller
Command = Callable[[Switchboard, str, forms.Form, Caller], Any]


SNOOZE = "snooze seconds"
"""The release form's delay field, as its label says it; its refusals say it the same way."""


def _snooze(form: forms.Form) -> int | None:
    """The release form's snooze: a whole number in the domain's range, refused in the form's words
    (not the API's `delay_seconds`); the application checks it again, as for every caller."""
    seconds = forms.whole_number(form, "delay_seconds", SNOOZE)
    check_delay_seconds(seconds, name=SNOOZE)
    return seconds


def _summary(form: forms.Form) -> str | None:
    return forms.text(form, "summary") or None


def _finish(command: Callable[..., Any]) -> Command:
    """complete or fail: with the form's JSON result and summary."""
    return lambda app, todo_id, form, caller: command(
        app, todo_id, caller=caller, result=forms.json_field(form, "result", "result"), summary=_summary(form))


# `POST /todos/{id}/<action>`: the `?done=` flash key after it, and the command the form's fields call
ACTIONS: dict[str, tuple[str, Command]] = {
    "claim": ("claimed", lambda app, todo_id, form, caller: app.claim(
        todo_id, caller=caller, lease_ttl_seconds=forms.whole_number(form, "lease_ttl_seconds", "lease seconds"))),
    "complete": ("completed", _finish(Switchboard.complete)),
    "fail": ("failed", _finish(Switchboard.fail)),
    "extend": ("extended", lambda app, todo_id, form, caller: app.heartbeat(
        todo_id, caller=caller, lease_ttl_seconds=forms.whole_number(form, "lease_ttl_seconds", "lease seconds"))),
    "release": ("released", lambda app, todo_id, form, caller: app.release(
        todo_id, caller=caller, summary=_summary(form),
        delay_seconds=_snooze(form))),
    "retry": ("retried", lambda app, todo_id, form, caller: app.retry(todo_id, caller=caller)),
    "move": ("moved", lambda app, todo_id, form, caller: app.release_quarantined(
        todo_id, forms.text(form, "queue"), caller=caller)),
    "discard": ("discarded", lambda app, todo_id, form, caller: app.discard_quarantined(
        todo_id, caller=caller, summary=_summary(form))),
}


class TodoPage(Controller):
    @get("/todos/{todo_id:str}", sync_to_thread=True)
    def todo_page(self, request: Request, board: NamedDependency[Board], todo_id: FromPath[str],
                  partial: FromQuery[str | None] = None) -> Response:
        if wants_partial(request, partial):
            return board.render(request, "_todo_live.html", **todo_context(board, caller_of(request), todo_id))
        after = live_position(request)
        context = todo_context(board, caller_of(request), todo_id)
        section = "quarantine" if context["quarantined"] else "todos"
        return board.render(request, "todo.html", section=section, live_after=after, **context)

    @post("/todos/{todo_id:str}/{action:str}", sync_to_thread=True)
    def todo_action(self, request: Request, board: NamedDependency[Board], todo_id: FromPath[str],
                    action: FromPath[str], data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        if action not in ACTIONS:
            raise NotFound(f"no action {action!r} on todos")
        done, command = ACTIONS[action]
        caller = caller_of(request)

        def act() -> Response:
            command(board.app, todo_id, data, caller)
            return Redirect(f"/todos/{quote(todo_id)}?done={done}", status_code=303)

        def again(**refused: Any) -> Response:
            after = live_position(request)
            return board.render(request, "todo.html", section="todos", form=data or {}, failed_action=action,
                                live_after=after, **refused, **todo_context(board, caller, todo_id))

        return board.form(act, again, subject=True)
