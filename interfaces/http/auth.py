"""Who is asking: board sessions, CSRF tokens, operator API tokens, and the security headers.

Board sessions are signed cookies (docs/adr/0012-operator-board.md): the cookie holds the
operator's name, a CSRF token and the time it was issued, signed with HMAC-SHA256 under a key
derived from `SWITCHBOARD_SECRET_KEY`. Nothing is kept per process, so any server process
sharing the secret key accepts any session. Every unsafe request made with the session must
carry its CSRF token (form field `_csrf` or header `X-CSRF-Token`); a bearer `sbo_` token opens
`/api/v1` only and needs none. `sbk_` credentials never open anything here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

import anyio.to_thread
from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.types import Message, Scope

from application.service import Caller, Switchboard

COOKIE = "sb_session"
CSRF_FIELD = "_csrf"
CSRF_HEADER = "x-csrf-token"
SESSION_SECONDS = 12 * 3600
UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SECURITY_HEADERS = (
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


@dataclass(frozen=True)
class Session:
    """A board session: `operator` is None before sign-in (the login form still has a CSRF token)."""

    operator: str | None
    csrf: str
    issued_at: int

    @classmethod
    def anonymous(cls) -> Session:
        return cls(None, secrets.token_urlsafe(24), int(time.time()))

    @classmethod
    def signed_in(cls, operator: str) -> Session:
        return cls(operator, secrets.token_urlsafe(24), int(time.time()))


class SessionCodec:
    """Encodes and verifies session cookies; a key change or tampering yields no session."""

    def __init__(self, secret_key: str, *, secure: bool, max_age: int = SESSION_SECONDS) -> None:
        self._key = hmac.new(secret_key.encode(), b"switchboard board session v1", hashlib.sha256).digest()
        self.secure = secure
        self.max_age = max_age

    def encode(self, session: Session) -> str:
        body = base64.urlsafe_b64encode(json.dumps(
            {"op": session.operator, "csrf": session.csrf, "iat": session.issued_at}, separators=(",", ":"),
        ).encode()).rstrip(b"=")
        return f"{body.decode()}.{self._sign(body)}"

    def decode(self, cookie: str | None, *, now: float | None = None) -> Session | None:
        if not cookie or len(cookie) > 1024 or not cookie.isascii() or "." not in cookie:
            return None  # (a non-ASCII cookie is no session, not an error)
        body, _, signature = cookie.partition(".")
        if not hmac.compare_digest(signature, self._sign(body.encode())):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            session = Session(data["op"], data["csrf"], int(data["iat"]))
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(session.csrf, str) or not (session.operator is None or isinstance(session.operator, str)):
            return None
        if (now if now is not None else time.time()) - session.issued_at > self.max_age:
            return None
        return session

    def cookie_header(self, session: Session | None) -> str:
        """The Set-Cookie value that stores this session (None: deletes the cookie)."""
        value, age = (self.encode(session), self.max_age) if session is not None else ("", 0)
        secure = "; Secure" if self.secure else ""
        return f"{COOKIE}={value}; Path=/; Max-Age={age}; HttpOnly; SameSite=Lax{secure}"

    def _sign(self, body: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, body, hashlib.sha256).digest()).rstrip(b"=").decode()


def session_of(connection: ASGIConnection) -> Session | None:
    codec: SessionCodec = connection.app.state.sessions
    return codec.decode(connection.cookies.get(COOKIE))


async def csrf_token_sent(request: Request) -> str | None:
    header = request.headers.get(CSRF_HEADER)
    if header:
        return header
    if (request.headers.get("content-type") or "").startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()  # Litestar caches the parsed form for the handler
        value = form.get(CSRF_FIELD)
        return value if isinstance(value, str) else None
    return None


def csrf_ok(session: Session, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode("utf-8", "surrogatepass"))


class BoardRedirect(Exception):
    """Raised by the board guard: not signed in, so go to /login (handled in app.py)."""

    def __init__(self, next_path: str) -> None:
        self.next_path = next_path


async def board_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Board pages: a signed-in operator whose account still exists; unsafe requests need CSRF."""
    session = session_of(connection)
    app: Switchboard = connection.app.state.switchboard
    if session is None or session.operator is None or not await anyio.to_thread.run_sync(
        app.operator_exists, session.operator,
    ):
        # back to this page after sign-in; a form post cannot be replayed, so that goes to the todos
        query = connection.scope.get("query_string", b"").decode("latin-1")
        back = connection.url.path + (f"?{query}" if query else "")
        raise BoardRedirect(back if connection.scope["method"] in ("GET", "HEAD") else "/todos")
    if connection.scope["method"] in UNSAFE:
        if not csrf_ok(session, await csrf_token_sent(connection)):  # type: ignore[arg-type]
            raise PermissionDeniedException("missing or wrong CSRF token")
    connection.scope["state"]["caller"] = Caller.operator(session.operator)
    connection.scope["state"]["session"] = session


async def api_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """`/api/v1`: a bearer `sbo_` token, or the board session plus the CSRF header on unsafe requests."""
    app: Switchboard = connection.app.state.switchboard
    authorization = connection.headers.get("authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        caller = None
        if scheme.lower() == "bearer" and 0 < len(token) <= 256:
            caller = await anyio.to_thread.run_sync(app.authenticate_operator_token, token)
        if caller is None:
            raise NotAuthorizedException("a valid operator token (sbo_…) or board session is required")
        connection.scope["state"]["caller"] = caller
        return
    session = session_of(connection)
    if session is None or session.operator is None or not await anyio.to_thread.run_sync(
        app.operator_exists, session.operator,
    ):
        raise NotAuthorizedException("a valid operator token (sbo_…) or board session is required")
    if connection.scope["method"] in UNSAFE and not csrf_ok(session, connection.headers.get(CSRF_HEADER)):
        raise PermissionDeniedException("missing or wrong CSRF token (X-CSRF-Token header)")
    connection.scope["state"]["caller"] = Caller.operator(session.operator)
    connection.scope["state"]["session"] = session


def caller_of(request: Request) -> Caller:
    return request.scope["state"]["caller"]


async def add_security_headers(message: Message, scope: Scope) -> None:
    """`before_send` hook: every HTTP response, errors included, carries CSP, frame denial, nosniff."""
    if message["type"] == "http.response.start":
        headers = message.setdefault("headers", [])
        present = {bytes(name).lower() for name, _ in headers}
        if isinstance(headers, list):
            headers.extend((n, v) for n, v in SECURITY_HEADERS if n not in present)
        else:
            message["headers"] = [*headers, *((n, v) for n, v in SECURITY_HEADERS if n not in present)]

