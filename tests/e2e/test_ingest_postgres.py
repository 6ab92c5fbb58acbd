"""End to end on PostgreSQL: concurrent identical deliveries, fan-out, an all-or-nothing append
(a failure injected by a trigger in the database) and redelivery after completion (CONTRACT §4, §7).

One `switchboard serve` (and, for one test, a second one) on one PostgreSQL database, with
SWITCHBOARD_SECRET_KEY set explicitly so every process decrypts the same signing secrets.
"""

from __future__ import annotations

import secrets
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from tests.e2e._ingest import CLI, Stack, assert_accepted, assert_error
from tests.fixtures import fixture

pytestmark = pytest.mark.postgres

QUEUES = ("inbox", "reviews")
SECRET_KEY = secrets.token_hex(32)
MARKER = "e2e-injected-failure-marker"


@pytest.fixture(scope="module")
def stack(module_pg_url, tmp_path_factory):
    stack = Stack(module_pg_url, tmp_path_factory.mktemp("pg-ingest"), secret_key=SECRET_KEY).start()
    yield stack
    stack.close()


def _parallel(send, n: int) -> list[httpx.Response]:
    """`n` requests released together, each on its own connection."""
    barrier = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            barrier.wait()
            return send(i, client)

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


def _assert_one_todo(stack, endpoint, hook, responses, delivery_count_before, todo_count_before):
    answers = [assert_accepted(r, trust_mode="signed", verified=True, queue="inbox", created=r.json()["created"])
               for r in responses]
    assert sorted(a["created"] for a in answers) == [0] * (len(answers) - 1) + [1]
    assert len({a["id"] for a in answers}) == 1
    assert len({a["event_id"] for a in answers}) == len(answers)  # every delivery is stored
    counts = stack.counts()
    assert counts["deliveries"] == delivery_count_before + len(answers)
    assert counts["todos"] == todo_count_before + 1
    todos = stack.todos_of(endpoint)
    assert [t["id"] for t in todos] == [answers[0]["id"]]
    events = stack.events_of(hook)
    assert len(events) == len(answers) and sum(e["todos_created"] for e in events) == 1


def test_twenty_parallel_identical_deliveries_mint_one_todo(stack):
    endpoint = stack.vend("parallel", QUEUES)
    hook = stack.webhook(endpoint, "github", "inbox")
    body, delivery = fixture("github_issues_opened.json"), str(uuid.uuid4())
    before = stack.counts()

    responses = _parallel(lambda i, client: stack.deliver(hook, body, event="issues", delivery=delivery,
                                                          client=client), 20)

    _assert_one_todo(stack, endpoint, hook, responses, before["deliveries"], before["todos"])


def test_parallel_identical_deliveries_across_two_servers_mint_one_todo(stack):
    endpoint = stack.vend("two-servers", QUEUES)
    hook = stack.webhook(endpoint, "github", "inbox")
    body, delivery = fixture("github_pull_request_opened.json"), str(uuid.uuid4())
    other = stack.another_server("second")
    try:
        urls = [hook["ingest_url"], hook["ingest_url"].replace(stack.server.base, other.base)]
        before = stack.counts()
        responses = _parallel(lambda i, client: stack.deliver(hook, body, event="pull_request", delivery=delivery,
                                                              url=urls[i % 2], client=client), 20)
    finally:
        assert other.stop() == 0, other.output()
    assert "Traceback" not in other.stderr(), other.output()
    _assert_one_todo(stack, endpoint, hook, responses, before["deliveries"], before["todos"])


@pytest.fixture
def fan_out(stack):
    """A webhook on an owner with routes to two more endpoints of the same operator."""
    owner, first, second = (stack.vend(name, QUEUES) for name in ("fan-owner", "fan-first", "fan-second"))
    hook = stack.webhook(owner, "generic", "inbox")
    for target in (first, second):
        routed = stack.webhooks.add_route(hook["webhook_id"], target["endpoint_id"], caller=CLI)
        assert routed["routed"] is True
    return hook, [owner, first, second]


def test_fan_out_mints_one_todo_per_target_in_one_delivery(stack, fan_out):
    hook, endpoints = fan_out
    ids = [e["endpoint_id"] for e in endpoints]
    before = stack.counts()

    answer = assert_accepted(stack.deliver(hook, b'{"title": "fan me out"}', delivery="fan-1"),
                             trust_mode="token", verified=False, queue="inbox", created=3, endpoint_ids=ids)

    assert stack.counts()["deliveries"] == before["deliveries"] + 1
    assert stack.counts()["todos"] == before["todos"] + 3
    stored = stack.webhooks.get_event(answer["event_id"], caller=CLI)
    assert stored["todos"] == answer["todos"] and stored["disposition"] == "routed"
    for endpoint, ref in zip(endpoints, answer["todos"]):
        todos = stack.todos_of(endpoint)
        assert [t["id"] for t in todos] == [ref["id"]]
        assert (todos[0]["queue"], todos[0]["title"], todos[0]["trust_mode"]) == ("inbox", "webhook: fan me out", "token")
    # dedup is per target: the same delivery again names the same three
    again = assert_accepted(stack.deliver(hook, b'{"title": "fan me out"}', delivery="fan-1"),
                            trust_mode="token", verified=False, queue="inbox", created=0, endpoint_ids=ids)
    assert [t["id"] for t in again["todos"]] == [t["id"] for t in answer["todos"]]
    # a rule naming one target reaches that one only
    stack.set_rules(hook, {"rules": [{"id": "to-second", "expr": ".payload.review == true",
                                      "action": {"queue": "reviews", "endpoints": [ids[2]]}}]})
    only = assert_accepted(stack.deliver(hook, b'{"title": "review me", "review": true}'),
                           trust_mode="token", verified=False, queue="reviews", created=1, endpoint_ids=[ids[2]])
    assert stack.app.get_todo(only["id"], caller=CLI)["routing"]["rule_id"] == "to-second"


