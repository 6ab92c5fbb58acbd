"""End to end: the operator API `/api/v1` against a real `switchboard serve` over real HTTP
(CONTRACT §6, §7, §9, §11).

One server per store is shared by the module. Most of the file runs on SQLite; tenancy and
concurrency run once on SQLite and once on PostgreSQL. Operators and their `sbo_` tokens come
from the real CLI; everything else goes through the API itself, webhook deliveries through ingest.
Every refusal is checked for the `{"error", "code"}` body and the security headers, and, where
it could change something, for having changed nothing.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest

from interfaces.http.auth import COOKIE, Session, SessionCodec
from tests.e2e._ingest import EVENT_ID, REDACTED, TODO_ID, Stack

SECRET_KEY = "ae" * 32  # 64 hex characters (CONTRACT §12)
QUEUES = ("inbox", "other")
ROW_KEYS = {
    "id", "queue", "source", "kind", "title", "state", "trust_mode", "owner", "attempt", "max_attempts",
    "lease_expires_at", "next_retry_at", "dead_letter", "created_at", "payload_size",
    "available_at",  # CONTRACT §13
}
FULL_KEYS = ROW_KEYS | {"endpoint_id", "payload", "routing", "result", "attempt_seq", "claimant", "prior_attempts",
                        "attempts", "resume_from", "traceparent"}
VEND_KEYS = {"endpoint_id", "slug", "mcp_url", "credential", "queues", "verbs", "expires_at", "mcp_json"}
CREDENTIAL = re.compile(r"^sbk_[A-Za-z0-9_-]{43}$")
SIGNING_SECRET = re.compile(r"^whsec_[0-9a-f]{64}$")
RULE_ID = re.compile(r"^rule_[0-9a-f]{24}$")
ALL_VERBS = {
    "list_todos", "get_todo", "claim", "claim_next", "heartbeat", "complete", "fail", "release",
    "create_webhook", "list_webhooks", "rotate_webhook", "delete_webhook", "add_webhook_route",
    "remove_webhook_route", "list_webhook_routes", "list_webhook_rules", "set_webhook_rules",
    "test_webhook_rules", "list_webhook_events", "get_webhook_event", "get_default_lease", "set_default_lease",
}
# a rule that faults (jq `error`) only on deliveries carrying `"boom": true`
BOOM_RULES = {"rules": [{"id": "boom", "expr": 'if .payload.boom then error("boom") else false end',
                         "action": {"queue": "other"}}]}
# Litestar's default request body limit (bytes); a bigger body answers 413
MAX_API_BODY = 10_000_000


# -- the server ---------------------------------------------------------------------------------


def _start(url: str, data_dir) -> Stack:
    return Stack(url, data_dir, secret_key=SECRET_KEY).start()


@pytest.fixture(scope="module")
def sqlite_stack(tmp_path_factory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("api-sqlite")
    stack = _start(f"sqlite:///{base}/switchboard.db", base / "var")
    yield stack
    stack.close()  # exit 0, and no traceback (no unhandled error) in the server's stderr


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stack(request, tmp_path_factory) -> Iterator[Stack]:
    """The SQLite server above, then a server on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_stack")
        return
    url = request.getfixturevalue("module_pg_url")  # skips without PostgreSQL, or fails when required
    stack = _start(url, tmp_path_factory.mktemp("api-postgres") / "var")
    yield stack
    stack.close()  # exit 0, and no traceback (no unhandled error) in the server's stderr


# -- operators and their clients ----------------------------------------------------------------


