"""The operator board in a real browser (CONTRACT §8): Chromium, driven through Playwright like a person
would, against a real `switchboard serve`.

Pages are used through their labelled controls and roles only (`get_by_label`, `get_by_role`), so
a control without a label fails a test. Live updates are timed from the moment the change is
committed elsewhere (a webhook's 202, another process's exit, another tab's action) to the moment
the row or state is visible, without a reload (a `window.__marker` set beforehand survives).
Setup that is not under test goes through the CLI, the operator API and real signed webhooks.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser.conftest import DESKTOP, PHONE, REQUIRE_BROWSER, start_board, stop_board
from tests.fixtures import fixture_json, sign

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import Page, expect
except ImportError:  # pragma: no cover - the dev extra installs it
    if REQUIRE_BROWSER:
        raise
    pytest.skip("the Python package playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

pytestmark = pytest.mark.browser

LIVE_MS = 1000  # CONTRACT §8: rows update within 1 s of any transition
NAV = ["Todos", "Quarantine", "Endpoints", "Webhooks", "Deliveries"]


# -- setup through the CLI, the operator API and ingest ------------------------------------------


@pytest.fixture(scope="module")
def api(board) -> Iterator[httpx.Client]:
    """The operator API as admin, with a bearer token minted by the CLI."""
    token = board.cli.json("operator", "token", "admin")["token"]
    # idle connections dropped after 2 s, before uvicorn's 5 s keep-alive timeout: a request sent on
    # a connection the server is closing at that moment fails ("Server disconnected"), and the
    # browser steps between two API calls can take about that long
    with httpx.Client(base_url=f"{board.base}/api/v1", headers={"authorization": f"Bearer {token}"},
                      timeout=30, limits=httpx.Limits(keepalive_expiry=2)) as client:
        yield client


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.request.url, response.status_code, response.text)
    return response.json()


def vend(api: httpx.Client, agent: str, queues=("inbox", "reviews")) -> dict[str, Any]:
    return ok(api.post("/endpoints", json={"agent": agent, "queues": list(queues)}), 201)


def push(api: httpx.Client, endpoint: dict[str, Any], title: str, **fields: Any) -> str:
    return ok(api.post(f"/endpoints/{endpoint['slug']}/todos", json={"title": title, **fields}), 201)["todo"]["id"]


def webhook(api: httpx.Client, endpoint: dict[str, Any], source: str = "generic") -> dict[str, Any]:
    return ok(api.post("/webhooks", json={"endpoint": endpoint["slug"], "source_type": source,
                                          "target_queue": "inbox"}), 201)


def act(api: httpx.Client, todo_id: str, action: str, **body: Any) -> dict[str, Any]:
    return ok(api.post(f"/todos/{todo_id}/{action}", json=body))


@pytest.fixture(scope="module")
def endpoint(api) -> dict[str, Any]:
    return vend(api, "Board Agent")


@pytest.fixture(scope="module")
def github(board, endpoint) -> dict[str, Any]:
    """A signed GitHub webhook on the module's endpoint, created through the CLI."""
    return board.cli.json("webhook", "create", "--endpoint", endpoint["slug"], "--source", "github", "--queue", "inbox")


def deliver_issue(hook: dict[str, Any], number: int, title: str) -> tuple[str, float]:
    """POSTs a GitHub `issues` delivery signed with the hook's secret; returns the todo id and the
    monotonic time its 202 arrived."""
    body = fixture_json("github_issues_opened.json")
    body["issue"]["number"], body["issue"]["title"] = number, title
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", "x-github-event": "issues", "x-github-delivery": str(uuid.uuid4()),
               "user-agent": "GitHub-Hookshot/browser-test", **sign("github", hook["signing_secret"], raw)}
    answer = httpx.post(hook["ingest_url"], content=raw, headers=headers, timeout=30)
    accepted = time.monotonic()
    assert answer.status_code == 202 and answer.json()["created"] == 1, answer.text
    return answer.json()["id"], accepted


def deliver_generic(hook: dict[str, Any], payload: Any) -> dict[str, Any]:
    answer = httpx.post(hook["ingest_url"], json=payload, headers={"x-delivery-id": str(uuid.uuid4())}, timeout=30)
    assert answer.status_code == 202, answer.text
    return answer.json()


def unique(prefix: str) -> str:
    return f"{prefix} {uuid.uuid4().hex[:6]}"


