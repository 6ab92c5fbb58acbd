"""The Todos and Quarantine lists: tabs per state, counts, filters by endpoint and queue (live region)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from litestar.params import FromQuery, QueryParameter

from application.service import Caller
from domain.names import QUARANTINE
from domain.todo import STATES, WAITING
from interfaces.http.auth import caller_of
from interfaces.http.board.forms import blank
from interfaces.http.board.pages import Board, live_position, wants_partial

TODOS_SHOWN = 200


def counts(board: Board, caller: Caller, endpoint: str | None, queue: str | None) -> dict[str, int]:
    """Counts per state within the queue filter, dead letters, and quarantined todos awaiting a decision."""
    counted = dict.fromkeys((*STATES, "all", "dead", "quarantine"), 0)
    for row in board.app.todo_counts(caller=caller, endpoint=endpoint):
        if row["queue"] == QUARANTINE and row["state"] in WAITING:
            counted["quarantine"] += row["count"]
        if queue is not None and row["queue"] != queue:
            continue
        counted["all"] += row["count"]
        counted[row["state"]] += row["count"]
        if row["state"] == "failed" and row["dead_letter"]:
            counted["dead"] += row["count"]
    return counted


def todos_context(board: Board, request: Request, caller: Caller, *, state: str | None, queue: str | None,
                  endpoint: str | None) -> dict[str, Any]:
    endpoints = board.app.list_endpoints(caller=caller)
    dead = state == "dead"
    rows = board.app.list_todos(caller=caller, endpoint=endpoint, state="failed" if dead else state,
                                queue=queue, limit=TODOS_SHOWN, dead_letter=True if dead else None)
    queues = sorted({q for e in endpoints for q in e["queues"]} | {QUARANTINE})
    base = {"endpoint": endpoint} if endpoint else {}

    def link(**params: str | None) -> str:
        chosen = {k: v for k, v in (base | params).items() if v}
        return "/todos" + (f"?{urlencode(chosen)}" if chosen else "")

    tabs = [
        ("all", "All", link(queue=queue)),
        *((s, s.capitalize(), link(state=s, queue=queue)) for s in STATES),
        ("dead", "Dead letters", link(state="dead", queue=queue)),
        ("quarantine", "Quarantine", link(queue=QUARANTINE)),
    ]
    current = "quarantine" if queue == QUARANTINE and state is None else (state or "all")
    held = [r["id"] for r in rows if r["queue"] == QUARANTINE]
    return {
        "rows": rows, "faults": board.app.fault_traces(held, caller=caller) if held else {},
        "counts": counts(board, caller, endpoint, queue), "tabs": tabs, "current": current,
        "state": state, "queue": queue, "endpoint": endpoint, "endpoints": endpoints, "queues": queues,
        "shown": TODOS_SHOWN, "live_src": request.url.path + (
            f"?{request.url.query}" if request.url.query else ""),
    }


class TodoList(Controller):
    @get("/todos", sync_to_thread=True)
    def todos(self, request: Request, board: NamedDependency[Board],
              state_filter: Annotated[str | None, QueryParameter(name="state")] = None,
              queue: FromQuery[str | None] = None, endpoint: FromQuery[str | None] = None,
              partial: FromQuery[str | None] = None) -> Response:
        after = None if wants_partial(request, partial) else live_position(request)
        context = todos_context(board, request, caller_of(request), state=blank(state_filter), queue=blank(queue),
                                endpoint=blank(endpoint))
        if after is None:
            return board.render(request, "_todos_live.html", **context)
        section = "quarantine" if context["current"] == "quarantine" else "todos"
        return board.render(request, "todos.html", section=section, live_after=after, **context)
