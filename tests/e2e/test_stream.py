"""`GET /api/v1/stream` against a real server: SSE of todo transitions, live, exact and resumable.

Writers are the server itself (API calls) and another process (the CLI's application layer in a
subprocess) at the same time; the stream must carry each transition of the operator's todos
exactly once, in log order, within a second, and resume after a reconnect with `Last-Event-ID`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from ._support import Cli, Server

WORKER = textwrap.dedent("""
    import sys
    from application.service import Caller
    from interfaces.bootstrap import build
    from interfaces.settings import Settings
    url, slug, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    c = build(Settings(database_url=url, data_dir=sys.argv[4]))
    cli = Caller.cli()
    me = c.app.endpoint_caller(slug)
    for i in range(n):
        todo = c.app.push(slug, f"other-{i}", caller=cli)["todo"]["id"]
        c.app.claim(todo, caller=me)
        c.app.complete(todo, caller=me)
    c.close()
""")


class Stream:
    """An SSE client on a thread: collects (arrival time, event dict) until closed."""

    def __init__(self, base: str, headers: dict[str, str]) -> None:
        self.events: list[tuple[float, dict]] = []
        self.status: int | None = None
        self.content_type: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base, headers), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the stream did not open"

    def _run(self, base: str, headers: dict[str, str]) -> None:
        with httpx.Client(timeout=httpx.Timeout(30, read=60)) as client:
            with client.stream("GET", f"{base}/api/v1/stream", headers=headers) as response:
                self.status = response.status_code
                self.content_type = response.headers.get("content-type")
                self._ready.set()
                if response.status_code != 200:
                    return
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if line == "":
                        if fields.get("event") == "todo":
                            data = json.loads(fields["data"])
                            assert str(data["position"]) == fields["id"]
                            self.events.append((time.monotonic(), data))
                        fields = {}
                    elif not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value[1:] if value.startswith(" ") else value

    def wait_for(self, predicate, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate([e for _, e in self.events]):
                return
            time.sleep(0.02)
        raise AssertionError(f"stream did not get there in {timeout}s: {[e for _, e in self.events][-5:]}")

    def close(self) -> None:
        self._stop.set()


def log_transitions(cli: Cli, owner_endpoints: set[str] | None = None) -> list[tuple[int, str, str]]:
    """(position, todo id, type) of every todo event in the log, from `audit export`."""
    endpoint_of: dict[str, str] = {}
    rows = []
    for line in cli.run("audit", "export").ok().stdout.splitlines():
        record = json.loads(line)
        if record["type"] == "TodoOpened":
            endpoint_of[record["aggregate"]] = record["data"]["endpoint_id"]
        if record["aggregate"] in endpoint_of and (owner_endpoints is None or endpoint_of[record["aggregate"]] in owner_endpoints):
            rows.append((record["position"], record["aggregate"], record["type"]))
    return rows


def triples(events) -> list[tuple[int, str, str]]:
    return [(e["position"], e["todo_id"], e["type"]) for e in events]


@pytest.fixture
def stack(store_url, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    server = Server(tmp_path, logs, url=store_url).start()
    server.wait_healthy()
    cli = Cli(store_url, tmp_path)
    token = cli.json("operator", "token", "admin", "--json")["token"]
    yield server, cli, {"Authorization": f"Bearer {token}"}, store_url, tmp_path
    server.stop()


def api(server: Server, headers, method: str, path: str, **kwargs) -> dict:
    response = httpx.request(method, f"{server.base}/api/v1{path}", headers=headers, timeout=10, **kwargs)
    assert response.status_code in (200, 201), response.text
    return response.json()


def test_every_transition_from_two_writing_processes_arrives_once_in_order_within_a_second(stack):
    server, cli, headers, url, data_dir = stack
    slug = api(server, headers, "POST", "/endpoints", json={"agent": "w", "queues": ["work"]})["slug"]
    stream = Stream(server.base, headers)
    assert (stream.status, stream.content_type.split(";")[0]) == (200, "text/event-stream")

    other = subprocess.Popen([sys.executable, "-c", WORKER, url, slug, "30", str(data_dir)],
                             cwd=Path(__file__).parents[2], stderr=subprocess.PIPE, text=True)
    sent_at: dict[str, float] = {}
    vended = cli.json("endpoint", "list", "--json")["endpoints"]
    for i in range(30):  # the server writes too, meanwhile
        todo = api(server, headers, "POST", f"/endpoints/{slug}/todos", json={"title": f"here-{i}"})["todo"]["id"]
        sent_at[todo] = time.monotonic()
        api(server, headers, "POST", f"/todos/{todo}/claim")
        api(server, headers, "POST", f"/todos/{todo}/fail", json={"summary": "again"})
    assert other.wait(60) == 0, other.stderr.read()

    expected = log_transitions(cli)
    stream.wait_for(lambda events: len(events) >= len(expected))
    time.sleep(0.3)  # nothing more may come
    stream.close()
    got = [e for _, e in stream.events]

    assert len(expected) == 30 * 3 * 2
    assert triples(got) == expected  # each once, in log order, nothing from before the stream opened
    assert {e["type"]: e["state"] for e in got} == {
        "TodoOpened": "pending", "TodoClaimed": "claimed", "TodoFailed": "failed", "TodoCompleted": "done"}
    opened_at = {e["todo_id"]: at for at, e in stream.events if e["type"] == "TodoOpened"}
    lags = sorted(opened_at[t] - sent_at[t] for t in sent_at)
    assert lags[-1] < 1.0, lags
    assert vended and all(e["endpoint_id"] == vended[0]["endpoint_id"] for e in got)


def test_a_reconnect_with_last_event_id_resumes_without_gap_or_repeat(stack):
    server, cli, headers, _, _ = stack
    slug = api(server, headers, "POST", "/endpoints", json={"agent": "w", "queues": ["work"]})["slug"]
    first = Stream(server.base, headers)
    todos = [api(server, headers, "POST", f"/endpoints/{slug}/todos", json={"title": f"t{i}"})["todo"]["id"]
             for i in range(5)]
    first.wait_for(lambda events: len(events) == 5)
    first.close()
    last = first.events[-1][1]["position"]

    for todo in todos:  # while nobody listens
        api(server, headers, "POST", f"/todos/{todo}/claim")
    second = Stream(server.base, headers | {"Last-Event-ID": str(last)})
    api(server, headers, "POST", f"/todos/{todos[0]}/complete")
    second.wait_for(lambda events: len(events) == 6)
    time.sleep(0.3)
    second.close()

    both = triples(e for _, e in first.events) + triples(e for _, e in second.events)
    assert both == log_transitions(cli)
    assert [e["type"] for _, e in second.events] == ["TodoClaimed"] * 5 + ["TodoCompleted"]


def test_an_operator_streams_only_its_own_todos_and_agents_cannot_stream(stack):
    server, cli, headers, _, _ = stack
    cli.run("operator", "create", "bob", "--password-stdin", stdin="bob-password-1\n").ok()
    bob = {"Authorization": f"Bearer {cli.json('operator', 'token', 'bob', '--json')['token']}"}
    mine = api(server, headers, "POST", "/endpoints", json={"agent": "a", "queues": ["work"]})
    bobs = api(server, bob, "POST", "/endpoints", json={"agent": "b", "queues": ["work"]})
    admin_stream, bob_stream = Stream(server.base, headers), Stream(server.base, bob)

    a = api(server, headers, "POST", f"/endpoints/{mine['slug']}/todos", json={"title": "admin's"})["todo"]["id"]
    b = api(server, bob, "POST", f"/endpoints/{bobs['slug']}/todos", json={"title": "bob's"})["todo"]["id"]
    admin_stream.wait_for(lambda events: len(events) == 1)
    bob_stream.wait_for(lambda events: len(events) == 1)
    time.sleep(0.3)
    admin_stream.close()
    bob_stream.close()

    assert [e["todo_id"] for _, e in admin_stream.events] == [a]
    assert [e["todo_id"] for _, e in bob_stream.events] == [b]
    for credential in (mine["credential"], "sbo_not-a-token", "x"):
        refused = Stream(server.base, {"Authorization": f"Bearer {credential}"})
        assert refused.status == 401
    bad = httpx.get(f"{server.base}/api/v1/stream", headers=headers | {"Last-Event-ID": "ten"}, timeout=5)
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_argument")


@pytest.mark.postgres
def test_two_servers_share_one_board_session_and_one_feed(pg_url, tmp_path):
    """Behind a balancer: a session signed in on one server works on the other (same secret key),
    and a stream on one carries what the other writes, within a second, resumable on either."""
    key = "5c" * 32  # 64 hex characters (CONTRACT §12)
    servers = []
    for name in ("first", "second"):
        logs = tmp_path / name
        logs.mkdir()
        servers.append(Server(tmp_path, logs, url=pg_url, name=name, SWITCHBOARD_SECRET_KEY=key).start())
    first, second = servers
    try:
        first.wait_healthy()
        second.wait_healthy()
        password = (tmp_path / "admin-password").read_text().strip()
        with httpx.Client(base_url=first.base, timeout=10) as board:
            form = board.get("/login").text
            csrf = form.split('name="_csrf" value="', 1)[1].split('"', 1)[0]
            assert board.post("/login", data={"_csrf": csrf, "name": "admin", "password": password},
                              follow_redirects=False).status_code == 303
            cookie = board.cookies["sb_session"]
            page = board.get("/todos").text
            token = page.split('name="_csrf" value="', 1)[1].split('"', 1)[0]
        session = {"Cookie": f"sb_session={cookie}"}
        # the session signed by the first server opens the second's API (with its CSRF token)
        answer = httpx.post(f"{second.base}/api/v1/endpoints", json={"agent": "shared", "queues": ["work"]},
                            headers=session | {"X-CSRF-Token": token}, timeout=10)
        assert answer.status_code == 201, answer.text
        slug = answer.json()["slug"]

        stream = Stream(first.base, session)
        sent = time.monotonic()
        todo = httpx.post(f"{second.base}/api/v1/endpoints/{slug}/todos", json={"title": "elsewhere"},
                          headers=session | {"X-CSRF-Token": token}, timeout=10).json()["todo"]["id"]
        stream.wait_for(lambda events: [e["todo_id"] for e in events] == [todo], timeout=1.0)
        assert stream.events[0][0] - sent < 1.0
        stream.close()

        last = stream.events[0][1]["position"]
        httpx.post(f"{first.base}/api/v1/todos/{todo}/claim", headers=session | {"X-CSRF-Token": token}, timeout=10)
        resumed = Stream(second.base, session | {"Last-Event-ID": str(last)})  # reconnect to the other one
        resumed.wait_for(lambda events: [e["type"] for e in events] == ["TodoClaimed"], timeout=2.0)
        resumed.close()
    finally:
        for server in servers:
            server.stop()