# -- what the page shows ------------------------------------------------------------------------------


def go_live(page: Page, path: str) -> None:
    """Opens a page with live regions, waits until its event stream is connected, and marks the
    document so that a reload would show (the marker would be gone)."""
    page.goto(path)
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    page.evaluate("window.__marker = 'not reloaded'")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__marker") == "not reloaded", "the page was reloaded or navigated"


def row(page: Page, todo_id: str):
    return page.locator(f'tr[data-todo-id="{todo_id}"]')


def row_state(page: Page, todo_id: str):
    return row(page, todo_id).locator('td[data-label="State"] .badge')


def todo_state(page: Page):
    """The state badge of a todo page's live state panel."""
    return page.locator('[data-live-part="state"] dl .badge').first


def timeline(page: Page):
    return page.locator("ol.timeline > li")


def count(page: Page, key: str):
    return page.locator(f'[data-count="{key}"]')


def nav_link(page: Page, name: str):
    return page.get_by_role("navigation", name="Board").get_by_role("link", name=name, exact=True)


def within(started: float, what: str, latency) -> float:
    seconds = time.monotonic() - started
    latency(what, seconds)
    assert seconds <= LIVE_MS / 1000, f"{what}: {seconds:.3f}s"
    return seconds


def assert_fits(page: Page, what: str) -> None:
    """No horizontal overflow of the document at the page's width."""
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"{what} overflows horizontally: scrollWidth {widths[0]} > {widths[1]}"


def assert_on_screen(page: Page, locator, what: str) -> None:
    """Visible and horizontally inside the viewport (reachable without sideways scrolling)."""
    expect(locator).to_be_visible()
    box = locator.bounding_box()
    width = page.evaluate("window.innerWidth")
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5, f"{what} is off screen: {box}"


# -- signing in -------------------------------------------------------------------------------------


