"""End to end: request hygiene (CONTRACT §12) — deep JSON, slow bodies, repeated signature headers,
huge header blocks — against the real `serve` (whatever HTTP parser it runs) and, in-process, against
the same uvicorn configuration with each parser uvicorn offers (h11 and httptools). Never a 500.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from typing import Any

import httpx
import pytest
import uvicorn

from application.service import Caller
from interfaces.bootstrap import build
from interfaces.http.app import create_app
from interfaces.http.server import uvicorn_config
from interfaces.settings import Settings
from tests.e2e._ingest import Stack, raw_request
from tests.e2e._support import free_port
from tests.fixtures import sign

CLI = Caller.cli()
BODY_TIMEOUT = "1"  # SWITCHBOARD_BODY_TIMEOUT for these servers (the default is 30 s)


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


class Target:
    """A running server and what the checks need from its store."""

    def __init__(self, base: str, port: int, container, token: str) -> None:
        self.base, self.port, self.container = base, port, container
        self.api = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        app = container.app
        self.endpoint = app.vend("hygiene", queues=["work"], caller=CLI)
        self.hook = container.webhooks.create(caller=CLI, endpoint=self.endpoint["slug"], source_type="github",
                                              target_queue="work")
        self.http = httpx.Client(timeout=30)

    def stored(self) -> tuple[int, int]:
        """Deliveries and todos of this endpoint, from the store."""
        events = self.container.webhooks.list_events(caller=CLI, webhook_id=self.hook["webhook_id"], limit=1000,
                                                     max_limit=1000)["events"]
        todos = self.container.app.list_todos(caller=CLI, endpoint=self.endpoint["slug"], limit=1000)
        return len(events), len(todos)


def check_json_depth(t: Target) -> None:
    push = f"{t.base}/api/v1/endpoints/{t.endpoint['slug']}/todos"
    for body in (b"[" * 1000 + b"]" * 1000, json.dumps({"title": "deep", "payload": nested(129)}).encode()):
        answer = t.http.post(push, content=body, headers=t.api)
        assert answer.status_code == 400, answer.text
        assert answer.json() == {"error": "JSON body nested deeper than 128 levels", "code": "invalid_argument"}
    # brackets inside strings are not nesting; 128 levels are fine
    fine = t.http.post(push, content=json.dumps({"title": "[[[{{{" * 100, "payload": nested(127)}).encode(),
                       headers=t.api)
    assert fine.status_code == 201, fine.text
    mcp = t.http.post(f"{t.base}/mcp/{t.endpoint['slug']}", content=b'{"jsonrpc":"2.0","id":1,"params":'
                      + b"[" * 1000 + b"]" * 1000 + b"}",
                      headers={"authorization": f"Bearer {t.endpoint['credential']}", "content-type": "application/json",
                               "accept": "application/json, text/event-stream"})
    assert mcp.status_code == 400, mcp.text
    assert mcp.json()["code"] == "invalid_argument"
    # checked after authentication: a stranger's deep body is a 401 like any other of theirs
    deep = b"[" * 1000 + b"]" * 1000
    assert t.http.post(push, content=deep, headers={"content-type": "application/json"}).status_code == 401
    assert t.http.post(f"{t.base}/mcp/{t.endpoint['slug']}", content=deep).status_code == 401


def check_slow_body(t: Target) -> None:
    before = t.stored()
    token = t.hook["ingest_url"].rsplit("/", 1)[1]
    head = (f"POST /webhooks/w/{token} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            "x-github-event: ping\r\ncontent-length: 100\r\n\r\n").encode()
    started = time.monotonic()
    status, headers, body = raw_request(t.port, head, [b'{"zen": "'])  # 9 of the 100 bytes, then silence
    assert status == 408, body
    assert json.loads(body)["code"] == "request_timeout"
    assert 0.9 <= time.monotonic() - started < 10
    api_head = (f"POST /api/v1/endpoints/{t.endpoint['slug']}/todos HTTP/1.1\r\nhost: x\r\n"
                f"authorization: {t.api['authorization']}\r\ncontent-type: application/json\r\n"
                "content-length: 50\r\n\r\n").encode()
    status, _, _ = raw_request(t.port, api_head, [b'{"title": "never finished'])
    assert status == 408
    assert t.stored() == before  # nothing stored


def check_repeated_signatures(t: Target) -> None:
    before = t.stored()
    body = b'{"zen": "Keep it logically awesome."}'
    good, = sign("github", t.hook["signing_secret"], body).values()
    bad = "sha256=" + "0" * 64
    base = [("content-type", "application/json"), ("x-github-event", "ping")]
    for pair in ((bad, good), (good, bad), (good, good)):
        headers = base + [("X-Hub-Signature-256", pair[0]), ("x-hub-signature-256", pair[1])]
        answer = t.http.post(t.hook["ingest_url"], content=body, headers=headers)
        assert answer.status_code == 401, (pair, answer.text)
        assert answer.json() == {"error": "signature verification failed", "code": "unauthorized"}
    assert t.stored() == before
    once = t.http.post(t.hook["ingest_url"], content=body, headers=base + [("X-Hub-Signature-256", good)])
    assert once.status_code == 202, once.text


def check_header_block(t: Target) -> None:
    assert t.http.get(f"{t.base}/healthz", headers={"x-padding": "a" * 60_000}).status_code == 200
    for size in (70_000, 200_000):
        answer = t.http.get(f"{t.base}/healthz", headers={"x-padding": "a" * size})
        assert answer.status_code == 431, answer.text
        assert answer.json()["code"] == "headers_too_large"
    many = t.http.post(t.hook["ingest_url"], content=b"{}", headers=[(f"x-h{i}", "b" * 100) for i in range(1000)])
    assert many.status_code == 431


CHECKS = [check_json_depth, check_slow_body, check_repeated_signatures, check_header_block]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The real `switchboard serve` on SQLite with a 1 s body timeout."""
    stack = Stack(f"sqlite:///{tmp_path_factory.mktemp('hygiene')}/switchboard.db",
                  tmp_path_factory.mktemp("hygiene-var"), SWITCHBOARD_BODY_TIMEOUT=BODY_TIMEOUT).start()
    token = stack.app.mint_operator_token("admin", caller=CLI)["token"]
    try:
        yield Target(stack.server.base, stack.server.port, stack.container, token), stack
    finally:
        stack.close()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_serve(served, check):
    target, stack = served
    check(target)
    assert "Traceback" not in stack.server.stderr(), stack.server.output()


PARSERS = ["h11", pytest.param("httptools", marks=pytest.mark.skipif(
    importlib.util.find_spec("httptools") is None, reason="httptools is not installed"))]


@pytest.fixture(scope="module", params=PARSERS)
def in_process(request, tmp_path_factory):
    """The app under `serve`'s uvicorn configuration, with one HTTP parser chosen."""
    tmp = tmp_path_factory.mktemp(f"hygiene-{request.param}")
    port = free_port()
    settings = Settings(database_url=f"sqlite:///{tmp}/s.db", data_dir=str(tmp), port=port,
                        base_url=f"http://127.0.0.1:{port}", body_timeout=float(BODY_TIMEOUT))
    container = build(settings)
    container.app.ensure_admin()
    server = uvicorn.Server(uvicorn_config(create_app(container), settings, http=request.param))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    token = container.app.mint_operator_token("admin", caller=CLI)["token"]
    try:
        yield Target(settings.base_url, port, container, token)
    finally:
        server.should_exit = True
        thread.join(10)
        container.close()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_each_http_parser(in_process, check):
    check(in_process)
