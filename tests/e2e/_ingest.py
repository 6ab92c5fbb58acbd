"""Helpers for the ingest end-to-end tests: a real `switchboard serve`, real HTTP, and the same store
opened in-process (and through the CLI) for setup and for counting what was stored.

The server, the in-process container and the CLI share one database URL and one data directory,
so they share the key that encrypts webhook signing secrets at rest (or all three get
SWITCHBOARD_SECRET_KEY explicitly).
"""

from __future__ import annotations

import re
import socket
import sqlite3
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import psycopg

from application.service import Caller
from interfaces.bootstrap import Container, build
from interfaces.settings import Settings
from tests.e2e._support import PG_SECRET_KEY, Cli, Server
from tests.fixtures import sign

CLI = Caller.cli()
MAX_BODY = 5 * 1024 * 1024
REFUSED_401 = {"error": "signature verification failed", "code": "unauthorized"}
UNKNOWN_404 = {"error": "unknown webhook", "code": "not_found"}
TOO_LARGE_413 = {"error": "payload too large", "code": "payload_too_large"}
ACCEPTED_KEYS = {"todos", "created", "id", "queue", "verified", "trust_mode", "event_id"}
TODO_REF_KEYS = {"id", "endpoint_id", "queue", "created"}
TODO_ID = re.compile(r"^td_[0-9a-f]{32}$")
EVENT_ID = re.compile(r"^ev_[0-9a-f]{32}$")
ENDPOINT_ID = re.compile(r"^ep_[0-9a-f]{32}$")
REDACTED = "«redacted»"


class StackCli(Cli):
    """The CLI on the stack's store, minting URLs with the server's base URL."""

    def __init__(self, url: str, data_dir: Path, base_url: str, **env: str) -> None:
        super().__init__(url, data_dir)
        self.extra = {"SWITCHBOARD_BASE_URL": base_url, **env}

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(**(self.extra | extra))


