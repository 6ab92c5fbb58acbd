"""The board's trusted senders (CONTRACT §13) in a real browser: an operator sets a GitHub webhook's
trusted logins and associations on the webhook page, a stranger's delivery is then held in the
quarantine view with the sender named, and releasing it from the todo page makes it claimable.
Setup goes through the operator API and real signed deliveries (tests/fixtures)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from tests.browser.conftest import REQUIRE_BROWSER
from tests.browser.test_board import api, ok, vend  # noqa: F401 - the module's API client fixture
from tests.fixtures import fixture, sign

try:
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover - the dev extra installs it
    if REQUIRE_BROWSER:
        raise
    pytest.skip("the Python package playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

pytestmark = pytest.mark.browser


def deliver(hook: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    body = fixture(name)
    headers = {"content-type": "application/json", "x-github-event": kind, "x-github-delivery": str(uuid.uuid4()),
               **sign("github", hook["signing_secret"], body)}
    answer = httpx.post(hook["ingest_url"], content=body, headers=headers, timeout=30)
    assert answer.status_code == 202, answer.text
    return answer.json()


def test_trust_is_set_on_the_webhook_page_and_a_held_todo_is_released_from_the_board(api, board, open_page):
    endpoint = vend(api, f"Trusting Agent {uuid.uuid4().hex[:4]}")
    hook = ok(api.post("/webhooks", json={"endpoint": endpoint["slug"], "source_type": "github",
                                          "target_queue": "inbox"}), 201)
    page = open_page()
    page.goto(f"/webhooks/{hook['webhook_id']}")
    panel = page.get_by_role("region", name="Trusted senders")
    expect(panel).to_contain_text("every sender is trusted")

    page.console.allow(r"status of 400")  # Chromium logs the refused form's status
    panel.get_by_label("Trusted logins").fill("bad!login")
    panel.get_by_role("button", name="Save trusted senders").click()
    expect(page.get_by_role("alert")).to_contain_text("invalid_argument")
    expect(page.get_by_role("region", name="Trusted senders").get_by_label("Trusted logins")).to_have_value("bad!login")

    panel = page.get_by_role("region", name="Trusted senders")
    panel.get_by_label("Trusted logins").fill("OctoCat-Alice, reviewer-riley")
    panel.get_by_label("MEMBER").check()
    panel.get_by_label("OWNER").check()
    panel.get_by_role("button", name="Save trusted senders").click()
    expect(page.get_by_text("Trusted senders saved.")).to_be_visible()
    panel = page.get_by_role("region", name="Trusted senders")
    expect(panel.get_by_label("Trusted logins")).to_have_value("octocat-alice, reviewer-riley")
    expect(panel.get_by_label("MEMBER")).to_be_checked()
    expect(panel.get_by_label("COLLABORATOR")).not_to_be_checked()
    listed = ok(api.get("/webhooks", params={"endpoint": endpoint["slug"]}))["webhooks"]
    assert [(w["trusted_senders"], w["trusted_associations"]) for w in listed] == [
        (["octocat-alice", "reviewer-riley"], ["OWNER", "MEMBER"])]

    assert deliver(hook, "issues", "github_issues_opened.json")["queue"] == "inbox"  # octocat-alice
    held = deliver(hook, "issue_comment", "github_issue_comment_created.json")  # drive-by-dana, NONE
    assert held["held"] is True

    page.goto(f"/todos?endpoint={endpoint['slug']}&queue=quarantine")
    row = page.locator(f'tr[data-todo-id="{held["id"]}"]')
    expect(row).to_contain_text("untrusted")
    expect(row).to_contain_text("drive-by-dana")
    page.goto(f"/todos/{held['id']}")
    expect(page.get_by_text("is not trusted by this webhook").first).to_be_visible()
    page.get_by_label("Release to queue").select_option("reviews")
    page.get_by_role("button", name="Release to queue").click()
    expect(page.get_by_text("Released from quarantine.")).to_be_visible()
    released = ok(api.get(f"/todos/{held['id']}"))
    assert (released["queue"], released["state"]) == ("reviews", "pending")

    page.goto(f"/webhooks/{hook['webhook_id']}")
    page.get_by_role("region", name="Trusted senders").get_by_role("button", name="Trust everyone").click()
    expect(page.get_by_text("Trusted senders saved.")).to_be_visible()
    expect(page.get_by_role("region", name="Trusted senders")).to_contain_text("every sender is trusted")
    assert deliver(hook, "issue_comment", "github_issue_comment_created.json")["queue"] == "inbox"


def test_the_trust_panel_is_only_on_forge_webhooks(api, open_page):
    endpoint = vend(api, f"Generic Agent {uuid.uuid4().hex[:4]}")
    hook = ok(api.post("/webhooks", json={"endpoint": endpoint["slug"], "source_type": "generic",
                                          "target_queue": "inbox"}), 201)
    page = open_page()
    page.goto(f"/webhooks/{hook['webhook_id']}")
    expect(page.get_by_role("heading", name="Routing rules")).to_be_visible()
    expect(page.get_by_role("region", name="Trusted senders")).to_have_count(0)


def test_a_queue_picked_for_release_is_kept_while_a_refresh_is_on_its_way(api, open_page):
    """The operator picks a queue (the select keeps no focus) while a refresh of the todo's page is
    on its way: the refresh is not applied over the changed form, nor retried while it is changed,
    and the release goes where the operator picked."""
    endpoint = vend(api, f"Picking Agent {uuid.uuid4().hex[:4]}")
    hook = ok(api.post("/webhooks", json={"endpoint": endpoint["slug"], "source_type": "github",
                                          "target_queue": "inbox"}), 201)
    ok(api.put(f"/webhooks/{hook['webhook_id']}/trust", json={"trusted_senders": ["octocat-alice"]}))
    held = deliver(hook, "issue_comment", "github_issue_comment_created.json")  # drive-by-dana
    assert held["held"] is True

    page = open_page()
    waiting: list[Any] = []
    page.route(f"**/todos/{held['id']}", lambda route: waiting.append(route)
               if route.request.headers.get("x-board-partial") else route.continue_())
    # the page's stream says this todo changed (nothing changes a quarantined todo and keeps its
    # release form), and asks for no reconnect for a minute
    change = json.dumps({"todo_id": held["id"], "type": "TodoOpened", "state": "pending"})
    page.route("**/api/v1/stream*", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"},
        body=f"retry: 60000\n\nevent: todo\nid: 1\ndata: {change}\n\n"))
    page.goto(f"/todos/{held['id']}")
    for _ in range(50):
        if waiting:
            break
        page.wait_for_timeout(100)
    assert len(waiting) == 1, "the stream's event never asked for a refresh"
    live = page.locator("[data-live-status]")
    page.get_by_label("Release to queue").select_option("reviews")
    page.get_by_role("heading", level=1).click()  # the select loses its focus; its value stays changed
    waiting.pop().continue_()
    expect(live).to_have_text("Live: updates paused while you edit a form")
    page.wait_for_timeout(1500)  # a retry finds the form still changed
    expect(live).to_have_text("Live: updates paused while you edit a form")
    expect(page.get_by_label("Release to queue")).to_have_value("reviews")
    page.unroute("**/api/v1/stream*")
    page.unroute(f"**/todos/{held['id']}")
    page.get_by_role("button", name="Release to queue").click()
    expect(page.get_by_text("Released from quarantine.")).to_be_visible()
    assert ok(api.get(f"/todos/{held['id']}"))["queue"] == "reviews"
