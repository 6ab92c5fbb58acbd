"""The board shows what the time decides — a todo's `claimable`, an endpoint's status — by the
application's injected clock, not the wall clock: a ManualClock set in the past moves the page.

The real app in process (Litestar's TestClient over ASGI), on a real SQLite store, signed in
through the board's own form. The ManualClock starts on 2026-01-01, long before the wall clock,
so a board that read the wall clock would show the retry due and the endpoint expired at once."""

from __future__ import annotations

import re

import pytest
from litestar.testing import TestClient

from application.service import Caller
from interfaces.http.app import create_app

CSRF = re.compile(r'name="_csrf" value="([^"]*)"')
STATUS = re.compile(r'<span class="badge endpoint-(\w+)">')


@pytest.fixture
def board(make_container, sqlite_url, clock):
    container = make_container(sqlite_url, clock=clock)
    password = container.app.ensure_admin()
    with TestClient(create_app(container)) as http:
        token = CSRF.search(http.get("/login").text).group(1)
        signed_in = http.post("/login", data={"_csrf": token, "name": "admin", "password": password},
                              follow_redirects=False)
        assert signed_in.status_code == 303, signed_in.text
        yield container, http


def test_a_todo_awaiting_its_retry_becomes_claimable_on_the_page_when_the_injected_clock_reaches_it(board, clock):
    container, http = board
    app, admin = container.app, Caller.operator("admin")
    endpoint = app.vend("agent", queues=["work"], caller=Caller.cli())
    todo_id = app.push(endpoint["slug"], "retry me", caller=admin)["todo"]["id"]
    app.claim(todo_id, caller=admin)
    app.fail(todo_id, caller=admin, summary="not yet")  # a retry at now + RETRY_BASE_DELAY (30 s)
    claim_form = f'action="/todos/{todo_id}/claim"'

    page = http.get(f"/todos/{todo_id}")
    assert page.status_code == 200 and app.get_todo(todo_id, caller=admin)["state"] == "failed"
    assert claim_form not in page.text  # the retry is not due by the application's clock
    clock.advance(seconds=31)
    assert claim_form in http.get(f"/todos/{todo_id}").text
    assert app.todo_now(todo_id, caller=admin)["claimable"] is True


def test_an_endpoint_expires_on_the_page_when_the_injected_clock_passes_its_lifetime(board, clock):
    container, http = board
    endpoint = container.app.vend("agent", queues=["work"], caller=Caller.cli(), ttl_seconds=3600,
                                  webhook_max=1)
    revoke_form = f'action="/endpoints/{endpoint["slug"]}/revoke"'

    page = http.get("/endpoints").text
    assert STATUS.findall(page) == ["active"] and revoke_form in page
    assert endpoint["slug"] in http.get("/webhooks").text  # offered to a new webhook while active
    clock.advance(seconds=3600)
    page = http.get("/endpoints").text
    assert STATUS.findall(page) == ["expired"] and revoke_form not in page
    assert endpoint["slug"] not in http.get("/webhooks").text
