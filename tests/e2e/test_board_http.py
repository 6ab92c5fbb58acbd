"""End to end: the operator board (CONTRACT §3, §8) against a real `switchboard serve`, over real HTTP
with cookies, forms and CSRF tokens as a browser sends them.

One server on SQLite is shared by the module; the CLI pushes todos and creates a second operator
on the same store. A PostgreSQL smoke test runs the sign-in and one action on its own server.
"""

from __future__ import annotations

import html
import json
import re
import uuid
from urllib.parse import quote

import httpx
import pytest

from tests.e2e._support import Cli, Server
from tests.fixtures import fixture, sign

CSRF = re.compile(r'name="_csrf" value="([^"]*)"')
ALERT = re.compile(r'role="alert">(.*?)</div>', re.S)
TODO_ID = re.compile(r"td_[0-9a-f]{32}")
REDACTED = "«redacted»"


class Browser:
    """An HTTP client that keeps cookies and signs in through the board's forms, like a browser."""

    def __init__(self, base: str) -> None:
        self.http = httpx.Client(base_url=base, follow_redirects=False, timeout=30)
        self.token = ""

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **kwargs) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def login_form(self, next_path: str | None = None) -> str:
        """GETs /login and returns the form's CSRF token."""
        page = self.get("/login", params={"next": next_path} if next_path else None)
        assert page.status_code == 200, page.text
        return CSRF.search(page.text).group(1)

    def sign_in(self, name: str, password: str) -> httpx.Response:
        answer = self.http.post("/login", data={"_csrf": self.login_form(), "name": name, "password": password})
        assert answer.status_code == 303, answer.text
        self.token = CSRF.search(self.get("/todos").text).group(1)
        return answer

    def post(self, path: str, csrf: bool = True, **fields: str | list[str]) -> httpx.Response:
        return self.http.post(path, data={**({"_csrf": self.token} if csrf else {}), **fields})

    def page(self, path: str, status: int = 200) -> str:
        answer = self.get(path)
        assert answer.status_code == status, (path, answer.status_code, answer.text[:2000])
        return answer.text


def alerts(text: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", a)).strip() for a in ALERT.findall(text)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("board")
    url = f"sqlite:///{data_dir}/switchboard.db"
    server = Server(data_dir, data_dir, url=url, SWITCHBOARD_INGEST_RATE="0").start()
    try:
        server.wait_healthy()
        server.cli = Cli(url, data_dir)
        server.admin_password = (data_dir / "admin-password").read_text().strip()
        yield server
    finally:
        code = server.stop()
    assert code == 0, server.output()
    assert "Traceback" not in server.stderr(), server.output()


@pytest.fixture
def anonymous(server):
    browser = Browser(server.base)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def admin(server):
    browser = Browser(server.base)
    browser.sign_in("admin", server.admin_password)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def endpoint(admin):
    """An endpoint of admin's, vended through the board."""
    answer = admin.post("/endpoints", agent="Board Agent", queues="inbox, reviews", ttl="7d", webhook_max="5")
    assert answer.status_code == 200, answer.text
    slug = re.search(r"<h1>Endpoint <code>([a-z0-9-]+)</code> vended</h1>", answer.text).group(1)
    return {"slug": slug, "page": answer.text}


def push(cli: Cli, slug: str, title: str, payload=None) -> str:
    """An operator-authored todo, pushed through the CLI on the server's store."""
    args = ["todo", "push", slug, title]
    if payload is not None:
        args += ["--payload", json.dumps(payload)]
    return cli.json(*args)["todo"]["id"]


def textarea(text: str, element_id: str) -> str:
    return html.unescape(re.search(rf'<textarea id="{element_id}"[^>]*>(.*?)</textarea>', text, re.S).group(1))


def state_of(admin: Browser, todo_id: str) -> str:
    """The todo's state as its page's state panel shows it."""
    part = admin.get(f"/todos/{todo_id}", headers={"X-Board-Partial": "1"})
    assert part.status_code == 200, part.text
    return re.search(r'<span class="badge state-(\w+)">', part.text).group(1)


# -- signing in --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/todos", "/todos?queue=quarantine", "/endpoints", "/webhooks", "/events",
                                  "/todos/td_00000000000000000000000000000000", "/webhooks/wh_x", "/events/ev_x"])
def test_every_page_but_login_sends_an_anonymous_visitor_to_sign_in(anonymous, path):
    answer = anonymous.get(path)
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/login?next={quote(path)}"  # the query too: back to the same view


def test_the_root_is_the_todos_once_signed_in_and_an_anonymous_post_changes_nothing(anonymous, admin):
    assert (admin.get("/").status_code, admin.get("/").headers["location"]) == (303, "/todos")
    answer = anonymous.http.post("/todos/td_00000000000000000000000000000000/claim", data={"_csrf": "x"})
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login")