class Stack:
    """One `switchboard serve` subprocess plus the same store opened in-process and via the CLI."""

    def __init__(self, url: str, data_dir: Path, *, name: str = "serve", secret_key: str | None = None,
                 **server_env: str) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        if secret_key is None and url.startswith("postgresql"):
            secret_key = PG_SECRET_KEY  # serve on PostgreSQL needs an explicit key
        self.url = url
        self.data_dir = data_dir
        keyed = {"SWITCHBOARD_SECRET_KEY": secret_key} if secret_key else {}
        env = {"SWITCHBOARD_INGEST_RATE": "0", **keyed, **server_env}
        self.server = Server(data_dir, data_dir, url=url, name=name, **env)
        self.secret_key = secret_key
        self.container: Container | None = None
        self.cli: StackCli | None = None
        self.http = httpx.Client(timeout=30)

    def start(self) -> Stack:
        self.server.start()
        self.server.wait_healthy()
        # after the server's first start: the secret-key file exists (unless given explicitly)
        self.container = build(Settings(database_url=self.url, data_dir=str(self.data_dir),
                                        base_url=self.server.base, secret_key=self.secret_key))
        keyed = {"SWITCHBOARD_SECRET_KEY": self.secret_key} if self.secret_key else {}
        self.cli = StackCli(self.url, self.data_dir, self.server.base, **keyed)
        return self

    def another_server(self, name: str, **env: str) -> Server:
        """A second `switchboard serve` on the same store, data dir and key (rate limit off unless
        given), started and healthy; the caller stops it."""
        keyed = {"SWITCHBOARD_SECRET_KEY": self.secret_key} if self.secret_key else {}
        server = Server(self.data_dir, self.data_dir, url=self.url, name=name,
                        **{"SWITCHBOARD_INGEST_RATE": "0", **keyed, **env})
        server.start()
        try:
            server.wait_healthy()
        except BaseException:
            server.stop()
            raise
        return server

    def close(self) -> None:
        self.http.close()
        if self.container is not None:
            self.container.close()
        code = self.server.stop()
        assert code == 0, self.server.output()
        assert "Traceback" not in self.server.stderr(), self.server.output()

    @property
    def app(self):
        return self.container.app

    @property
    def webhooks(self):
        return self.container.webhooks

    # -- setup through the application layer --------------------------------------------------

    def vend(self, agent: str, queues: Iterable[str], **options: Any) -> dict[str, Any]:
        self.app.ensure_admin()
        return self.app.vend(agent, queues=list(queues), caller=CLI, **options)

    def webhook(self, endpoint: dict[str, Any], source: str, queue: str) -> dict[str, Any]:
        hook = self.webhooks.create(caller=CLI, endpoint=endpoint["slug"], source_type=source, target_queue=queue)
        assert hook["ingest_url"].startswith(f"{self.server.base}/webhooks/w/"), hook
        return hook

    def set_rules(self, hook: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
        return self.webhooks.set_rules(hook["webhook_id"], document, caller=CLI)

    # -- HTTP ------------------------------------------------------------------------------------

    def post(self, url: str, body: bytes, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
        return self.http.post(url, content=body, headers=headers or {}, **kw)

    def deliver(self, hook: dict[str, Any], body: bytes, *, event: str | None = None, delivery: str | None = None,
                headers: dict[str, str] | None = None, secret: str | None = None, url: str | None = None,
                client: httpx.Client | None = None) -> httpx.Response:
        """POSTs a body signed the way the hook's source signs it (GitHub, Gitea, Cairn, Standard
        Webhooks, Stripe or Slack headers; the timestamped ones signed now)."""
        source = hook["source_type"]
        sent = {"content-type": "application/json"}
        if source == "github":
            sent |= {"x-github-event": event or "ping", "x-github-delivery": delivery or str(uuid.uuid4()),
                     "user-agent": "GitHub-Hookshot/e2e"}
        elif source == "gitea":
            sent |= {"x-gitea-event": event or "push", "x-gitea-delivery": delivery or str(uuid.uuid4())}
        elif source == "generic" and delivery:
            sent["x-delivery-id"] = delivery
        if source != "generic":
            sent |= sign(source, secret or hook["signing_secret"], body,
                         message_id=delivery if source == "standard" else None)
        sent |= headers or {}
        return (client or self.http).post(url or hook["ingest_url"], content=body, headers=sent)

    # -- what is stored --------------------------------------------------------------------------

    def scalar(self, sql: str, params: tuple = ()) -> Any:
        return scalar(self.url, sql, params)

    def counts(self) -> dict[str, int]:
        """Every stored event, and the deliveries and todos among them (the source of truth)."""
        rows = query(self.url, "SELECT topic, count(*) FROM stored_events GROUP BY topic")
        by_topic = {topic: n for topic, n in rows}
        return {"events": sum(by_topic.values()), "deliveries": by_topic.get("DeliveryAccepted", 0),
                "todos": by_topic.get("TodoOpened", 0)}

    def events_of(self, hook: dict[str, Any]) -> list[dict[str, Any]]:
        return self.webhooks.list_events(caller=CLI, webhook_id=hook["webhook_id"], limit=1000,
                                         max_limit=1000)["events"]

    def todos_of(self, endpoint: dict[str, Any], **filters: Any) -> list[dict[str, Any]]:
        return self.app.list_todos(caller=CLI, endpoint=endpoint["slug"], limit=1000, **filters)


def query(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url[len("sqlite:///"):], timeout=30)
        try:
            return conn.execute(sql.replace("%s", "?"), params).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def scalar(url: str, sql: str, params: tuple = ()) -> Any:
    return query(url, sql, params)[0][0]


def assert_accepted(response: httpx.Response, *, trust_mode: str, verified: bool, queue: str | None,
                    created: int, endpoint_ids: list[str] | None = None) -> dict[str, Any]:
    """A 202 with exactly the body of CONTRACT §4; returns it."""
    assert response.status_code == 202, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    extra = set(body) - ACCEPTED_KEYS
    assert set(body) >= ACCEPTED_KEYS and extra <= {"dropped", "faulted"}, body
    assert body["verified"] is verified and body["trust_mode"] == trust_mode, body
    assert EVENT_ID.match(body["event_id"]), body
    assert isinstance(body["todos"], list)
    for ref in body["todos"]:
        assert set(ref) == TODO_REF_KEYS, ref
        assert TODO_ID.match(ref["id"]) and ENDPOINT_ID.match(ref["endpoint_id"]), ref
        assert isinstance(ref["created"], bool)
    assert body["created"] == created == sum(ref["created"] for ref in body["todos"]), body
    if body["todos"]:
        assert body["id"] == body["todos"][0]["id"] and body["queue"] == body["todos"][0]["queue"] == queue, body
    else:
        assert body["id"] is None and body["queue"] is None, body
    if endpoint_ids is not None:
        assert [ref["endpoint_id"] for ref in body["todos"]] == endpoint_ids, body
    return body


def assert_error(response: httpx.Response, status: int, expected: dict[str, str]) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    assert response.json() == expected


# -- raw HTTP, for bodies no well-behaved client sends ------------------------------------------


def raw_request(port: int, head: bytes, body_parts: Iterable[bytes] = (), timeout: float = 15) -> tuple[int, dict, bytes]:
    """Sends a hand-written request; keeps reading the answer even if the server stops reading the
    body and resets the connection. Returns (status, headers, body)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    data = b""
    try:
        sock.sendall(head)
        try:
            for part in body_parts:
                sock.sendall(part)
        except OSError:  # the server answered and closed without reading the rest: allowed
            pass
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    header_block, _, rest = data.partition(b"\r\n\r\n")
                    length = re.search(rb"(?im)^content-length:\s*(\d+)", header_block)
                    if length and len(rest) >= int(length.group(1)):
                        break
        except OSError:
            pass
    finally:
        sock.close()
    assert data, "no answer at all"
    header_block, _, rest = data.partition(b"\r\n\r\n")
    lines = header_block.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, rest


def chunked(total: int, piece: int = 1 << 16) -> Iterable[bytes]:
    """`total` bytes of a JSON-ish body in HTTP/1.1 chunks, then the last chunk."""
    sent = 0
    while sent < total:
        n = min(piece, total - sent)
        yield f"{n:x}\r\n".encode() + b" " * n + b"\r\n"
        sent += n
    yield b"0\r\n\r\n"