@dataclass
class Operator:
    name: str
    password: str
    token: str
    http: httpx.Client  # base URL /api/v1, bearer token

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.http.get(path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        return self.http.post(path, json=body, **kw) if body is not None else self.http.post(path, **kw)

    def put(self, path: str, body: Any, **kw: Any) -> httpx.Response:
        return self.http.put(path, json=body, **kw)


def api_client(stack: Stack, headers: dict[str, str] | None = None) -> httpx.Client:
    return httpx.Client(base_url=f"{stack.server.base}/api/v1", headers=headers or {}, timeout=30)


def operator(stack: Stack, name: str) -> Operator:
    """The operator `name` on this stack (created through the CLI unless it is admin), with a token."""
    known: dict[str, Operator] = stack.__dict__.setdefault("operators", {})
    if name not in known:
        if name == "admin":
            password = (stack.data_dir / "admin-password").read_text().strip()
        else:
            password = f"{name}-password-{secrets.token_hex(4)}"
            stack.cli.run("operator", "create", name, "--password-stdin", stdin=password + "\n").ok()
        token = stack.cli.json("operator", "token", name)["token"]
        assert token.startswith("sbo_")
        known[name] = Operator(name, password, token, api_client(stack, {"authorization": f"Bearer {token}"}))
    return known[name]


@pytest.fixture(scope="module")
def api(sqlite_stack) -> Operator:
    """admin on the SQLite server."""
    return operator(sqlite_stack, "admin")


@pytest.fixture(scope="module")
def admin(stack) -> Operator:
    return operator(stack, "admin")


@pytest.fixture(scope="module")
def bob(stack) -> Operator:
    return operator(stack, "bob")


# -- helpers ------------------------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def assert_security_headers(response: httpx.Response) -> None:
    headers = response.headers
    assert "default-src 'self'" in headers.get("content-security-policy", ""), headers
    assert headers.get("x-frame-options") == "DENY", headers
    assert headers.get("x-content-type-options") == "nosniff", headers


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.request.method, response.request.url, response.status_code,
                                            response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    assert_security_headers(response)
    return response.json()


def refused(response: httpx.Response, status: int, code: str) -> str:
    """Asserts an error answer `{"error", "code"}` with the security headers; returns the message."""
    assert response.status_code == status, (response.request.method, response.request.url, response.status_code,
                                            response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    assert_security_headers(response)
    body = response.json()
    assert set(body) == {"error", "code"} and body["code"] == code, body
    assert isinstance(body["error"], str) and body["error"], body
    return body["error"]


def vend(op: Operator, queues=QUEUES, **options: Any) -> dict[str, Any]:
    return ok(op.post("/endpoints", {"agent": unique("agent"), "queues": list(queues), **options}), 201)


def push(op: Operator, endpoint: dict[str, Any], title: str | None = None, **fields: Any) -> dict[str, Any]:
    answer = ok(op.post(f"/endpoints/{endpoint['slug']}/todos", {"title": title or unique("todo"), **fields}), 201)
    assert answer["created"] is True
    return answer["todo"]


def todo(op: Operator, todo_id: str) -> dict[str, Any]:
    return ok(op.get(f"/todos/{todo_id}"))


def webhook(op: Operator, endpoint: dict[str, Any], source: str = "generic", queue: str = "inbox") -> dict[str, Any]:
    return ok(op.post("/webhooks", {"endpoint": endpoint["slug"], "source_type": source, "target_queue": queue}), 201)


def deliver(hook: dict[str, Any], payload: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """One generic delivery through ingest; returns the 202 body."""
    response = httpx.post(hook["ingest_url"], json=payload, headers=headers or {}, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


def now() -> datetime:
    return datetime.now(timezone.utc)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- todos: list, get, history ------------------------------------------------------------------


def test_list_todos_filters_newest_first_and_limit_bounds(api):
    endpoint = vend(api)
    first = push(api, endpoint)
    second = push(api, endpoint, queue="other")
    third = push(api, endpoint)
    ok(api.post(f"/todos/{third['id']}/claim"))

    for ref in (endpoint["slug"], endpoint["endpoint_id"]):  # `?endpoint=` takes a slug or an id
        rows = ok(api.get("/todos", params={"endpoint": ref}))["todos"]
        assert ids(rows) == [third["id"], second["id"], first["id"]]
    for row in rows:
        assert set(row) == ROW_KEYS, row  # a row, never the payload
        assert row["trust_mode"] == "operator" and row["source"] == "operator" and row["max_attempts"] == 5
    mine = {"endpoint": endpoint["slug"]}
    assert ids(ok(api.get("/todos", params=mine | {"state": "pending"}))["todos"]) == [second["id"], first["id"]]
    assert ids(ok(api.get("/todos", params=mine | {"state": "claimed"}))["todos"]) == [third["id"]]
    assert ok(api.get("/todos", params=mine | {"state": "done"}))["todos"] == []
    assert ids(ok(api.get("/todos", params=mine | {"queue": "other"}))["todos"]) == [second["id"]]
    assert ids(ok(api.get("/todos", params=mine | {"queue": "inbox", "state": "pending"}))["todos"]) == [first["id"]]
    assert ids(ok(api.get("/todos", params=mine | {"limit": 1}))["todos"]) == [third["id"]]
    # a page that does not hold every row says so with next_cursor; ?cursor= continues after it
    page = ok(api.get("/todos", params=mine | {"limit": 2}))
    assert ids(page["todos"]) == [third["id"], second["id"]]
    rest = ok(api.get("/todos", params=mine | {"limit": 2, "cursor": page["next_cursor"]}))
    assert ids(rest["todos"]) == [first["id"]] and "next_cursor" not in rest
    refused(api.get("/todos", params=mine | {"cursor": "nonsense"}), 400, "invalid_argument")
    assert "next_cursor" not in ok(api.get("/todos", params=mine | {"limit": 3}))
    assert len(ok(api.get("/todos", params=mine | {"limit": 1000}))["todos"]) == 3
    assert ok(api.get("/todos", params=mine | {"queue": "quarantine"}))["todos"] == []  # operators may look
    everything = ids(ok(api.get("/todos", params={"limit": 1000}))["todos"])
    assert {first["id"], second["id"], third["id"]} <= set(everything)

    for limit in (0, -1, 1001, 10**30):
        assert "limit" in refused(api.get("/todos", params={"limit": limit}), 400, "invalid_argument")
    refused(api.get("/todos", params={"limit": "ten"}), 422, "validation_failed")
    refused(api.get("/todos", params={"state": "lost"}), 400, "invalid_argument")
    refused(api.get("/todos", params={"queue": "Not A Queue!"}), 400, "invalid_argument")
    refused(api.get("/todos", params={"endpoint": "no-such-endpoint"}), 404, "not_found")


def test_get_todo_is_the_full_todo_and_unknown_ids_answer_404(api):
    endpoint = vend(api)
    payload = {"nested": {"n": 1}, "text": "<script>x</script>"}
    row = push(api, endpoint, payload=payload)
    full = todo(api, row["id"])
    assert set(full) == FULL_KEYS, full
    assert full["payload"] == payload and full["endpoint_id"] == endpoint["endpoint_id"]
    assert full["prior_attempts"] == [] and full["result"] is None and full["attempt"] == 0
    assert {k: full[k] for k in ROW_KEYS} == row
    assert row["payload_size"] == len(json.dumps(payload, separators=(",", ":")).encode())

    for unknown in (f"td_{uuid.uuid4().hex}", "td_nothex", "garbage", "ep_" + uuid.uuid4().hex):
        assert unknown in refused(api.get(f"/todos/{unknown}"), 404, "not_found")
        refused(api.get(f"/todos/{unknown}/history"), 404, "not_found")
        refused(api.get(f"/todos/{unknown}/explain"), 404, "not_found")


def test_history_lists_every_transition_in_order(api):
    endpoint = vend(api)
    row = push(api, endpoint)
    steps = [("claim", {}), ("extend", {}), ("release", {"summary": "later"}), ("claim", {}),
             ("fail", {"summary": "broke"}), ("retry", None), ("claim", {}), ("complete", {"result": {"ok": 1}})]
    for action, body in steps:
        ok(api.post(f"/todos/{row['id']}/{action}", body))
    history = ok(api.get(f"/todos/{row['id']}/history"))
    events = history["events"]
    assert [e["type"] for e in events] == [
        "TodoOpened", "TodoClaimed", "LeaseRenewed", "TodoReleased", "TodoClaimed", "TodoFailed", "TodoRequeued",
        "TodoClaimed", "TodoCompleted",
    ]
    assert [e["version"] for e in events] == list(range(1, len(events) + 1))
    positions = [e["position"] for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    for event in events:
        assert {"position", "version", "time", "type", "actor", "data"} <= set(event), event
        assert event["actor"] == "operator:admin", event
        assert isinstance(event["data"], dict)
    times = [parse_time(e["time"]) for e in events]
    assert times == sorted(times)


def test_explain_tells_the_story_and_why_the_todo_is_in_its_state(api):
    endpoint = vend(api)
    row = push(api, endpoint)
    for action, body in [("claim", {}), ("fail", {"summary": "broke"}), ("retry", None), ("claim", {}),
                         ("complete", {"summary": "fixed"})]:
        ok(api.post(f"/todos/{row['id']}/{action}", body))

    explained = ok(api.get(f"/todos/{row['id']}/explain"))

    assert set(explained) == {"state", "because", "story", "attempts"}
    assert explained["state"] == "done"
    assert re.fullmatch(r"done: attempt 1 was completed by admin at \S+Z: “fixed”", explained["because"])
    history = ok(api.get(f"/todos/{row['id']}/history"))["events"]
    assert [(s["position"], s["time"]) for s in explained["story"]] == [(e["position"], e["time"]) for e in history]
    assert [s["text"].split(" ")[0] for s in explained["story"]] == [
        "Pushed", "Attempt", "Attempt", "Retried", "Attempt", "Attempt"]
    assert explained["story"][2]["text"].startswith("Attempt 1 failed (admin): “broke”. Retry at ")


# -- todos: the actions -------------------------------------------------------------------------


def test_extend_saves_a_checkpoint_and_the_next_claim_resumes_from_it(api):
    endpoint = vend(api)
    todo_id = push(api, endpoint)["id"]
    path = f"/todos/{todo_id}"
    first = ok(api.post(f"{path}/claim"))
    assert first["resume_from"] is None and first["attempts"][0]["outcome"] == "claimed"
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", first["traceparent"])
    refused(api.post(f"{path}/extend", {"checkpoint": "x" * 70_000}), 400, "invalid_argument")  # over 64 KiB
    assert todo(api, todo_id)["lease_expires_at"] == first["lease_expires_at"]  # unchanged
    ok(api.post(f"{path}/extend", {"checkpoint": {"page": 4}}))
    ok(api.post(f"{path}/release", {"summary": "later"}))
    again = ok(api.post(f"{path}/claim"))
    assert again["resume_from"] == {"page": 4}
    assert [(a["n"], a["outcome"], a.get("checkpoint")) for a in again["attempts"]] == [
        (1, "released", {"page": 4}), (2, "claimed", None)]
    assert again["attempts"][0]["summary"] == "later" and again["traceparent"] == again["attempts"][1]["traceparent"]


def test_claim_extend_release_fail_retry_complete(api):
    endpoint = vend(api)
    todo_id = push(api, endpoint)["id"]
    path = f"/todos/{todo_id}"

    for action in ("extend", "complete", "fail", "release"):  # nothing held yet
        refused(api.post(f"{path}/{action}"), 409, "conflict")
    refused(api.post(f"{path}/retry"), 409, "conflict")  # only a failed todo can be retried

    before = now()
    claimed = ok(api.post(f"{path}/claim", {"lease_ttl_seconds": 120}))
    assert set(claimed) >= FULL_KEYS and "lease_token" not in claimed
    assert (claimed["state"], claimed["owner"], claimed["attempt"], claimed["attempt_seq"]) == (
        "claimed", "operator:admin", 1, 1)
    lease = parse_time(claimed["lease_expires_at"])
    assert 115 <= (lease - before).total_seconds() <= 130
    refused(api.post(f"{path}/claim"), 409, "conflict")
    assert todo(api, todo_id)["lease_expires_at"] == claimed["lease_expires_at"]  # the refusal changed nothing

    extended = ok(api.post(f"{path}/extend", {"lease_ttl_seconds": 600}))
    assert set(extended) == ROW_KEYS
    assert 590 <= (parse_time(extended["lease_expires_at"]) - before).total_seconds() <= 610
    default = ok(api.post(f"{path}/extend"))  # no body: the endpoint's default lease (300 s)
    assert 290 <= (parse_time(default["lease_expires_at"]) - now()).total_seconds() <= 305
    refused(api.post(f"{path}/extend", {"lease_ttl_seconds": "long"}), 422, "validation_failed")

    released = ok(api.post(f"{path}/release", {"summary": "not now"}))
    assert (released["state"], released["owner"], released["attempt"]) == ("pending", None, 1)

    ok(api.post(f"{path}/claim"))
    failed = ok(api.post(f"{path}/fail", {"summary": "it broke", "result": {"error": "x"}}))
    assert (failed["state"], failed["dead_letter"], failed["attempt"]) == ("failed", False, 2)
    retry_in = (parse_time(failed["next_retry_at"]) - now()).total_seconds()
    assert 50 <= retry_in <= 61  # 30 s * 2^(2-1)
    refused(api.post(f"{path}/complete"), 409, "conflict")
    refused(api.post(f"{path}/claim"), 409, "conflict")  # its retry is not due yet

    retried = ok(api.post(f"{path}/retry"))
    assert (retried["state"], retried["attempt"], retried["next_retry_at"]) == ("pending", 0, None)
    refused(api.post(f"{path}/retry"), 409, "conflict")

    ok(api.post(f"{path}/claim"))
    refused(api.post(f"{path}/complete", {"result": "x" * 70_000}), 400, "invalid_argument")  # over 64 KiB
    assert todo(api, todo_id)["state"] == "claimed"
    refused(api.post(f"{path}/complete", {"summary": 12}), 422, "validation_failed")
    done = ok(api.post(f"{path}/complete", {"result": {"merged": True}, "summary": "s" * 3000}))
    assert (done["state"], done["owner"], done["lease_expires_at"]) == ("done", None, None)
    full = todo(api, todo_id)
    assert full["result"] == {"merged": True} and full["attempt_seq"] == 3
    attempts = full["prior_attempts"]
    assert [a["outcome"] for a in attempts] == ["completed", "failed", "released"]
    assert [a["seq"] for a in attempts] == [3, 2, 1]
    assert len(attempts[0]["summary"].encode()) <= 2048  # cut, not refused
    assert attempts[1]["summary"] == "it broke" and attempts[2]["summary"] == "not now"
    for action in ("claim", "extend", "complete", "fail", "release", "retry"):
        refused(api.post(f"{path}/{action}"), 409, "conflict")


def test_only_the_lease_holder_may_act(api, sqlite_stack):
    """A todo held by the endpoint (an agent) is not the operator's to extend, complete, fail or release."""
    endpoint = vend(api)
    todo_id = push(api, endpoint)["id"]
    agent = sqlite_stack.app.endpoint_caller(endpoint["slug"])
    sqlite_stack.app.claim(todo_id, caller=agent)
    for action in ("extend", "complete", "fail", "release", "claim"):
        refused(api.post(f"/todos/{todo_id}/{action}"), 409, "conflict")
    held = todo(api, todo_id)
    assert (held["state"], held["owner"]) == ("claimed", f"endpoint:{endpoint['slug']}")


@pytest.mark.parametrize("action", ["claim", "extend", "complete", "fail", "release", "retry", "discard"])
def test_actions_on_unknown_todos_answer_404(api, action):
    unknown = f"td_{uuid.uuid4().hex}"
    assert unknown in refused(api.post(f"/todos/{unknown}/{action}"), 404, "not_found")
    refused(api.post(f"/todos/{unknown}/move", {"queue": "inbox"}), 404, "not_found")


# -- quarantine: move and discard ---------------------------------------------------------------


@pytest.fixture(scope="module")
def boom_hook(api) -> dict[str, Any]:
    """A generic webhook whose rule faults on `{"boom": true}` (saved before any delivery)."""
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    ok(api.put(f"/webhooks/{hook['webhook_id']}/rules", BOOM_RULES))
    return hook | {"endpoint": endpoint}


def quarantined(hook: dict[str, Any]) -> str:
    answer = deliver(hook, {"title": unique("boom"), "boom": True})
    assert answer["faulted"] is True and answer["queue"] == "quarantine", answer
    return answer["id"]


def test_a_quarantined_todo_moves_to_a_queue_of_its_endpoint(api, boom_hook):
    todo_id = quarantined(boom_hook)
    listed = ok(api.get("/todos", params={"endpoint": boom_hook["endpoint"]["slug"], "queue": "quarantine"}))
    assert todo_id in ids(listed["todos"])
    held = todo(api, todo_id)
    assert (held["queue"], held["state"]) == ("quarantine", "pending")
    assert held["routing"] == {"stage": "fault", "rule_index": 0, "rule_id": "boom", "reason": "error",
                               "detail": "boom", "action": {"queue": "quarantine"}}

    path = f"/todos/{todo_id}/move"
    refused(api.post(path, {"queue": "elsewhere"}), 403, "forbidden")  # not one of the endpoint's queues
    refused(api.post(path, {"queue": "quarantine"}), 400, "invalid_argument")
    refused(api.post(path, {"queue": "Bad Name!"}), 400, "invalid_argument")
    refused(api.post(path, {}), 422, "validation_failed")
    refused(api.post(path), 422, "validation_failed")
    assert todo(api, todo_id)["queue"] == "quarantine"

    moved = ok(api.post(path, {"queue": "other"}))
    assert (moved["queue"], moved["state"]) == ("other", "pending")
    refused(api.post(path, {"queue": "inbox"}), 409, "conflict")  # no longer in quarantine
    refused(api.post(f"/todos/{todo_id}/discard"), 409, "conflict")
    assert "TodoMoved" in [e["type"] for e in ok(api.get(f"/todos/{todo_id}/history"))["events"]]
    assert todo_id not in ids(ok(api.get("/todos", params={"queue": "quarantine"}))["todos"])


def test_a_quarantined_todo_can_be_discarded(api, boom_hook):
    todo_id = quarantined(boom_hook)
    discarded = ok(api.post(f"/todos/{todo_id}/discard", {"summary": "spam"}))
    assert (discarded["queue"], discarded["state"]) == ("quarantine", "done")
    refused(api.post(f"/todos/{todo_id}/discard"), 409, "conflict")
    refused(api.post(f"/todos/{todo_id}/move", {"queue": "inbox"}), 409, "conflict")

    held = quarantined(boom_hook)  # nobody works on a quarantined todo: release or discard it first
    refused(api.post(f"/todos/{held}/claim"), 409, "conflict")
    assert todo(api, held)["state"] == "pending"


# -- endpoints: vend, list, revoke, push --------------------------------------------------------


def test_vend_shows_the_credential_once(api, sqlite_stack):
    agent = unique("Vended Agent")
    answer = api.post("/endpoints", {"agent": agent, "queues": ["inbox", "other"]})
    assert answer.headers["cache-control"] == "no-store"  # the credential must not be kept by any cache
    vended = ok(answer, 201)
    assert set(vended) == VEND_KEYS, vended
    assert CREDENTIAL.match(vended["credential"]) and vended["slug"].startswith("vended-agent-")
    assert vended["mcp_url"] == f"{sqlite_stack.server.base}/mcp/{vended['slug']}"
    assert vended["mcp_json"] == {"mcpServers": {"switchboard": {
        "type": "http", "url": vended["mcp_url"], "headers": {"Authorization": f"Bearer {vended['credential']}"},
    }}}
    assert set(vended["verbs"]) == ALL_VERBS and vended["queues"] == ["inbox", "other"]
    assert vended["expires_at"] is None

    listing = api.get("/endpoints")
    rows = ok(listing)["endpoints"]
    assert vended["credential"] not in listing.text and "sbk_" not in listing.text
    row = next(r for r in rows if r["endpoint_id"] == vended["endpoint_id"])
    assert "credential" not in row and "mcp_json" not in row
    assert (row["slug"], row["agent"], row["owner"], row["revoked"]) == (vended["slug"], agent, "admin", False)

    scoped = ok(api.post("/endpoints", {
        "agent": unique("scoped"), "queues": ["inbox"], "verbs": ["list_todos", "claim"], "webhook_max": 0,
        "source_types": ["github"], "webhook_queues": ["inbox"], "ttl_seconds": 3600,
        "default_lease_ttl_seconds": 120,
    }), 201)
    assert scoped["verbs"] == ["list_todos", "claim"]
    assert 3500 <= (parse_time(scoped["expires_at"]) - now()).total_seconds() <= 3700
    row = next(r for r in ok(api.get("/endpoints"))["endpoints"] if r["endpoint_id"] == scoped["endpoint_id"])
    assert (row["webhook_max"], row["source_types"], row["default_lease_ttl_seconds"]) == (0, ["github"], 120)


@pytest.mark.parametrize("body", [
    pytest.param({"agent": "a"}, id="no-queues"),
    pytest.param({"queues": ["inbox"]}, id="no-agent"),
    pytest.param({"agent": "a", "queues": []}, id="empty-queues"),
    pytest.param({"agent": "", "queues": ["inbox"]}, id="empty-agent"),
    pytest.param({"agent": "a", "queues": ["quarantine"]}, id="reserved-queue"),
    pytest.param({"agent": "a", "queues": ["Not A Queue"]}, id="bad-queue"),
    pytest.param({"agent": "a", "queues": "inbox"}, id="queues-not-a-list"),
    pytest.param({"agent": "a", "queues": ["inbox"], "verbs": ["fly"]}, id="unknown-verb"),
    pytest.param({"agent": "a", "queues": ["inbox"], "webhook_max": 1001}, id="ceiling-too-high"),
    pytest.param({"agent": "a", "queues": ["inbox"], "webhook_max": -1}, id="negative-ceiling"),
    pytest.param({"agent": "a", "queues": ["inbox"], "source_types": ["svn"]}, id="unknown-source-type"),
    pytest.param({"agent": "a", "queues": ["inbox"], "ttl_seconds": 0}, id="zero-ttl"),
    pytest.param({"agent": "a", "queues": ["inbox"], "ttl_seconds": 10**15}, id="ttl-beyond-any-date"),
    pytest.param({"agent": "a", "queues": ["inbox"], "default_lease_ttl_seconds": 59}, id="short-lease"),
    pytest.param({"agent": "a", "queues": ["inbox"], "default_lease_ttl_seconds": 86401}, id="long-lease"),
    pytest.param([], id="array"),
])
def test_vend_refuses_bad_input(api, body):
    """Values the schema admits but the contract refuses: 400; bodies the schema refuses: 422."""
    before = len(ok(api.get("/endpoints"))["endpoints"])
    misfit = not isinstance(body, dict) or "agent" not in body or "queues" not in body or isinstance(body["queues"], str)
    refused(api.post("/endpoints", body), *((422, "validation_failed") if misfit else (400, "invalid_argument")))
    assert len(ok(api.get("/endpoints"))["endpoints"]) == before


def test_vend_refuses_unreadable_bodies(api):
    refused(api.post("/endpoints"), 422, "validation_failed")
    refused(api.post("/endpoints", content=b"{not json", headers={"content-type": "application/json"}), 400,
            "invalid_argument")


def test_revoke_then_revoke_again_is_a_conflict(api, sqlite_stack):
    endpoint = vend(api)
    pending = push(api, endpoint)
    revoked = ok(api.post(f"/endpoints/{endpoint['slug']}/revoke"))
    assert revoked["endpoint_id"] == endpoint["endpoint_id"] and revoked["revoked"] is True
    assert "credential" not in revoked
    refused(api.post(f"/endpoints/{endpoint['slug']}/revoke"), 409, "conflict")
    refused(api.post(f"/endpoints/{endpoint['endpoint_id']}/revoke"), 409, "conflict")  # by id too
    refused(api.post(f"/endpoints/{endpoint['slug']}/todos", {"title": "late"}), 409, "conflict")
    row = next(r for r in ok(api.get("/endpoints"))["endpoints"] if r["endpoint_id"] == endpoint["endpoint_id"])
    assert row["revoked"] is True
    assert todo(api, pending["id"])["state"] == "pending"
    # the credential stops working at once
    mcp = httpx.post(endpoint["mcp_url"], json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                     headers={"authorization": f"Bearer {endpoint['credential']}",
                              "accept": "application/json, text/event-stream"})
    assert mcp.status_code == 401

    by_id = vend(api)
    assert ok(api.post(f"/endpoints/{by_id['endpoint_id']}/revoke"))["revoked"] is True
    for unknown in ("no-such-endpoint", f"ep_{uuid.uuid4().hex}"):
        assert unknown in refused(api.post(f"/endpoints/{unknown}/revoke"), 404, "not_found")


def test_push_creates_then_a_live_key_answers_200(api):
    endpoint = vend(api)
    path = f"/endpoints/{endpoint['slug']}/todos"
    payload = {"repo": "o/r", "n": [1, 2, 3]}
    first = ok(api.post(path, {"title": "deploy", "payload": payload, "key": "deploy-1"}), 201)
    assert first["created"] is True and set(first["todo"]) == ROW_KEYS
    row = first["todo"]
    assert (row["queue"], row["title"], row["state"], row["trust_mode"], row["source"]) == (
        "inbox", "deploy", "pending", "operator", "operator")
    assert row["payload_size"] == len(json.dumps(payload, separators=(",", ":")).encode())

    again = ok(api.post(path, {"title": "deploy again", "payload": {}, "key": "deploy-1"}), 200)
    assert again == {"todo": row, "created": False}
    ok(api.post(f"/todos/{row['id']}/claim"))
    assert ok(api.post(path, {"title": "x", "key": "deploy-1"}), 200)["todo"]["id"] == row["id"]  # still live
    ok(api.post(f"/todos/{row['id']}/complete"))
    fresh = ok(api.post(path, {"title": "deploy", "key": "deploy-1"}), 201)  # done: the key mints anew
    assert fresh["created"] is True and fresh["todo"]["id"] != row["id"]

    by_id = ok(api.post(f"/endpoints/{endpoint['endpoint_id']}/todos", {"title": "t", "queue": "other"}), 201)
    assert by_id["todo"]["queue"] == "other"
    assert ok(api.post(path, {"title": "no payload"}), 201)["todo"]["payload_size"] == len(b"null")


@pytest.mark.parametrize(("body", "status", "code"), [
    pytest.param({}, 422, "validation_failed", id="no-title"),
    pytest.param({"title": ""}, 400, "invalid_argument", id="empty-title"),
    pytest.param({"title": 7}, 422, "validation_failed", id="title-not-text"),
    pytest.param({"title": "t", "key": ""}, 400, "invalid_argument", id="empty-key"),
    pytest.param({"title": "t", "key": "k" * 600}, 400, "invalid_argument", id="long-key"),
    pytest.param({"title": "t", "queue": "quarantine"}, 400, "invalid_argument", id="quarantine"),
    pytest.param({"title": "t", "queue": "Bad Queue"}, 400, "invalid_argument", id="bad-queue"),
    pytest.param({"title": "t", "queue": "elsewhere"}, 403, "forbidden", id="queue-out-of-scope"),
])
def test_push_refusals_store_nothing(api, body, status, code):
    endpoint = vend(api)
    refused(api.post(f"/endpoints/{endpoint['slug']}/todos", body), status, code)
    assert ok(api.get("/todos", params={"endpoint": endpoint["slug"]}))["todos"] == []


def test_push_to_an_unknown_endpoint_is_404_and_an_oversized_body_is_413(api):
    for unknown in ("no-such-endpoint", f"ep_{uuid.uuid4().hex}"):
        assert unknown in refused(api.post(f"/endpoints/{unknown}/todos", {"title": "t"}), 404, "not_found")
    endpoint = vend(api)
    body = json.dumps({"title": "huge", "payload": "x" * (MAX_API_BODY + 1024)}).encode()
    response = api.http.post(f"/endpoints/{endpoint['slug']}/todos", content=body,
                             headers={"content-type": "application/json"})
    refused(response, 413, "payload_too_large")
    assert ok(api.get("/todos", params={"endpoint": endpoint["slug"]}))["todos"] == []


# -- JSON types: a body's values are read as the types they are ----------------------------------
#
# reference.md's error table: a wrong type is 422 validation_failed. The JSON string "3" is not a
# number, "true" (or 1) is not a boolean, "null" is not null, 7 is not text; nothing is stored. A
# query parameter is text by nature and is read as its type (`?limit=10`; `?limit=ten` is 422,
# test_list_todos_filters_newest_first_and_limit_bounds).


@pytest.mark.parametrize("change", [
    pytest.param({"max_in_flight": "3"}, id="int-as-text"),
    pytest.param({"max_claims_per_minute": "30"}, id="rate-as-text"),
    pytest.param({"max_in_flight": 3.0}, id="int-as-float"),
    pytest.param({"max_in_flight": "null"}, id="null-as-text"),
    pytest.param({"paused": "true"}, id="bool-as-text"),
    pytest.param({"paused": 1}, id="bool-as-number"),
])
def test_queue_controls_of_the_wrong_json_type_are_refused_and_change_nothing(api, change):
    endpoint = vend(api)
    queues = f"/endpoints/{endpoint['slug']}/queues"
    ok(api.put(f"{queues}/inbox", {"max_in_flight": 5}))
    before = ok(api.get(queues))
    (field,) = change
    assert field in refused(api.put(f"{queues}/inbox", change), 422, "validation_failed")
    assert ok(api.get(queues)) == before
    assert ok(api.put(f"{queues}/inbox", {"paused": True, "max_in_flight": 3, "max_claims_per_minute": 30})) == {
        "queue": "inbox", "paused": True, "max_in_flight": 3, "max_claims_per_minute": 30, "in_flight": 0,
        "claims_last_minute": 0}


def test_a_lease_or_a_delay_sent_as_text_is_refused_and_the_todo_stays_as_it_was(api):
    endpoint = vend(api)
    todo_id = push(api, endpoint)["id"]
    path = f"/todos/{todo_id}"
    for body in ({"lease_ttl_seconds": "120"}, {"lease_ttl_seconds": "nan"}):
        assert "lease_ttl_seconds" in refused(api.post(f"{path}/claim", body), 422, "validation_failed")
    assert todo(api, todo_id)["state"] == "pending"
    claimed = ok(api.post(f"{path}/claim", {"lease_ttl_seconds": 120}))
    events = ok(api.get(f"{path}/history"))["events"]
    assert "lease_ttl_seconds" in refused(api.post(f"{path}/extend", {"lease_ttl_seconds": "600"}), 422,
                                          "validation_failed")
    assert "delay_seconds" in refused(api.post(f"{path}/release", {"delay_seconds": "600"}), 422,
                                      "validation_failed")
    assert "summary" in refused(api.post(f"{path}/release", {"summary": 5}), 422, "validation_failed")
    held = todo(api, todo_id)
    assert (held["state"], held["lease_expires_at"]) == ("claimed", claimed["lease_expires_at"])
    assert ok(api.get(f"{path}/history"))["events"] == events


@pytest.mark.parametrize("change", [
    pytest.param({"webhook_max": "3"}, id="ceiling-as-text"),
    pytest.param({"ttl_seconds": "3600"}, id="ttl-as-text"),
    pytest.param({"default_lease_ttl_seconds": "120"}, id="lease-as-text"),
    pytest.param({"agent": 7}, id="agent-as-number"),
])
def test_vend_refuses_a_value_of_the_wrong_json_type(api, change):
    before = len(ok(api.get("/endpoints"))["endpoints"])
    body = {"agent": unique("typed"), "queues": ["inbox"]} | change
    (field,) = change
    assert field in refused(api.post("/endpoints", body), 422, "validation_failed")
    assert len(ok(api.get("/endpoints"))["endpoints"]) == before


def test_a_bulk_retry_with_booleans_sent_as_text_is_refused_and_retries_nothing(api):
    endpoint = vend(api)
    todo_id = push(api, endpoint)["id"]
    for _ in range(5):  # a release spends an attempt: the fifth makes a dead letter
        ok(api.post(f"/todos/{todo_id}/claim"))
        released = ok(api.post(f"/todos/{todo_id}/release"))
    assert (released["state"], released["dead_letter"]) == ("failed", True)
    for change in ({"dead_letters": "true"}, {"dry_run": "false"}, {"dry_run": 0}, {"queue": 1}):
        body = {"endpoint": endpoint["slug"], "dead_letters": True, "dry_run": True} | change
        (field,) = change
        assert field in refused(api.post("/todos/retry", body), 422, "validation_failed")
    still = todo(api, todo_id)
    assert (still["state"], still["dead_letter"]) == ("failed", True)
    assert ok(api.post("/todos/retry", {"endpoint": endpoint["slug"], "dead_letters": True, "dry_run": True})) == {
        "would_retry": 1}


def test_a_replay_of_the_last_n_sent_as_text_is_refused(api):
    hook = webhook(api, vend(api))
    path = f"/webhooks/{hook['webhook_id']}/rules/replay"
    assert "last" in refused(api.post(path, {"rules": [], "last": "10"}), 422, "validation_failed")
    assert ok(api.post(path, {"rules": [], "last": 10}))["evaluated"] == 0


# -- webhooks -----------------------------------------------------------------------------------


def test_webhooks_create_list_rotate_delete(api):
    endpoint = vend(api, webhook_max=2)
    generic = webhook(api, endpoint)
    assert set(generic) == {"webhook_id", "ingest_url", "source_type", "target_queue", "trust_mode"}
    assert (generic["source_type"], generic["trust_mode"], generic["target_queue"]) == ("generic", "token", "inbox")
    signed = webhook(api, endpoint, "github", "inbox")
    assert signed["trust_mode"] == "signed" and SIGNING_SECRET.match(signed["signing_secret"])

    listing = api.get("/webhooks", params={"endpoint": endpoint["slug"]})
    answer = ok(listing)
    assert signed["signing_secret"] not in listing.text and generic["ingest_url"] not in listing.text
    assert [w["webhook_id"] for w in answer["webhooks"]] == [generic["webhook_id"], signed["webhook_id"]]
    for row in answer["webhooks"]:
        assert "signing_secret" not in row and "ingest_url" not in row
    assert answer["ceiling"] == {"max": 2, "used": 2, "allowed_source_types": ["github", "gitea", "cairn", "generic"],
                                 "allowed_queues": ["inbox", "other"]}
    everything = ok(api.get("/webhooks"))
    assert {generic["webhook_id"], signed["webhook_id"]} <= {w["webhook_id"] for w in everything["webhooks"]}
    assert "ceiling" not in everything
    refused(api.post("/webhooks", {"endpoint": endpoint["slug"], "source_type": "gitea", "target_queue": "inbox"}),
            409, "ceiling_exceeded")

    # rotate: a new URL at once, the old one is unknown
    first_url = generic["ingest_url"]
    rotated = ok(api.post(f"/webhooks/{generic['webhook_id']}/rotate"))
    assert rotated["webhook_id"] == generic["webhook_id"] and rotated["ingest_url"] != first_url
    assert "signing_secret" not in rotated
    assert httpx.post(first_url, json={"title": "old"}).status_code == 404
    assert httpx.post(rotated["ingest_url"], json={"title": "new"}).status_code == 202
    resigned = ok(api.post(f"/webhooks/{signed['webhook_id']}/rotate"))
    assert SIGNING_SECRET.match(resigned["signing_secret"]) and resigned["signing_secret"] != signed["signing_secret"]

    # delete: gone for good, and the ceiling has room again
    assert ok(api.post(f"/webhooks/{generic['webhook_id']}/delete")) == {
        "webhook_id": generic["webhook_id"], "deleted": True}
    for path in ("delete", "rotate"):
        refused(api.post(f"/webhooks/{generic['webhook_id']}/{path}"), 404, "not_found")
    refused(api.get(f"/webhooks/{generic['webhook_id']}/rules"), 404, "not_found")
    assert httpx.post(rotated["ingest_url"], json={"title": "gone"}).status_code == 404
    assert generic["webhook_id"] not in {w["webhook_id"] for w in ok(api.get("/webhooks"))["webhooks"]}
    webhook(api, endpoint, "gitea", "other")


@pytest.mark.parametrize(("change", "status", "code"), [
    pytest.param({"source_type": "svn"}, 400, "invalid_argument", id="unknown-source"),
    pytest.param({"source_type": ""}, 400, "invalid_argument", id="empty-source"),
    pytest.param({"target_queue": "quarantine"}, 400, "invalid_argument", id="quarantine"),
    pytest.param({"target_queue": "elsewhere"}, 403, "forbidden", id="queue-not-allowed"),
    pytest.param({"source_type": "gitea"}, 403, "forbidden_source_type", id="source-not-allowed"),
    pytest.param({"endpoint": "no-such-endpoint"}, 404, "not_found", id="unknown-endpoint"),
    pytest.param({"endpoint": None}, 422, "validation_failed", id="no-endpoint"),
])
def test_create_webhook_refusals(api, change, status, code):
    endpoint = vend(api, source_types=["github", "generic"], webhook_queues=["inbox"])
    body = {"endpoint": endpoint["slug"], "source_type": "generic", "target_queue": "inbox"} | change
    refused(api.post("/webhooks", {k: v for k, v in body.items() if v is not None}), status, code)
    assert ok(api.get("/webhooks", params={"endpoint": endpoint["slug"]}))["webhooks"] == []


def test_webhooks_for_the_new_senders_through_the_api(api):
    endpoint = vend(api, webhook_max=3, source_types=["standard", "stripe", "slack"])
    made = {source: webhook(api, endpoint, source) for source in ("standard", "stripe", "slack")}
    assert {hook["trust_mode"] for hook in made.values()} == {"signed"}
    assert SIGNING_SECRET.match(made["stripe"]["signing_secret"]) and SIGNING_SECRET.match(made["slack"]["signing_secret"])
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", made["standard"]["signing_secret"])
    listing = ok(api.get("/webhooks", params={"endpoint": endpoint["slug"]}))
    assert listing["ceiling"]["allowed_source_types"] == ["standard", "stripe", "slack"]
    assert [w["source_type"] for w in listing["webhooks"]] == ["standard", "stripe", "slack"]
    refused(api.post("/webhooks", {"endpoint": vend(api)["slug"], "source_type": "slack", "target_queue": "inbox"}),
            403, "forbidden_source_type")


def test_webhook_routes_on_unknown_ids_answer_404(api):
    unknown = f"wh_{uuid.uuid4().hex}"
    for method, path, body in (
        ("POST", "rotate", None), ("POST", "delete", None), ("GET", "rules", None),
        ("PUT", "rules", {"rules": []}), ("POST", "rules/test", {"payload": {}}),
        ("POST", "rules/replay", {"rules": {"rules": []}}),
    ):
        response = api.http.request(method, f"/webhooks/{unknown}/{path}", json=body)
        assert unknown in refused(response, 404, "not_found")
    refused(api.get("/webhooks", params={"endpoint": "no-such-endpoint"}), 404, "not_found")
    refused(api.get("/events", params={"webhook": unknown}), 404, "not_found")


# -- rules --------------------------------------------------------------------------------------


def test_rules_get_and_put(api):
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    path = f"/webhooks/{hook['webhook_id']}/rules"
    assert ok(api.get(path)) == {"webhook_id": hook["webhook_id"], "rules": [], "default_action": None, "params": {}}
    document = {
        "rules": [{"name": "pings", "expr": '.payload.kind == "ping"', "action": {"drop": True}},
                  {"id": "urgent", "expr": ".payload.urgent == $params.flag", "action": {"queue": "other"}}],
        "default_action": {"queue": "inbox"}, "params": {"flag": True},
    }
    saved = ok(api.put(path, document))
    assert RULE_ID.match(saved["rules"][0]["id"]), saved  # minted when omitted
    assert saved["rules"][1]["id"] == "urgent"
    assert (saved["default_action"], saved["params"]) == ({"queue": "inbox"}, {"flag": True})
    assert ok(api.get(path)) == saved
    # the saved rules route deliveries
    assert deliver(hook, {"urgent": True})["queue"] == "other"
    assert deliver(hook, {"kind": "ping"}).get("dropped") is True
    assert deliver(hook, {"urgent": False})["queue"] == "inbox"


def _rule(rule_id: str, expr: str = "true", action: dict | None = None) -> dict:
    return {"id": rule_id, "expr": expr, "action": action or {"queue": "other"}}


@pytest.mark.parametrize(("document", "status", "code"), [
    pytest.param({"rules": [_rule(f"r{i}") for i in range(33)]}, 400, "too_many_rules", id="too_many_rules"),
    pytest.param({"rules": [_rule("bad", action={"teleport": True})]}, 400, "invalid_rule", id="invalid_rule"),
    pytest.param({"rules": [_rule("same"), _rule("same")]}, 400, "invalid_rule", id="duplicate-id"),
    pytest.param({"rules": [_rule("bad id!")]}, 400, "invalid_rule", id="bad-id"),
    pytest.param({"rules": [_rule("x", expr="(((")]}, 400, "invalid_expression", id="invalid_expression"),
    pytest.param({"rules": [_rule("x", expr="$ENV.HOME")]}, 400, "forbidden_function", id="forbidden_function"),
    pytest.param({"rules": [_rule("x", expr="input")]}, 400, "forbidden_function", id="input"),
    pytest.param({"rules": [], "params": {"big": "x" * 17_000}}, 400, "invalid_params", id="invalid_params"),
    pytest.param({"rules": [], "params": "nope"}, 400, "invalid_params", id="params-a-string"),
    pytest.param({"rules": [], "params": [1, 2]}, 400, "invalid_params", id="params-a-list"),
    pytest.param({"rules": [_rule("x", action={"queue": "elsewhere"})]}, 403, "forbidden", id="forbidden-queue"),
    pytest.param({"rules": [_rule("x", action={"queue": "other", "endpoints": [f"ep_{'0' * 32}"]})]}, 403,
                 "forbidden", id="forbidden-endpoint"),
    pytest.param({"rules": [_rule("x", action={"queue": "quarantine"})]}, 400, "invalid_rule", id="quarantine"),
    pytest.param({"rules": "true"}, 422, "validation_failed", id="rules-not-a-list"),
    pytest.param({"default_action": {"queue": "other"}}, 422, "validation_failed", id="no-rules"),
])
def test_every_refused_rule_save_keeps_the_saved_rules(api, document, status, code):
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    path = f"/webhooks/{hook['webhook_id']}/rules"
    saved = ok(api.put(path, {"rules": [_rule("keep", '.payload.keep == true')], "params": {"p": 1}}))
    message = refused(api.put(path, document), status, code)
    if code not in ("invalid_argument", "invalid_params", "too_many_rules", "validation_failed"):
        assert "rule #1" in message or "rule #2" in message, message  # the error names the rule
    assert ok(api.get(path)) == saved


def test_a_rule_save_that_faults_on_a_stored_delivery_is_refused(api):
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    path = f"/webhooks/{hook['webhook_id']}/rules"
    saved = ok(api.put(path, {"rules": [_rule("keep", ".payload.keep == true")]}))
    event_id = deliver(hook, {"boom": True})["event_id"]
    message = refused(api.put(path, BOOM_RULES), 400, "invalid_argument")
    assert "rule #1 (boom)" in message and event_id in message, message
    assert ok(api.get(path)) == saved


def test_rules_test_takes_exactly_one_of_payload_or_event_id(api):
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    ok(api.put(f"/webhooks/{hook['webhook_id']}/rules",
               {"rules": [_rule("urgent", ".payload.urgent == true", {"queue": "other"})]}))
    event_id = deliver(hook, {"urgent": True}, headers={"authorization": "Bearer hidden"})["event_id"]
    path = f"/webhooks/{hook['webhook_id']}/rules/test"

    tested = ok(api.post(path, {"payload": {"urgent": True}, "headers": {"X-Thing": "1"}}))
    assert set(tested) == {"decision", "trace", "envelope"}
    assert tested["decision"] == {"drop": False, "queue": "other", "endpoints": [endpoint["endpoint_id"]],
                                  "faulted": False}
    assert tested["trace"] == {"stage": "rule", "rule_index": 0, "rule_id": "urgent", "action": {"queue": "other"}}
    assert tested["envelope"]["payload"] == {"urgent": True} and tested["envelope"]["headers"] == {"x-thing": "1"}
    assert ok(api.post(path, {"payload": None}))["trace"]["stage"] == "default"  # a JSON null payload is given

    stored = ok(api.post(path, {"event_id": event_id}))
    assert stored["decision"]["queue"] == "other"
    assert stored["envelope"]["headers"]["authorization"] == REDACTED

    # the candidate at the top level, as `rules set --file` reads it and as replay takes it
    candidate = {"rules": [_rule("all", "true", {"drop": True})]}
    assert ok(api.post(path, {"event_id": event_id, **candidate}))["decision"]["drop"] is True
    assert ok(api.post(path, {"payload": {}, "rules": [], "default_action": {"queue": "inbox"}}))[
        "trace"] == {"stage": "default", "action": {"queue": "inbox"}}
    params_rule = [_rule("flagged", "$params.flag == true", {"drop": True})]
    assert ok(api.post(path, {"payload": {}, "rules": params_rule, "params": {"flag": True}}))["decision"]["drop"]
    assert not ok(api.post(path, {"payload": {}, "rules": params_rule}))["decision"]["drop"]
    # the older nested form still works
    assert ok(api.post(path, {"event_id": event_id, "rules": candidate}))["decision"]["drop"] is True
    for params in ("nope", [1], {"big": "x" * 17_000}):
        refused(api.post(path, {"payload": {}, "rules": [], "params": params}), 400, "invalid_params")

    refused(api.post(path, {}), 400, "invalid_argument")
    refused(api.post(path, {"payload": {}, "event_id": event_id}), 400, "invalid_argument")
    refused(api.post(path, {"payload": {}, "rules": {"rules": [{"expr": "true", "action": {"drop": True}}]}}),
            400, "invalid_rule")  # candidate rules must carry ids
    refused(api.post(path, {"payload": {}, "rules": {"rules": [_rule("x", "$ENV")]}}), 400, "forbidden_function")
    refused(api.post(path, {"payload": {}, "headers": {"x": 1}}), 422, "validation_failed")
    refused(api.post(path, {"event_id": f"ev_{uuid.uuid4().hex}"}), 404, "not_found")
    refused(api.post(path, {"event_id": "nonsense"}), 404, "not_found")
    # saved rules are unchanged by a dry run
    assert [r["id"] for r in ok(api.get(f"/webhooks/{hook['webhook_id']}/rules"))["rules"]] == ["urgent"]


def test_rules_replay_compares_candidate_with_saved_rules(api):
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    path = f"/webhooks/{hook['webhook_id']}/rules/replay"
    events = [deliver(hook, {"n": n})["event_id"] for n in range(3)]
    candidate = {"rules": [_rule("two", ".payload.n == 2", {"drop": True})]}
    replayed = ok(api.post(path, candidate))  # the dry run's shape: the candidate at the top level
    assert ok(api.post(path, {"rules": candidate})) == replayed  # the older nested form still works
    assert replayed["evaluated"] == 3
    assert replayed["decisions"] == {"queue:inbox": 2, "drop": 1}
    assert [c["event_id"] for c in replayed["changed"]] == [events[2]]
    assert replayed["changed"][0]["before"]["queue"] == "inbox" and replayed["changed"][0]["after"]["drop"] is True
    assert (replayed["changed"][0]["kind"], replayed["changed"][0]["title"]) == (None, "webhook delivery")
    assert ok(api.post(path, {**candidate, "last": 2}))["evaluated"] == 2
    assert ok(api.post(path, {**candidate, "default_action": {"drop": True}}))["decisions"] == {"drop": 3}
    refused(api.post(path, {**candidate, "params": "nope"}), 400, "invalid_params")
    assert ok(api.post(path, {"rules": {"rules": []}, "last": 100_000}))["changed"] == []

    for last in (0, -1, 100_001):
        refused(api.post(path, {"rules": candidate, "last": last}), 400, "invalid_argument")
    refused(api.post(path, {}), 422, "validation_failed")
    refused(api.post(path, {"rules": {"rules": [_rule("x", "(((")]}}), 400, "invalid_expression")
    refused(api.post(path, {"rules": {"rules": [{"expr": "true", "action": {"drop": True}}]}}), 400, "invalid_rule")
    assert ok(api.get(f"/webhooks/{hook['webhook_id']}/rules"))["rules"] == []  # nothing saved


# -- events -------------------------------------------------------------------------------------


def test_events_list_and_get(api):
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    first_delivery_id = unique("d")
    first = deliver(hook, {"title": "one"}, headers={"authorization": "Bearer secret", "x-delivery-id": first_delivery_id})
    second = deliver(hook, {"title": "two"})

    listed = ok(api.get("/events", params={"webhook": hook["webhook_id"]}))
    assert [e["id"] for e in listed["events"]] == [second["event_id"], first["event_id"]]
    # the sender's delivery id, to match its "recent deliveries" (here X-Delivery-Id, else the body's hash)
    assert listed["events"][1]["delivery_id"] == first_delivery_id
    assert listed["events"][0]["delivery_id"].startswith("sha256:")
    assert "next_cursor" not in listed
    for row in listed["events"]:
        assert "payload" not in row and "headers" not in row and "body" not in row
        assert row["webhook_id"] == hook["webhook_id"] and row["disposition"] == "routed"
    everything = ok(api.get("/events", params={"limit": 200}))["events"]
    assert {first["event_id"], second["event_id"]} <= {e["id"] for e in everything}

    page = ok(api.get("/events", params={"webhook": hook["webhook_id"], "limit": 1}))
    assert [e["id"] for e in page["events"]] == [second["event_id"]]
    rest = ok(api.get("/events", params={"webhook": hook["webhook_id"], "limit": 1, "cursor": page["next_cursor"]}))
    assert [e["id"] for e in rest["events"]] == [first["event_id"]]

    detail = ok(api.get(f"/events/{first['event_id']}"))
    assert EVENT_ID.match(detail["id"]) and detail["id"] == first["event_id"]
    assert detail["delivery_id"] == first_delivery_id
    assert detail["payload"] == {"title": "one"} and detail["headers"]["authorization"] == REDACTED
    assert detail["webhook_id"] == hook["webhook_id"] and detail["endpoint_id"] == endpoint["endpoint_id"]
    assert [t["id"] for t in detail["todos"]] == [first["id"]] and TODO_ID.match(first["id"])

    for limit in (0, 201, -5):
        refused(api.get("/events", params={"limit": limit}), 400, "invalid_argument")
    refused(api.get("/events", params={"limit": "many"}), 422, "validation_failed")
    for cursor in ("not-a-position", "-1", "9" * 19, "1" * 20):
        refused(api.get("/events", params={"cursor": cursor}), 400, "invalid_argument")
    for unknown in (f"ev_{uuid.uuid4().hex}", "ev_nothex", "nothing"):
        assert unknown in refused(api.get(f"/events/{unknown}"), 404, "not_found")


# -- the live stream ----------------------------------------------------------------------------


def _sse_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event.get("event") == "todo":
                yield json.loads(event["data"])
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.strip()


def test_stream_sends_this_operators_transitions(sqlite_stack, api):
    endpoint = vend(api)
    with api_client(sqlite_stack, {"authorization": f"Bearer {api.token}"}) as client, \
            client.stream("GET", "/stream", timeout=httpx.Timeout(10, read=10)) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        assert_security_headers(response)
        row = push(api, endpoint)  # after the stream opened: sent live
        for data in _sse_events(response):
            if data["todo_id"] == row["id"]:
                break
        assert (data["type"], data["state"], data["queue"]) == ("TodoOpened", "pending", "inbox")
        assert data["endpoint_id"] == endpoint["endpoint_id"]

    refused(api.get("/stream", headers={"last-event-id": "soon"}), 400, "invalid_argument")
    refused(httpx.get(f"{sqlite_stack.server.base}/api/v1/stream"), 401, "unauthorized")


# -- authentication -----------------------------------------------------------------------------


ROUTES = [
    ("GET", "/todos", None), ("GET", "/todos/{todo}", None), ("GET", "/todos/{todo}/history", None),
    ("GET", "/todos/{todo}/explain", None),
    *(("POST", f"/todos/{{todo}}/{action}", {}) for action in ("claim", "extend", "complete", "fail", "release")),
    ("POST", "/todos/{todo}/retry", None), ("POST", "/todos/{todo}/move", {"queue": "inbox"}),
    ("POST", "/todos/{todo}/discard", {}),
    ("POST", "/endpoints", {"agent": "a", "queues": ["inbox"]}), ("GET", "/endpoints", None),
    ("POST", "/endpoints/{endpoint}/revoke", None), ("POST", "/endpoints/{endpoint}/todos", {"title": "t"}),
    ("GET", "/webhooks", None), ("POST", "/webhooks", {"endpoint": "{endpoint}", "source_type": "generic",
                                                         "target_queue": "inbox"}),
    ("POST", "/webhooks/{webhook}/rotate", None), ("POST", "/webhooks/{webhook}/delete", None),
    ("GET", "/webhooks/{webhook}/rules", None), ("PUT", "/webhooks/{webhook}/rules", {"rules": []}),
    ("POST", "/webhooks/{webhook}/rules/test", {"payload": {}}),
    ("POST", "/webhooks/{webhook}/rules/replay", {"rules": {"rules": []}}),
    ("GET", "/events", None), ("GET", "/events/{event}", None), ("GET", "/stream", None),
]


@pytest.fixture(scope="module")
def things(api, sqlite_stack) -> dict[str, str]:
    """One of each of admin's things, and an `sbk_` credential."""
    endpoint = vend(api)
    hook = webhook(api, endpoint)
    delivered = deliver(hook, {"title": "auth"})
    return {"endpoint": endpoint["slug"], "webhook": hook["webhook_id"], "event": delivered["event_id"],
            "todo": delivered["id"], "credential": endpoint["credential"]}


def _request(client: httpx.Client, method: str, path: str, body: Any, things: dict[str, str], **kw: Any):
    path = path.format(**things)
    if isinstance(body, dict):
        body = json.loads(json.dumps(body).replace("{endpoint}", things["endpoint"]))
    return client.request(method, path, json=body, **kw)


def _unchanged(api: Operator, things: dict[str, str]) -> tuple:
    """What an unauthenticated request could have changed."""
    return (todo(api, things["todo"]), ok(api.get("/endpoints")), ok(api.get("/webhooks")),
            ok(api.get(f"/webhooks/{things['webhook']}/rules")))


@pytest.mark.parametrize("authorization", [
    pytest.param(None, id="none"),
    pytest.param("Bearer {credential}", id="sbk-credential"),
    pytest.param("Bearer sbo_" + "A" * 43, id="wrong-sbo"),
    pytest.param("Bearer", id="bare-scheme"),
    pytest.param("Basic YWRtaW46YWRtaW4=", id="basic"),
    pytest.param("Bearer sbo_" + "A" * 300, id="long-token"),
])
def test_requests_without_a_valid_credential_answer_401(sqlite_stack, api, things, authorization):
    before = _unchanged(api, things)
    headers = {"authorization": authorization.format(**things)} if authorization else {}
    with api_client(sqlite_stack, headers) as client:
        for method, path, body in ROUTES:
            message = refused(_request(client, method, path, body, things), 401, "unauthorized")
            assert "sbo_" in message
    assert _unchanged(api, things) == before


def test_an_operator_token_does_not_open_board_pages(sqlite_stack, api):
    page = httpx.get(f"{sqlite_stack.server.base}/todos", headers={"authorization": f"Bearer {api.token}"})
    assert page.status_code in (303, 401, 404), (page.status_code, page.text[:200])  # 404: no board yet
    if page.status_code == 303:
        assert page.headers["location"].startswith("/login")


def board_session(stack: Stack, name: str, password: str) -> tuple[str, str]:
    """A signed-in board session (cookie value, CSRF token): through `POST /login` with the form's CSRF
    token when the board serves it, else minted with the server's key."""
    codec = SessionCodec(SECRET_KEY, secure=False)
    with httpx.Client(base_url=stack.server.base, timeout=30) as client:
        form = client.get("/login")
        anonymous = codec.decode(form.cookies.get(COOKIE)) if form.status_code == 200 else None
        if anonymous is None:  # no board yet: the cookie the board would set
            session = Session.signed_in(name)
            return codec.encode(session), session.csrf
        assert anonymous.operator is None and anonymous.csrf in form.text  # the form carries the token
        cookie = {"cookie": f"{COOKIE}={form.cookies[COOKIE]}"}
        forged = client.post("/login", data={"name": name, "password": password, "_csrf": "forged"}, headers=cookie)
        assert forged.status_code == 403, forged.text
        signed = client.post("/login", data={"name": name, "password": password, "_csrf": anonymous.csrf},
                             headers=cookie)
        assert signed.status_code == 303, signed.text
        session = codec.decode(signed.cookies[COOKIE])
        assert session is not None and session.operator == name
        return signed.cookies[COOKIE], session.csrf


def test_the_board_session_opens_the_api_with_its_csrf_header(sqlite_stack, api):
    cookie, csrf = board_session(sqlite_stack, "admin", api.password)
    endpoint = vend(api)
    path = f"/endpoints/{endpoint['slug']}/todos"
    with api_client(sqlite_stack, {"cookie": f"{COOKIE}={cookie}"}) as board:
        rows = ok(board.get("/todos", params={"endpoint": endpoint["slug"]}))["todos"]
        assert rows == []
        assert endpoint["endpoint_id"] in {e["endpoint_id"] for e in ok(board.get("/endpoints"))["endpoints"]}
        created = ok(board.post(path, json={"title": "from the board"}, headers={"x-csrf-token": csrf}), 201)
        todo_id = created["todo"]["id"]
        claimed = ok(board.post(f"/todos/{todo_id}/claim", headers={"x-csrf-token": csrf}))
        assert claimed["owner"] == "operator:admin"  # the same operator as its token

        # unsafe methods without the header, or with a wrong one: 403 and nothing changed
        before = (ok(api.get("/todos", params={"endpoint": endpoint["slug"]})), todo(api, todo_id),
                  ok(api.get("/endpoints")))
        for headers in ({}, {"x-csrf-token": "wrong"}, {"x-csrf-token": ""}):
            for method, target, body in (
                ("POST", path, {"title": "forged"}), ("POST", f"/todos/{todo_id}/complete", {}),
                ("POST", f"/todos/{todo_id}/release", None), ("POST", "/endpoints", {"agent": "x", "queues": ["a"]}),
                ("POST", f"/endpoints/{endpoint['slug']}/revoke", None),
                ("PUT", f"/webhooks/wh_{'0' * 32}/rules", {"rules": []}),
            ):
                refused(board.request(method, target, json=body, headers=headers), 403, "forbidden")
        # a form field is not the API's CSRF header
        refused(board.post(path, data={"title": "form", "_csrf": csrf}), 403, "forbidden")
        assert (ok(api.get("/todos", params={"endpoint": endpoint["slug"]})), todo(api, todo_id),
                ok(api.get("/endpoints"))) == before


def test_sessions_that_name_no_operator_answer_401(sqlite_stack):
    codec = SessionCodec(SECRET_KEY, secure=False)
    other_key = SessionCodec("another-key-" + "x" * 40, secure=False)
    stale = Session("admin", "csrf", int(time.time()) - 13 * 3600)
    for cookie in (
        codec.encode(Session.anonymous()),  # the login form's session: not signed in
        codec.encode(Session.signed_in("nobody")),  # no such operator
        other_key.encode(Session.signed_in("admin")),  # signed with another key
        codec.encode(Session.signed_in("admin"))[:-2] + "xx",  # tampered
        codec.encode(stale),  # expired
        "garbage",
    ):
        with api_client(sqlite_stack, {"cookie": f"{COOKIE}={cookie}", "x-csrf-token": "csrf"}) as client:
            refused(client.get("/todos"), 401, "unauthorized")
            refused(client.post("/endpoints", json={"agent": "a", "queues": ["a"]}), 401, "unauthorized")


# -- errors and headers -------------------------------------------------------------------------


def test_every_answer_carries_the_security_headers(sqlite_stack, api):
    base = f"{sqlite_stack.server.base}/api/v1"
    assert_security_headers(api.get("/endpoints"))
    refused(httpx.delete(f"{base}/todos", headers={"authorization": f"Bearer {api.token}"}), 405,
            "method_not_allowed")
    refused(api.get("/nothing-here"), 404, "not_found")
    refused(httpx.get(f"{base}/todos"), 401, "unauthorized")
    schema = httpx.get(f"{sqlite_stack.server.base}/schema/openapi.json")
    assert schema.status_code == 200 and "/api/v1/todos" in schema.json()["paths"]
    assert_security_headers(schema)


def test_the_schema_names_the_api_s_security_schemes_and_tag_on_every_operation(sqlite_stack):
    schema = httpx.get(f"{sqlite_stack.server.base}/schema/openapi.json").json()
    operations = [op for item in schema["paths"].values() for op in item.values() if isinstance(op, dict)]
    assert operations
    for operation in operations:
        assert operation.get("security") == [{"operatorToken": []}, {"boardSession": []}], operation.get("operationId")
        assert operation.get("tags") == ["operator"], operation.get("operationId")


# -- tenancy (SQLite and PostgreSQL) ------------------------------------------------------------


@dataclass
class Holdings:
    endpoint: dict[str, Any]
    webhook: dict[str, Any]
    event_id: str
    todo_id: str
    pushed_id: str


def holdings(op: Operator) -> Holdings:
    endpoint = vend(op)
    hook = webhook(op, endpoint)
    delivered = deliver(hook, {"title": f"{op.name}'s delivery"})
    return Holdings(endpoint, hook, delivered["event_id"], delivered["id"], push(op, endpoint)["id"])


def _foreign_requests(theirs: Holdings, mine: Holdings) -> list[tuple[str, str, Any, str]]:
    """(method, path, body, the foreign id in it) for every route that takes an id."""
    todo_id, endpoint, hook, event = theirs.todo_id, theirs.endpoint, theirs.webhook["webhook_id"], theirs.event_id
    requests = [
        ("GET", f"/todos/{todo_id}", None, todo_id), ("GET", f"/todos/{todo_id}/history", None, todo_id),
        ("GET", f"/todos/{todo_id}/explain", None, todo_id),
        *(("POST", f"/todos/{todo_id}/{a}", {}, todo_id) for a in ("claim", "extend", "complete", "fail", "release",
                                                                    "discard")),
        ("POST", f"/todos/{todo_id}/retry", None, todo_id),
        ("POST", f"/todos/{todo_id}/move", {"queue": "inbox"}, todo_id),
        ("GET", f"/webhooks/{hook}/rules", None, hook), ("PUT", f"/webhooks/{hook}/rules", {"rules": []}, hook),
        ("POST", f"/webhooks/{hook}/rules/test", {"payload": {}}, hook),
        ("POST", f"/webhooks/{hook}/rules/replay", {"rules": {"rules": []}}, hook),
        ("POST", f"/webhooks/{hook}/rotate", None, hook), ("POST", f"/webhooks/{hook}/delete", None, hook),
        ("GET", f"/events?webhook={hook}", None, hook), ("GET", f"/events/{event}", None, event),
        ("POST", f"/webhooks/{mine.webhook['webhook_id']}/rules/test", {"event_id": event}, event),
    ]
    for ref in (endpoint["slug"], endpoint["endpoint_id"]):
        requests += [
            ("GET", f"/todos?endpoint={ref}", None, ref), ("GET", f"/webhooks?endpoint={ref}", None, ref),
            ("POST", f"/endpoints/{ref}/revoke", None, ref), ("POST", f"/endpoints/{ref}/todos", {"title": "x"}, ref),
            ("POST", "/webhooks", {"endpoint": ref, "source_type": "generic", "target_queue": "inbox"}, ref),
        ]
    return requests


def _random_like(value: str) -> str:
    prefix, sep, _ = value.partition("_")
    if sep and prefix in ("td", "ep", "wh", "ev"):
        return f"{prefix}_{uuid.uuid4().hex}"
    return f"{value.rsplit('-', 1)[0]}-{secrets.token_hex(2)}"  # a slug


def _snapshot(op: Operator, mine: Holdings) -> tuple:
    return (todo(op, mine.todo_id), todo(op, mine.pushed_id), ok(op.get("/endpoints")), ok(op.get("/webhooks")),
            ok(op.get(f"/webhooks/{mine.webhook['webhook_id']}/rules")), ok(op.get(f"/events/{mine.event_id}")),
            ok(op.get("/todos", params={"endpoint": mine.endpoint["slug"]})))


def test_another_operators_ids_answer_exactly_like_unknown_ones(admin, bob):
    admins, bobs = holdings(admin), holdings(bob)
    before = _snapshot(admin, admins)
    for method, path, body, foreign in _foreign_requests(admins, bobs):
        random_id = _random_like(foreign)
        theirs = bob.http.request(method, path, json=body)
        unknown = bob.http.request(method, path.replace(foreign, random_id),
                                   json=json.loads(json.dumps(body).replace(foreign, random_id)))
        refused(theirs, 404, "not_found")
        refused(unknown, 404, "not_found")
        assert theirs.json() == json.loads(unknown.text.replace(random_id, foreign)), (method, path)
    assert _snapshot(admin, admins) == before  # nothing of admin's changed
    assert deliver(admins.webhook, {"title": "still works"})["created"] == 1


def test_lists_hold_only_the_callers_things(admin, bob):
    admins, bobs = holdings(admin), holdings(bob)
    for me, mine, theirs in ((admin, admins, bobs), (bob, bobs, admins)):
        todos = set(ids(ok(me.get("/todos", params={"limit": 1000}))["todos"]))
        assert {mine.todo_id, mine.pushed_id} <= todos and not {theirs.todo_id, theirs.pushed_id} & todos
        endpoints = ok(me.get("/endpoints"))["endpoints"]
        assert mine.endpoint["endpoint_id"] in {e["endpoint_id"] for e in endpoints}
        assert all(e["owner"] == me.name for e in endpoints)
        hooks = {w["webhook_id"] for w in ok(me.get("/webhooks"))["webhooks"]}
        assert mine.webhook["webhook_id"] in hooks and theirs.webhook["webhook_id"] not in hooks
        events = {e["id"] for e in ok(me.get("/events", params={"limit": 200}))["events"]}
        assert mine.event_id in events and theirs.event_id not in events
        assert not {e["endpoint_id"] for e in ok(me.get("/events", params={"limit": 200}))["events"]} & {
            theirs.endpoint["endpoint_id"]}


def test_the_stream_holds_only_the_callers_transitions(stack, admin, bob):
    admins, bobs = holdings(admin), holdings(bob)
    last = push(bob, bobs.endpoint)["id"]
    seen: list[dict[str, Any]] = []
    with bob.http.stream("GET", "/stream", headers={"last-event-id": "0"},
                         timeout=httpx.Timeout(10, read=10)) as response:
        assert response.status_code == 200
        for data in _sse_events(response):
            seen.append(data)
            if data["todo_id"] == last:
                break
    todo_ids = {d["todo_id"] for d in seen}
    assert {bobs.todo_id, bobs.pushed_id, last} <= todo_ids
    assert not todo_ids & {admins.todo_id, admins.pushed_id}
    positions = [d["position"] for d in seen]
    assert positions == sorted(positions)


# -- concurrency (SQLite and PostgreSQL) --------------------------------------------------------


def _race(stack: Stack, token: str, n: int, request) -> list[httpx.Response]:
    """n requests released together, each on its own connection."""
    barrier = threading.Barrier(n)

    def one(_: int) -> httpx.Response:
        with api_client(stack, {"authorization": f"Bearer {token}"}) as client:
            client.get("/endpoints")  # connect first
            barrier.wait()
            return request(client)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


def test_concurrent_claims_have_one_winner(stack, admin):
    endpoint = vend(admin)
    todo_id = push(admin, endpoint)["id"]
    answers = _race(stack, admin.token, 8, lambda c: c.post(f"/todos/{todo_id}/claim"))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] + [409] * 7, [(r.status_code, r.text) for r in answers]
    for response in answers:
        if response.status_code == 409:
            refused(response, 409, "conflict")
    claimed = todo(admin, todo_id)
    assert (claimed["state"], claimed["attempt"], claimed["attempt_seq"]) == ("claimed", 1, 1)
    history = ok(admin.get(f"/todos/{todo_id}/history"))["events"]
    assert [e["type"] for e in history].count("TodoClaimed") == 1


def test_concurrent_pushes_with_one_key_mint_one_todo(stack, admin):
    endpoint = vend(admin)
    key = unique("key")
    answers = _race(stack, admin.token, 8, lambda c: c.post(f"/endpoints/{endpoint['slug']}/todos",
                                                            json={"title": "once", "key": key}))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [200] * 7 + [201], [(r.status_code, r.text) for r in answers]
    assert len({r.json()["todo"]["id"] for r in answers}) == 1
    assert len(ok(admin.get("/todos", params={"endpoint": endpoint["slug"]}))["todos"]) == 1


def test_concurrent_revokes_have_one_winner(stack, admin):
    endpoint = vend(admin)
    answers = _race(stack, admin.token, 6, lambda c: c.post(f"/endpoints/{endpoint['slug']}/revoke"))
    assert sorted(r.status_code for r in answers) == [200] + [409] * 5, [(r.status_code, r.text) for r in answers]
