"""The operator board (CONTRACT §8): server-rendered pages over the same application layer as the API.

Every page but `/login` sits behind `board_guard` (a signed-in operator; CSRF on every POST).
Handlers run in worker threads (`sync_to_thread=True`) and render there too, with the board's
own Jinja environment (autoescape on; filters for JSON, times and sizes). A refusal of the
application (DomainError) becomes an HTML page with the status of `errors.STATUS_BY_CODE`: an
action form re-renders its page with the message, anything else renders `error.html`.

Live regions: a GET of a page with the header `X-Board-Partial: 1` (or `?partial=1`) answers
only the fragment of its live region, rendered from the same include the full page uses.
`static/board.js` fetches it after each `todo` event of `/api/v1/stream` (debounced).
"""

from __future__ import annotations

import json
import math
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from litestar import MediaType, Request, Response, Router, get, post
from litestar.exceptions import HTTPException
from litestar.params import FromPath, FromQuery, QueryParameter, URLEncodedBody
from litestar.response import Redirect

from application.service import Caller
from application.webhooks import DEFAULT_REPLAY_LAST  # the replay's default N, the CLI's too
from domain.endpoint import ALL_VERBS, DEFAULT_WEBHOOK_MAX, SOURCE_TYPES, parse_lifetime
from domain.errors import DomainError, InvalidArgument, NotFound
from domain.names import QUARANTINE
from domain.todo import MAX_ATTEMPTS, STATES
from interfaces.bootstrap import Container
from interfaces.http.auth import (
    CSRF_FIELD, CSRF_HEADER, Session, SessionCodec, board_guard, caller_of, csrf_ok,
    session_of,
)
from interfaces.http.errors import STATUS_BY_CODE
from interfaces.http.ratelimit import TokenBuckets, client_address

TEMPLATES = Path(__file__).parent / "templates"
PARTIAL_HEADER = "x-board-partial"
TODOS_SHOWN = 200
EVENTS_SHOWN = 50
PAYLOAD_SHOWN_BYTES = 256 * 1024  # a payload over this is shown cut, with a link to download it whole
# paths that are not the board's: an unknown one there stays a JSON 404 (`errors.http_error_handler`)
NOT_BOARD = ("/api/", "/mcp", "/webhooks/w/", "/metrics", "/healthz", "/schema", "/static/")
PASSWORD_MAX_CHARS = 1024
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
}


# -- formatting (Jinja filters) -----------------------------------------------------------