TRIGGER = f"""
CREATE SEQUENCE sbtest_seen_rows;
CREATE FUNCTION sbtest_fail_third_todo() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n integer;
BEGIN
    IF NEW.topic = 'TodoOpened' AND position(convert_to('{MARKER}', 'UTF8') IN NEW.state) > 0 THEN
        PERFORM nextval('sbtest_seen_rows');
        n := coalesce(nullif(current_setting('sbtest.seen', true), ''), '0')::integer + 1;
        PERFORM set_config('sbtest.seen', n::text, true);  -- counts within this transaction
        IF n >= 3 THEN
            RAISE EXCEPTION 'e2e: injected failure at TodoOpened row %', n;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER sbtest_fail_third_todo BEFORE INSERT ON stored_events
    FOR EACH ROW EXECUTE FUNCTION sbtest_fail_third_todo();
"""
DROP_TRIGGER = """
DROP TRIGGER IF EXISTS sbtest_fail_third_todo ON stored_events;
DROP FUNCTION IF EXISTS sbtest_fail_third_todo();
DROP SEQUENCE IF EXISTS sbtest_seen_rows;
"""


def test_fan_out_append_is_all_or_nothing(stack, fan_out):
    """The database refuses the 3rd TodoOpened row of the append: nothing of it is stored."""
    hook, endpoints = fan_out
    ids = [e["endpoint_id"] for e in endpoints]
    # the marker in the title: a TodoOpened names its payload by digest (docs/adr/0027), the title is inline
    body = f'{{"title": "doomed {MARKER}", "marker": "{MARKER}"}}'.encode()
    with psycopg.connect(stack.url, autocommit=True) as conn:
        conn.execute(TRIGGER)
    try:
        before = stack.counts()
        stack.container.views.catch_up()  # the read model holds every delivery stored so far (the projector may lag)
        deliveries_before = stack.scalar("SELECT count(*) FROM sb_stored_deliveries")

        refused = stack.deliver(hook, body, delivery="doomed-1")

        assert_error(refused, 503, {"error": "store down", "code": "unavailable"})
        # the trigger saw three TodoOpened rows: two were written before the third failed
        assert stack.scalar("SELECT last_value FROM sbtest_seen_rows") == 3
        assert stack.counts() == before
        stack.container.views.catch_up()
        assert stack.scalar("SELECT count(*) FROM sb_stored_deliveries") == deliveries_before
        assert stack.events_of(hook) == []
        assert all(stack.todos_of(endpoint) == [] for endpoint in endpoints)
        # the server is fine: a delivery without the marker goes through meanwhile
        assert_accepted(stack.deliver(hook, b'{"title": "fine"}'), trust_mode="token", verified=False,
                        queue="inbox", created=3, endpoint_ids=ids)
    finally:
        with psycopg.connect(stack.url, autocommit=True) as conn:
            conn.execute(DROP_TRIGGER)
    # the failed attempt bound no idempotency key: the sender's retry mints all three
    retried = assert_accepted(stack.deliver(hook, body, delivery="doomed-1"), trust_mode="token", verified=False,
                              queue="inbox", created=3, endpoint_ids=ids)
    assert len(stack.events_of(hook)) == 2
    assert {t["id"] for e in endpoints for t in stack.todos_of(e)} >= {t["id"] for t in retried["todos"]}


def test_redelivery_after_complete_mints_a_new_todo(stack):
    endpoint = stack.vend("finisher", QUEUES)
    hook = stack.webhook(endpoint, "github", "inbox")
    agent = stack.app.endpoint_caller(endpoint["slug"])
    body, delivery = fixture("github_issues_opened.json"), str(uuid.uuid4())

    def send(created: int) -> dict:
        return assert_accepted(stack.deliver(hook, body, event="issues", delivery=delivery), trust_mode="signed",
                               verified=True, queue="inbox", created=created)

    first = send(1)
    assert send(0)["id"] == first["id"]  # pending
    stack.app.claim(first["id"], caller=agent)
    assert send(0)["id"] == first["id"]  # claimed
    stack.app.complete(first["id"], caller=agent, summary="fixed")
    second = send(1)  # done: the same key mints a new todo
    assert second["id"] != first["id"]
    assert stack.app.get_todo(second["id"], caller=CLI)["state"] == "pending"
    assert send(0)["id"] == second["id"]

    # failed and awaiting its retry: still the live todo for that key
    stack.app.claim(second["id"], caller=agent)
    stack.app.fail(second["id"], caller=agent, summary="flaky")
    failed = stack.app.get_todo(second["id"], caller=CLI)
    assert failed["state"] == "failed" and failed["dead_letter"] is False
    assert send(0)["id"] == second["id"]
    assert [t["id"] for t in stack.todos_of(endpoint)] == [second["id"], first["id"]]
