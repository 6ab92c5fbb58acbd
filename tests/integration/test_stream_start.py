"""`GET /api/v1/stream` without Last-Event-ID (or `?after=`) starts at the present as the client sees it: a todo
committed the moment the client has the 200 is sent, however late the server starts the body.

The real app in process, on a real SQLite store, called over ASGI directly so that the test
can act between the response's headers and its body: its `send` opens a todo when the
headers arrive, before Litestar iterates the stream. A stream that fixed its start only when
its body began (the race CI hit under load: the client's push committed before the server's
generator had run) would count that todo as past and never send it."""

from __future__ import annotations

import json

import anyio
from litestar.testing import TestClient

from application.service import Caller
from interfaces.http.app import create_app


async def streamed(asgi, token: str, *, query: str = "", headers: list[tuple[bytes, bytes]] = (),
                   on_headers=None, until: bytes) -> bytes:
    """Calls `GET /api/v1/stream` over ASGI until its body holds `until` (5 s at most): the body.
    `on_headers` runs (on a thread) when the 200's headers are sent, before the body starts."""
    body = bytearray()
    done = anyio.Event()

    async def receive() -> dict:
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
            if on_headers is not None:
                await anyio.to_thread.run_sync(on_headers)
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))
            if until in body:
                done.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/api/v1/stream", "raw_path": b"/api/v1/stream", "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"test"), (b"authorization", f"Bearer {token}".encode()), *headers],
        "client": ("127.0.0.1", 50000), "server": ("test", 80), "state": {},
    }
    with anyio.move_on_after(5):  # the feed polls every 0.25 s: plenty, were it sent at all
        await asgi(scope, receive, send)
    done.set()
    return bytes(body)


def todo_ids(body: bytes) -> list[str]:
    return [json.loads(line[len("data:"):])["todo_id"] for line in body.decode().splitlines()
            if line.startswith("data:") and "todo_id" in line]


def test_a_todo_committed_as_the_headers_arrive_is_sent(make_container, sqlite_url):
    container = make_container(sqlite_url)
    app = container.app
    container.app.ensure_admin()
    token = app.operators.mint_token("admin", caller=Caller.cli())
    endpoint = app.vend("agent", queues=["inbox"], caller=Caller.cli())
    asgi = create_app(container)
    pushed: list[str] = []

    def push() -> None:
        pushed.append(app.push(endpoint["slug"], "right after the headers", caller=Caller.operator("admin"))["todo"]["id"])

    with TestClient(asgi) as http:  # runs the app's lifespan (the writer, the feed) on its portal
        body = http.blocking_portal.call(lambda: streamed(asgi, token, on_headers=push, until=b"TodoOpened"))

    assert pushed, "the stream never answered"
    events = [json.loads(line[len("data:"):]) for line in body.decode().splitlines()
              if line.startswith("data:") and "todo_id" in line]
    assert [(e["todo_id"], e["type"]) for e in events] == [(pushed[0], "TodoOpened")], body.decode()


def test_a_stream_opened_after_a_position_sends_what_committed_since(make_container, sqlite_url):
    """`?after=` (the position a board page was rendered at): a todo opened before the stream was
    asked for, after that position, is sent; a Last-Event-ID (a reconnect) wins over it."""
    container = make_container(sqlite_url)
    app = container.app
    app.ensure_admin()
    token = app.operators.mint_token("admin", caller=Caller.cli())
    endpoint = app.vend("agent", queues=["inbox"], caller=Caller.cli())
    asgi = create_app(container)
    rendered = asgi.state.feed.present()
    first = app.push(endpoint["slug"], "while the page loaded", caller=Caller.operator("admin"))["todo"]["id"]
    resumed = asgi.state.feed.present()
    second = app.push(endpoint["slug"], "after the last event seen", caller=Caller.operator("admin"))["todo"]["id"]

    def opened(http: TestClient, query: str, headers: list[tuple[bytes, bytes]] = ()) -> list[str]:
        return todo_ids(http.blocking_portal.call(
            lambda: streamed(asgi, token, query=query, headers=headers, until=second.encode())))

    with TestClient(asgi) as http:  # the app's lifespan runs once
        assert opened(http, f"after={rendered}") == [first, second]
        assert opened(http, f"after={rendered}", [(b"last-event-id", str(resumed).encode())]) == [second]
        for bad in ("x", "-1", "1.5", "9" * 19):
            answer = http.get(f"/api/v1/stream?after={bad}", headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_argument", answer.text


def test_the_apps_shutdown_ends_the_feeds_tailer(make_container, sqlite_url):
    """The store closes right after the app: a tailer still reading it then would run on a closed
    SQLite connection, which crashes the process (CI saw it). A stream still open at shutdown
    keeps the tailer busy until the app's shutdown ends it."""
    asgi = create_app(make_container(sqlite_url))
    with TestClient(asgi):
        open_stream = asgi.state.feed.follow()
        assert asgi.state.feed.tailing
    assert not asgi.state.feed.tailing, "the app shut down with the feed's tailer still reading the store"
    open_stream.close()


def test_a_keepalive_carries_the_position_read_up_to(make_container, sqlite_url, monkeypatch):
    """A stream whose owner saw no transition for a while still moves its client's Last-Event-ID:
    each keepalive names the log position read up to, so a reconnect (which sends it) resumes
    there, not at the `?after=` of a page left open for hours, whose stretch of everyone's log
    would be read again."""
    monkeypatch.setattr("interfaces.http.api.stream.KEEPALIVE_SECONDS", 0.2)
    container = make_container(sqlite_url)
    app = container.app
    app.ensure_admin()
    app.operators.create("other", caller=Caller.cli())
    token = app.operators.mint_token("admin", caller=Caller.cli())
    asgi = create_app(container)
    rendered = asgi.state.feed.present()
    theirs = app.vend("not admin's", queues=["inbox"], caller=Caller.operator("other"))
    app.push(theirs["slug"], "someone else's", caller=Caller.operator("other"))
    head = asgi.state.feed.present()
    assert head > rendered

    with TestClient(asgi) as http:
        text = http.blocking_portal.call(
            lambda: streamed(asgi, token, query=f"after={rendered}", until=b"keepalive")).decode()
    assert "keepalive" in text, text
    assert "someone else's" not in text, text  # another owner's transition is not sent
    keepalive = text[text.index(": keepalive"):].split("\r\n\r\n", 1)[0]
    assert f"id: {head}" in keepalive.splitlines(), text
