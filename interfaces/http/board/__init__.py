"""The operator board (CONTRACT §8): server-rendered pages over the same application layer as the API.

One module per section, each a Litestar `Controller` whose handlers take the shared `Board`
(templates, rendering, refusals) by dependency injection:

- `sign_in`: `/login` (the one public page), `/`, `/logout`
- `todos`: the Todos and Quarantine lists · `todo`: one todo's page and its actions
- `endpoints`: list, vend, revoke · `queues`: an endpoint's queue controls, "Retry all" dead letters
- `webhooks`: list, mint, one webhook, rotate, delete, rules
- `events`: stored deliveries · `downloads`: a todo's payload and a delivery's body as files

A new section is a module with a `Controller` listed in `SECTIONS` below (templates stay in
interfaces/http/templates/). Every page but `/login` sits behind `board_guard` (a signed-in
operator; CSRF on every POST). Handlers run in worker threads (`sync_to_thread=True`) and render
there too. A refusal of the application (DomainError) becomes an HTML page with the status of
`errors.STATUS_BY_CODE`: an action form re-renders its page with the message (`Board.form`, the
one form-refusal handler), anything else renders `error.html` (`Board.refusal`). What depends on
the time now (a todo's `claimable`, an endpoint's status) comes from the application, by its clock.

Live regions: a GET of a page with the header `X-Board-Partial: 1` (or `?partial=1`) answers
only the fragment of its live region, rendered from the same include the full page uses.
`static/board.js` fetches it after each `todo` event of `/api/v1/stream` (debounced).
"""

from __future__ import annotations

from litestar import Request, Response, Router
from litestar.di import Provide
from litestar.exceptions import HTTPException

from domain.errors import DomainError
from interfaces.bootstrap import Container
from interfaces.http.auth import board_guard
from interfaces.http.board.downloads import Downloads
from interfaces.http.board.endpoints import EndpointPages
from interfaces.http.board.events import DeliveryPages
from interfaces.http.board.filters import excerpt, rule_number
from interfaces.http.board.pages import Board
from interfaces.http.board.queues import QueuePages
from interfaces.http.board.sign_in import SignedIn, SignIn
from interfaces.http.board.todo import TodoPage
from interfaces.http.board.todos import TodoList
from interfaces.http.board.webhooks import WebhookPages

__all__ = ["NOT_BOARD", "SECTIONS", "Board", "board_routes", "excerpt", "rule_number"]

# paths that are not the board's: an unknown one there stays a JSON 404 (`errors.http_error_handler`)
NOT_BOARD = ("/api/", "/mcp", "/webhooks/w/", "/metrics", "/healthz", "/schema", "/static/")
# the sections behind `board_guard`, one controller each
SECTIONS = (SignedIn, TodoList, TodoPage, Downloads, EndpointPages, QueuePages, WebhookPages, DeliveryPages)


def board_routes(container: Container, board: Board | None = None) -> list[Router]:
    """The board's routes: a public router (`/login`) and one guarded by `board_guard` for every section."""
    board = board or Board(container)
    # plain functions, not bound methods: Litestar deep-copies a router's layers when registering it
    dependencies = {"board": Provide(lambda: board, use_cache=True, sync_to_thread=False)}

    def refused(request: Request, error: DomainError) -> Response:
        return board.refusal(request, error)

    def http_refused(request: Request, error: HTTPException) -> Response:
        return board.http_refusal(request, error)

    pages = Router(
        path="/", guards=[board_guard], include_in_schema=False, dependencies=dependencies,
        exception_handlers={DomainError: refused, HTTPException: http_refused}, route_handlers=list(SECTIONS),
    )
    # in a router: an app-level GET and POST on one path would wrap the sync GET twice (Litestar 2.25)
    public = Router(path="/", include_in_schema=False, dependencies=dependencies, route_handlers=[SignIn])
    return [public, pages]
