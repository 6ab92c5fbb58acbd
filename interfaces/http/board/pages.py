"""What every section of the board shares: its Jinja environment, rendering, and how a refusal of
the application becomes an HTML answer (`Board.form` for an action form, `Board.refusal` else)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException

from domain.errors import DomainError
from domain.todo import MAX_ATTEMPTS
from interfaces.bootstrap import Container
from interfaces.http.auth import CSRF_FIELD, Session, session_of
from interfaces.http.board.filters import FILTERS, PAYLOAD_SHOWN_BYTES
from interfaces.http.errors import STATUS_BY_CODE
from interfaces.http.ratelimit import TokenBuckets

TEMPLATES = Path(__file__).parent.parent / "templates"
PARTIAL_HEADER = "x-board-partial"
FAILED_LOGIN_RATE, FAILED_LOGIN_BURST = 0.2, 10  # 10 wrong passwords at once, then one per 5 s
# `?done=<key>` after a successful POST: a fixed vocabulary, so a link cannot put words on the page
DONE = {
    "claimed": "Claimed: the lease is yours.",
    "completed": "Completed.",
    "failed": "Failed: a retry is scheduled unless that was the last attempt.",
    "extended": "Lease extended.",
    "released": "Released: pending again.",
    "retried": "Retried: pending again with a fresh budget of attempts.",
    "moved": "Released from quarantine.",
    "discarded": "Discarded.",
    "revoked": "Endpoint revoked.",
    "webhook_deleted": "Webhook deleted.",
    "rules_saved": "Rules saved.",
    "trust_saved": "Trusted senders saved.",
    "queue_set": "Queue controls saved.",
    "bulk_retried": "Every dead letter shown was retried, in one bulk action (one event per todo).",
}
_BULK_ID = re.compile(r"ba_[A-Za-z0-9_-]{1,64}")


def notice(done: object, query: Any) -> str | None:
    """The flash a `?done=` names; a bulk retry's says how many and its bulk-action id, the cause
    every retried todo's event carries (`?retried=N&bulk=ba_…`, checked: anything else is left out)."""
    if not isinstance(done, str):
        return None
    if done == "bulk_retried":
        count, bulk = query.get("retried"), query.get("bulk")
        if isinstance(count, str) and count.isdigit() and isinstance(bulk, str) and _BULK_ID.fullmatch(bulk):
            plural = "" if count == "1" else "s"
            return f"Retried {int(count)} dead letter{plural} in bulk action {bulk} (one event per todo, with that cause)."
    return DONE.get(done)


def error_text(error: DomainError) -> str:
    return f"{error.code}: {error.message}"


def wants_partial(request: Request, partial: str | None) -> bool:
    """Only the page's live region: `?partial=1` or the header `X-Board-Partial: 1`."""
    return bool(partial or request.headers.get(PARTIAL_HEADER))


def live_position(request: Request) -> int:
    """The log position now, taken before a live page reads what it shows: the page's event stream
    starts after it (`?after=`, board.js), so a transition that commits while the page is read and
    sent still comes as an event."""
    return request.app.state.feed.present()


class Board:
    """The board's shared parts: the application, templates, refusals, and per-process sign-in limits."""

    def __init__(self, container: Container) -> None:
        self.app = container.app
        self.webhooks = container.webhooks
        self.failed_logins = TokenBuckets(FAILED_LOGIN_RATE, FAILED_LOGIN_BURST)  # per address, this process
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True, lstrip_blocks=True,
        )
        self.env.filters.update(FILTERS)
        self.env.globals.update(shown_bytes=PAYLOAD_SHOWN_BYTES)
        # compiling a page's templates takes ~0.1-0.3 s: do it now, off the request path, not on its first view
        threading.Thread(target=self.compile_templates, name="switchboard-board-templates", daemon=True).start()

    def compile_templates(self) -> None:
        for name in self.env.list_templates(extensions=["html"]):
            self.env.get_template(name)

    def render(self, request: Request, template: str, *, status: int = 200, session: Session | None = None,
               headers: dict[str, str] | None = None, **context: Any) -> Response:
        """The template rendered with the session's operator and CSRF token and any `?done=` flash."""
        session = session or request.scope.get("state", {}).get("session") or session_of(request)
        values = {
            "operator": session.operator if session else None, "csrf": session.csrf if session else "",
            "csrf_field": CSRF_FIELD, "section": None, "error": None,
            "notice": notice(request.query_params.get("done"), request.query_params), "max_attempts": MAX_ATTEMPTS,
            **context,
        }
        body = self.env.get_template(template).render(values)
        return Response(body, status_code=status, media_type=MediaType.HTML,
                        headers={"cache-control": "no-store", "vary": "X-Board-Partial, Cookie", **(headers or {})})

    def form(self, act: Callable[[], Response], again: Callable[..., Response], *, subject: bool = False) -> Response:
        """The one form-refusal handler: runs a form's action; when the application refuses it, the
        form's page again (`again(status=, error=)`) with the message and the status of
        `errors.STATUS_BY_CODE`. On a form about one subject of its path (`/todos/{id}/claim`),
        `not_found` means that subject is gone: it propagates to `refusal`, a 404 page."""
        try:
            return act()
        except DomainError as error:
            if subject and error.code == "not_found":
                raise
            return again(status=STATUS_BY_CODE.get(error.code, 400), error=error_text(error))

    def refusal(self, request: Request, error: DomainError) -> Response:
        """An application refusal outside an action form: a page saying so, with its status."""
        status = STATUS_BY_CODE.get(error.code, 400)
        heading = "Not found" if status == 404 else "Refused"
        return self.render(request, "error.html", status=status, heading=heading, error=error_text(error))

    def not_found(self, request: Request) -> Response:
        """An unknown board page: the board's own 404 page (an unknown API path stays JSON)."""
        return self.render(request, "error.html", status=404, heading="Not found",
                           error=f"There is no page at {request.url.path}.")

    def http_refusal(self, request: Request, error: HTTPException) -> Response:
        """Litestar's own refusals on board routes (bad CSRF token, bad query) as HTML."""
        heading = {403: "Forbidden", 404: "Not found"}.get(error.status_code, "Refused")
        return self.render(request, "error.html", status=error.status_code, heading=heading,
                           error=str(error.detail), headers=error.headers)