def test_a_wrong_password_shows_an_error_and_the_right_one_lands_on_the_todos(board, open_page, screenshot):
    page = open_page(signed_in=False)
    page.goto("/todos")
    expect(page).to_have_url(re.compile(r"/login\?next=/todos$"))
    expect(page.get_by_role("heading", level=1, name="Sign in")).to_be_visible()
    expect(page.get_by_label("Name")).to_be_focused()
    screenshot(page, "login")

    page.get_by_label("Name").fill("admin")
    page.get_by_label("Password").fill("not-the-password")
    page.console.allow(r"status of 401")  # Chromium logs the refused sign-in's status
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("wrong name or password")
    expect(page.get_by_label("Name")).to_have_value("admin")
    expect(page.get_by_label("Password")).to_be_focused()

    page.get_by_label("Password").fill(board.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{board.base}/todos")
    expect(page.get_by_role("heading", level=1, name="Todos")).to_be_visible()
    expect(page.locator(".who-name")).to_have_text("admin")
    expect(page.get_by_role("alert")).to_have_count(0)
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{board.base}/login")
    page.goto("/todos")
    expect(page).to_have_url(re.compile(r"/login\?next=/todos$"))


def test_signing_in_with_the_keyboard_alone(board, open_page):
    page = open_page(signed_in=False)
    page.goto("/login")
    expect(page.get_by_label("Name")).to_be_focused()
    page.keyboard.type("admin")
    page.keyboard.press("Tab")
    expect(page.get_by_label("Password")).to_be_focused()
    page.keyboard.type(board.password)
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{board.base}/todos")
    expect(page.get_by_role("heading", level=1, name="Todos")).to_be_visible()


def test_tab_reaches_the_skip_link_first_then_the_navigation(open_page):
    page = open_page()
    page.goto("/todos")
    order = []
    for _ in range(2 + len(NAV)):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.textContent.trim()"))
    assert order == ["Skip to content", "Switchboard", *NAV]
    for _ in range(len(NAV) + 1):
        page.keyboard.press("Shift+Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    assert_on_screen(page, skip, "the focused skip link")
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    page.keyboard.press("Tab")  # onwards from the content, not from the top again
    assert page.evaluate("document.querySelector('main').contains(document.activeElement)")


def test_a_todo_is_claimed_with_tab_and_enter(api, endpoint, open_page):
    todo_id = push(api, endpoint, unique("keyboard claim"))
    page = open_page()
    page.goto(f"/todos/{todo_id}")
    claim = page.get_by_role("button", name="Claim", exact=True)
    for _ in range(40):
        page.keyboard.press("Tab")
        if claim.evaluate("button => button === document.activeElement"):
            break
    expect(claim).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.get_by_role("status")).to_have_text("Claimed: the lease is yours.")
    expect(todo_state(page)).to_have_text("claimed")


# -- live updates ---------------------------------------------------------------------------------------


def test_a_signed_webhook_appears_on_the_todos_without_a_reload(api, github, endpoint, open_page, latency):
    page = open_page()
    go_live(page, f"/todos?endpoint={endpoint['slug']}")
    pending = int(count(page, "pending").inner_text())
    total = int(count(page, "all").inner_text())

    todo_id, accepted = deliver_issue(github, 4242, "Uploader crashes on a space in the name")
    expect(row(page, todo_id)).to_be_visible(timeout=LIVE_MS)
    within(accepted, "webhook POST 202 → row visible on Todos", latency)
    assert_not_reloaded(page)
    expect(count(page, "pending")).to_have_text(str(pending + 1), timeout=LIVE_MS)
    expect(count(page, "all")).to_have_text(str(total + 1))
    expect(row(page, todo_id)).to_have_class(re.compile(r"\bis-updated\b"))
    expect(row(page, todo_id).get_by_role("link")).to_have_text(
        "issues opened: octo-org/octo-repo#4242 Uploader crashes on a space in the name")
    expect(row_state(page, todo_id)).to_have_text("pending")
    expect(row(page, todo_id).locator('td[data-label="Trust"]')).to_have_text("signed")

    second, accepted = deliver_issue(github, 4243, "A second issue while the page is open")
    expect(row(page, second)).to_be_visible(timeout=LIVE_MS)
    within(accepted, "webhook POST 202 → row visible on Todos (second)", latency)
    expect(count(page, "pending")).to_have_text(str(pending + 2), timeout=LIVE_MS)
    assert_not_reloaded(page)


def test_a_todo_committed_before_the_stream_opened_still_shows(github, endpoint, open_page):
    """A todo committed after the page was rendered and before its event stream opened still
    comes as an event: the stream starts at the position the page was rendered at."""
    page = open_page()
    delivered: list[str] = []

    def deliver_first(route) -> None:  # after the page's render, before its stream answers
        if not delivered:
            delivered.append(deliver_issue(github, 4244, "Committed before the stream opened")[0])
        route.continue_()

    page.route("**/api/v1/stream*", deliver_first)
    go_live(page, f"/todos?endpoint={endpoint['slug']}")
    assert delivered, "the page never opened its stream"
    expect(row(page, delivered[0])).to_be_visible(timeout=LIVE_MS)
    expect(row(page, delivered[0])).to_have_class(re.compile(r"\bis-updated\b"))  # flashed as news
    expect(page.locator("tr.is-updated")).to_have_count(1)  # and nothing else
    assert_not_reloaded(page)


def test_a_refused_action_keeps_the_operators_input_while_the_page_is_live(api, endpoint, open_page):
    """A refused complete shows the page again with what the operator typed; a later transition of
    the todo does not replace it (the form counts as being edited)."""
    todo_id = push(api, endpoint, unique("refused complete"))
    page = open_page()
    page.goto(f"/todos/{todo_id}")
    page.get_by_role("button", name="Claim", exact=True).click()
    expect(page.get_by_role("status")).to_have_text("Claimed: the lease is yours.")
    page.get_by_label("Summary").fill("half done")
    page.get_by_label("Result JSON").fill('{"broken": ')
    page.get_by_role("button", name="Complete", exact=True).click()
    page.console.allow(r"status of 400")
    expect(page.get_by_role("alert")).to_contain_text("JSON")
    act(api, todo_id, "extend", lease_ttl_seconds=600)  # a transition while the refused form is shown
    expect(page.locator("[data-live-status]")).to_have_text("Live: updates paused while you edit a form")
    page.wait_for_timeout(LIVE_MS)
    expect(page.get_by_label("Summary")).to_have_value("half done")
    expect(page.get_by_label("Result JSON")).to_have_value('{"broken": ')


def test_a_refused_action_with_nothing_typed_does_not_hold_the_page(api, endpoint, open_page):
    """A refused claim whose lease field was left empty has no input to keep: the page it shows
    stays live, and a later transition of the todo shows."""
    todo_id = push(api, endpoint, unique("refused claim"))
    page = open_page()
    page.route("**/api/v1/stream*", lambda route: route.abort())  # this page does not see the claim below
    page.goto(f"/todos/{todo_id}")
    act(api, todo_id, "claim")
    page.console.allow(r"status of 409|net::ERR_FAILED")  # the aborted streams
    page.get_by_role("button", name="Claim", exact=True).click()
    expect(page.get_by_role("alert")).to_contain_text("conflict")
    page.unroute("**/api/v1/stream*")  # the refused page's stream reconnects, from after the claim
    expect(page.locator("[data-live-status]")).to_have_text("Live", timeout=10_000)
    act(api, todo_id, "release")
    expect(todo_state(page)).to_have_text("pending", timeout=LIVE_MS)
    expect(page.locator("[data-live-status]")).to_have_text("Live")


def test_the_focused_button_keeps_the_focus_when_its_region_refreshes(api, endpoint, open_page):
    """A keyboard user on the Claim button gets it back when a claim elsewhere took it away for a
    while (the page showed the claimed todo, without the button) and a release brought it back."""
    todo_id = push(api, endpoint, unique("focus kept"))
    page = open_page()
    go_live(page, f"/todos/{todo_id}")
    claim = page.get_by_role("button", name="Claim", exact=True)
    claim.focus()
    act(api, todo_id, "claim")
    expect(todo_state(page)).to_have_text("claimed", timeout=LIVE_MS)
    expect(claim).to_have_count(0)
    act(api, todo_id, "release")
    expect(timeline(page).filter(has_text="released")).to_have_count(1, timeout=LIVE_MS)
    expect(claim).to_be_focused()
    assert_not_reloaded(page)


def test_a_button_that_came_back_is_not_focused_once_the_focus_moved(api, endpoint, open_page):
    """The focus a refresh took away is given back only if the operator has not moved it since,
    even when it has left the page's controls again by the time the button comes back."""
    todo_id = push(api, endpoint, unique("focus moved"))
    page = open_page()
    go_live(page, f"/todos/{todo_id}")
    claim = page.get_by_role("button", name="Claim", exact=True)
    claim.focus()
    act(api, todo_id, "claim")
    expect(todo_state(page)).to_have_text("claimed", timeout=LIVE_MS)
    nav = page.get_by_role("link", name="Todos", exact=True).first
    nav.focus()
    page.evaluate("document.activeElement.blur()")  # nothing focused again, as when the button left
    act(api, todo_id, "release")
    expect(timeline(page).filter(has_text="released")).to_have_count(1, timeout=LIVE_MS)
    expect(claim).not_to_be_focused()
    assert page.evaluate("document.activeElement === document.body")
    assert_not_reloaded(page)


def test_a_focused_link_stays_on_its_todo_when_a_new_row_comes_above_it(api, open_page):
    """The focus is kept by what a control does, not by its place: a new todo (of the same title)
    shifts every row down and the focus stays on the first todo's link; a state tab whose count
    changes keeps it too."""
    mine = vend(api, unique("Focus Agent"))
    title = unique("same title")
    first = push(api, mine, title)
    page = open_page()
    go_live(page, f"/todos?endpoint={mine['slug']}")
    link = row(page, first).get_by_role("link", name=title, exact=True)
    link.focus()
    second = push(api, mine, title)
    expect(row(page, second)).to_be_visible(timeout=LIVE_MS)
    expect(page.locator("tbody tr").first).to_have_attribute("data-todo-id", second)
    expect(link).to_be_focused()
    tab = page.locator("a.tab-pending")
    expect(tab.locator("[data-count]")).to_have_text("2")
    tab.focus()
    push(api, mine, title)
    expect(tab.locator("[data-count]")).to_have_text("3", timeout=LIVE_MS)
    expect(tab).to_be_focused()
    assert_not_reloaded(page)


def test_claim_fail_and_retry_from_the_board_while_the_list_watches(api, endpoint, open_page, latency, screenshot):
    title = "Triage the flaky upload test"
    todo_id = push(api, endpoint, title, payload={"repo": "octo-org/octo-repo", "test": "test_upload_with_space"})
    watcher = open_page()
    go_live(watcher, f"/todos?endpoint={endpoint['slug']}")
    expect(row_state(watcher, todo_id)).to_have_text("pending")

    page = open_page()
    page.goto(f"/todos?endpoint={endpoint['slug']}")
    page.get_by_role("link", name=title).click()
    expect(page.get_by_role("heading", level=1, name=title)).to_be_visible()
    expect(todo_state(page)).to_have_text("pending")
    expect(timeline(page)).to_have_count(1)

    def step(button: str, flash: str, state: str, events: int, newest: str) -> None:
        page.get_by_role("button", name=button, exact=True).click()
        started = time.monotonic()  # the POST and its redirect are done once the flash shows
        expect(page.get_by_role("status")).to_have_text(flash)
        expect(todo_state(page)).to_have_text(state)
        expect(timeline(page)).to_have_count(events)
        expect(timeline(page).last.locator(".event-type")).to_have_text(newest)
        expect(row_state(watcher, todo_id)).to_have_text(state, timeout=LIVE_MS)
        within(started, f"board {button.lower()} in one tab → row state in another", latency)

    step("Claim", "Claimed: the lease is yours.", "claimed", 2, "TodoClaimed")
    expect(page.locator('[data-live-part="state"]')).to_contain_text("operator:admin")
    page.get_by_label("Summary").fill("upload still flaky on CI")
    page.get_by_label("Result JSON").fill('{"error": "timeout"}')
    step("Fail", "Failed: a retry is scheduled unless that was the last attempt.", "failed", 3, "TodoFailed")
    expect(page.get_by_role("button", name="Claim", exact=True)).to_have_count(0)  # waiting for its retry
    expect(page.locator('[data-live-part="history"]')).to_contain_text("upload still flaky on CI")
    step("Retry now", "Retried: pending again with a fresh budget of attempts.", "pending", 4, "TodoRequeued")
    step("Claim", "Claimed: the lease is yours.", "claimed", 5, "TodoClaimed")
    expect(page.locator('[data-live-part="history"] .badge.outcome-failed')).to_have_text("failed")
    assert_not_reloaded(watcher)
    screenshot(page, "todo")


def test_transitions_made_by_another_process_show_up_live(board, api, endpoint, open_page, latency):
    todo_id = push(api, endpoint, unique("retried from the CLI"))
    act(api, todo_id, "claim")
    act(api, todo_id, "fail", summary="first try failed")
    page = open_page()
    go_live(page, f"/todos/{todo_id}")
    expect(todo_state(page)).to_have_text("failed")
    expect(timeline(page)).to_have_count(3)

    board.cli.run("todo", "retry", todo_id).ok()  # another process, on the same store
    exited = time.monotonic()
    expect(todo_state(page)).to_have_text("pending", timeout=LIVE_MS)
    within(exited, "CLI `todo retry` exits → state on the todo page", latency)
    expect(timeline(page)).to_have_count(4, timeout=LIVE_MS)
    expect(timeline(page).last).to_contain_text("TodoRequeued")
    story = page.locator('[data-live-part="story"]')  # the story and its because follow live too
    expect(story.locator(".because")).to_contain_text("pending: claimable since the CLI retried it", timeout=LIVE_MS)
    expect(story.locator("li").last).to_have_text(re.compile(r"Retried by the CLI with a fresh budget of 5 attempts"))
    assert_not_reloaded(page)

    listing = open_page()
    go_live(listing, f"/todos?endpoint={endpoint['slug']}")
    title = unique("pushed by the CLI")
    pushed = board.cli.json("todo", "push", endpoint["slug"], title)["todo"]["id"]
    exited = time.monotonic()
    expect(row(listing, pushed)).to_be_visible(timeout=LIVE_MS)
    within(exited, "CLI `todo push` exits → row on Todos", latency)
    expect(row(listing, pushed).get_by_role("link")).to_have_text(title)
    expect(row(listing, pushed).locator('td[data-label="Trust"]')).to_have_text("operator")
    assert_not_reloaded(listing)


# -- endpoints ----------------------------------------------------------------------------------------------


def test_vending_shows_the_credential_and_mcp_json_once(board, open_page, screenshot):
    page = open_page()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto("/todos")
    nav_link(page, "Endpoints").click()
    expect(page.get_by_role("heading", level=1, name="Endpoints")).to_be_visible()
    page.get_by_label("Agent name").fill("demo agent (fake)")
    page.get_by_label(re.compile(r"^Queues")).fill("inbox, reviews")
    page.get_by_label(re.compile(r"^Lifetime")).fill("7d")
    page.get_by_label("Webhook ceiling").fill("3")
    page.get_by_label("delete_webhook").uncheck()
    screenshot(page, "endpoints")
    page.get_by_role("button", name="Vend endpoint").click()

    heading = page.get_by_role("heading", level=1, name=re.compile(r"^Endpoint .* vended$"))
    expect(heading).to_be_visible()
    slug = heading.locator("code").inner_text()
    expect(page.get_by_role("alert")).to_contain_text("will not be shown again")
    credential = page.locator("#credential").inner_text().strip()
    assert re.fullmatch(r"sbk_[A-Za-z0-9_-]{43}", credential), credential
    mcp = json.loads(page.locator("#mcp-json").inner_text())
    entry = mcp["mcpServers"]["switchboard"]
    assert entry["url"] == f"{board.base}/mcp/{slug}" and entry["headers"] == {"Authorization": f"Bearer {credential}"}
    expect(page.get_by_label("mcp.json")).to_be_visible()
    assert "delete_webhook" not in page.locator(".secret").inner_text()
    page.get_by_role("button", name="Copy", exact=True).click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == credential
    screenshot(page, "vended")

    nav_link(page, "Todos").click()
    expect(page.get_by_role("heading", level=1, name="Todos")).to_be_visible()
    nav_link(page, "Endpoints").click()
    expect(page.get_by_role("link", name=slug, exact=True)).to_be_visible()
    for content in (page.content(), page.locator("body").inner_text()):
        assert credential not in content and "sbk_" not in content
    page.go_back()
    try:  # back to the answer of the vend form: it was no-store, so no cache may show it again
        page.go_back()
    except PlaywrightError as error:  # Chromium offers to resend the form instead
        assert "ERR_CACHE_MISS" in str(error), error
        expect(page.locator("body")).to_contain_text("Confirm Form Resubmission")
    assert credential not in page.content()


# -- webhooks, rules, quarantine, deliveries ----------------------------------------------------------------


def test_the_rules_editor_dry_runs_replays_and_saves(api, endpoint, open_page, screenshot):
    hook = webhook(api, endpoint)
    push_event = deliver_generic(hook, {"kind": "push", "ref": "refs/heads/main"})["event_id"]
    deliver_generic(hook, {"kind": "ping"})
    candidate = {"rules": [{"id": "pings", "expr": '.payload.kind == "ping"', "action": {"drop": True}},
                           {"id": "pushes", "expr": '.payload.kind == "push"', "action": {"queue": "reviews"}}],
                 "default_action": {"queue": "inbox"}, "params": {}}
    text = json.dumps(candidate, indent=2)

    page = open_page()
    page.goto("/todos")
    nav_link(page, "Webhooks").click()
    page.get_by_role("link", name=hook["webhook_id"]).click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Webhook {hook['webhook_id']}")
    expect(page.get_by_label("Stored delivery to dry-run against").locator("option")).to_have_count(3)

    page.get_by_label("Rules JSON").fill(text)
    page.get_by_label("Stored delivery to dry-run against").select_option(push_event)
    page.get_by_role("button", name="Dry run").click()
    result = page.locator("section.result")
    expect(result.get_by_role("heading", name=f"Dry run on {push_event}")).to_be_visible()
    expect(result.locator("dd").first).to_have_text("queue reviews")
    expect(result).to_contain_text("pushes")  # the rule that decided, in the trace
    expect(page.get_by_label("Rules JSON")).to_have_value(text)  # the candidate stays in the editor
    expect(page.get_by_label("Stored delivery to dry-run against")).to_have_value(push_event)
    screenshot(page, "webhook-rules")

    page.get_by_label("Last N deliveries to replay over").fill("10")
    page.get_by_role("button", name="Replay").click()
    replay = page.locator("section.result")
    expect(replay.get_by_role("heading", name="Replay over 2 deliveries")).to_be_visible()
    expect(replay.locator("table.compact tbody td")).to_have_text(["drop", "1", "queue:reviews", "1"])
    expect(page.get_by_label("Rules JSON")).to_have_value(text)

    page.get_by_role("button", name="Save rules").click()
    expect(page.get_by_role("status")).to_have_text("Rules saved.")
    page.reload()
    expect(page.get_by_role("status")).to_have_text("Rules saved.")
    assert json.loads(page.get_by_label("Rules JSON").input_value()) == candidate
    expect(page.locator(".hint").first).to_contain_text("2 rules saved now")

    page.get_by_label("Rules JSON").fill('{"rules": [')
    page.get_by_role("button", name="Save rules").click()  # refused: the page keeps the broken text
    page.console.allow(r"status of 400")
    expect(page.get_by_role("alert")).to_contain_text("not valid JSON")
    expect(page.get_by_label("Rules JSON")).to_have_value('{"rules": [')


def test_quarantined_todos_are_released_and_discarded_from_the_board(api, endpoint, open_page):
    hook = webhook(api, endpoint)
    faulting = {"rules": [{"id": "boom", "expr": 'error("boom")', "action": {"queue": "reviews"}}],
                "default_action": None, "params": {}}
    page = open_page()
    page.goto(f"/webhooks/{hook['webhook_id']}")
    page.get_by_label("Rules JSON").fill(json.dumps(faulting))
    page.get_by_role("button", name="Save rules").click()
    expect(page.get_by_role("status")).to_have_text("Rules saved.")
    held = []
    for n in range(2):
        answer = deliver_generic(hook, {"n": n})
        assert answer["faulted"] is True and answer["queue"] == "quarantine", answer
        held.append(answer["id"])

    nav_link(page, "Quarantine").click()
    expect(page.get_by_role("heading", level=1, name="Quarantine")).to_be_visible()
    expect(nav_link(page, "Quarantine")).to_have_attribute("aria-current", "page")
    for todo_id in held:
        expect(row(page, todo_id)).to_be_visible()
    row(page, held[0]).get_by_role("link").click()
    expect(nav_link(page, "Quarantine")).to_have_attribute("aria-current", "page")  # still in the quarantine
    expect(page.get_by_role("button", name="Claim", exact=True)).to_have_count(0)
    expect(page.locator("dl.facts-compact")).to_contain_text("boom")  # the routing trace
    page.get_by_label("Release to queue").select_option("reviews")
    page.get_by_role("button", name="Release to queue").click()
    expect(page.get_by_role("status")).to_have_text("Released from quarantine.")
    expect(todo_state(page)).to_have_text("pending")
    expect(page.locator('[data-live-part="state"]')).to_contain_text("reviews")

    page.goto(f"/todos/{held[1]}")
    page.get_by_label("Why discard").fill("noise from a test")
    page.once("dialog", lambda dialog: dialog.dismiss())  # "Discard this quarantined todo?" — no
    page.get_by_role("button", name="Discard").click()
    expect(todo_state(page)).to_have_text("pending")
    expect(page.get_by_role("status")).to_have_count(0)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Discard").click()
    expect(page.get_by_role("status")).to_have_text("Discarded.")
    expect(todo_state(page)).to_have_text("done")
    expect(timeline(page).last).to_contain_text("TodoDiscarded")


# -- layout, keyboard, console -----------------------------------------------------------------------------


@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["390px", "1280px"])
def test_the_board_fits_the_width_with_its_nav_and_actions_on_screen(api, endpoint, github, open_page, viewport):
    pending = push(api, endpoint, unique("a pending todo with a rather long title that has to wrap somewhere"))
    claimed = push(api, endpoint, unique("claimed on the board"), payload={"long": "x" * 400})
    act(api, claimed, "claim")
    page = open_page(viewport)
    pages = {
        "/todos": ["Apply"], f"/todos/{pending}": ["Claim"],
        f"/todos/{claimed}": ["Complete", "Fail", "Extend lease", "Release"],
        "/endpoints": ["Vend endpoint"], "/webhooks": ["Create webhook"],
        f"/webhooks/{github['webhook_id']}": ["Dry run", "Replay", "Save rules"], "/events": ["Apply"],
    }
    for path, buttons in pages.items():
        page.goto(path)
        assert_fits(page, path)
        for name in NAV:
            assert_on_screen(page, nav_link(page, name), f"nav link {name} on {path}")
        assert_on_screen(page, page.get_by_role("button", name="Sign out"), f"sign out on {path}")
        for name in buttons:
            assert_on_screen(page, page.get_by_role("button", name=name, exact=True), f"button {name} on {path}")


