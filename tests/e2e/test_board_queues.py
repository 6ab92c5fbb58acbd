"""The board's queue controls, snooze and "Retry all" (CONTRACT §13) over real HTTP against
`switchboard serve`, signed in through the board's forms as a browser would."""

from __future__ import annotations

import re

from tests.e2e.test_board_http import Browser, alerts, push, server, admin, endpoint  # noqa: F401 - fixtures


def test_the_endpoint_page_links_to_its_queue_controls_which_set_and_show_them(admin, endpoint, server):
    assert f'href="/endpoints/{endpoint["slug"]}/queues"' in admin.page("/endpoints")
    page = admin.page(f"/endpoints/{endpoint['slug']}/queues")
    assert 'data-queue="inbox"' in page and 'data-queue="reviews"' in page

    saved = admin.post(f"/endpoints/{endpoint['slug']}/queues/inbox", paused="1", max_in_flight="3",
                       max_claims_per_minute="")
    assert saved.status_code == 303 and saved.headers["location"].endswith("?done=queue_set")
    listed = server.cli.json("queue", "list", endpoint["slug"])["queues"]
    assert listed[0] == {"queue": "inbox", "paused": True, "max_in_flight": 3, "max_claims_per_minute": None,
                              "in_flight": 0, "claims_last_minute": None}
    page = admin.page(f"/endpoints/{endpoint['slug']}/queues?done=queue_set")
    assert "Queue controls saved." in page and "badge queue-paused" in page

    refused = admin.post(f"/endpoints/{endpoint['slug']}/queues/inbox", max_in_flight="0")
    assert refused.status_code == 400
    assert any("invalid_argument" in a and "1..10000" in a for a in alerts(refused.text))
    admin.post(f"/endpoints/{endpoint['slug']}/queues/inbox")  # unticked, empty: open, no limits
    assert server.cli.json("queue", "list", endpoint["slug"])["queues"][0]["paused"] is False
    assert admin.post("/endpoints/nobody-zz99/queues/inbox", paused="1").status_code == 404


def test_the_controls_form_names_each_limit_as_its_label_in_every_refusal(admin, endpoint, server):
    """Out of range said `max_in_flight must be within 1..10000` (the API's name) where a non-number
    said "max in flight must be a whole number" (the form's label)."""
    page = admin.page(f"/endpoints/{endpoint['slug']}/queues")
    assert ">Max in flight</label>" in page and ">Claims per minute</label>" in page
    for field, typed, says in (
            ("max_in_flight", "10001", "max in flight must be within 1..10000"),
            ("max_in_flight", "many", "max in flight must be a whole number"),
            ("max_claims_per_minute", "0", "claims per minute must be within 1..100000"),
            ("max_claims_per_minute", "lots", "claims per minute must be a whole number")):
        refused = admin.post(f"/endpoints/{endpoint['slug']}/queues/reviews", paused="1", **{field: typed})
        assert refused.status_code == 400 and any(says in a for a in alerts(refused.text)), alerts(refused.text)
        assert not any(field in a for a in alerts(refused.text))
    assert server.cli.json("queue", "list", endpoint["slug"])["queues"][1]["paused"] is False  # nothing set


def test_a_release_from_the_board_can_snooze(admin, endpoint, server):
    todo = push(server.cli, endpoint["slug"], "snooze me")
    assert admin.post(f"/todos/{todo}/claim").status_code == 303
    assert admin.post(f"/todos/{todo}/release", summary="later", delay_seconds="600").status_code == 303
    shown = server.cli.json("todo", "show", todo)
    assert shown["state"] == "pending" and shown["available_at"] > shown["created_at"]
    assert server.cli.json("todo", "history", todo)["events"][-1]["data"]["available_at"] is not None
    other = push(server.cli, endpoint["slug"], "claimed to see its release form")
    admin.post(f"/todos/{other}/claim")
    assert 'id="release-delay"' in admin.page(f"/todos/{other}")
    # both refusals name the field as the form labels it ("Snooze seconds"), not the API's delay_seconds
    for typed, says in (("90000", "snooze seconds must be within 0..86400"),
                        ("soon", "snooze seconds must be a whole number")):
        refused = admin.post(f"/todos/{other}/release", delay_seconds=typed)
        assert refused.status_code == 400 and any(says in a for a in alerts(refused.text)), alerts(refused.text)
        assert not any("delay_seconds" in a for a in alerts(refused.text))
    assert server.cli.json("todo", "show", other)["state"] == "claimed"  # the lease is kept


def test_retry_all_on_the_dead_letter_view_retries_them_in_one_bulk_action(admin, endpoint, server):
    from datetime import datetime, timezone

    from application.service import Caller
    from interfaces.bootstrap import build
    from interfaces.settings import Settings
    from tests.doubles import ManualClock

    clock = ManualClock(datetime.now(timezone.utc))
    container = build(Settings(database_url=server.cli.url, data_dir=str(server.cli.data_dir)), clock=clock)
    try:
        agent = Caller("endpoint", endpoint["slug"])
        dead = []
        for n in range(3):
            todo = container.app.push(endpoint["slug"], f"doomed {n}", caller=Caller.cli(), queue="reviews")["todo"]["id"]
            while True:
                container.app.claim(todo, caller=agent)
                if container.app.fail(todo, caller=agent)["dead_letter"]:
                    break
                clock.advance(hours=1)  # past the retry's time
            dead.append(todo)
    finally:
        container.close()

    view = admin.page(f"/todos?state=dead&endpoint={endpoint['slug']}")
    assert 'action="/dead-letters/retry"' in view and "Retry all" in view
    answer = admin.post("/dead-letters/retry", endpoint=endpoint["slug"])
    assert answer.status_code == 303 and "done=bulk_retried" in answer.headers["location"]
    causes = {server.cli.json("todo", "history", t)["events"][-1]["cause"] for t in dead}
    assert len(causes) == 1 and (bulk := causes.pop()).startswith("ba_")
    # the page it goes back to says how many and the bulk action's id (the cause of every event)
    back = admin.page(answer.headers["location"])
    assert f"Retried 3 dead letters in bulk action {bulk}" in back
    forged = admin.page(f"/todos?state=dead&done=bulk_retried&retried=9&bulk=%3Cb%3Ex")  # not an id: the plain notice
    assert "Every dead letter shown was retried" in forged and "<b>x" not in forged
    assert {server.cli.json("todo", "show", t)["state"] for t in dead} == {"pending"}
    assert "Retry all" not in admin.page(f"/todos?state=dead&endpoint={endpoint['slug']}")  # none left
