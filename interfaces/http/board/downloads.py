"""Downloads: a todo's whole payload and a delivery's body as received (pages show them cut)."""

from __future__ import annotations

import json

from litestar import Controller, Request, Response, get
from litestar.di import NamedDependency
from litestar.params import FromPath

from interfaces.http.auth import caller_of
from interfaces.http.board.pages import Board


def download(body: bytes, filename: str, media_type: str) -> Response:
    """An attachment: the browser saves it, never renders it (a sender's body is not ours to display)."""
    return Response(body, media_type=media_type, headers={
        "content-disposition": f'attachment; filename="{filename}"', "cache-control": "no-store"})


class Downloads(Controller):
    @get("/todos/{todo_id:str}/payload", sync_to_thread=True)
    def todo_payload(self, request: Request, board: NamedDependency[Board], todo_id: FromPath[str]) -> Response:
        """The whole payload (the page shows at most PAYLOAD_SHOWN_BYTES of it)."""
        todo = board.app.get_todo(todo_id, caller=caller_of(request))
        payload = todo["payload"]
        if isinstance(payload, str):  # a body that was not JSON, kept as text
            return download(payload.encode(), f"{todo['id']}-payload.txt", "text/plain; charset=utf-8")
        return download(json.dumps(payload, ensure_ascii=False).encode(), f"{todo['id']}-payload.json",
                        "application/json")

    @get("/events/{event_id:str}/body", sync_to_thread=True)
    def event_body(self, request: Request, board: NamedDependency[Board], event_id: FromPath[str]) -> Response:
        """The delivery's body exactly as received."""
        body, content_type = board.webhooks.event_body(event_id, caller=caller_of(request))
        json_body = (content_type or "").split(";")[0].strip().lower().endswith(("/json", "+json"))
        return download(body, f"{event_id}-body.{'json' if json_body else 'bin'}",
                        "application/json" if json_body else "application/octet-stream")