def test_the_main_pages_log_no_console_errors_and_go_live(api, endpoint, github, open_page):
    todo_id, _ = deliver_issue(github, 77, "console check")
    event_id = ok(api.get("/events", params={"webhook": github["webhook_id"]}))["events"][0]["id"]
    page = open_page()
    for path in ("/todos", "/todos?queue=quarantine", f"/todos/{todo_id}"):
        page.goto(path)
        expect(page.locator("[data-live-status]")).to_have_text("Live")  # board.js ran under the CSP
    for path in ("/endpoints", "/webhooks", f"/webhooks/{github['webhook_id']}", "/events", f"/events/{event_id}"):
        page.goto(path)
        expect(page.get_by_role("heading", level=1)).to_be_visible()
    # open_page's teardown fails the test on any console error or uncaught exception


def test_the_todos_view_shows_each_state_and_live_rows(api, open_page, screenshot, latency):
    """Runs last: the screenshots of the Todos view (with rows just updated live) and the deliveries."""
    demo = vend(api, "release bot")
    hook = webhook(api, demo, "github")
    done = push(api, demo, "Publish release notes for v2.4.0", queue="reviews")
    act(api, done, "claim")
    act(api, done, "complete", summary="published", result={"url": "https://example.test/notes/v2.4.0"})
    failed = push(api, demo, "Bump the pinned jq to 1.8", payload={"package": "jq"})
    act(api, failed, "claim")
    act(api, failed, "fail", summary="the lock file is out of date")
    claimed = push(api, demo, "Review PR #311: retry webhooks with jitter", queue="reviews")
    act(api, claimed, "claim")
    push(api, demo, "Rotate the staging webhook secret")

    page = open_page()
    go_live(page, f"/todos?endpoint={demo['slug']}")
    for todo_id, state in ((done, "done"), (failed, "failed"), (claimed, "claimed")):
        expect(row_state(page, todo_id)).to_have_text(state)
    first, _ = deliver_issue(hook, 318, "Uploads stall behind a proxy")
    second, accepted = deliver_issue(hook, 319, "Document the quarantine queue")
    expect(row(page, second)).to_be_visible(timeout=LIVE_MS)
    within(accepted, "webhook POST 202 → row visible on Todos (screenshot run)", latency)
    expect(row(page, first)).to_be_visible()
    expect(row(page, second)).to_have_class(re.compile(r"\bis-updated\b"))
    for key, shown in (("all", "6"), ("pending", "3"), ("claimed", "1"), ("done", "1"), ("failed", "1")):
        expect(count(page, key)).to_have_text(shown)
    screenshot(page, "todos")

    phone = open_page(PHONE)
    phone.goto(f"/todos?endpoint={demo['slug']}")
    expect(row(phone, second)).to_be_visible()
    assert_fits(phone, "/todos at 390px")
    screenshot(phone, "todos-390", full_page=False)

    page.goto("/events")
    expect(page.get_by_role("heading", level=1, name="Deliveries")).to_be_visible()
    expect(page.locator("tbody tr").first.locator(".badge.verified-yes")).to_be_visible()
    screenshot(page, "deliveries")


# -- PostgreSQL ----------------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_on_postgresql_a_todo_pushed_by_another_process_shows_up_live(browser, pg_url, tmp_path, open_page, latency):
    other = start_board(tmp_path, pg_url)
    try:
        context = browser.new_context(base_url=other.base, viewport=DESKTOP)
        try:
            other.sign_in(context.new_page())
            state = context.storage_state()
        finally:
            context.close()
        slug = other.cli.json("endpoint", "vend", "pg agent", "--queue", "inbox")["slug"]
        page = open_page(base=other.base, state=state)
        go_live(page, "/todos")
        title = unique("pushed on postgres")
        todo_id = other.cli.json("todo", "push", slug, title)["todo"]["id"]
        exited = time.monotonic()
        expect(row(page, todo_id)).to_be_visible(timeout=LIVE_MS)
        within(exited, "PostgreSQL: CLI `todo push` exits → row on Todos", latency)
        assert_not_reloaded(page)
        row(page, todo_id).get_by_role("link").click()
        page.get_by_role("button", name="Claim", exact=True).click()
        expect(todo_state(page)).to_have_text("claimed")
        page.context.close()  # its event stream, before the server stops
    finally:
        stop_board(other)