def test_the_login_form_issues_an_anonymous_session_with_a_csrf_token(anonymous):
    page = anonymous.get("/login")
    assert page.status_code == 200
    cookie = page.headers["set-cookie"]
    assert cookie.startswith("sb_session=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    token = CSRF.search(page.text).group(1)
    assert len(token) >= 24
    for field in ('name="name"', 'name="password"', 'for="login-name"', 'for="login-password"'):
        assert field in page.text
    again = anonymous.get("/login")  # the same session is kept while it is valid
    assert "set-cookie" not in again.headers and CSRF.search(again.text).group(1) == token


def test_a_wrong_password_answers_401_and_signs_nobody_in(server, anonymous):
    token = anonymous.login_form()
    for name, password in (("admin", "not-the-password"), ("nobody", "whatever-it-is"), ("admin", "")):
        answer = anonymous.http.post("/login", data={"_csrf": token, "name": name, "password": password})
        assert answer.status_code == 401, answer.text
        assert "wrong name or password" in answer.text
    assert anonymous.get("/todos").status_code == 303


def test_a_sign_in_without_the_csrf_token_of_the_session_is_refused(server, anonymous):
    password = server.admin_password
    assert anonymous.http.post("/login", data={"name": "admin", "password": password}).status_code == 403  # no cookie
    token = anonymous.login_form()
    assert anonymous.http.post("/login", data={"name": "admin", "password": password}).status_code == 403
    assert anonymous.http.post("/login", data={"_csrf": token + "x", "name": "admin",
                                               "password": password}).status_code == 403
    assert anonymous.get("/todos").status_code == 303  # still signed out
    other = Browser(server.base)  # another browser's valid token does not fit this session
    try:
        assert other.http.post("/login", data={"_csrf": token, "name": "admin", "password": password}).status_code == 403
    finally:
        other.close()


def test_signing_in_opens_the_board_with_the_security_headers(server, anonymous):
    token = anonymous.login_form("/endpoints")
    answer = anonymous.http.post("/login", data={"_csrf": token, "name": "admin", "password": server.admin_password,
                                                 "next": "/endpoints"})
    assert (answer.status_code, answer.headers["location"]) == (303, "/endpoints")
    assert "HttpOnly" in answer.headers["set-cookie"]
    page = anonymous.get("/todos")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["cache-control"] == "no-store"
    new_token = CSRF.search(page.text).group(1)
    assert new_token != token  # a fresh session (and token) at sign-in
    assert '<form method="post" action="/logout"' in page.text and ">admin<" in page.text
    assert anonymous.get("/login").headers["location"] == "/todos"  # signed in already


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/\\evil.example", "/login"])
def test_sign_in_returns_only_to_a_local_page(server, anonymous, target):
    token = anonymous.login_form()
    answer = anonymous.http.post("/login", data={"_csrf": token, "name": "admin", "password": server.admin_password,
                                                 "next": target})
    assert (answer.status_code, answer.headers["location"]) == (303, "/todos")


def test_signing_out_ends_the_session(server, anonymous):
    anonymous.sign_in("admin", server.admin_password)
    assert anonymous.post("/logout", csrf=False).status_code == 403  # a cross-site form cannot sign you out
    answer = anonymous.post("/logout")
    assert (answer.status_code, answer.headers["location"]) == (303, "/login")
    assert "Max-Age=0" in answer.headers["set-cookie"]
    assert anonymous.get("/todos").status_code == 303


# -- assets and markup -------------------------------------------------------------------------


def test_assets_are_served_by_the_app_and_pages_carry_no_inline_code(admin, anonymous, endpoint):
    for path, kind in (("/static/board.css", "text/css"), ("/static/board.js", "javascript"),
                       ("/static/favicon.svg", "image/svg+xml")):
        answer = admin.get(path)
        assert answer.status_code == 200 and kind in answer.headers["content-type"], path
        assert "nosniff" == answer.headers["x-content-type-options"]
    script = admin.get("/static/board.js").text.replace('"', "'")
    assert "EventSource('/api/v1/stream' + (after ? '?after=' + encodeURIComponent(after) : ''))" in script
    # a live page says where its stream starts: the log position it was rendered at
    assert re.search(r'data-live-after="\d+"', admin.page("/todos"))
    for path in ("/todos", "/todos?queue=quarantine", "/endpoints", "/webhooks", "/events", "/login"):
        text = admin.page(path) if path != "/login" else anonymous.page(path)
        assert "<script>" not in text and "<style" not in text and " style=" not in text, path
        assert not re.search(r"\son[a-z]+=", text), path
        assert re.findall(r'<script[^>]*>', text) == ['<script src="/static/board.js" defer>'], path
        assert not re.search(r'(src|href)="(https?:)?//', text), path  # no CDN
        labelled = set(re.findall(r'<label for="([^"]+)"', text))
        controls = set(re.findall(r'<(?:input|select|textarea)[^>]*\sid="([^"]+)"', text))
        assert controls <= labelled, (path, controls - labelled)
        assert 'href="#main"' in text and 'id="main"' in text  # skip link


# -- todos ---------------------------------------------------------------------------------------


def test_a_todo_pushed_by_the_cli_is_listed_with_its_badges_and_counts(server, admin, endpoint):
    before = admin.page("/todos")
    pending = int(re.search(r'data-count="pending">(\d+)<', before).group(1))
    title = f"listed {uuid.uuid4().hex[:8]}"
    todo_id = push(server.cli, endpoint["slug"], title, {"n": 1})
    page = admin.page("/todos")
    row = re.search(rf'<tr data-todo-id="{todo_id}">(.*?)</tr>', page, re.S).group(1)
    assert f'href="/todos/{todo_id}"' in row and title in row
    assert '<span class="badge state-pending">pending</span>' in row
    assert '<span class="badge trust-operator"' in row and "0/5" in row
    assert int(re.search(r'data-count="pending">(\d+)<', page).group(1)) == pending + 1
    assert todo_id in admin.page("/todos?state=pending") and todo_id not in admin.page("/todos?state=done")
    assert todo_id in admin.page(f"/todos?endpoint={endpoint['slug']}&queue=inbox")
    assert todo_id not in admin.page("/todos?queue=reviews")
    assert 'aria-live="polite"' in page and 'data-live-src="/todos"' in page


def test_the_live_region_is_served_alone_on_request(server, admin, endpoint):
    todo_id = push(server.cli, endpoint["slug"], "partial rendering")
    for headers, path in (({"X-Board-Partial": "1"}, "/todos?state=pending"), ({}, "/todos?state=pending&partial=1")):
        part = admin.get(path, headers=headers)
        assert part.status_code == 200 and "<html" not in part.text and "<nav class=\"mainnav\"" not in part.text
        assert part.text.lstrip().startswith('<div data-live-part="list">') and todo_id in part.text
        assert 'data-count="pending"' in part.text
    part = admin.get(f"/todos/{todo_id}", headers={"X-Board-Partial": "1"})
    assert 'data-live-part="state"' in part.text and 'data-live-part="history"' in part.text
    assert 'data-live-part="story"' in part.text and "pending: claimable since it was pushed at " in part.text
    assert "<html" not in part.text and "TodoOpened" in part.text
    page = admin.page(f"/todos/{todo_id}")
    assert f'data-live-src="/todos/{todo_id}"' in page and f'data-live-todo="{todo_id}"' in page
    assert page.count('aria-live="polite"') == 3


def test_each_todo_action_of_the_board_moves_the_todo(server, admin, endpoint):
    todo_id = push(server.cli, endpoint["slug"], "act on me", {"job": "x"})
    page = admin.page(f"/todos/{todo_id}")
    assert f'action="/todos/{todo_id}/claim"' in page

    def act(action: str, expected: str, **fields: str) -> str:
        answer = admin.post(f"/todos/{todo_id}/{action}", **fields)
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"].startswith(f"/todos/{todo_id}?done=")
        assert state_of(admin, todo_id) == expected
        return admin.page(answer.headers["location"])

    claimed = act("claim", "claimed", lease_ttl_seconds="120")
    assert alerts(claimed) == [] and "Claimed: the lease is yours." in claimed
    assert "<code>operator:admin</code>" in claimed
    for action in ("complete", "fail", "extend", "release"):
        assert f'/todos/{todo_id}/{action}"' in claimed
    act("extend", "claimed", lease_ttl_seconds="600")
    failed = act("fail", "failed", summary="could not", result='{"error": "boom"}')
    assert "Retry now" in failed and "could not" in failed and '"error": "boom"' in html.unescape(failed)
    act("retry", "pending")
    act("claim", "claimed")
    act("release", "pending", summary="not now")
    act("claim", "claimed")
    done = act("complete", "done", summary="all good", result='{"ok": true}')
    assert "Done: nothing left to do." in done
    history = server.cli.json("todo", "history", todo_id)["events"]
    assert [e["type"] for e in history] == [
        "TodoOpened", "TodoClaimed", "LeaseRenewed", "TodoFailed", "TodoRequeued", "TodoClaimed", "TodoReleased",
        "TodoClaimed", "TodoCompleted"]
    assert {e["actor"] for e in history[1:]} == {"operator:admin"}
    for event_type in ("TodoFailed", "TodoRequeued", "TodoCompleted"):
        assert event_type in done  # the full timeline
    assert "all good" in done and "not now" in done  # attempt summaries
    because = re.search(r'<p class="because" data-because>([^<]*)</p>', done).group(1)  # the story, in sentences
    assert html.unescape(because).startswith("done: attempt 2 was completed by admin at ")
    assert "Attempt 1 failed (admin): “could not”. Retry at " in done
    assert "Retried by admin with a fresh budget of 5 attempts: pending again." in done


def test_the_todo_page_shows_every_attempt_as_a_table_with_its_traceparent(server, admin, endpoint):
    todo_id = push(server.cli, endpoint["slug"], "attempt me")
    assert "No attempts yet." in admin.page(f"/todos/{todo_id}")
    assert admin.post(f"/todos/{todo_id}/claim").status_code == 303
    assert admin.post(f"/todos/{todo_id}/release", summary="hand back").status_code == 303
    assert admin.post(f"/todos/{todo_id}/claim").status_code == 303
    page = admin.page(f"/todos/{todo_id}")
    table = re.search(r'<table class="cards attempts">(.*?)</table>', page, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>")[1], re.S)
    assert len(rows) == 2
    assert "outcome-released" in rows[0] and "hand back" in rows[0] and "outcome-claimed" in rows[1]
    traces = [re.search(r'<code class="traceparent">(00-[0-9a-f]{32}-[0-9a-f]{16}-01)</code>', r).group(1) for r in rows]
    assert traces[0] != traces[1] and traces[0].split("-")[1] == traces[1].split("-")[1] == todo_id[3:]


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(server, admin, endpoint):
    todo_id = push(server.cli, endpoint["slug"], "guarded")
    assert admin.post(f"/todos/{todo_id}/claim", csrf=False).status_code == 403
    wrong = admin.http.post(f"/todos/{todo_id}/claim", data={"_csrf": admin.token[:-2] + "zz"})
    assert wrong.status_code == 403 and "CSRF" in wrong.text
    assert admin.http.post(f"/todos/{todo_id}/claim", headers={"X-CSRF-Token": "nope"}).status_code == 403
    assert state_of(admin, todo_id) == "pending"
    assert admin.http.post(f"/todos/{todo_id}/claim", headers={"X-CSRF-Token": admin.token}).status_code == 303
    assert state_of(admin, todo_id) == "claimed"


def test_a_refused_action_shows_the_reason_on_the_page(server, admin, endpoint):
    todo_id = push(server.cli, endpoint["slug"], "refusals")
    answer = admin.post(f"/todos/{todo_id}/complete")
    assert answer.status_code == 409 and answer.headers["content-type"].startswith("text/html")
    assert alerts(answer.text)[0].startswith("Refused. conflict:")
    admin.post(f"/todos/{todo_id}/claim")
    bad = admin.post(f"/todos/{todo_id}/complete", summary="keep me", result="{not json")
    assert bad.status_code == 400 and "invalid_argument" in alerts(bad.text)[0]
    assert (textarea(bad.text, "finish-summary"), textarea(bad.text, "finish-result")) == ("keep me", "{not json")
    assert state_of(admin, todo_id) == "claimed"
    assert admin.post(f"/todos/{todo_id}/explode").status_code == 404
    assert admin.get("/todos?state=bogus").status_code == 400
    missing = admin.get("/todos/td_00000000000000000000000000000000")
    assert missing.status_code == 404 and "not_found" in missing.text and "<html" in missing.text


def test_payload_and_title_are_shown_escaped(server, admin, endpoint):
    title = "<script>alert('title')</script>"
    todo_id = push(server.cli, endpoint["slug"], title, {"html": "<script>alert('payload')</script>", "amp": "a&b"})
    for text in (admin.page(f"/todos/{todo_id}"), admin.page("/todos")):
        assert "<script>alert" not in text
        assert "&lt;script&gt;alert(" in text
    page = admin.page(f"/todos/{todo_id}")
    assert "&lt;script&gt;alert(&#39;payload&#39;)&lt;/script&gt;" in page and "a&amp;b" in page


@pytest.mark.parametrize("who", ["admin", "anonymous"])
def test_an_unknown_page_is_html_and_an_unknown_machine_path_stays_json(request, who):
    browser = request.getfixturevalue(who)
    for path in ("/quarantine", "/todos/td_1/payload/more", "/nothing/here"):
        answer = browser.get(path)
        assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/html"), path
        assert "<h1>Not found</h1>" in answer.text and f"There is no page at {path}." in answer.text
        assert 'href="/static/board.css"' in answer.text and answer.headers["content-security-policy"]
    for path in ("/api/v1/nothing", "/mcp", "/webhooks/w/", "/static/nothing.css"):
        answer = browser.get(path)
        assert answer.headers["content-type"].startswith("application/json"), (path, answer.text[:200])
        assert answer.json()["code"] in ("not_found", "unauthorized"), path
    posted = browser.http.post("/webhooks/nope/deeper/still", content=b"{}")  # not a browser's navigation
    assert posted.status_code == 404 and posted.json() == {"error": "Not Found", "code": "not_found"}


def test_a_payload_downloads_whole_from_its_todo_and_delivery(server, admin, anonymous, endpoint):
    body = json.dumps({"text": "ü" * 300_000}, ensure_ascii=False).encode()  # 600,012 bytes: shown cut
    hook = server.cli.json("webhook", "create", "--endpoint", endpoint["slug"], "--source", "generic", "--queue", "inbox")
    ingest = server.base + "/webhooks/w/" + hook["ingest_url"].rsplit("/", 1)[1]  # the CLI mints the default base
    accepted = httpx.post(ingest, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert accepted.status_code == 202, accepted.text
    todo_id, event_id = accepted.json()["id"], accepted.json()["event_id"]
    for page, download in ((f"/todos/{todo_id}", f"/todos/{todo_id}/payload"),
                           (f"/events/{event_id}", f"/events/{event_id}/body")):
        text = admin.page(page)
        assert f'<a href="{download}" download>Download it whole</a>' in text
        assert "585.9 KiB in all (600012 bytes)" in text and len(text.encode()) < 300 * 1024
        whole = admin.get(download)
        assert whole.status_code == 200 and whole.headers["content-type"].startswith("application/json")
        assert whole.headers["content-disposition"].startswith("attachment; filename=")
        assert json.loads(whole.content) == json.loads(body)
        assert anonymous.get(download).status_code == 303
    assert admin.get(f"/events/{event_id}/body").content == body  # exactly as received
    assert admin.get("/todos/td_00000000000000000000000000000000/payload").status_code == 404
    assert admin.get("/events/ev_00000000000000000000000000000000/body").status_code == 404


# -- endpoints -----------------------------------------------------------------------------------


def test_vending_shows_the_credential_and_mcp_json_once(server, admin, endpoint):
    page = endpoint["page"]
    credential = re.search(r'<code id="credential"[^>]*>(sbk_[A-Za-z0-9_-]{43})</code>', page).group(1)
    assert "will not be shown again" in page
    mcp_json = json.loads(html.unescape(re.search(r'<pre class="json" id="mcp-json"[^>]*>(.*?)</pre>', page, re.S).group(1)))
    entry = mcp_json["mcpServers"]["switchboard"]
    assert entry["headers"] == {"Authorization": f"Bearer {credential}"}
    assert entry["url"] == f"{server.base}/mcp/{endpoint['slug']}" and entry["type"] == "http"
    listing = admin.page("/endpoints")
    assert endpoint["slug"] in listing and credential not in listing and "sbk_" not in listing
    assert credential not in admin.page("/todos") and admin.get("/endpoints").headers["cache-control"] == "no-store"
    row = next(r for r in server.cli.json("endpoint", "list")["endpoints"] if r["slug"] == endpoint["slug"])
    assert row["queues"] == ["inbox", "reviews"] and row["expires_at"] is not None and row["owner"] == "admin"


def test_vend_takes_verbs_lease_and_refuses_bad_input_keeping_the_form(admin):
    answer = admin.post("/endpoints", agent="narrow", queues="only", scope="1", verbs=["list_todos", "claim_next"],
                        source_types=["github"], default_lease="120", ttl="never")
    assert answer.status_code == 200, answer.text
    assert "2: list_todos, claim_next" in answer.text
    refused = admin.post("/endpoints", agent="bad", queues="Not A Queue!", ttl="7d")
    assert refused.status_code == 400 and alerts(refused.text)[0].startswith("Refused. invalid_argument")
    assert 'value="bad"' in refused.text and 'value="Not A Queue!"' in refused.text
    assert admin.post("/endpoints", agent="x", queues="q", ttl="soon").status_code == 400
    assert admin.post("/endpoints", agent="x", queues="q", scope="1").status_code == 400  # no verb ticked


def test_the_vend_form_names_its_default_lease_as_its_label_in_every_refusal(admin):
    """Out of range said "default lease must be within 60..86400 seconds" where a non-number said
    "default lease seconds must be a whole number", as the form labels it."""
    assert ">Default lease seconds <span" in admin.page("/endpoints")
    for typed, says in (("30", "default lease seconds must be within 60..86400 seconds"),
                        ("soon", "default lease seconds must be a whole number")):
        refused = admin.post("/endpoints", agent="leased", queues="inbox", ttl="7d", default_lease=typed)
        assert refused.status_code == 400 and any(says in a for a in alerts(refused.text)), alerts(refused.text)
        assert f'value="{typed}"' in refused.text  # the form is kept


def test_revoking_an_endpoint_from_the_board(admin):
    answer = admin.post("/endpoints", agent="short lived", queues="tmp")
    slug = re.search(r"<h1>Endpoint <code>([a-z0-9-]+)</code> vended</h1>", answer.text).group(1)
    revoked = admin.post(f"/endpoints/{slug}/revoke")
    assert (revoked.status_code, revoked.headers["location"]) == (303, "/endpoints?done=revoked")
    page = admin.page("/endpoints?done=revoked")
    assert "Endpoint revoked." in page
    row = re.search(rf'<tr>\s*<td data-label="Slug"><a href="/todos\?endpoint={slug}">.*?</tr>', page, re.S).group(0)
    assert "endpoint-revoked" in row and "/revoke" not in row
    again = admin.post(f"/endpoints/{slug}/revoke")
    assert again.status_code == 409 and "conflict" in alerts(again.text)[0]


# -- tenancy -------------------------------------------------------------------------------------


def test_another_operator_sees_none_of_admins_things(server, admin, endpoint):
    name, password = f"bob{uuid.uuid4().hex[:6]}", "bob-password-123"
    server.cli.run("operator", "create", name, "--password-stdin", stdin=password + "\n").ok()
    todo_id = push(server.cli, endpoint["slug"], "admin's own")
    hook = admin.post("/webhooks", endpoint=endpoint["slug"], source_type="generic", target_queue="inbox")
    webhook_id = re.search(r"/webhooks/(wh_[0-9a-f]{32})", hook.text).group(1)
    bob = Browser(server.base)
    try:
        bob.sign_in(name, password)
        assert bob.get(f"/todos/{todo_id}").status_code == 404
        assert bob.post(f"/todos/{todo_id}/claim").status_code == 404
        assert state_of(admin, todo_id) == "pending"
        assert todo_id not in bob.page("/todos") and re.search(r'data-count="all">0<', bob.page("/todos"))
        assert bob.get(f"/todos?endpoint={endpoint['slug']}").status_code == 404
        assert endpoint["slug"] not in bob.page("/endpoints")
        assert bob.post(f"/endpoints/{endpoint['slug']}/revoke").status_code == 404
        assert webhook_id not in bob.page("/webhooks") and bob.get(f"/webhooks/{webhook_id}").status_code == 404
        assert bob.post(f"/webhooks/{webhook_id}/rotate").status_code == 404
        assert bob.post("/webhooks", endpoint=endpoint["slug"], source_type="generic",
                        target_queue="inbox").status_code == 404
        assert bob.get(f"/events?webhook={webhook_id}").status_code == 404
    finally:
        bob.close()


# -- webhooks, rules, quarantine, deliveries -----------------------------------------------------------


def _create_hook(admin: Browser, endpoint: dict, source: str) -> dict:
    answer = admin.post("/webhooks", endpoint=endpoint["slug"], source_type=source, target_queue="inbox")
    assert answer.status_code == 200, answer.text
    hook = {
        "webhook_id": re.search(r"/webhooks/(wh_[0-9a-f]{32})", answer.text).group(1),
        "ingest_url": re.search(r'<code id="ingest-url"[^>]*>([^<]+)</code>', answer.text).group(1),
        "page": answer.text,
    }
    secret = re.search(r'<code id="signing-secret"[^>]*>(whsec_[0-9a-f]{64})</code>', answer.text)
    hook["signing_secret"] = secret.group(1) if secret else None
    return hook


def test_the_board_offers_the_new_senders_and_a_stripe_webhook_made_there_takes_signed_deliveries(admin):
    vend_form = admin.page("/endpoints")
    for source in ("standard", "stripe", "slack"):  # offered, but not ticked by default (CONTRACT §2's four are)
        assert re.search(rf'<input id="source-{source}" type="checkbox" name="source_types" value="{source}">', vend_form)
    assert re.search(r'<input id="source-github" type="checkbox" name="source_types" value="github" checked>', vend_form)
    answer = admin.post("/endpoints", agent="Payments", queues="inbox", ttl="7d", scope="1",
                        verbs=["list_todos", "claim_next"], source_types=["stripe", "standard", "slack"])
    assert answer.status_code == 200, answer.text
    slug = re.search(r"<h1>Endpoint <code>([a-z0-9-]+)</code> vended</h1>", answer.text).group(1)
    choices = re.findall(r'<option value="([a-z]+)"', admin.page("/webhooks"))
    assert {"github", "gitea", "cairn", "generic", "standard", "stripe", "slack"} <= set(choices)
    hook = _create_hook(admin, {"slug": slug}, "stripe")
    assert hook["signing_secret"], hook["page"]
    body = json.dumps({"id": f"evt_{uuid.uuid4().hex}", "type": "charge.succeeded",
                       "data": {"object": {"id": "ch_3Mt", "description": "Pro plan"}}}).encode()
    delivered = httpx.post(hook["ingest_url"], content=body, headers={
        "content-type": "application/json", **sign("stripe", hook["signing_secret"], body)})
    assert delivered.status_code == 202, delivered.text
    assert "charge.succeeded: ch_3Mt (Pro plan)" in admin.page(f"/todos?endpoint={slug}")
    standard = _create_hook(admin, {"slug": slug}, "standard")
    assert re.search(r'<code id="signing-secret"[^>]*>whsec_[A-Za-z0-9+/]{43}=</code>', standard["page"])


def test_creating_and_rotating_a_webhook_shows_its_secrets_once(admin, endpoint):
    hook = _create_hook(admin, endpoint, "github")
    assert hook["signing_secret"] and "will not be shown again" in hook["page"]
    listing = admin.page("/webhooks")
    assert hook["webhook_id"] in listing and hook["signing_secret"] not in listing
    assert hook["ingest_url"] not in listing and hook["ingest_url"] not in admin.page(f"/webhooks/{hook['webhook_id']}")
    rotated = admin.post(f"/webhooks/{hook['webhook_id']}/rotate")
    assert rotated.status_code == 200
    new_url = re.search(r'<code id="ingest-url"[^>]*>([^<]+)</code>', rotated.text).group(1)
    assert new_url != hook["ingest_url"] and "whsec_" in rotated.text
    assert httpx.post(hook["ingest_url"], content=b"{}").status_code == 404  # the old URL is gone
    deleted = admin.post(f"/webhooks/{hook['webhook_id']}/delete")
    assert (deleted.status_code, deleted.headers["location"]) == (303, "/webhooks?done=webhook_deleted")
    assert admin.get(f"/webhooks/{hook['webhook_id']}").status_code == 404
    refused = admin.post("/webhooks", endpoint=endpoint["slug"], source_type="generic", target_queue="elsewhere")
    assert refused.status_code == 403 and alerts(refused.text)[0].startswith("Refused. forbidden")


def test_quarantined_todos_are_released_or_discarded_from_the_board(admin, endpoint):
    def held_count() -> int:
        return int(re.search(r'data-count="quarantine"[^>]*>(\d+)<', admin.page("/todos")).group(1))

    before = held_count()
    hook = _create_hook(admin, endpoint, "generic")
    faulting = {"rules": [{"id": "boom", "expr": 'error("boom")', "action": {"queue": "reviews"}}],
                "default_action": None, "params": {}}
    saved = admin.post(f"/webhooks/{hook['webhook_id']}/rules", rules=json.dumps(faulting))
    assert (saved.status_code, saved.headers["location"]) == (303, f"/webhooks/{hook['webhook_id']}?done=rules_saved")
    held = []
    for n in range(2):
        answer = httpx.post(hook["ingest_url"], json={"n": n}, headers={"x-delivery-id": f"q-{uuid.uuid4()}"})
        assert answer.status_code == 202 and answer.json()["faulted"] is True, answer.text
        held.append(answer.json()["id"])
    quarantine = admin.page("/todos?queue=quarantine")
    assert all(t in quarantine for t in held) and 'class="tab tab-quarantine" href="/todos?queue=quarantine" aria-current="page"' in quarantine
    assert held_count() == before + 2
    page = admin.page(f"/todos/{held[0]}")
    assert f'action="/todos/{held[0]}/move"' in page and f'action="/todos/{held[0]}/discard"' in page
    options = re.findall(r'<option value="([^"]+)"', re.search(r'<select id="move-queue".*?</select>', page, re.S).group(0))
    assert options == ["inbox", "reviews"]
    assert "<dt>Stage</dt><dd>fault</dd>" in page and "<code>boom</code>" in page  # the routing trace
    assert f'action="/todos/{held[0]}/claim"' not in page  # an operator releases or discards it
    because = html.unescape(re.search(r'<p class="because" data-because>([^<]*)</p>', page).group(1))
    assert because.startswith("held: rule 1 (boom) faulted (error: ") and "an operator releases or discards it" in because

    refused = admin.post(f"/todos/{held[0]}/move", queue="nowhere")
    assert refused.status_code == 403 and alerts(refused.text)[0].startswith("Refused. forbidden")
    moved = admin.post(f"/todos/{held[0]}/move", queue="reviews")
    assert moved.headers["location"] == f"/todos/{held[0]}?done=moved"
    assert held[0] in admin.page("/todos?queue=reviews&state=pending")
    discarded = admin.post(f"/todos/{held[1]}/discard", summary="noise")
    assert discarded.headers["location"] == f"/todos/{held[1]}?done=discarded"
    assert state_of(admin, held[1]) == "done"
    assert "TodoDiscarded" in admin.page(f"/todos/{held[1]}")
    assert held_count() == before  # released and discarded: nothing awaits a decision
    assert all(t in admin.page("/todos?queue=quarantine") for t in held[1:])  # the discarded one stays listed


def test_the_rules_editor_dry_runs_replays_and_saves_keeping_the_candidate(admin, endpoint):
    hook = _create_hook(admin, endpoint, "generic")
    for kind in ("push", "ping"):
        answer = httpx.post(hook["ingest_url"], json={"kind": kind}, headers={"x-delivery-id": f"r-{uuid.uuid4()}"})
        assert answer.status_code == 202
    page = admin.page(f"/webhooks/{hook['webhook_id']}")
    events = re.findall(r'<option value="(ev_[0-9a-f]{32})"', page)
    assert len(events) == 2 and '<textarea id="rules-text"' in page
    candidate = {"rules": [{"id": "pings", "expr": '.payload.kind == "ping"', "action": {"drop": True}},
                           {"id": "rest", "expr": "true", "action": {"queue": "reviews"}}],
                 "default_action": None, "params": {}}
    text = json.dumps(candidate, indent=1)
    base = f"/webhooks/{hook['webhook_id']}/rules"

    tested = admin.post(f"{base}/test", rules=text, event_id=events[1])  # the older one: kind push
    assert tested.status_code == 200, alerts(tested.text)
    assert "Dry run on" in tested.text and 'queue <span class="queue">reviews</span>' in tested.text
    assert textarea(tested.text, "rules-text") == text  # the candidate stays in the editor
    assert f'<option value="{events[1]}" selected>' in tested.text

    replayed = admin.post(f"{base}/replay", rules=text, last="10")
    assert replayed.status_code == 200
    counts = dict(re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">(\d+)</td></tr>", replayed.text))
    assert counts == {"drop": "1", "queue:reviews": "1"}
    assert len(re.findall(r'<td data-label="Delivery"><a href="/events/ev_', replayed.text)) == 2  # both change

    bad = admin.post(f"{base}/test", rules='{"rules": [', event_id=events[0])
    assert bad.status_code == 400 and "not valid JSON" in alerts(bad.text)[0]
    assert textarea(bad.text, "rules-text") == '{"rules": ['
    no_event = admin.post(f"{base}/test", rules=text)
    assert no_event.status_code == 400 and "choose a stored delivery" in alerts(no_event.text)[0]
    forbidden = admin.post(base, rules=json.dumps({"rules": [{"id": "x", "expr": "true", "action": {"queue": "elsewhere"}}]}))
    assert forbidden.status_code == 403 and "forbidden" in alerts(forbidden.text)[0]

    saved = admin.post(base, rules=text)
    assert saved.status_code == 303
    after = admin.page(saved.headers["location"])
    assert "Rules saved." in after and "2 rules saved now" in after


def test_deliveries_are_listed_with_badges_and_shown_with_redacted_headers(admin, endpoint):
    hook = _create_hook(admin, endpoint, "github")
    body = fixture("github_issues_opened.json")
    headers = {"content-type": "application/json", "x-github-event": "issues", "x-github-delivery": str(uuid.uuid4()),
               **sign("github", hook["signing_secret"], body)}
    answer = httpx.post(hook["ingest_url"], content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    event_id = answer.json()["event_id"]
    listing = admin.page(f"/events?webhook={hook['webhook_id']}")
    row = re.search(rf'<tr>\s*<td data-label="Delivery"><a href="/events/{event_id}">.*?</tr>', listing, re.S).group(0)
    assert "verified-yes" in row and "trust-signed" in row and "disposition-routed" in row
    assert event_id in admin.page("/events")
    detail = admin.page(f"/events/{event_id}")
    assert f"<code>x-hub-signature-256</code></td><td class=\"wrap\">{REDACTED}</td>" in detail
    assert headers["x-hub-signature-256"] not in detail
    assert f'href="/todos/{answer.json()["id"]}"' in detail
    assert admin.get("/events/ev_00000000000000000000000000000000").status_code == 404
    assert admin.get("/events?webhook=wh_00000000000000000000000000000000").status_code == 404


# -- PostgreSQL --------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_the_board_on_postgresql(pg_url, tmp_path):
    server = Server(tmp_path, tmp_path, url=pg_url).start()
    browser = Browser(server.base)
    try:
        server.wait_healthy()
        browser.sign_in("admin", (tmp_path / "admin-password").read_text().strip())
        vended = browser.post("/endpoints", agent="pg agent", queues="inbox")
        slug = re.search(r"<h1>Endpoint <code>([a-z0-9-]+)</code> vended</h1>", vended.text).group(1)
        todo_id = push(Cli(pg_url, tmp_path), slug, "on postgres")
        assert todo_id in browser.page("/todos")
        assert browser.post(f"/todos/{todo_id}/claim").status_code == 303
        assert state_of(browser, todo_id) == "claimed"
    finally:
        browser.close()
        code = server.stop()
    assert code == 0 and "Traceback" not in server.stderr(), server.output()


def test_a_garbled_session_cookie_is_no_session_not_an_error(server):
    """A cookie someone else set (non-ASCII, forged, truncated) must not lock operators out."""
    for value in ("eyJvcCI6ImFkbWluIn0.\u00e9", "eyJvcCI6ImFkbWluIn0.x", "no-dot", "a" * 5000):
        with httpx.Client(base_url=server.base, follow_redirects=False, timeout=10) as http:
            headers = {"cookie": f"sb_session={value}".encode("utf-8")}
            assert http.get("/todos", headers=headers).status_code == 303
            assert http.get("/login", headers=headers).status_code == 200
            assert http.get("/api/v1/todos", headers=headers).status_code == 401
    assert "Traceback" not in server.stderr()


def test_failed_sign_ins_are_throttled_per_address(tmp_path):
    data_dir = tmp_path / "throttle"
    data_dir.mkdir()
    throttled = Server(data_dir, data_dir, url=f"sqlite:///{data_dir}/switchboard.db").start()
    try:
        throttled.wait_healthy()
        password = (data_dir / "admin-password").read_text().strip()
        browser = Browser(throttled.base)
        # One wrong password, then nine empty ones: each is a failed sign-in, and the empty ones skip
        # the password hash, so the ten land within a second or two even on a loaded machine (the
        # bucket refills one sign-in per 5 s; ten slow wrong passwords could take long enough to earn one).
        for wrong in ["not-the-password"] + [""] * 9:
            answer = browser.http.post("/login", data={"_csrf": browser.login_form(), "name": "admin", "password": wrong})
            assert answer.status_code == 401
        answer = browser.http.post("/login", data={"_csrf": browser.login_form(), "name": "admin", "password": password})
        assert answer.status_code == 429 and "too many failed sign-ins" in answer.text
        assert browser.get("/todos").status_code == 303  # not signed in, even with the right password
        browser.close()
    finally:
        throttled.stop()
