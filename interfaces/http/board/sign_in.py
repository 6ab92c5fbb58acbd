"""Sign-in and sign-out: `/login` is the one public page; `/` and `/logout` need a session."""

from __future__ import annotations

import math
from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import QueryParameter, URLEncodedBody
from litestar.response import Redirect

from interfaces.http.auth import CSRF_FIELD, CSRF_HEADER, Session, SessionCodec, csrf_ok, session_of
from interfaces.http.board import forms
from interfaces.http.board.pages import Board
from interfaces.http.ratelimit import client_address

PASSWORD_MAX_CHARS = 1024


def login_page(board: Board, request: Request, session: Session | None, *, next_path: str | None,
               status: int = 200, error: str | None = None, name: str = "") -> Response:
    """The sign-in form; a fresh anonymous session (and its CSRF token) unless this one is still unused."""
    codec: SessionCodec = request.app.state.sessions
    fresh = session is None or session.operator is not None
    session = Session.anonymous() if fresh else session
    return board.render(
        request, "login.html", status=status, session=session, error=error, name=name,
        next_path=forms.safe_next(next_path), headers={"set-cookie": codec.cookie_header(session)} if fresh else None,
    )


class SignIn(Controller):
    """Public: the sign-in form and its POST (CSRF-checked against the anonymous session)."""

    include_in_schema = False

    @get("/login", sync_to_thread=True)
    def login_form(self, request: Request, board: NamedDependency[Board],
                   next_path: Annotated[str | None, QueryParameter(name="next")] = None) -> Response:
        session = session_of(request)
        if session is not None and session.operator is not None and board.app.operator_exists(session.operator):
            return Redirect(forms.safe_next(next_path), status_code=303)
        return login_page(board, request, session, next_path=next_path)

    @post("/login", sync_to_thread=True)
    def login(self, request: Request, board: NamedDependency[Board],
              data: URLEncodedBody[dict[str, Any] | None] = None) -> Response:
        session = session_of(request)
        next_path = forms.text(data, "next")
        sent = forms.text(data, CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if session is None or not csrf_ok(session, sent):
            return login_page(board, request, None, next_path=next_path, status=403,
                              error="This sign-in form has expired or was not sent by the board: try again.")
        name, password = forms.text(data, "name"), str((data or {}).get("password") or "")
        client = client_address(request)
        wait = board.failed_logins.wait(client)
        if wait > 0:
            return login_page(board, request, session, next_path=next_path, status=429, name=name[:64],
                              error=f"too many failed sign-ins from this address: try again in {math.ceil(wait)} s")
        if (not name or not password or len(password) > PASSWORD_MAX_CHARS
                or not board.app.verify_password(name, password)):
            board.failed_logins.take(client)
            return login_page(board, request, session, next_path=next_path, status=401,
                              error="wrong name or password", name=name[:64])
        codec: SessionCodec = request.app.state.sessions
        return Redirect(forms.safe_next(next_path), status_code=303,
                        headers={"set-cookie": codec.cookie_header(Session.signed_in(name))})


class SignedIn(Controller):
    """Behind `board_guard`: the board's front door and sign-out."""

    @get("/")
    async def index(self) -> Redirect:
        """Signed in: the Todos view; else `board_guard` sends the browser to sign in, then back here."""
        return Redirect("/todos", status_code=303)

    @post("/logout")
    async def logout(self, request: Request) -> Redirect:
        codec: SessionCodec = request.app.state.sessions
        return Redirect("/login", status_code=303, headers={"set-cookie": codec.cookie_header(None)})