def pretty(value: Any) -> str:
    """JSON with indentation (escaped by the template like any text); a plain string as itself."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def compact(value: Any) -> str:
    """JSON on one line."""
    return json.dumps(value, ensure_ascii=False)


def when(value: str | None) -> str:
    """An RFC 3339 time as `YYYY-MM-DD HH:MM:SSZ`."""
    if not value:
        return "—"
    moment = _parse_time(value)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment else value


def size(value: int | None) -> str:
    if value is None:
        return "—"
    for unit in ("B", "KiB", "MiB"):
        if value < 1024 or unit == "MiB":
            return f"{value} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def rule_number(trace: dict[str, Any] | None) -> int | None:
    """The rule a trace names, as a person counts it (from 1); `rule_index` in data counts from 0."""
    index = (trace or {}).get("rule_index")
    return index + 1 if isinstance(index, int) and not isinstance(index, bool) else None


def excerpt(value: Any, limit: int = PAYLOAD_SHOWN_BYTES) -> str:
    """At most `limit` bytes of `pretty(value)`, encoding only what is shown (a cut never pays for the
    rest); a cut falls on a character boundary."""
    if isinstance(value, str):
        text = value[:limit]
    else:
        parts, length = [], 0
        for chunk in json.JSONEncoder(indent=2, ensure_ascii=False).iterencode(value):
            parts.append(chunk)
            length += len(chunk)  # characters: at least one byte each, so `limit` characters suffice
            if length >= limit:
                break
        text = "".join(parts)
    return text.encode()[:limit].decode(errors="ignore")


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).astimezone(timezone.utc)
    except ValueError:
        return None


# -- form and query parsing -----------------------------------------------------------------


def _text(form: dict[str, Any] | None, name: str) -> str:
    value = (form or {}).get(name, "")
    if isinstance(value, list):
        value = value[-1] if value else ""
    return str(value).strip()


def _all(form: dict[str, Any] | None, name: str) -> list[str]:
    value = (form or {}).get(name, [])
    return [str(v) for v in (value if isinstance(value, list) else [value]) if str(v)]


def _names(text: str) -> list[str]:
    return [part for part in re.split(r"[\s,]+", text) if part]


def _int(form: dict[str, Any] | None, name: str, label: str) -> int | None:
    text = _text(form, name)
    if not text:
        return None
    if not re.fullmatch(r"-?\d{1,9}", text):
        raise InvalidArgument(f"{label} must be a whole number")
    return int(text)


def _json(form: dict[str, Any] | None, name: str, label: str) -> Any:
    text = _text(form, name)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as error:
        raise InvalidArgument(f"{label} is not valid JSON: {error}") from None


def _ttl(text: str) -> int | None:
    """A lifetime `<n>s|m|h|d` in seconds, or None for `never` (or nothing)."""
    return parse_lifetime(text) if text.strip() else None


def _blank(value: str | None) -> str | None:
    return value.strip() if value and value.strip() else None


def safe_next(value: str | None) -> str:
    """A local path to return to after sign-in (never another origin, never /login itself)."""
    if (not value or len(value) > 2048 or not value.startswith("/") or value.startswith(("//", "/\\"))
            or any(c in value for c in "\\\r\n\t ") or value.split("?")[0] in ("/login", "/logout")):
        return "/todos"
    return value


def _download(body: bytes, filename: str, media_type: str) -> Response:
    """An attachment: the browser saves it, never renders it (a sender's body is not ours to display)."""
    return Response(body, media_type=media_type, headers={
        "content-disposition": f'attachment; filename="{filename}"', "cache-control": "no-store"})


def _error_text(error: DomainError) -> str:
    return f"{error.code}: {error.message}"


class Board:
    """Renders board pages and turns application refusals into HTML answers."""

    def __init__(self, container: Container) -> None:
        self.app = container.app
        self.webhooks = container.webhooks
        self.env = Environment(
            loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True, lstrip_blocks=True,
        )
        self.env.filters.update(pretty=pretty, compact=compact, when=when, size=size, rule_number=rule_number,
                                excerpt=excerpt)
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
        done = request.query_params.get("done")
        values = {
            "operator": session.operator if session else None, "csrf": session.csrf if session else "",
            "csrf_field": CSRF_FIELD, "section": None, "error": None,
            "notice": DONE.get(done) if isinstance(done, str) else None, "max_attempts": MAX_ATTEMPTS,
            **context,
        }
        body = self.env.get_template(template).render(values)
        return Response(body, status_code=status, media_type=MediaType.HTML,
                        headers={"cache-control": "no-store", "vary": "X-Board-Partial, Cookie", **(headers or {})})

    def refusal(self, request: Request, error: DomainError) -> Response:
        """An application refusal outside an action form: a page saying so, with its status."""
        status = STATUS_BY_CODE.get(error.code, 400)
        heading = "Not found" if status == 404 else "Refused"
        return self.render(request, "error.html", status=status, heading=heading, error=_error_text(error))

    def not_found(self, request: Request) -> Response:
        """An unknown board page: the board's own 404 page (an unknown API path stays JSON)."""
        return self.render(request, "error.html", status=404, heading="Not found",
                           error=f"There is no page at {request.url.path}.")

    def http_refusal(self, request: Request, error: HTTPException) -> Response:
        """Litestar's own refusals on board routes (bad CSRF token, bad query) as HTML."""
        heading = {403: "Forbidden", 404: "Not found"}.get(error.status_code, "Refused")
        return self.render(request, "error.html", status=error.status_code, heading=heading,
                           error=str(error.detail), headers=error.headers)

    # -- todos ----------------------------------------------------------------------------------

    def counts(self, caller: Caller, endpoint: str | None, queue: str | None) -> dict[str, int]:
        """Counts per state within the queue filter, dead letters, and quarantined todos awaiting a decision."""
        counts = dict.fromkeys((*STATES, "all", "dead", "quarantine"), 0)
        for row in self.app.todo_counts(caller=caller, endpoint=endpoint):
            if row["queue"] == QUARANTINE and row["state"] in ("pending", "failed"):
                counts["quarantine"] += row["count"]
            if queue is not None and row["queue"] != queue:
                continue
            counts["all"] += row["count"]
            counts[row["state"]] += row["count"]
            if row["state"] == "failed" and row["dead_letter"]:
                counts["dead"] += row["count"]
        return counts

    def todos_context(self, request: Request, caller: Caller, *, state: str | None, queue: str | None,
                      endpoint: str | None) -> dict[str, Any]:
        endpoints = self.app.list_endpoints(caller=caller)
        dead = state == "dead"
        rows = self.app.list_todos(caller=caller, endpoint=endpoint, state="failed" if dead else state,
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
            "rows": rows, "faults": self.app.fault_traces(held, caller=caller) if held else {},
            "counts": self.counts(caller, endpoint, queue), "tabs": tabs, "current": current,
            "state": state, "queue": queue, "endpoint": endpoint, "endpoints": endpoints, "queues": queues,
            "shown": TODOS_SHOWN, "live_src": request.url.path + (
                f"?{request.url.query}" if request.url.query else ""),
        }

    def todo_context(self, caller: Caller, todo_id: str) -> dict[str, Any]:
        todo = self.app.get_todo(todo_id, caller=caller)
        history = self.app.history(todo_id, caller=caller, payloads=False)["events"]
        for event in history:  # the payload is shown once, in its own panel
            if "payload" in event.get("omitted", ()):
                event["data"]["payload"] = f"«{size(todo['payload_size'])}, shown under Payload»"
        endpoint = next((e for e in self.app.list_endpoints(caller=caller)
                         if e["endpoint_id"] == todo["endpoint_id"]), None)
        retry_at = _parse_time(todo["next_retry_at"])
        claimable = todo["queue"] != QUARANTINE and (
            todo["state"] == "pending"
            or (todo["state"] == "failed" and not todo["dead_letter"] and retry_at is not None
                and retry_at <= datetime.now(timezone.utc)))
        return {
            "todo": todo, "history": history, "endpoint": endpoint, "claimable": claimable,
            "quarantined": todo["queue"] == QUARANTINE,
            "release_queues": [q for q in (endpoint["queues"] if endpoint else []) if q != QUARANTINE],
            "live_src": f"/todos/{quote(todo['id'])}",
        }

    # -- webhooks -------------------------------------------------------------------------------

    def webhook_context(self, caller: Caller, webhook_id: str, *, rules_text: str | None = None) -> dict[str, Any]:
        rules = self.webhooks.rules(webhook_id, caller=caller)  # not_found for a foreign or deleted one
        webhook = next((w for w in self.webhooks.list(caller=caller)["webhooks"]
                        if w["webhook_id"] == rules["webhook_id"]), None)
        if webhook is None:
            raise NotFound(f"webhook {webhook_id} not found")
        endpoints = {e["endpoint_id"]: e for e in self.app.list_endpoints(caller=caller)}
        document = {k: rules[k] for k in ("rules", "default_action", "params")}
        return {
            "webhook": webhook, "owner": endpoints.get(webhook["endpoint_id"]),
            "routes": self.webhooks.routes(webhook_id, caller=caller)["routes"], "slugs": {
                k: e["slug"] for k, e in endpoints.items()},
            "deliveries": self.webhooks.list_events(caller=caller, webhook_id=webhook["webhook_id"],
                                                    limit=EVENTS_SHOWN)["events"],
            "rules_text": rules_text if rules_text is not None else json.dumps(document, indent=2, ensure_ascii=False),
            "saved_rules": len(rules["rules"]), "last": DEFAULT_REPLAY_LAST, "event_id": None,
            "test": None, "replay": None, "section": "webhooks",
        }


def board_routes(container: Container, board: Board | None = None) -> list:
    """The board's routes: a public router (`/login`) and one guarded by `board_guard` for every page."""
    board = board or Board(container)
    app = container.app
    webhooks = container.webhooks
    failed_logins = TokenBuckets(FAILED_LOGIN_RATE, FAILED_LOGIN_BURST)  # per address, this process

    # -- sign-in ----------------------------------------------------------------------------------

    @get("/")
    async def index() -> Redirect:
        """Signed in: the Todos view; else `board_guard` sends the browser to sign in, then back here."""
        return Redirect("/todos", status_code=303)

    @get("/login", sync_to_thread=True, include_in_schema=False)
    def login_form(request: Request, next_path: Annotated[str | None, QueryParameter(name="next")] = None) -> Response:
        session = session_of(request)
        if session is not None and session.operator is not None and app.operator_exists(session.operator):
            return Redirect(safe_next(next_path), status_code=303)
        return login_page(request, session, next_path=next_path)

    def login_page(request: Request, session: Session | None, *, next_path: str | None, status: int = 200,
                   error: str | None = None, name: str = "") -> Response:
        codec: SessionCodec = request.app.state.sessions
        fresh = session is None or session.operator is not None
        session = Session.anonymous() if fresh else session
        return board.render(
            request, "login.html", status=status, session=session, error=error, name=name,
            next_path=safe_next(next_path), headers={"set-cookie": codec.cookie_header(session)} if fresh else None,
        )

    @post("/login", sync_to_thread=True, include_in_schema=False)
    def login(request: Request, data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        session = session_of(request)
        next_path = _text(data, "next")
        sent = _text(data, CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if session is None or not csrf_ok(session, sent):
            return login_page(request, None, next_path=next_path, status=403,
                              error="This sign-in form has expired or was not sent by the board: try again.")
        name, password = _text(data, "name"), str((data or {}).get("password") or "")
        client = client_address(request)
        wait = failed_logins.wait(client)
        if wait > 0:
            return login_page(request, session, next_path=next_path, status=429, name=name[:64],
                              error=f"too many failed sign-ins from this address: try again in {math.ceil(wait)} s")
        if not name or not password or len(password) > PASSWORD_MAX_CHARS or not app.verify_password(name, password):
            failed_logins.take(client)
            return login_page(request, session, next_path=next_path, status=401, error="wrong name or password",
                              name=name[:64])
        codec: SessionCodec = request.app.state.sessions
        return Redirect(safe_next(next_path), status_code=303,
                        headers={"set-cookie": codec.cookie_header(Session.signed_in(name))})

    @post("/logout")
    async def logout(request: Request) -> Redirect:
        codec: SessionCodec = request.app.state.sessions
        return Redirect("/login", status_code=303, headers={"set-cookie": codec.cookie_header(None)})

    # -- todos --------------------------------------------------------------------------------------

    @get("/todos", sync_to_thread=True)
    def todos(request: Request, state_filter: Annotated[str | None, QueryParameter(name="state")] = None,
              queue: FromQuery[str | None] = None, endpoint: FromQuery[str | None] = None,
              partial: FromQuery[str | None] = None) -> Response:
        context = board.todos_context(request, caller_of(request), state=_blank(state_filter), queue=_blank(queue),
                                      endpoint=_blank(endpoint))
        section = "quarantine" if context["current"] == "quarantine" else "todos"
        if partial or request.headers.get(PARTIAL_HEADER):
            return board.render(request, "_todos_live.html", **context)
        return board.render(request, "todos.html", section=section, **context)

    @get("/todos/{todo_id:str}", sync_to_thread=True)
    def todo_page(request: Request, todo_id: FromPath[str], partial: FromQuery[str | None] = None) -> Response:
        context = board.todo_context(caller_of(request), todo_id)
        if partial or request.headers.get(PARTIAL_HEADER):
            return board.render(request, "_todo_live.html", **context)
        section = "quarantine" if context["quarantined"] else "todos"
        return board.render(request, "todo.html", section=section, **context)

    @get("/todos/{todo_id:str}/payload", sync_to_thread=True)
    def todo_payload(request: Request, todo_id: FromPath[str]) -> Response:
        """The whole payload, as a download (the page shows at most PAYLOAD_SHOWN_BYTES of it)."""
        todo = app.get_todo(todo_id, caller=caller_of(request))
        payload = todo["payload"]
        if isinstance(payload, str):  # a body that was not JSON, kept as text
            return _download(payload.encode(), f"{todo['id']}-payload.txt", "text/plain; charset=utf-8")
        return _download(json.dumps(payload, ensure_ascii=False).encode(), f"{todo['id']}-payload.json",
                         "application/json")

    def finish(todo_id: str, form: dict[str, Any] | None, caller: Caller, command) -> None:
        command(todo_id, caller=caller, result=_json(form, "result", "result"),
                summary=_text(form, "summary") or None)

    actions = {
        "claim": ("claimed", lambda todo_id, form, caller: app.claim(
            todo_id, caller=caller, lease_ttl_seconds=_int(form, "lease_ttl_seconds", "lease seconds"))),
        "complete": ("completed", lambda todo_id, form, caller: finish(todo_id, form, caller, app.complete)),
        "fail": ("failed", lambda todo_id, form, caller: finish(todo_id, form, caller, app.fail)),
        "extend": ("extended", lambda todo_id, form, caller: app.heartbeat(
            todo_id, caller=caller, lease_ttl_seconds=_int(form, "lease_ttl_seconds", "lease seconds"))),
        "release": ("released", lambda todo_id, form, caller: app.release(
            todo_id, caller=caller, summary=_text(form, "summary") or None)),
        "retry": ("retried", lambda todo_id, form, caller: app.retry(todo_id, caller=caller)),
        "move": ("moved", lambda todo_id, form, caller: app.release_quarantined(
            todo_id, _text(form, "queue"), caller=caller)),
        "discard": ("discarded", lambda todo_id, form, caller: app.discard_quarantined(
            todo_id, caller=caller, summary=_text(form, "summary") or None)),
    }

    @post("/todos/{todo_id:str}/{action:str}", sync_to_thread=True)
    def todo_action(request: Request, todo_id: FromPath[str], action: FromPath[str],
                    data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        if action not in actions:
            raise NotFound(f"no action {action!r} on todos")
        done, command = actions[action]
        caller = caller_of(request)
        try:
            command(todo_id, data, caller)
        except DomainError as error:
            if error.code == "not_found":
                raise
            return board.render(request, "todo.html", status=STATUS_BY_CODE.get(error.code, 400), section="todos",
                                error=_error_text(error), form=data or {}, failed_action=action,
                                **board.todo_context(caller, todo_id))
        return Redirect(f"/todos/{quote(todo_id)}?done={done}", status_code=303)

    # -- endpoints ------------------------------------------------------------------------------------

    def endpoints_page(request: Request, *, status: int = 200, error: str | None = None,
                       form: dict[str, Any] | None = None) -> Response:
        rows = app.list_endpoints(caller=caller_of(request))
        now = datetime.now(timezone.utc)
        for row in rows:
            expires = _parse_time(row["expires_at"])
            row["status"] = "revoked" if row["revoked"] else "expired" if expires and expires <= now else "active"
        given = bool(_text(form, "scope"))  # re-shown after a refusal: keep what was ticked
        return board.render(
            request, "endpoints.html", status=status, section="endpoints", error=error, rows=rows,
            all_verbs=ALL_VERBS, source_types=SOURCE_TYPES, form=form or {},
            chosen_verbs=set(_all(form, "verbs")) if given else set(ALL_VERBS),
            chosen_sources=set(_all(form, "source_types")) if given else set(SOURCE_TYPES),
            default_webhook_max=DEFAULT_WEBHOOK_MAX,
        )

    @get("/endpoints", sync_to_thread=True)
    def endpoints(request: Request) -> Response:
        return endpoints_page(request)

    @post("/endpoints", sync_to_thread=True)
    def vend(request: Request, data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        try:
            webhook_max = _int(data, "webhook_max", "webhook ceiling")
            verbs, source_types = None, None
            if _text(data, "scope"):  # the form's checkboxes were shown: what is ticked is the choice
                verbs, source_types = _all(data, "verbs"), _all(data, "source_types")
                if not verbs:
                    raise InvalidArgument("choose at least one verb")
            vended = app.vend(
                _text(data, "agent"), queues=_names(_text(data, "queues")), caller=caller_of(request),
                verbs=verbs, source_types=source_types,
                webhook_max=DEFAULT_WEBHOOK_MAX if webhook_max is None else webhook_max,
                webhook_queues=_names(_text(data, "webhook_queues")) or None, ttl_seconds=_ttl(_text(data, "ttl")),
                default_lease_seconds=_int(data, "default_lease", "default lease seconds"),
            )
        except DomainError as error:
            return endpoints_page(request, status=STATUS_BY_CODE.get(error.code, 400), error=_error_text(error),
                                  form=data or {})
        return board.render(request, "vended.html", section="endpoints", vended=vended,
                            mcp_json=json.dumps(vended["mcp_json"], indent=2))

    @post("/endpoints/{ref:str}/revoke", sync_to_thread=True)
    def revoke(request: Request, ref: FromPath[str]) -> Response:
        try:
            app.revoke(ref, caller=caller_of(request))
        except DomainError as error:
            if error.code == "not_found":
                raise
            return endpoints_page(request, status=STATUS_BY_CODE.get(error.code, 400), error=_error_text(error))
        return Redirect("/endpoints?done=revoked", status_code=303)

    # -- webhooks -------------------------------------------------------------------------------------

    def webhooks_page(request: Request, *, status: int = 200, error: str | None = None,
                      form: dict[str, Any] | None = None) -> Response:
        caller = caller_of(request)
        endpoints = app.list_endpoints(caller=caller)
        now = datetime.now(timezone.utc)
        active = [e for e in endpoints if not e["revoked"] and not (
            (expires := _parse_time(e["expires_at"])) and expires <= now)]
        return board.render(
            request, "webhooks.html", status=status, section="webhooks", error=error, form=form or {},
            rows=webhooks.list(caller=caller)["webhooks"], slugs={e["endpoint_id"]: e["slug"] for e in endpoints},
            active=active, source_types=SOURCE_TYPES,
            webhook_queues=sorted({q for e in active for q in e["webhook_queues"]}),
        )

    @get("/webhooks", sync_to_thread=True)
    def webhooks_list(request: Request) -> Response:
        return webhooks_page(request)

    @post("/webhooks", sync_to_thread=True)
    def webhook_create(request: Request, data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        try:
            minted = webhooks.create(caller=caller_of(request), endpoint=_text(data, "endpoint"),
                                     source_type=_text(data, "source_type"), target_queue=_text(data, "target_queue"))
        except DomainError as error:
            return webhooks_page(request, status=STATUS_BY_CODE.get(error.code, 400), error=_error_text(error),
                                 form=data or {})
        return board.render(request, "webhook_minted.html", section="webhooks", minted=minted, rotated=False)

    @get("/webhooks/{webhook_id:str}", sync_to_thread=True)
    def webhook_page(request: Request, webhook_id: FromPath[str]) -> Response:
        return board.render(request, "webhook.html", **board.webhook_context(caller_of(request), webhook_id))

    @post("/webhooks/{webhook_id:str}/rotate", sync_to_thread=True)
    def webhook_rotate(request: Request, webhook_id: FromPath[str]) -> Response:
        minted = webhooks.rotate(webhook_id, caller=caller_of(request))
        return board.render(request, "webhook_minted.html", section="webhooks", minted=minted, rotated=True)

    @post("/webhooks/{webhook_id:str}/delete", sync_to_thread=True)
    def webhook_delete(request: Request, webhook_id: FromPath[str]) -> Response:
        webhooks.delete(webhook_id, caller=caller_of(request))
        return Redirect("/webhooks?done=webhook_deleted", status_code=303)

    def rules_form(request: Request, webhook_id: str, data: dict[str, Any] | None, step) -> Response:
        """Runs a rules step on the textarea's candidate; the page keeps the candidate text either way."""
        caller = caller_of(request)
        text = str((data or {}).get("rules") or "")
        context = board.webhook_context(caller, webhook_id, rules_text=text)  # not_found: a 404 page
        context["event_id"] = _text(data, "event_id") or None
        try:
            last = _int(data, "last", "last N")
            context["last"] = last if last is not None else DEFAULT_REPLAY_LAST
            try:
                candidate = json.loads(text)
            except ValueError as error:
                raise InvalidArgument(f"the rules are not valid JSON: {error}") from None
            if not isinstance(candidate, dict):
                raise InvalidArgument("the rules must be a JSON object {rules, default_action?, params?}")
            answer = step(caller, candidate, context)
        except DomainError as error:
            context["error"] = _error_text(error)
            return board.render(request, "webhook.html", status=STATUS_BY_CODE.get(error.code, 400), **context)
        return answer if isinstance(answer, Response) else board.render(request, "webhook.html", **context)

    @post("/webhooks/{webhook_id:str}/rules/test", sync_to_thread=True)
    def rules_test(request: Request, webhook_id: FromPath[str], data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def step(caller: Caller, candidate: dict[str, Any], context: dict[str, Any]) -> None:
            if not context["event_id"]:
                raise InvalidArgument("choose a stored delivery to test the rules against")
            context["test"] = webhooks.test_rules(webhook_id, caller=caller, event_id=context["event_id"],
                                                  candidate=candidate)

        return rules_form(request, webhook_id, data, step)

    @post("/webhooks/{webhook_id:str}/rules/replay", sync_to_thread=True)
    def rules_replay(request: Request, webhook_id: FromPath[str], data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def step(caller: Caller, candidate: dict[str, Any], context: dict[str, Any]) -> None:
            context["replay"] = webhooks.replay(webhook_id, candidate, caller=caller, last=context["last"])

        return rules_form(request, webhook_id, data, step)

    @post("/webhooks/{webhook_id:str}/rules", sync_to_thread=True)
    def rules_save(request: Request, webhook_id: FromPath[str], data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        def step(caller: Caller, candidate: dict[str, Any], context: dict[str, Any]) -> Response:
            saved = webhooks.set_rules(webhook_id, candidate, caller=caller)
            return Redirect(f"/webhooks/{quote(saved['webhook_id'])}?done=rules_saved", status_code=303)

        return rules_form(request, webhook_id, data, step)

    # -- deliveries -----------------------------------------------------------------------------------

    @get("/events", sync_to_thread=True)
    def events(request: Request, webhook: FromQuery[str | None] = None, cursor: FromQuery[str | None] = None) -> Response:
        caller = caller_of(request)
        webhook = _blank(webhook)
        page = webhooks.list_events(caller=caller, webhook_id=webhook, limit=EVENTS_SHOWN, cursor=_blank(cursor))
        hooks = webhooks.list(caller=caller)["webhooks"]
        older = None
        if page.get("next_cursor"):
            older = "/events?" + urlencode({k: v for k, v in (("webhook", webhook), ("cursor", page["next_cursor"])) if v})
        return board.render(request, "events.html", section="events", rows=page["events"], hooks=hooks,
                            webhook=webhook, older=older, newest="/events" + (
                                f"?{urlencode({'webhook': webhook})}" if webhook else "") if cursor else None)

    @get("/events/{event_id:str}", sync_to_thread=True)
    def event_page(request: Request, event_id: FromPath[str]) -> Response:
        event = webhooks.get_event(event_id, caller=caller_of(request))
        return board.render(request, "event.html", section="events", event=event)

    @get("/events/{event_id:str}/body", sync_to_thread=True)
    def event_body(request: Request, event_id: FromPath[str]) -> Response:
        """The delivery's body exactly as received, as a download."""
        body, content_type = webhooks.event_body(event_id, caller=caller_of(request))
        json_body = (content_type or "").split(";")[0].strip().lower().endswith(("/json", "+json"))
        return _download(body, f"{event_id}-body.{'json' if json_body else 'bin'}",
                         "application/json" if json_body else "application/octet-stream")

    def refused(request: Request, error: DomainError) -> Response:
        return board.refusal(request, error)

    def http_refused(request: Request, error: HTTPException) -> Response:
        return board.http_refusal(request, error)

    # plain functions, not bound methods: Litestar deep-copies a router's layers when registering it
    pages = Router(
        path="/", guards=[board_guard], include_in_schema=False,
        exception_handlers={DomainError: refused, HTTPException: http_refused},
        route_handlers=[
            index, logout, todos, todo_page, todo_payload, todo_action, endpoints, vend, revoke, webhooks_list,
            webhook_create, webhook_page, webhook_rotate, webhook_delete, rules_test, rules_replay, rules_save, events,
            event_page, event_body,
        ],
    )
    # in a router: an app-level GET and POST on one path would wrap the sync GET twice (Litestar 2.25)
    public = Router(path="/", include_in_schema=False, route_handlers=[login_form, login])
    return [public, pages]
